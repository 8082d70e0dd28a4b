"""The blocking client: the same methods as AsyncClient over a plain socket, no event loop."""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, BinaryIO, TypeVar

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import MethodNotFoundError, SessiondError
from sessiond_schemas.events import Event
from sessiond_schemas.paths import default_socket

from ._follow import follow
from ._methods import Methods, encode_request
from ._wire import ConnectionLostError, connect_blocking, raise_for, skew_error

T = TypeVar("T")
_response_decoder = msgspec.json.Decoder(rpc.Response)


class Client(Methods):
    """Blocking twin of AsyncClient: `with Client() as c: c.ping()`.

    Calls on one Client are serialised by a lock, so it may be shared by
    threads; give busy threads a Client each to keep their calls concurrent.
    """

    def __init__(self, socket_path: str | None = None, timeout: float | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._file: BinaryIO | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Connect to the daemon (the first call does it by itself)."""
        sock = connect_blocking(self.socket_path, self.timeout)
        self._sock, self._file = sock, sock.makefile("rb")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._file = None

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _call(self, method: str, result_type: Any, pick: Callable[[Any], Any] | None = None,
              **params: Any) -> Any:
        with self._lock:
            if self._sock is None:
                self.connect()
            assert self._sock is not None and self._file is not None
            request_id = next(self._ids)
            try:
                self._sock.sendall(encode_request(request_id, method, params))
                while True:
                    line = self._file.readline()
                    if not line:
                        raise ConnectionLostError("the daemon closed the connection")
                    reply = _response_decoder.decode(line)
                    if reply.id == request_id or reply.id is None:
                        break  # id None: the daemon refused the connection itself
            except OSError as exc:
                self.close()
                raise ConnectionLostError(f"lost the daemon: {exc}") from exc
        try:
            raw = raise_for(reply)
        except MethodNotFoundError as exc:
            raise self._skew(method, exc) from None
        result = msgspec.json.decode(raw, type=result_type)
        return pick(result) if pick else result

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

    def call(self, method: str, result_type: type[T] | Any = Any, **params: Any) -> T:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        return self._call(method, result_type, **params)  # type: ignore[no-any-return]
