"""The async client: one Unix-socket connection, pipelined requests matched by id."""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import Any, TextIO, TypeVar, overload

from sessiond_schemas import rpc
from sessiond_schemas.errors import MethodNotFoundError, SessiondError
from sessiond_schemas.paths import default_socket

from ._connection import Connection, open_connection
from ._methods import (
    AsyncCaller,
    Call,
    ExportDocument,
    Methods,
    decoded,
    encode_request,
    export_page,
    whole_state,
)
from ._subscription import Subscription
from ._wire import ConnectionLostError, skew_error

T = TypeVar("T")


class AsyncCalls(AsyncCaller, Methods):
    """The API over the async connection core; subclasses say which connection to use."""

    socket_path: str

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    async def _connection(self) -> Connection:
        raise NotImplementedError

    async def _run(self, call: Call[T]) -> T:
        connection = await self._connection()
        request_id = next(self._ids)
        line = encode_request(request_id, call.method, call.params)  # may refuse: not sent
        reply = await connection.request(request_id, line)
        try:
            return call.finish(reply)
        except MethodNotFoundError as exc:
            raise await self._skew(call.method, exc) from None

    async def _skew(self, method: str, exc: MethodNotFoundError) -> MethodNotFoundError:
        """Name both releases in a method-not-found (the daemon may be older)."""
        try:
            daemon = await self.ping() if method != "daemon.ping" else None
        except SessiondError:
            daemon = None
        return skew_error(method, self.socket_path, exc, daemon)

    async def trajectory(self, session_id: str, full: bool = False,
                   max_output_len: int | None = None) -> list[rpc.Step]:
        """The session's steps (user, message, reasoning, command, tool_call, ...), from
        every page of session.trajectory. -> list[Step]."""
        found: list[rpc.Step] = []
        cursor: str | None = None
        while True:
            page = await self.trajectory_page(session_id, full=full,
                                          max_output_len=max_output_len, cursor=cursor)
            found += page.steps
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    async def export_session(self, session_id: str) -> dict[str, Any]:
        """The export document of a session (events, view, checkpoints, checksum), put
        together from every page of session.export. -> dict."""
        return (await self.export_session_to(session_id)).document

    async def export_session_to(self, session_id: str,
                          out: TextIO | None = None) -> ExportDocument:
        """Read every page of session.export; with `out` (a text file) write the export
        document there as the pages come, never holding it whole. -> ExportDocument."""
        document, cursor = ExportDocument(out, session_id), None
        while True:
            cursor = document.add(await self._run(export_page(session_id, cursor)))
            if cursor is None:
                return document

    async def session_state_dict(self, session_id: str,
                                 at_version: int | None = None) -> dict[str, Any]:
        """The whole session state as a dict, `progress.path` and `metrics.edges_traversed`
        included (rebuilt from every page of progress.list at the view's version)."""
        state = await self.get_session(session_id, at_version=at_version)
        steps, after = [], 0
        while True:
            page = await self.list_progress(session_id, after_version=after,
                                            at_version=state.version)
            steps += page.steps
            if page.next is None:
                return whole_state(state, steps)
            after = page.next

    @overload
    async def call(self, method: str, result_type: type[T], **params: Any) -> T: ...
    @overload
    async def call(self, method: str, result_type: Any = ..., **params: Any) -> Any: ...

    async def call(self, method: str, result_type: Any = Any, **params: Any) -> Any:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        return await self._run(decoded(method, result_type, params))


class AsyncClient(AsyncCalls):
    """Talk to a sessiond daemon: `async with AsyncClient() as c: await c.ping()`.

    `connect()` and `aclose()` may be called from any task, and clients closed in any
    order; calls from many tasks share the one connection.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        super().__init__()
        self.socket_path = socket_path or default_socket()
        self._conn: Connection | None = None

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the connection (a new one in place of a lost one; an open one is kept)."""
        if self._conn is not None and not self._conn.lost:
            return
        old, self._conn = self._conn, await open_connection(self.socket_path)
        if old is not None:
            await old.aclose()

    async def aclose(self) -> None:
        """Close the connection; calls still waiting get ConnectionLostError."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    async def _connection(self) -> Connection:
        if self._conn is None:
            raise ConnectionLostError("not connected; use `async with AsyncClient()`")
        return self._conn

    def subscribe(self, session_id: str | None = None, *, from_position: int | None = None,
                  from_version: int | None = None, types: list[str] | None = None,
                  retry_for: float | None = None) -> Subscription:
        """Follow events (of one session, or all) on a connection of their own.

        Without from_position/from_version it starts from now: from the `async with`'s
        entry, which connects and subscribes (waiting for the daemon up to `retry_for`),
        or from the first iteration without one. It resubscribes by itself after a drop
        or a daemon restart (retrying for `retry_for` seconds, for ever when None); each
        matching event is yielded once, in order.
        """
        return Subscription(self.socket_path, session_id=session_id, from_position=from_position,
                            from_version=from_version, types=types, retry_for=retry_for)
