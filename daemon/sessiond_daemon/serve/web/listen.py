"""Where the HTTP face listens, and uvicorn's server run as a task of the daemon's loop.

uvicorn parses HTTP (h11); this module only opens the sockets, refuses addresses that are
not loopback (unless allowed), hands each Unix connection's peer credentials to the app,
and gives every connection an idle deadline from its first byte on.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import structlog
import uvicorn
from anyio.abc import TaskStatus
from uvicorn.protocols.http.h11_impl import H11Protocol

from sessiond_daemon.serve.server import peer_of

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


class _PeerProtocol(H11Protocol):
    """uvicorn's h11 protocol, plus: the peer's credentials in the scope of a Unix
    connection (SO_PEERCRED), an abort callable, the idle deadline armed at connect
    (uvicorn arms it only after a first response, so a silent client would stay), and
    connections past `limit_concurrency` dropped when they are made."""

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
        inner = self.app

        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            scope[PEER] = peer
            scope[ABORT] = transport.abort
            await inner(scope, receive, send)

        self.app = app
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler)
        self._idle_since = self.loop.time()

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

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()


class _Embedded(uvicorn.Server):
    """uvicorn's server without its signal handlers: the daemon owns SIGTERM and SIGHUP."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve(app: ASGIApp, sockets: list[socket.socket], *, idle_timeout_s: float,
                max_connections: int, graceful_s: float,
                task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve `app` on `sockets` until cancelled, then close them and end the requests
    (long polls and SSE tails are cut after `graceful_s`)."""
    config = uvicorn.Config(
        app, lifespan="off", http=_PeerProtocol, log_config=None, access_log=False,
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
