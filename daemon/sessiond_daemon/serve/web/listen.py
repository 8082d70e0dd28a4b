"""Where the HTTP face listens, and uvicorn's server run as a task of the daemon's loop.

uvicorn parses HTTP (h11); this module opens the sockets, refuses addresses that are not
loopback (unless allowed), hands each Unix connection's peer credentials to the app, and
guards every connection, whatever route it asks for:

- deadlines: an idle one from its first byte on; a request's head whole within
  `head_timeout_s` of the connection (or of the last response) and its body within
  `body_timeout_s` of its head, each a timer that fires without another byte;
- a cap per peer (a uid: SO_PEERCRED on a Unix socket, the kernel's socket table for a
  loopback TCP client; else its address) that leaves a quarter of the connections to the
  owner;
- the daemon's memory budget (serve/budget.py), for any ASGI route: the request body
  received and held, reads reserved by size, the response bytes handed over and unsent in
  the transport; past the budget the connection holding the most, on any face, is closed.

It subclasses uvicorn's `H11Protocol` and reads its request cycle (`cycle`, its
`more_body`, `response_complete`): uvicorn has no public hook for a request's head and
body, so the version is pinned to the tested range (pyproject.toml) and
tests/test_memory_budget.py fails when those attributes move.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import structlog
import uvicorn
from anyio.abc import TaskStatus
from uvicorn.protocols.http.h11_impl import H11Protocol

from sessiond_daemon.serve.budget import COPIES, Holding, ReplyBudget, Reservation
from sessiond_daemon.serve.server import Peer, peer_of
from sessiond_daemon.stores.rows import page_reserve

log = structlog.get_logger("sessiond.http")

ASGIApp = Callable[..., Any]
PEER = "sessiond.peer"  # the scope key of a Unix peer's credentials (server.Peer)
ABORT = "sessiond.abort"  # the scope key of a callable that drops the connection at once


class ListenError(ValueError):
    """An http_listen address that cannot be served; the message says why."""


def parse(address: str, *, allow_remote: bool = False) -> tuple[str, int] | str:
    """`host:port` (IPv6 as `[::1]:4437`) -> (host, port); a path with a slash -> the path.

    A host that is not a loopback address is refused unless `allow_remote`: the token is
    the only thing that guards TCP, and it travels in clear text without TLS.
    """
    if "/" in address:
        return address
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ListenError(f"an HTTP listen address is host:port or a socket path: {address!r}")
    host = host.strip("[]") or "127.0.0.1"
    if not allow_remote and not _loopback(host):
        raise ListenError(
            f"{address!r} is not a loopback address; the HTTP face serves 127.0.0.1, ::1,"
            " localhost or a Unix socket (set http_allow_remote = true to serve others,"
            " behind TLS)")
    return host, int(port)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tcp_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (port 0: any free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def tcp_peer_uid(sock: socket.socket) -> int | None:
    """The uid owning the other end of a loopback TCP connection, from the kernel's socket
    table (/proc/net/tcp, tcp6): the peer's socket is the one whose local address is our
    remote and whose remote is our local. None when not found (not loopback, no /proc)."""
    try:
        local, remote = sock.getsockname(), sock.getpeername()
        if not _loopback(remote[0]):
            return None
        six = sock.family == socket.AF_INET6
        want = (_proc_address(remote, six), _proc_address(local, six))
        with open("/proc/net/tcp6" if six else "/proc/net/tcp") as table:
            next(table)
            for line in table:
                fields = line.split()
                if (fields[1], fields[2]) == want:
                    return int(fields[7])
    except (OSError, ValueError, IndexError, StopIteration):
        pass
    return None


def _proc_address(address: tuple[Any, ...], six: bool) -> str:
    """An address as /proc/net/tcp prints it: its 32-bit words in host order, the port."""
    if six:
        words = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, address[0]))
        host = "".join(f"{w:08X}" for w in words)
    else:
        host = f"{struct.unpack('=I', socket.inet_aton(address[0]))[0]:08X}"
    return f"{host}:{address[1]:04X}"


@dataclass(slots=True, eq=False)
class Guard:
    """What a listener's connections share: the memory budget, the deadlines, and the
    count of connections per peer."""

    budget: ReplyBudget
    head_timeout_s: float
    body_timeout_s: float
    per_peer: int  # connections one peer other than the owner may hold
    others_max: int  # connections every peer but the owner may hold together
    counts: dict[object, int] = field(default_factory=dict)
    others: int = 0
    refused: int = 0

    def admit(self, key: object, owner: bool) -> bool:
        if not owner and (self.counts.get(key, 0) >= self.per_peer
                          or self.others >= self.others_max):
            self.refused += 1
            return False
        self.counts[key] = self.counts.get(key, 0) + 1
        self.others += not owner
        return True

    def leave(self, key: object, owner: bool) -> None:
        left = self.counts.get(key, 0) - 1
        if left > 0:
            self.counts[key] = left
        else:
            self.counts.pop(key, None)
        self.others -= not owner


class _PeerProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: the peer's credentials in the scope of a Unix
    connection (SO_PEERCRED), an abort callable, the idle deadline armed at connect
    (uvicorn arms it only after a first response, so a silent client would stay), the
    head and body deadlines, the cap per peer, the memory budget, and connections past
    `limit_concurrency` dropped when they are made."""

    guard: ClassVar[Guard]  # set on the subclass serve() makes
    _key: object = None  # the peer the connection is counted under (None: not counted)
    _owner = False
    _holding: Holding | None = None
    _timer: asyncio.TimerHandle | None = None
    _head_of: object = None  # the cycle when the head's timer was armed
    _body_of: object = None  # the cycle whose body is being timed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # uvicorn answers 503 from `limit_concurrency` connections on; serve() sets it one
        # past our limit, so past the limit a connection is dropped here instead.
        if (self.limit_concurrency is not None
                and len(self.connections) >= self.limit_concurrency):
            # Past the limit a connection is dropped at once: a flood of idle connections
            # must not take the descriptors the RPC socket and the database need.
            transport.abort()
            return
        sock = transport.get_extra_info("socket")
        peer = peer_of(sock) if sock is not None and sock.family == socket.AF_UNIX else None
        uid = peer.uid if peer is not None else (
            tcp_peer_uid(sock) if sock is not None else None)
        key: object = ("uid", uid) if uid is not None else ("address", (self.client or ("",))[0])
        owner = uid in (os.getuid(), 0)
        guard = self.guard
        if not guard.admit(key, owner):
            log.info("http.peer_over_cap", peer=str(key), cap=guard.per_peer)
            transport.abort()
            return
        self._key, self._owner = key, owner
        holding = Holding((peer.pid if peer else -1, uid if uid is not None else -1),
                          lambda reason: transport.abort())
        guard.budget.join(holding)
        self._holding = holding
        self.app = _metered(self.app, peer, transport, guard.budget, holding)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)
        self._idle_since = self.loop.time()
        self._arm_head()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._cancel_timer()
        if self._key is not None:
            self.guard.leave(self._key, self._owner)
            self._key = None
        holding, self._holding = self._holding, None
        if holding is not None:
            self.guard.budget.leave(holding)
            self.guard.budget.transport_closed(holding)

    def data_received(self, data: bytes) -> None:
        # uvicorn's idle timer starts again at every byte, so a client that sends a byte
        # now and then would hold its connection for ever: between requests, the head of
        # the next must come whole within twice the idle deadline, however it trickles.
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and self.loop.time() - self._idle_since > 2 * self.timeout_keep_alive:
            assert self.transport is not None
            self.transport.abort()
            return
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        self._arm_head()
        super().on_response_complete()
        self._watch()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._sample()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._sample()  # the client read: what it holds unsent is counted down

    def _sample(self) -> None:
        if self._holding is not None and self.transport is not None:
            self.guard.budget.sample(self._holding, self.transport)

    # --- the head and body deadlines --------------------------------------------------

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm_head(self) -> None:
        """The next request's head must come whole within head_timeout_s from now."""
        self._cancel_timer()
        self._head_of = self.cycle
        self._timer = self.loop.call_later(self.guard.head_timeout_s, self._head_due)

    def _watch(self) -> None:
        """A new request's head came: time its body, if it has one still to come."""
        cycle = self.cycle
        if cycle is None or cycle is self._head_of or cycle is self._body_of:
            return
        self._cancel_timer()
        self._body_of = cycle
        if cycle.more_body and not cycle.response_complete:
            self._timer = self.loop.call_later(self.guard.body_timeout_s, self._body_due)

    def _head_due(self) -> None:
        self._timer = None
        if self.cycle is self._head_of and not self._closing():
            log.info("http.head_late", timeout_s=self.guard.head_timeout_s,
                     client=str(self.client))
            self._drop()

    def _body_due(self) -> None:
        self._timer = None
        cycle = self.cycle
        if (cycle is self._body_of and cycle is not None and cycle.more_body
                and not cycle.response_complete and not self._closing()):
            log.info("http.body_late", timeout_s=self.guard.body_timeout_s,
                     client=str(self.client))
            self._drop()

    def _closing(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    def _drop(self) -> None:
        assert self.transport is not None
        self.transport.abort()


def _metered(inner: ASGIApp, peer: Peer | None, transport: asyncio.Transport,
             budget: ReplyBudget, holding: Holding) -> ASGIApp:
    """`inner`, any ASGI app, with its requests' memory held in the daemon's budget:
    the body it receives, the items its reads take from the store (by size), the
    response bytes it sends (until the transport has them, then as its unsent bytes)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        scope[PEER] = peer
        scope[ABORT] = transport.abort
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        reservation = Reservation(budget, holding)
        token = page_reserve.set(reservation)
        received = 0

        async def metered_receive() -> Any:
            nonlocal received
            # Past three quarters of the budget, a connection holding more than its
            # share is not read (its body waits in the socket) until there is room.
            await budget.room_to_receive(holding, sample)
            message = await receive()
            size = len(message.get("body", b""))
            if size:
                if not budget.make_room(holding, size, built=True):
                    return {"type": "http.disconnect"}  # it held the most: closed
                budget.receive(holding, size)
                received += size
            return message

        async def metered_send(message: Any) -> None:
            size = len(message.get("body", b"")) if message["type"] == "http.response.body" \
                else 0
            if not size:
                await send(message)
                return
            # While it is handed over, a body is held twice: the app's, and h11's framed
            # copy of it (then the transport's unsent bytes, sampled).
            size *= COPIES
            if not budget.make_room(holding, size, built=True):
                return  # it held the most: closed, its answer dropped
            budget.wait(holding, size)
            try:
                await send(message)
            finally:
                budget.wait(holding, -size)
                sample()
                # What its reads reserved is in this body now (a tail's next pages are
                # reserved again as they are read).
                reservation.release()

        def sample() -> None:
            budget.sample(holding, transport)

        try:
            await inner(scope, metered_receive, metered_send)
        finally:
            page_reserve.reset(token)
            reservation.end()
            budget.receive(holding, -received)
            sample()

    return app


class _Embedded(uvicorn.Server):
    """uvicorn's server without its signal handlers: the daemon owns SIGTERM and SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def guard_of(budget: ReplyBudget, *, head_timeout_s: float, body_timeout_s: float,
             max_connections: int, per_peer: int) -> Guard:
    """A listener's guard: every peer but the owner holds at most `per_peer` (and a
    quarter of `max_connections`) connections, all of them together three quarters."""
    return Guard(budget, head_timeout_s, body_timeout_s,
                 per_peer=max(1, min(per_peer, max_connections // 4)),
                 others_max=max(1, max_connections - max_connections // 4))


async def serve(app: ASGIApp, sockets: list[socket.socket], *, idle_timeout_s: float,
                max_connections: int, graceful_s: float, guard: Guard,
                task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on `sockets` until cancelled, then close them and end the requests
    (long polls and SSE tails are cut after `graceful_s`)."""

    class Guarded(_PeerProtocol):
        pass

    Guarded.guard = guard
    config = uvicorn.Config(
        app, lifespan="off", http=Guarded, log_config=None, access_log=False,
        server_header=False, timeout_keep_alive=max(1, round(idle_timeout_s)),
        limit_concurrency=max_connections + 1, timeout_graceful_shutdown=max(1, round(graceful_s)),
        h11_max_incomplete_event_size=64 << 10)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    server = _Embedded(config)
    config.load()
    server.lifespan = config.lifespan_class(config)
    await server.startup(sockets=sockets)
    try:
        task_status.started()
        await server.main_loop()
    finally:
        with anyio.CancelScope(shield=True):
            server.should_exit = True
            await server.shutdown(sockets=sockets)
