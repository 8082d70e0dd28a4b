"""The async client: one Unix-socket connection, pipelined requests matched by id."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

import anyio
import msgspec
from anyio.abc import TaskGroup

from sessiond_schemas import rpc
from sessiond_schemas.errors import MethodNotFoundError, SessiondError
from sessiond_schemas.paths import default_socket

from ._methods import Methods, encode_request
from ._subscription import Subscription
from ._transport import Transport, open_transport
from ._wire import ConnectionLostError, raise_for, skew_error

T = TypeVar("T")
_response_decoder = msgspec.json.Decoder(rpc.Response)
_batch_decoder = msgspec.json.Decoder(list[rpc.Response])


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.reply: rpc.Response | SessiondError | None = None


class AsyncClient(Methods):
    """Talk to a sessiond daemon: `async with AsyncClient() as c: await c.ping()`."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self._transport: Transport | None = None
        self._tg: TaskGroup | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the connection and start reading answers."""
        self._transport = await open_transport(self.socket_path)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._read_loop, self._transport)

    async def aclose(self) -> None:
        """Close the connection; calls still waiting get ConnectionLostError."""
        if self._tg is None or self._transport is None:
            return
        await self._transport.aclose()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        self._tg = self._transport = None
        self._fail_pending(ConnectionLostError("connection closed"))

    async def _read_loop(self, transport: Transport) -> None:
        try:
            while True:
                line = await transport.receive_line()
                replies = _batch_decoder.decode(line) if line[:1] == b"[" else [
                    _response_decoder.decode(line)]
                for reply in replies:
                    self._deliver(reply)
        except EOFError:
            pass
        finally:
            self._fail_pending(ConnectionLostError("the daemon closed the connection"))

    def _deliver(self, reply: rpc.Response) -> None:
        if reply.id is None and isinstance(reply.error, rpc.ErrorObject):
            # An answer to no request: the daemon refused the connection itself.
            try:
                raise_for(reply)
            except SessiondError as exc:
                self._fail_pending(exc)
            return
        pending = self._pending.pop(reply.id, None) if isinstance(reply.id, int) else None
        if pending is not None:
            pending.reply = reply
            pending.done.set()

    def _fail_pending(self, error: SessiondError) -> None:
        for pending in self._pending.values():
            pending.reply = error
            pending.done.set()
        self._pending.clear()

    async def _call(self, method: str, result_type: Any,
                    pick: Callable[[Any], Any] | None = None, **params: Any) -> Any:
        if self._transport is None:
            raise ConnectionLostError("not connected; use `async with AsyncClient()`")
        request_id = next(self._ids)
        line = encode_request(request_id, method, params)  # may refuse: nothing pending yet
        pending = self._pending[request_id] = _Pending()
        try:
            await self._transport.send(line)
        except EOFError as exc:
            self._pending.pop(request_id, None)
            raise ConnectionLostError("the connection to the daemon is closed") from exc
        await pending.done.wait()
        if isinstance(pending.reply, SessiondError):
            raise pending.reply
        assert pending.reply is not None
        try:
            raw = raise_for(pending.reply)
        except MethodNotFoundError as exc:
            raise await self._skew(method, exc) from None
        result = msgspec.json.decode(raw, type=result_type)
        return pick(result) if pick else result

    async def _skew(self, method: str, exc: MethodNotFoundError) -> MethodNotFoundError:
        """Name both releases in a method-not-found (the daemon may be older)."""
        try:
            daemon = await self.ping() if method != "daemon.ping" else None
        except SessiondError:
            daemon = None
        return skew_error(method, self.socket_path, exc, daemon)

    def subscribe(self, session_id: str | None = None, *, from_position: int | None = None,
                  from_version: int | None = None, types: list[str] | None = None,
                  retry_for: float | None = None) -> Subscription:
        """Follow events (of one session, or all) on a connection of their own.

        Without from_position/from_version it starts from now. It resubscribes by
        itself after a drop or a daemon restart (retrying for `retry_for` seconds,
        for ever when None); each matching event is yielded once, in order.
        """
        return Subscription(self.socket_path, session_id=session_id, from_position=from_position,
                            from_version=from_version, types=types, retry_for=retry_for)

    async def call(self, method: str, result_type: type[T] | Any = Any, **params: Any) -> T:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        return await self._call(method, result_type, **params)  # type: ignore[no-any-return]
