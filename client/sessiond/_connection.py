"""The async connection core: one Unix-socket connection, pipelined requests matched by id.

Shared by `AsyncClient`, the SDK integrations' `LoopClient` and `Subscription`. No
background task: on asyncio the connection is an `asyncio.Protocol` whose callbacks
resolve the waiting calls; on trio (through anyio) the waiting calls read in turn,
one chunk at a time under a lock. Either way it can be opened, used and closed from any
task, in any order, and a call that fails before or while sending leaves nothing pending.

asyncio's transport registers its fd with the selector once; anyio's Unix stream
re-registers it on every receive (measured, ~120 -> ~85 us of client CPU per call),
which is why asyncio gets a protocol of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib

import anyio
from anyio.abc import SocketAttribute, SocketStream

from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError

from ._wire import ConnectionLostError, check_peer, decode_replies, raise_for, unavailable


class Waiter:
    """One call waiting for its answer (or a line-reader waiting for a line)."""

    __slots__ = ("event", "reply")

    def __init__(self) -> None:
        self.event = anyio.Event()
        self.reply: rpc.Response | SessiondError | None = None

    def set(self, reply: rpc.Response | SessiondError) -> None:
        if self.reply is None:
            self.reply = reply
            self.event.set()

    def done(self) -> bool:
        return self.event.is_set()


# Lines (a subscription's notifications) queued unread past which the connection stops
# reading its socket until the reader has taken half of them.
MAX_QUEUED_LINE_BYTES = 4 << 20


class Replies:
    """Framing and routing, free of I/O: bytes in, answers handed to their waiters.

    In line mode (a subscription) lines are queued as they are, for `receive_line`.
    """

    def __init__(self, lines: bool = False) -> None:
        self.pending: dict[int, Waiter] = {}
        self.lines: collections.deque[bytes] | None = collections.deque() if lines else None
        self.line_waiter: Waiter | None = None
        self.queued = 0  # bytes of the lines queued and not yet received
        self.error: SessiondError | None = None  # set once the connection is gone
        self._buffer = bytearray()

    def feed(self, data: bytes) -> None:
        # A large answer comes in many pieces: look for its end only in what is new.
        start = len(self._buffer)
        self._buffer += data
        while (end := self._buffer.find(b"\n", start)) >= 0:
            start = 0
            line = self._buffer[:end]  # one copy; msgspec reads a bytearray
            del self._buffer[:end + 1]
            if self.lines is not None:
                self.lines.append(bytes(line))
                self.queued += len(line)
                self._wake_line_reader()
            else:
                for reply in decode_replies(line):
                    self.deliver(reply)

    def deliver(self, reply: rpc.Response) -> None:
        if reply.id is None and isinstance(reply.error, rpc.ErrorObject):
            try:  # an answer to no request: the daemon refused the connection itself
                raise_for(reply)
            except SessiondError as exc:
                self.fail(exc)
            return
        waiter = self.pending.pop(reply.id, None) if isinstance(reply.id, int) else None
        if waiter is not None:
            waiter.set(reply)

    def fail(self, error: SessiondError) -> None:
        """The connection is gone: every waiting call gets `error`."""
        if self.error is None:
            self.error = error
        for waiter in self.pending.values():
            waiter.set(error)
        self.pending.clear()
        self._wake_line_reader()

    def _wake_line_reader(self) -> None:
        waiter, self.line_waiter = self.line_waiter, None
        if waiter is not None:
            waiter.set(ConnectionLostError("woken"))


class Connection:
    """One connection: `request` a line and await its answer, `receive_line` in line mode."""

    def __init__(self, lines: bool = False) -> None:
        self.replies = Replies(lines)

    @property
    def lost(self) -> bool:
        return self.replies.error is not None

    async def request(self, request_id: int, line: bytes) -> rpc.Response:
        """Send one encoded request and wait for its answer; never leaves it pending."""
        if self.replies.error is not None:
            raise ConnectionLostError("the connection to the daemon is closed") \
                from self.replies.error
        waiter = self.replies.pending[request_id] = Waiter()
        try:
            await self.send(line)
            await self._wait(waiter)
        finally:
            self.replies.pending.pop(request_id, None)
        reply = waiter.reply
        if isinstance(reply, SessiondError):
            raise reply
        assert reply is not None
        return reply

    async def receive_line(self) -> bytes:
        """The next line (line mode) without its newline; EOFError once the peer closed."""
        lines = self.replies.lines
        assert lines is not None, "receive_line needs a connection opened in line mode"
        while not lines:
            if self.replies.error is not None:
                raise EOFError
            waiter = self.replies.line_waiter = Waiter()
            await self._wait(waiter)
        line = lines.popleft()
        self.replies.queued -= len(line)
        if self.replies.queued <= MAX_QUEUED_LINE_BYTES // 2:
            self._resume_reading()
        return line

    def _resume_reading(self) -> None:
        """Read the socket again once the queued lines are taken (see MAX_QUEUED_LINE_BYTES)."""

    async def send(self, data: bytes) -> None:
        raise NotImplementedError

    async def _wait(self, waiter: Waiter) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        """Close from any task; waiting calls get ConnectionLostError."""
        raise NotImplementedError


class AsyncioConnection(Connection, asyncio.Protocol):
    """On asyncio: the loop's callbacks feed the answers in; writes wait for the drain."""

    def __init__(self, lines: bool = False) -> None:
        super().__init__(lines)
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()
        self._drained: asyncio.Future[None] | None = None
        self._lost: asyncio.Future[None] = self.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.replies.feed(data)
        if self.replies.queued > MAX_QUEUED_LINE_BYTES and self.transport is not None \
                and self.transport.is_reading():
            # A subscriber that does not keep up: stop reading, so the daemon sees it
            # (and drops it as slow, by its own limit) instead of the client's memory
            # growing with the log.
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing() \
                and not self.transport.is_reading():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.replies.fail(ConnectionLostError("the daemon closed the connection"))
        self.resume_writing()
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._drained = self.loop.create_future()

    def resume_writing(self) -> None:
        drained, self._drained = self._drained, None
        if drained is not None and not drained.done():
            drained.set_result(None)

    async def send(self, data: bytes) -> None:
        if self.replies.error is not None or self.transport is None:
            raise ConnectionLostError("the connection to the daemon is closed")
        self.transport.write(data)  # one write per line keeps concurrent lines whole
        if self._drained is not None:
            await asyncio.shield(self._drained)

    async def _wait(self, waiter: Waiter) -> None:
        await waiter.event.wait()

    def close(self) -> None:
        """Close from any task or thread, whether or not its loop still runs; waiting
        calls get ConnectionLostError."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is not running and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._close)
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to do
                self._close()

    def _close(self) -> None:
        self.replies.fail(ConnectionLostError("connection closed"))
        if self.transport is not None:
            self.transport.close()

    async def aclose(self) -> None:
        """Close, and on this connection's own loop wait until the transport is closed."""
        self.close()
        if self.transport is not None and asyncio.get_running_loop() is self.loop:
            await asyncio.shield(self._lost)


