"""A client for SDK integrations: asyncio-native, no background task, reconnects by itself.

SDKs call their session stores from whatever task, event loop or thread they run in, and
close them from another. This is `AsyncClient`'s connection core (`_connection.py`, an
asyncio protocol: no reader task) with one connection per event loop, (re)opened on the
loop of the caller, and a `close()` that works from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from sessiond_schemas.errors import InvalidRequestError, TooLargeError
from sessiond_schemas.paths import default_socket

from .._async import AsyncCalls
from .._connection import AsyncioConnection, Connection, open_connection


class ValueTooLargeError(TooLargeError, ValueError):
    """A value over one of the daemon's size caps: a ValueError, as the SDKs raise for a
    value their store cannot take; the message names the setting (data["setting"])."""


@contextlib.contextmanager
def sized() -> Iterator[None]:
    """Around a write: a size cap hit (the daemon's -32005, or -32600 for a request over
    max_request_bytes) raises ValueTooLargeError naming the setting to raise."""
    try:
        yield
    except TooLargeError as exc:
        raise ValueTooLargeError(exc.message, exc.data) from exc
    except InvalidRequestError as exc:
        if exc.data.get("setting") != "max_request_bytes":
            raise
        raise ValueTooLargeError(
            f"the request is {exc.data.get('size')} bytes, over the daemon's"
            f" max_request_bytes ({exc.data.get('limit')})", exc.data) from exc


class LoopClient(AsyncCalls):
    """The client API (`Methods`) over one asyncio connection per event loop."""

    def __init__(self, socket_path: str | None = None) -> None:
        super().__init__()
        self.socket_path = socket_path or default_socket()
        self._conn: AsyncioConnection | None = None
        self._connecting: asyncio.Lock | None = None
        self._lock_loop: asyncio.AbstractEventLoop | None = None

    async def _connection(self) -> Connection:
        loop = asyncio.get_running_loop()
        conn = self._conn
        if conn is not None and not conn.lost and conn.loop is loop:
            return conn
        if self._lock_loop is not loop:
            self._connecting, self._lock_loop = asyncio.Lock(), loop
        assert self._connecting is not None
        async with self._connecting:
            conn = self._conn
            if conn is None or conn.lost or conn.loop is not loop:
                opened = await open_connection(self.socket_path)
                assert isinstance(opened, AsyncioConnection)
                self._conn = conn = opened
        return conn

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection, from any thread, whether or not its loop still runs
        (the next call opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
