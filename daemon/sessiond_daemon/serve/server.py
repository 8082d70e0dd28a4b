"""The JSON-RPC 2.0 server: NDJSON framing on a Unix socket, dispatch, limits, peer check."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import os
import re
import select
import socket
import struct
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

import anyio
import msgspec
import structlog
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskStatus

from sessiond_daemon import host
from sessiond_daemon.core import access, text
from sessiond_daemon.core.access import Grants
from sessiond_daemon.core.hooks import NO_METRICS, Hooks
from sessiond_daemon.core.request import client_gone, page_budget
from sessiond_daemon.core.writer import Command, Writer
from sessiond_daemon.features.service import VERSION, invalid_params
from sessiond_daemon.features.subscriptions import Subscriptions
from sessiond_daemon.serve.budget import Holding, ReplyBudget, Reservation
from sessiond_daemon.serve.methods import ConnectionHandler, Handler, MethodTable
from sessiond_daemon.stores.interface import Store
from sessiond_daemon.stores.rows import page_reserve
from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PARSE_ERROR,
    InternalError,
    InvalidParamsError,
    MethodNotFoundError,
    OverloadedError,
    ParseError,
    PermissionDeniedError,
    SessiondError,
    ShuttingDownError,
)
from sessiond_schemas.events import EventMeta, new_id

log = structlog.get_logger("sessiond.rpc")

_encoder = msgspec.json.Encoder()
_request_decoder = msgspec.json.Decoder(rpc.Request)
_batch_decoder = msgspec.json.Decoder(list[msgspec.Raw])
_EMPTY_PARAMS = msgspec.Raw(b"{}")
WHOLE_LINE = 1 << 20  # answers from this size on are written without a copy for the newline
# The id of a request line that begins {"jsonrpc":"2.0","id":... (as the clients send them).
_LEADING_ID = re.compile(
    rb'\s*\{\s*(?:"jsonrpc"\s*:\s*"2\.0"\s*,\s*)?"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,128}")\s*[,}]')


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_request_bytes: int = 128 << 20
    max_connections: int = 1024
    max_inflight: int = 256
    max_subscriptions: int = 64  # per connection
    max_subscription_buffer: int = 1 << 20  # unread bytes before a live subscriber is dropped
    max_batch_requests: int = 64  # requests in one batch line
    max_reply_buffer: int = 16 << 20  # unsent reply bytes before we stop reading a client
    max_reply_buffer_total: int = 512 << 20  # reply bytes held across connections (budget.py)
    max_page_bytes: int = 4 << 20  # a paged read's byte budget (shared by a batch's items)
    request_timeout_s: float = 30.0  # a line begun must end within this (0: no deadline)


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gid: int


class Slot:
    """One of a connection's max_inflight slots, held by a line; released once."""

    __slots__ = ("gate", "held", "in_use")

    def __init__(self, gate: anyio.Semaphore, size: int) -> None:
        self.gate, self.held = gate, True
        self.in_use = size - gate.value  # the connection's requests running now, this one too

    def release(self) -> None:
        if self.held:
            self.held = False
            self.gate.release()


@dataclass(frozen=True, slots=True, eq=False)
class Connection:
    """What a request may need of the connection it came on, and how to end it."""

    peer: Peer
    subscriptions: Subscriptions
    holding: Holding  # its reply bytes held, in the daemon's budget
    context: contextvars.Context  # what its requests run in (copies, for tasks)


def _failure(request_id: Any, code: int, message: str,
             data: dict[str, Any] | None = None) -> rpc.Failure:
    error = rpc.ErrorObject(code=code, message=message, data=data if data else msgspec.UNSET)
    return rpc.Failure(jsonrpc="2.0", id=request_id, error=error)