class StreamConnection(Connection):
    """Elsewhere (trio), over an anyio stream: each waiting call reads in its turn."""

    def __init__(self, stream: SocketStream, lines: bool = False) -> None:
        super().__init__(lines)
        self.stream = stream
        self._read_lock = anyio.Lock()
        self._send_lock = anyio.Lock()

    async def send(self, data: bytes) -> None:
        if self.replies.error is not None:
            raise ConnectionLostError("the connection to the daemon is closed")
        try:
            async with self._send_lock:
                await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self.replies.fail(ConnectionLostError("the daemon closed the connection"))
            raise ConnectionLostError("the connection to the daemon is closed") from exc

    async def _wait(self, waiter: Waiter) -> None:
        while not waiter.done():
            async with self._read_lock:  # per chunk: whoever's answer came goes at once
                if waiter.done():  # fed by the previous reader
                    return
                try:
                    data = await self.stream.receive()
                except (anyio.EndOfStream, anyio.BrokenResourceError,
                        anyio.ClosedResourceError, OSError):
                    self.replies.fail(ConnectionLostError("the daemon closed the connection"))
                    return
                self.replies.feed(data)

    async def aclose(self) -> None:
        self.replies.fail(ConnectionLostError("connection closed"))
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()


async def open_connection(path: str, lines: bool = False) -> Connection:
    """Connect to the daemon's socket with the fastest connection for this event loop.

    A missing or silent socket is DaemonUnavailableError (naming the path); a socket
    answered by a uid this client does not trust is UntrustedDaemonError.
    """
    connection: Connection
    try:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not asyncio (trio)
            stream = await anyio.connect_unix(path)
            connection = StreamConnection(stream, lines)
            sock = stream.extra(SocketAttribute.raw_socket)
        else:
            _, protocol = await loop.create_unix_connection(
                lambda: AsyncioConnection(lines), path)
            connection = protocol
            assert protocol.transport is not None
            sock = protocol.transport.get_extra_info("socket")
    except OSError as exc:
        raise unavailable(path, exc) from exc
    try:
        check_peer(sock, path)
    except BaseException:
        await connection.aclose()
        raise
    return connection
