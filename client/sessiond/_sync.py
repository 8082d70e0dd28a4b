"""The blocking client: the same methods as AsyncClient over a plain socket, no event loop."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any, TextIO, TypeVar, overload

from sessiond_schemas import rpc
from sessiond_schemas.errors import MethodNotFoundError, SessiondError
from sessiond_schemas.events import Event
from sessiond_schemas.paths import default_socket

from ._follow import follow
from ._methods import (
    Call,
    ExportDocument,
    Methods,
    SyncCaller,
    decoded,
    encode_request,
    export_page,
    whole_state,
)
from ._wire import ConnectionLostError, connect_blocking, decode_replies, skew_error

T = TypeVar("T")
_RECEIVE = 1 << 16  # bytes asked of each receive (past 128 KiB, each is an mmap)


class Client(SyncCaller, Methods):
    """Blocking twin of AsyncClient: `with Client() as c: c.ping()`.

    Calls on one Client are serialised by a lock, so it may be shared by
    threads; give busy threads a Client each to keep their calls concurrent.
    """

    def __init__(self, socket_path: str | None = None, timeout: float | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout
        self._sock: socket.socket | None = None
        # What was received past the last line read (an answer's next piece, or a line
        # for an earlier id): read from the socket itself, not through a makefile, whose
        # readline runs socket.SocketIO's Python code on every call.
        self._pending = bytearray()
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Connect to the daemon (the first call does it by itself)."""
        self._sock = connect_blocking(self.socket_path, self.timeout)
        self._pending.clear()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._pending.clear()

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, call: Call[T]) -> T:
        with self._lock:
            if self._sock is None:
                self.connect()
            request_id = next(self._ids)
            line = encode_request(request_id, call.method, call.params)  # may refuse: not sent
            reply = self._exchange(request_id, line)
        try:
            return call.finish(reply)
        except MethodNotFoundError as exc:
            raise self._skew(call.method, exc) from None

    def _exchange(self, request_id: int, line: bytes) -> rpc.Response:
        """Send one request line and read until its answer (or the daemon's refusal)."""
        sock = self._sock
        assert sock is not None
        try:
            sock.sendall(line)
            while True:
                for reply in decode_replies(self._line(sock)):
                    if reply.id == request_id or reply.id is None:
                        return reply  # id None: the daemon refused the connection itself
        except OSError as exc:
            self.close()
            raise ConnectionLostError(f"lost the daemon: {exc}") from exc

    def _line(self, sock: socket.socket) -> bytes | bytearray:
        """The next line the daemon sent, without its newline (the socket's timeout applies
        to each receive)."""
        pending = self._pending
        if not pending:  # the usual case: the answer comes whole in one receive
            data = sock.recv(_RECEIVE)
            if not data:
                raise ConnectionLostError("the daemon closed the connection")
            end = data.find(b"\n")
            if end == len(data) - 1:
                return data[:-1]
            pending += data
            if end >= 0:
                return self._take(end)
        start = 0
        while (end := pending.find(b"\n", start)) < 0:
            start = len(pending)  # a large answer comes in pieces: look in what is new only
            data = sock.recv(_RECEIVE)
            if not data:
                raise ConnectionLostError("the daemon closed the connection")
            pending += data
        return self._take(end)

    def _take(self, end: int) -> bytearray:
        line = self._pending[:end]
        del self._pending[:end + 1]
        return line

    def _skew(self, method: str, exc: MethodNotFoundError) -> MethodNotFoundError:
        """Name both releases in a method-not-found (the daemon may be older)."""
        try:
            daemon = self.ping() if method != "daemon.ping" else None
        except SessiondError:
            daemon = None
        return skew_error(method, self.socket_path, exc, daemon)

    def subscribe(self, session_id: str | None = None, *, from_position: int | None = None,
                  from_version: int | None = None, types: list[str] | None = None,
                  retry_for: float | None = None) -> Iterator[Event]:
        """Follow events on a connection of their own: a generator (see AsyncClient.subscribe)."""
        return follow(self.socket_path, session_id=session_id, from_position=from_position,
                      from_version=from_version, types=types, retry_for=retry_for)

    def trajectory(self, session_id: str, full: bool = False,
                   max_output_len: int | None = None) -> list[rpc.Step]:
        """The session's steps (user, message, reasoning, command, tool_call, ...), from
        every page of session.trajectory. -> list[Step]."""
        found: list[rpc.Step] = []
        cursor: str | None = None
        while True:
            page = self.trajectory_page(session_id, full=full,
                                          max_output_len=max_output_len, cursor=cursor)
            found += page.steps
            if page.next_cursor is None:
                return found
            cursor = page.next_cursor

    def export_session(self, session_id: str) -> dict[str, Any]:
        """The export document of a session (events, view, checkpoints, checksum), put
        together from every page of session.export. -> dict."""
        return (self.export_session_to(session_id)).document

    def export_session_to(self, session_id: str,
                          out: TextIO | None = None) -> ExportDocument:
        """Read every page of session.export; with `out` (a text file) write the export
        document there as the pages come, never holding it whole. -> ExportDocument."""
        document, cursor = ExportDocument(out, session_id), None
        while True:
            cursor = document.add(self._run(export_page(session_id, cursor)))
            if cursor is None:
                return document

    def session_state_dict(self, session_id: str,
                           at_version: int | None = None) -> dict[str, Any]:
        """The whole session state as a dict, `progress.path` and `metrics.edges_traversed`
        included (rebuilt from every page of progress.list at the view's version)."""
        state = self.get_session(session_id, at_version=at_version)
        steps, after = [], 0
        while True:
            page = self.list_progress(session_id, after_version=after, at_version=state.version)
            steps += page.steps
            if page.next is None:
                return whole_state(state, steps)
            after = page.next

    @overload
    def call(self, method: str, result_type: type[T], **params: Any) -> T: ...
    @overload
    def call(self, method: str, result_type: Any = ..., **params: Any) -> Any: ...

    def call(self, method: str, result_type: Any = Any, **params: Any) -> Any:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        return self._run(decoded(method, result_type, params))