def peer_of(sock: socket.socket) -> Peer:
    """Read the connecting process's pid, uid and gid (SO_PEERCRED)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return Peer(pid, uid, gid)


class Server:
    """Serves the contract's methods to every connection on a listener."""

    def __init__(self, methods: MethodTable, limits: ServerLimits, *,
                 store: Store, writer: Writer,
                 allowed_uids: frozenset[int] = frozenset(),
                 allowed_gids: frozenset[int] = frozenset(),
                 grants: Grants | None = None) -> None:
        self.store, self.writer = store, writer  # what a connection's subscriptions read
        self.grants = grants or Grants()  # what other allowed uids may call
        self.limits = limits
        self.allowed_uids = allowed_uids
        self.allowed_gids = allowed_gids
        self.connections = 0
        self.subscriptions = 0
        self.draining = False
        self.inflight = 0
        self.budget = ReplyBudget(limits.max_reply_buffer_total)
        self._open: set[Connection] = set()  # every connection being served
        self.metrics: Hooks = NO_METRICS  # lifecycle sets Prometheus with --metrics-listen
        self._idle: anyio.Event | None = None  # made only while someone waits for it
        # From the method table (methods.py): each method's params decoder, and its
        # handler, or the connection's (the subscription methods), and its grant.
        self._decoders = {name: msgspec.json.Decoder(m.params) for name, m in methods.items()}
        self._handlers: dict[str, Handler] = {
            name: m.handler for name, m in methods.items() if m.handler is not None}
        self._on_connection: dict[str, ConnectionHandler] = {
            name: m.on_connection for name, m in methods.items() if m.on_connection is not None}
        self._grants: dict[str, Callable[[Any], str]] = {
            name: m.grant for name, m in methods.items() if m.grant is not None}
        # The writes that go by the write lane (`_write_lane`): their commands' makers.
        self._commands: dict[str, Callable[[Any, EventMeta], Command]] = {
            name: m.command for name, m in methods.items() if m.command is not None}

    # --- accepting ------------------------------------------------------------------

    async def serve(self, listener: SocketListener, *,
                    task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled; each connection runs in its own task."""
        task_status.started()
        await host.accept_forever(listener, self._guarded_connection, what="rpc")

    async def wait_idle(self) -> None:
        """Return once no request is being executed."""
        while self.inflight:
            self._idle = self._idle or anyio.Event()
            await self._idle.wait()

    def _allowed(self, peer: Peer) -> bool:
        return (peer.uid in (os.getuid(), 0) or peer.uid in self.allowed_uids
                or peer.gid in self.allowed_gids)

    def recheck(self) -> int:
        """After a reload: end every connection whose peer the new settings no longer let
        in. Its subscriptions are dropped saying why, it gets the -32006 a new connection
        would, and it is closed (its requests in flight are not answered). Returns how
        many were ended."""
        revoked = [conn for conn in self._open if not self._allowed(conn.peer)]
        for conn in revoked:
            peer = conn.peer
            reason = (f"access revoked: uid {peer.uid} may no longer use this daemon"
                      " (allowed_uids / allowed_gids changed by a reload)")
            log.warning("rpc.access_revoked", peer_uid=peer.uid, peer_pid=peer.pid,
                        subscriptions=len(conn.subscriptions.cursors()))
            conn.subscriptions.revoke(reason)
            refused = PermissionDeniedError(
                f"uid {peer.uid} may not use this daemon: access revoked by a reload",
                {"uid": peer.uid, "reason": "access revoked"})
            conn.subscriptions.out.write(_encoder.encode(self._error(None, refused)) + b"\n")
            conn.holding.close(reason)
        return len(revoked)

    async def _guarded_connection(self, stream: SocketStream) -> None:
        try:
            await self._connection(stream)
        except Exception:  # a bug in one connection must not end the accept loop
            log.exception("rpc.connection_failed", error_id=new_id())

    async def _connection(self, stream: SocketStream) -> None:
        # anyio's Unix stream re-registers its fd with epoll on every receive; an
        # asyncio transport registers once (py-spy: a quarter of a ping's samples). So the
        # accepted socket moves to an asyncio transport, inside our own task group.
        raw = stream.extra(SocketAttribute.raw_socket)
        peer = peer_of(raw)
        sock = socket.socket(fileno=raw.detach())
        if not self._allowed(peer) or self.connections >= self.limits.max_connections:
            await self._refuse(sock, peer)
            return
        self.connections += 1  # counted before any wait: the next accept sees it
        try:
            loop = asyncio.get_running_loop()
            _, link = await loop.connect_accepted_socket(
                partial(_Link, self.limits.max_request_bytes, loop), sock)
            assert link.transport is not None
            writer = asyncio.StreamWriter(link.transport, link, None, loop)
            if self.limits.max_reply_buffer < 64 << 10:  # below asyncio's high-water mark:
                link.transport.set_write_buffer_limits(high=self.limits.max_reply_buffer)
            try:
                structlog.contextvars.bind_contextvars(peer_pid=peer.pid, peer_uid=peer.uid)
                log.debug("rpc.connected")
                holding = await self._serve_link(link, writer, peer)
            finally:
                log.debug("rpc.disconnected")
                writer.close()
                with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                    await writer.wait_closed()
        finally:
            self.connections -= 1
        # Its transport let go of the answers it held only now.
        self.budget.transport_closed(holding)

    async def _refuse(self, sock: socket.socket, peer: Peer) -> None:
        """Answer a connection that may not be served (its peer, or too many) and close it."""
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        try:
            if not self._allowed(peer):
                log.warning("rpc.peer_refused", uid=peer.uid, pid=peer.pid)
                refused: SessiondError = PermissionDeniedError(
                    f"uid {peer.uid} may not use this daemon", {"uid": peer.uid})
            else:
                refused = OverloadedError("too many connections; retry later",
                                          {"retry_after_ms": 100})
            await self._send_quietly(writer, _encoder.encode(self._error(None, refused)))
            await self._linger(reader, writer)
        finally:
            writer.close()
            with anyio.CancelScope(shield=True), contextlib.suppress(OSError):
                await writer.wait_closed()

    def count_subscriptions(self, delta: int) -> None:
        """Count live subscriptions: the socket's, and the HTTP face's live tails."""
        self.subscriptions += delta

    async def _serve_link(self, link: _Link, writer: asyncio.StreamWriter,
                          peer: Peer) -> Holding:
        """Serve a connection's lines: each is taken where it is read (in the transport's
        callback: no reading task, no stream reader) and answered in a task of its own;
        this task only waits for the connection to end, and for room when a line must.
        Returns what it held of the daemon's reply budget (given back by then)."""
        gate_size = self.limits.max_inflight
        gate = anyio.Semaphore(gate_size)
        conn: Connection
        budget = self.budget
        limits = self.limits
        transport = link.transport
        assert transport is not None

        def shut(reason: str) -> None:
            """End the connection at once: its requests are cancelled, answers not yet
            handed to the transport dropped. Called from its own tasks, or from another
            connection's (the budget) or a reload's (revoked access)."""
            log.debug("rpc.connection_closed", reason=reason)
            if reason.startswith(("access revoked", "request line")):
                # What was written last (the reason) is sent if the client reads; the
                # connection is cut a moment later in any case.
                transport.close()
                loop.call_later(1.0, transport.abort)
            else:
                transport.abort()
            link.stop()
            tg.cancel_scope.cancel()
            for other in requests:
                if other is not asyncio.current_task():
                    other.cancel()

        # The answers this connection built and has not handed to its transport, and its
        # transport's unsent bytes: what it holds of the daemon's reply budget.
        holding = Holding((peer.pid, peer.uid), shut)

        # The write lane's commands not yet answered, and what waits for them (the end);
        # the request tasks that have not yet taken their first step.
        lanes = unstarted = 0
        lanes_done: asyncio.Future[None] | None = None

        async def run(line: bytes, slot: Slot, share: int, req: rpc.Request | None) -> None:
            """Answer a line (`req`: the request it holds, decoded already) on its slot;
            `share`: what its answer may weigh, reserved in the daemon's budget (when the
            line was taken) while it is built."""
            nonlocal unstarted
            unstarted -= 1
            # What its reads take from the store is reserved by size as they take it.
            reservation = Reservation(budget, holding)
            page_reserve.set(reservation)
            try:
                try:
                    reply = await self.handle_line(line, conn, slot, req)
                except Exception:  # a bug: no line may take down the connection or daemon
                    error_id = new_id()
                    log.exception("rpc.line_failed", error_id=error_id)
                    reply = _encoder.encode(_failure(None, INTERNAL_ERROR, "internal error",
                                                     {"error_id": error_id}))
                finally:
                    budget.reserve(holding, -share)
                    reservation.end()
                if reply is not None:
                    # Not held here while it waits for the client to read: the transport
                    # has its copy once `send` put it there.
                    sending = send(reply)
                    del reply
                    await sending
            except ConnectionError:
                pass  # the client went away; its answer has nowhere to go
            finally:
                slot.release()

        def admit(size: int) -> bool:
            """Count an answer of `size` bytes as built and unsent (False: it is dropped)."""
            # Past the daemon's budget the connection holding the most is closed first,
            # this one if it is that one (then its answer is dropped).
            if not budget.make_room(holding, size, built=True):
                return False
            budget.wait(holding, size)
            if holding.waiting > max(size, 2 * limits.max_reply_buffer):
                # Answers pile up for a client that reads none of them (pages can pass
                # their budget: one item always comes whole). Its requests are dropped and
                # it is closed.
                log.warning("rpc.client_not_reading", waiting_bytes=holding.waiting,
                            limit=limits.max_reply_buffer)
                settle(size)
                shut("not reading")
                return False
            return True

        def put(reply: bytes) -> None:
            if holding.closed or transport.is_closing():  # closed meanwhile (by the budget,
                return  # or the client)
            if len(reply) < WHOLE_LINE:
                transport.write(reply + b"\n")  # one write() a line
            else:  # no copy of a large answer to add its newline
                transport.write(reply)
                transport.write(b"\n")

        def settle(size: int) -> None:
            budget.wait(holding, -size)
            budget.sample(holding, transport)

        async def send(reply: bytes) -> None:
            """Hand an answer to the transport, waiting while the client reads too slowly."""
            size = len(reply)
            if not admit(size):
                return
            try:
                # Past max_reply_buffer unsent bytes this answer waits (holding its
                # max_inflight slot) until the client reads.
                if transport.get_write_buffer_size() > limits.max_reply_buffer:
                    await self._room_to_reply(writer)
                put(reply)
            finally:
                settle(size)
            # The transport has the line now (a copy): held twice while the client does
            # not read, otherwise.
            del reply
            await drained()

        async def drained() -> None:
            if link.paused_writing:
                await writer.drain()
                budget.sample(holding, transport)

        def send_now(reply: bytes | None, slot: Slot, share: int) -> None:
            """`run` without its task, for an answer built without waiting (the write
            lane's): written at once when `send` would not wait, else by a task."""
            budget.reserve(holding, -share)
            if reply is None or holding.closed:
                slot.release()
            elif transport.get_write_buffer_size() > limits.max_reply_buffer:
                spawn(send(reply), slot)
            else:
                size = len(reply)
                if admit(size):
                    try:
                        put(reply)
                    finally:
                        settle(size)
                if link.paused_writing:
                    spawn(drained(), slot)
                else:
                    slot.release()

        def answered(slot: Slot, share: int, reply: bytes | None) -> None:
            nonlocal lanes
            lanes -= 1
            try:
                send_now(reply, slot, share)
            except Exception:  # a bug: the connection is served on, its slot given back
                slot.release()
                log.exception("rpc.answer_failed", error_id=new_id())
            finally:
                if not lanes and lanes_done is not None and not lanes_done.done():
                    lanes_done.set_result(None)

        async def finishing(step: Awaitable[None], slot: Slot) -> None:
            try:
                await step
            except ConnectionError:
                pass
            finally:
                slot.release()

        def spawn(step: Coroutine[Any, Any, None], slot: Slot) -> None:
            """Run the part of a lane answer that must wait (for room, or the drain) in a
            task of the connection's, holding the line's slot until it is done."""
            if holding.closed:  # the connection is over: nobody waits for the task
                step.close()
                slot.release()
                return
            task = loop.create_task(finishing(step, slot), context=context.copy())
            requests.add(task)
            task.add_done_callback(finished)

        # A plain asyncio task per request, not the task group's: anyio's start_soon costs
        # about 20 us more per request (bench/README: "CPU per append"). The tasks are the
        # group's children all the same: awaited before the connection closes, cancelled
        # with it.
        requests: set[asyncio.Task[None]] = set()
        loop = asyncio.get_running_loop()

        def finished(task: asyncio.Task[None]) -> None:
            requests.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("rpc.request_task_failed", error_id=new_id(),
                          exc_info=task.exception())

        # The line taken next has a slot already when its wait for room acquired one.
        held: list[Slot] = []

        def ready() -> bool:
            """Back-pressure: past max_reply_buffer unsent bytes, or max_inflight requests,
            or while the daemon's reply budget is nearly spent and this connection holds
            more than its share, no line is taken (and the socket is not read)."""
            if transport.get_write_buffer_size() > limits.max_reply_buffer \
                    or budget.over(holding):
                return False
            if not held:
                try:
                    gate.acquire_nowait()
                except anyio.WouldBlock:
                    return False
                held.append(Slot(gate, gate_size))
            return True

        def take(line: bytes) -> bool:
            """Start answering a line (ready() said there is room); False once this
            connection was closed by the budget."""
            nonlocal lanes, unstarted
            slot = held.pop()
            # The answer's share of max_page_bytes (as handle_line will give it at most) is
            # reserved now, so that the lines taken next see it in the budget.
            share = max(1, limits.max_page_bytes // max(1, slot.in_use))
            if not budget.make_room(holding, share, built=False):
                slot.release()
                return False  # this connection held the most: it was closed
            budget.reserve(holding, share)
            req = _request(line)
            if req is not None and req.method in self._commands:
                lanes += 1
                context.run(self._write_lane, req, conn, partial(answered, slot, share),
                            unstarted == 0)
                return True
            unstarted += 1
            task = loop.create_task(run(line, slot, share, req), context=context.copy())
            requests.add(task)
            task.add_done_callback(finished)
            return True

        async def room() -> None:
            """Wait until ready() may say yes (ConnectionError: the client went away)."""
            await self._room_to_reply(writer)
            await budget.room_to_read(holding, partial(budget.sample, holding, transport))
            if not held:
                await gate.acquire()
                held.append(Slot(gate, gate_size))

        def received(delta: int) -> bool:
            """The bytes received and not yet taken as lines changed by `delta` (False:
            past the budget, this connection held the most and was closed)."""
            if delta > 0 and not budget.make_room(holding, delta, built=True):
                return False
            budget.receive(holding, delta)
            return True

        def late() -> None:
            """A line begun request_timeout_s ago has not ended: say so and close."""
            timeout = limits.request_timeout_s
            log.warning("rpc.request_line_late", timeout_s=timeout, held_bytes=holding.receiving)
            if not transport.is_closing():
                transport.write(_encoder.encode(_failure(
                    None, INVALID_REQUEST, "request line not ended in time",
                    {"detail": f"a line must end within {timeout} s of its first byte"
                               " (request_timeout_s)", "setting": "request_timeout_s",
                     "limit": timeout})) + b"\n")
            shut(f"request line not ended within {timeout} s")

        client_gone.set(_gone(writer))  # copied into each request task's context
        context = contextvars.copy_context()
        async with anyio.create_task_group() as tg:
            conn = Connection(peer, Subscriptions(
                self.store, self.writer, writer, tg,
                max_buffer=limits.max_subscription_buffer,
                max_subscriptions=limits.max_subscriptions,
                on_count=self.count_subscriptions), holding, context)
            self.metrics.connection(conn.subscriptions)
            budget.join(holding)
            self._open.add(conn)
            try:
                try:
                    link.start(ready, take, partial(self._too_large, transport), received,
                               late, limits.request_timeout_s)
                    while await link.next_wait():
                        await room()
                except ConnectionError:
                    pass
                finally:
                    link.stop()
                    for slot in held:
                        slot.release()
                    held.clear()
                # The client stopped sending: its subscriptions end; requests in flight
                # still get their answers before the connection closes.
                conn.subscriptions.close()
                while requests or lanes:
                    if lanes:
                        lanes_done = loop.create_future()
                        await lanes_done
                    else:
                        await asyncio.wait(set(requests))
            finally:
                for task in requests:
                    task.cancel()
                if requests:
                    with anyio.CancelScope(shield=True):
                        await asyncio.wait(set(requests))
                budget.leave(holding)
                self._open.discard(conn)
                link.release()
        return holding

    def _too_large(self, transport: asyncio.WriteTransport, head: bytes, size: int) -> None:
        """Answer a line over max_request_bytes (discarded as it came): -32600 under the
        request's id when the line begins with it."""
        limit = self.limits.max_request_bytes
        found = _LEADING_ID.match(head)
        request_id = msgspec.json.decode(found.group(1)) if found else None
        log.warning("rpc.request_too_large", limit=limit, size=size)
        reply = _encoder.encode(_failure(
            request_id, INVALID_REQUEST, "request too large",
            {"detail": f"a line may hold at most {limit} bytes (max_request_bytes)",
             "limit": limit, "size": size, "setting": "max_request_bytes"}))
        if not transport.is_closing():
            transport.write(reply + b"\n")

    async def _room_to_reply(self, writer: asyncio.StreamWriter) -> None:
        """Wait while the client has more than max_reply_buffer unsent reply bytes."""
        while writer.transport.get_write_buffer_size() > self.limits.max_reply_buffer:
            if writer.transport.is_closing():
                raise ConnectionResetError("the client went away")
            await writer.drain()  # returns once the buffer is down to its low-water mark

    @staticmethod
    async def _linger(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Close gently: closing on unread input resets the connection, and the client
        would lose our last answer. So end our side, then discard its input for a moment."""
        with contextlib.suppress(ConnectionError, OSError), anyio.move_on_after(1):
            writer.write_eof()
            while await reader.read(1 << 16):
                pass

    @staticmethod
    async def _send_quietly(writer: asyncio.StreamWriter, data: bytes) -> None:
        try:
            writer.write(data + b"\n")
            await writer.drain()
        except ConnectionError:
            pass

    # --- dispatch -------------------------------------------------------------------

    async def handle_line(self, line: bytes, conn: Connection, slot: Slot | None = None,
                          req: rpc.Request | None = None) -> bytes | None:
        """Answer one NDJSON line: a request or a batch; None when nothing is to be sent.

        `slot` is the line's max_inflight slot. A batch's first item runs on it and
        gives it back when done; every other item takes a slot of its own while it runs.
        `req`: the line's request, when the caller decoded it already.
        """
        if req is None:
            line = line.strip()
            if not line:
                return None
            if line[:1] == b"[":
                return await self._handle_batch(line, conn, slot)
        # Requests running side by side on a connection share its page budget: those
        # that start while n run get 1/n of it, so a pipelining client that does not
        # read holds about max_page_bytes * ln(max_inflight), not max_inflight pages.
        page_budget.set(max(1, self.limits.max_page_bytes // max(1, slot.in_use if slot else 1)))
        reply = await (self._handle_one(msgspec.Raw(line), conn) if req is None
                       else self._handle_request(req, conn))
        return _encoder.encode(reply) if reply is not None else None

    async def _handle_batch(self, line: bytes, conn: Connection,
                            slot: Slot | None) -> bytes | None:
        try:
            items = _batch_decoder.decode(line)
        except (msgspec.DecodeError, RecursionError) as exc:
            return _encoder.encode(_failure(None, PARSE_ERROR, "parse error", {"detail": str(exc)}))
        if not items:
            return _encoder.encode(_failure(None, INVALID_REQUEST, "invalid request",
                                            {"detail": "empty batch"}))
        limit = self.limits.max_batch_requests
        if len(items) > limit:
            return _encoder.encode(_failure(
                None, INVALID_REQUEST, f"batch too large: {len(items)} requests, limit {limit}",
                {"detail": f"a batch may hold at most {limit} requests (max_batch_requests)",
                 "limit": limit, "size": len(items)}))
        # The items share one page budget, so a batch's answer is about one page.
        budget = max(1, self.limits.max_page_bytes // len(items))
        replies: list[bytes | None] = [None] * len(items)

        async def one(i: int, item: msgspec.Raw) -> None:
            page_budget.set(budget)  # this task's own context
            if slot is None:
                reply = await self._handle_one(item, conn)
            elif i == 0:  # on the line's own slot, given back at once: the others wait for it
                try:
                    reply = await self._handle_one(item, conn)
                finally:
                    slot.release()
            else:
                async with slot.gate:
                    reply = await self._handle_one(item, conn)
            # Encoded at once: bytes are smaller than the objects they were made from.
            replies[i] = _encoder.encode(reply) if reply is not None else None

        async with anyio.create_task_group() as tg:
            for i, item in enumerate(items):
                tg.start_soon(one, i, item)
        answered = [r for r in replies if r is not None]
        return b"[" + b",".join(answered) + b"]" if answered else None

    async def _handle_one(self, raw: msgspec.Raw,
                          conn: Connection) -> rpc.Success | rpc.Failure | None:
        try:
            req = _request_decoder.decode(raw)
        except msgspec.ValidationError as exc:  # JSON, but not a request
            return _failure(None, INVALID_REQUEST, "invalid request", {"detail": str(exc)})
        except (msgspec.DecodeError, RecursionError) as exc:  # not JSON, not UTF-8, too deep
            return _failure(None, PARSE_ERROR, "parse error", {"detail": str(exc)})
        return await self._handle_request(req, conn)

    async def _handle_request(self, req: rpc.Request,
                              conn: Connection) -> rpc.Success | rpc.Failure | None:
        call = self._call(req)
        try:
            result = await self._dispatch(req, conn)
        except SessiondError as exc:
            return self._reply(call, error=exc)
        return self._reply(call, result)

    def _call(self, req: rpc.Request) -> _Call:
        return _Call(req.method, None if isinstance(req.id, msgspec.UnsetType) else req.id,
                     isinstance(req.id, msgspec.UnsetType), self.metrics.clock())

    def _reply(self, call: _Call, result: object = None,
               error: SessiondError | None = None) -> rpc.Success | rpc.Failure | None:
        """Count a call in the metrics; its answer (None for a notification)."""
        self.metrics.request(call.method, 0 if error is None else error.code, call.started)
        if call.notification:
            return None
        if error is not None:
            return self._error(call.id, error)
        return rpc.Success(jsonrpc="2.0", id=call.id, result=result)

    def _write_lane(self, req: rpc.Request, conn: Connection,
                    answer: Callable[[bytes | None], None], first: bool) -> None:
        """Take a request that is a write of one command (Method.command) where its line is
        read: checked as `_dispatch` checks it, queued on the writer, answered (`answer`,
        given the encoded reply, or None for a notification) from the writer's `then`. No
        task, no future, no loop turn of its own.

        `first`: no request task of the connection's earlier lines is still to take its
        first step (where it queues its write). Then the command is queued at once; else
        after those steps, so that a connection's pipelined writes reach the writer in the
        order they were sent, as when each had a task."""
        make = self._commands[req.method]
        call = self._call(req)
        try:
            params, meta = self._params(req, conn)
            cmd = make(params, meta)
        except SessiondError as exc:
            answer(_encoded(self._reply(call, error=exc)))
            return
        except Exception:
            answer(_encoded(self._reply(call, error=_internal_error(req.method))))
            return
        decided = partial(self._decided, call, answer)
        cmd.then = partial(_run_in, conn.context, decided)  # the connection's context
        self._begin()
        if first:
            self._enqueue(cmd, decided)
        else:
            asyncio.get_running_loop().call_soon(self._enqueue, cmd, decided)

    def _enqueue(self, cmd: Command, decided: Callable[[Command], None]) -> None:
        """Queue a lane's command; one the writer refuses is answered at once."""
        try:
            self.writer.enqueue(cmd)
        except SessiondError as exc:  # the queue is full, or the writer closing
            cmd.error = exc
            decided(cmd)

    def _decided(self, call: _Call, answer: Callable[[bytes | None], None],
                 cmd: Command) -> None:
        """The writer decided a command of the write lane: answer it (always: the
        connection counts its lane's commands until each is answered)."""
        self._end()
        error, cmd.error = cmd.error, None
        result, cmd.result = cmd.result, None
        try:
            if error is None:
                assert result is not None
                reply = _encoded(self._reply(call, msgspec.Raw(result)))
            else:
                reply = _encoded(self._reply(call, error=error))
        except Exception:  # a bug: answered as the task path answers one
            reply = None if call.notification else _encoder.encode(
                self._error(call.id, _internal_error(call.method)))
        del error
        answer(reply)

    def _begin(self) -> None:
        """A call is being executed (a handler runs, or a lane's command is queued)."""
        self.inflight += 1

    def _end(self) -> None:
        """That call is over; `wait_idle` returns once none is left."""
        self.inflight -= 1
        if not self.inflight and self._idle is not None:
            self._idle.set()
            self._idle = None

    def _params(self, req: rpc.Request, conn: Connection) -> tuple[Any, EventMeta]:
        """What every call checks before its handler runs: the method, the daemon not
        shutting down, the params (decoded and valid), the caller's grant. Returns the
        params and the events' meta; raises the contract's error."""
        decoder = self._decoders.get(req.method)
        if decoder is None:
            raise MethodNotFoundError(
                f"method not found: {req.method} (this daemon is sessiond {VERSION},"
                f" protocol {rpc.PROTOCOL_VERSION})",
                {"method": req.method, "version": VERSION, "protocol": rpc.PROTOCOL_VERSION})
        if self.draining:
            raise ShuttingDownError("the daemon is shutting down")
        peer = conn.peer
        params_raw = req.params if isinstance(req.params, msgspec.Raw) else _EMPTY_PARAMS
        try:
            params = decoder.decode(params_raw)
        except msgspec.ValidationError as exc:
            raise invalid_params(exc, context=f"invalid params for {req.method}") from exc
        except RecursionError as exc:
            raise InvalidParamsError(f"invalid params for {req.method}: nested too deeply",
                                     {"detail": "nested too deeply", "path": "$"}) from exc
        except msgspec.DecodeError as exc:  # not UTF-8 inside params: the line is not JSON
            raise ParseError(f"parse error in params of {req.method}: {exc}",
                             {"detail": str(exc)}) from exc
        text.refuse_nul_in_params(params_raw, req.method)  # the rule for text on both stores
        grant = self._grants.get(req.method)
        self.grants.check(req.method, peer.uid, grant(params) if grant else None)  # or -32006
        access.caller.set((self.grants, peer.uid))  # for grants that depend on stored data
        return params, EventMeta(peer_uid=peer.uid, peer_pid=peer.pid)

    async def _dispatch(self, req: rpc.Request, conn: Connection) -> object:
        params, meta = self._params(req, conn)
        handler = self._handlers.get(req.method)
        if handler is None:  # the connection's own (events.subscribe)
            handler = partial(_on_connection, self._on_connection[req.method], conn)
        self._begin()
        try:
            result = await handler(params, meta)
        except SessiondError:
            raise
        except Exception as exc:
            raise _internal_error(req.method) from exc
        finally:
            self._end()
        return result

    @staticmethod
    def _error(request_id: Any, exc: SessiondError) -> rpc.Failure:
        return _failure(request_id, exc.code, exc.message, exc.data)


class _Link(asyncio.streams.FlowControlMixin, asyncio.Protocol):
    """A served connection's transport callbacks: its bytes are cut into lines where they
    are received and each line is handed to the server at once, while it has room; when it
    has none, reading stops and the connection's task waits for room.

    A line over `limit` bytes is discarded as it comes (never holding more than the limit)
    and answered by `too_large` with its first 200 bytes and its size. The bytes it holds
    (lines not taken yet, the line being received) are told to `received` as they change,
    for the daemon's memory budget; a line begun and not ended within `line_timeout_s`
    (while the connection is read) is told to `late`, without waiting for another byte.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop=loop)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.paused_writing = False  # past the transport's high-water mark: a drain waits
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # the buffer's first bytes known to hold no newline
        self._discard: tuple[bytes, int] | None = None  # a line too long: its head, size
        self._ready: Callable[[], bool] | None = None
        self._take: Callable[[bytes], bool] = _refuse_line
        self._too_large: Callable[[bytes, int], None] = _ignore_too_large
        self._blocked = False  # a line waits for room (reading is paused meanwhile)
        self._ended = False  # no more input: end of file, or the connection is lost
        self._stopped = False  # no more lines are taken
        self._waiter: asyncio.Future[None] | None = None
        self._closed: asyncio.Future[None] = loop.create_future()
        self._received: Callable[[int], bool] = _room_always  # False: closed by the budget
        self._late: Callable[[], None] = _nothing
        self._held = 0  # the buffer's size as last told to `received`
        self._line_timeout = 0.0
        self._line_started = 0.0  # when the line being received began (0: none is)
        self._line_timer: asyncio.TimerHandle | None = None

    def start(self, ready: Callable[[], bool], take: Callable[[bytes], bool],
              too_large: Callable[[bytes, int], None], received: Callable[[int], bool],
              late: Callable[[], None], line_timeout_s: float) -> None:
        """Hand lines over from now on: each once `ready()` (False: wait for room), to
        `take` (False: the connection was closed, take no more)."""
        self._ready, self._take, self._too_large = ready, take, too_large
        self._received, self._late, self._line_timeout = received, late, line_timeout_s
        self._held = 0  # what came before was told to nobody
        self._pump()
        self._account()

    def stop(self) -> None:
        """Take no more lines (the connection is being closed)."""
        self._stopped = True
        self._wake()

    def release(self) -> None:
        """Let go of the server's callbacks once the connection is over: they hold the
        link (a reference cycle), and with it its transport and any answers still in it,
        which would wait for the garbage collector instead of being freed at once."""
        self.stop()
        self._ready = None
        self._take, self._too_large = _refuse_line, _ignore_too_large
        self._received, self._late = _room_always, _nothing
        self._buffer = bytearray()
        if self._line_timer is not None:
            self._line_timer.cancel()
            self._line_timer = None

    async def next_wait(self) -> bool:
        """Wait until a line waits for room (True: wait for it, then call again) or no
        line will come any more (False). Called again after a True, it first takes the
        lines that waited."""
        if self._blocked and not self._stopped:
            self._blocked = False
            self._pump()
            self._account()
            transport = self.transport
            if not self._blocked and transport is not None and not transport.is_closing() \
                    and not transport.is_reading() and not self._ended:
                transport.resume_reading()
        while not (self._blocked or self._ended or self._stopped):
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._blocked and not self._stopped

    # --- the transport's callbacks ------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self._discard is not None:
            head, size = self._discard
            end = data.find(b"\n")
            if end < 0:
                self._discard = (head, size + len(data))
                return
            self._discard = None
            self._too_large(head, size + end + 1)
            data = data[end + 1:]
        self._buffer += data
        if not self._blocked and self._ready is not None:
            self._pump()
        self._account()

    def _account(self) -> None:
        """Tell the budget what the buffer holds now, and time the line being received."""
        held = len(self._buffer)
        if held != self._held:
            delta, self._held = held - self._held, held
            if not self._received(delta):
                self._stopped = True  # closed by the budget: this connection held the most
                return
        receiving = bool(held or self._discard) and not self._blocked
        if not receiving:
            self._line_started = 0.0
        elif not self._line_started:
            self._line_started = self.loop.time()
            if self._line_timer is None and self._line_timeout:
                self._line_timer = self.loop.call_later(self._line_timeout, self._line_due)

    def _line_due(self) -> None:
        """The line deadline's timer: the line begun `line_timeout_s` ago is not ended."""
        self._line_timer = None
        if self._stopped or self._ended or not self._line_started:
            return
        left = self._line_started + self._line_timeout - self.loop.time()
        if left > 0:  # a later line: its own deadline
            self._line_timer = self.loop.call_later(left, self._line_due)
            return
        self._late()

    def pause_writing(self) -> None:
        super().pause_writing()
        self.paused_writing = True

    def resume_writing(self) -> None:
        super().resume_writing()
        self.paused_writing = False

    def eof_received(self) -> bool:
        self._ended = True
        if self._discard is not None:  # the input ended inside a line too long: answer it
            head, size = self._discard
            self._discard = None
            self._too_large(head, size)
        self._wake()
        return True  # keep the sending side open: the answers to come still go out

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._ended = True
        if not self._closed.done():
            self._closed.set_result(None)
        self._wake()

    def _get_close_waiter(self, stream: asyncio.StreamWriter) -> asyncio.Future[None]:
        return self._closed  # what StreamWriter.wait_closed awaits

    # --- cutting lines ------------------------------------------------------------------

    def _pump(self) -> None:
        """Hand over every whole line received, while there is room."""
        ready, buffer, limit = self._ready, self._buffer, self._limit
        assert ready is not None
        pos, start = 0, self._scanned
        while not self._stopped:
            end = buffer.find(b"\n", start)
            if end < 0:
                if len(buffer) - pos > limit:  # too long already: discard it as it comes
                    self._discard = (bytes(buffer[pos:pos + 200]), len(buffer) - pos)
                    pos = len(buffer)
                break
            if end - pos > limit:
                self._too_large(bytes(buffer[pos:pos + 200]), end + 1 - pos)
                pos = start = end + 1
                continue
            if not ready():
                self._block()
                break
            line = bytes(buffer[pos:end])
            pos = start = end + 1
            if not self._take(line):
                self._stopped = True
        del buffer[:pos]
        self._scanned = 0 if self._blocked else len(buffer)
        if pos and len(buffer):  # whole lines taken: the rest is a new line's beginning
            self._line_started = 0.0

    def _block(self) -> None:
        self._blocked = True
        transport = self.transport
        if transport is not None and not transport.is_closing() and transport.is_reading():
            transport.pause_reading()
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@dataclass(frozen=True, slots=True)
class _Call:
    """A request being answered: what its answer and its metrics need."""

    method: str
    id: Any  # None for a notification, which gets no answer
    notification: bool
    started: float  # metrics clock


def _internal_error(method: str) -> InternalError:
    """A bug in serving `method`: logged (the exception in hand) under a new error id."""
    error_id = new_id()
    log.exception("rpc.internal_error", error_id=error_id, method=method)
    return InternalError("internal error", {"error_id": error_id})


def _encoded(reply: rpc.Success | rpc.Failure | None) -> bytes | None:
    return None if reply is None else _encoder.encode(reply)


def _request(line: bytes) -> rpc.Request | None:
    """The request a line holds; None when it holds none (a batch, or not a request: the
    line's task says what is wrong, or skips a blank line)."""
    try:
        return _request_decoder.decode(line)
    except (msgspec.DecodeError, RecursionError):
        return None


def _run_in(context: contextvars.Context, call: Callable[[Command], None],
            cmd: Command) -> None:
    context.run(call, cmd)


def _refuse_line(line: bytes) -> bool:
    return False


def _ignore_too_large(head: bytes, size: int) -> None:
    pass


def _room_always(delta: int) -> bool:
    return True


def _nothing() -> None:
    pass


async def _on_connection(handler: ConnectionHandler, conn: Connection, params: Any,
                         meta: EventMeta) -> object:
    return await handler(conn.subscriptions, params)


def _gone(writer: asyncio.StreamWriter) -> Callable[[], bool]:
    """Whether the client closed its socket (POLLHUP: both directions shut, not a client
    that only stopped sending). Safe to call from a read connection's thread."""
    sock = writer.get_extra_info("socket")

    def gone() -> bool:
        if writer.is_closing() or sock is None:
            return writer.is_closing()
        try:
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return any(events & (select.POLLHUP | select.POLLERR)
                       for _, events in poller.poll(0))
        except (OSError, ValueError):
            return True
    return gone
