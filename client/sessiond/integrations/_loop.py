"""A client for SDK integrations: asyncio-native, no background task, reconnects by itself.

SDKs call their session stores from whatever task (or event loop) they run in, and close
them from another, so `AsyncClient`, whose reader task belongs to the task that opened
it, does not fit. Here the reader is an asyncio protocol: answers resolve futures from
the event loop's callbacks, and a connection is (re)opened on the loop of the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidRequestError, SessiondError, TooLargeError
from sessiond_schemas.paths import default_socket

from .._methods import Methods, encode_request
from .._wire import ConnectionLostError, check_peer, raise_for, unavailable

_decoder = msgspec.json.Decoder(rpc.Response)


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


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.pending: dict[int, asyncio.Future[rpc.Response]] = {}
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        # A large answer comes in many pieces: look for its end only in what is new.
        start = len(self.buffer)
        self.buffer += data
        while (end := self.buffer.find(b"\n", start)) >= 0:
            start = 0
            line = self.buffer[:end]  # one copy; msgspec reads a bytearray
            del self.buffer[:end + 1]
            reply = _decoder.decode(line)
            if reply.id is None and isinstance(reply.error, rpc.ErrorObject):
                try:  # the daemon refused the connection itself
                    raise_for(reply)
                except SessiondError as exc:
                    self._fail(exc)
                continue
            future = self.pending.pop(reply.id, None) if isinstance(reply.id, int) else None
            if future is not None and not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._fail(ConnectionLostError("the daemon closed the connection"))

    def _fail(self, error: SessiondError) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()


class LoopClient(Methods):
    """The client API (`Methods`) over one asyncio connection per event loop."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self._ids = itertools.count(1)
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Lock | None = None

    async def _connection(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        if self._protocol is not None and not self._protocol.lost and self._loop is loop:
            return self._protocol
        if self._loop is not loop:
            self._connecting, self._loop = asyncio.Lock(), loop
        assert self._connecting is not None
        async with self._connecting:
            if self._protocol is None or self._protocol.lost or self._loop is not loop:
                try:
                    transport, protocol = await loop.create_unix_connection(
                        _Protocol, self.socket_path)
                except OSError as exc:
                    raise unavailable(self.socket_path, exc) from exc
                try:  # who answers: our uid, root, or a trusted one (as the other clients)
                    check_peer(transport.get_extra_info("socket"), self.socket_path)
                except BaseException:
                    transport.close()
                    raise
                self._protocol = protocol
                self._loop = loop
        return self._protocol

    async def _call(self, method: str, result_type: Any,
                    pick: Callable[[Any], Any] | None = None, **params: Any) -> Any:
        protocol = await self._connection()
        request_id = next(self._ids)
        line = encode_request(request_id, method, params)  # may refuse: nothing pending yet
        future = protocol.pending[request_id] = asyncio.get_running_loop().create_future()
        assert protocol.transport is not None
        protocol.transport.write(line)
        try:
            reply = await future
        finally:
            protocol.pending.pop(request_id, None)
        result = msgspec.json.decode(raise_for(reply), type=result_type)
        return pick(result) if pick else result

    async def call(self, method: str, result_type: Any = Any, **params: Any) -> Any:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        return await self._call(method, result_type, **params)

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection, from any thread, whether or not its loop still runs
        (the next call opens a new one)."""
        protocol, loop, self._protocol = self._protocol, self._loop, None
        if protocol is None or protocol.transport is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is not None and loop is not running and loop.is_running():
            loop.call_soon_threadsafe(protocol.transport.close)
        else:
            with contextlib.suppress(RuntimeError):  # its loop is closed: nothing to do
                protocol.transport.close()
