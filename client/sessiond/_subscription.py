"""Following events from async code: an async iterator on its own connection."""

from __future__ import annotations

from collections import deque
from types import TracebackType

import anyio

from sessiond_schemas.events import Event

from ._connection import Connection, open_connection
from ._follow import RESUBSCRIBE_PAUSE, Follower, backoff
from ._wire import ConnectionLostError


class Subscription(Follower):
    """`async with client.subscribe(...) as events: async for event in events: ...`

    Entered with `async with`, it is subscribed once the body runs: a subscription "from
    now" hands out every event committed after that, those the body writes before its
    first iteration too, and a subscribe the daemon refuses (no such session) raises
    there. The entry connects, waiting for the daemon as a resubscribe does (`retry_for`),
    and subscribes again if the daemon goes away before it answers. Iterated without
    `async with`, it subscribes at the first iteration."""

    def __init__(self, socket_path: str, *, session_id: str | None = None,
                 from_position: int | None = None, from_version: int | None = None,
                 types: list[str] | None = None, retry_for: float | None = None) -> None:
        super().__init__(session_id, from_position, from_version, types)
        self.socket_path = socket_path
        self.retry_for = retry_for  # seconds to keep reconnecting; None: for ever
        self._transport: Connection | None = None
        self._early: deque[Event] = deque()  # events that came before the answer

    async def __aenter__(self) -> Subscription:
        while not self.answered and self.ended is None:
            try:
                outcome = await self._next_line()
            except BaseException:  # a refusal, or cancelled: the connection is not left open
                await self.aclose()
                raise
            if isinstance(outcome, Event):
                self._early.append(outcome)
            elif outcome is False:  # gone, or going down: subscribe again
                await self._resubscribe()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection, cancelled or not (it is let go of before the wait)."""
        transport, self._transport = self._transport, None
        if transport is not None:
            with anyio.CancelScope(shield=True):
                await transport.aclose()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        if self._early:
            return self._early.popleft()
        while self.ended is None:
            outcome = await self._next_line()
            if isinstance(outcome, Event):
                return outcome
            if outcome is False:  # dropped, or the daemon went away: resubscribe
                await self._resubscribe()
        raise StopAsyncIteration

    async def _next_line(self) -> Event | bool:
        """Connect and subscribe when not connected, then take the next line (`on_line`:
        an event, True to go on, False to subscribe again)."""
        fresh = self._transport is None
        if self._transport is None:
            self._transport = await self._connect()  # gives up after retry_for: raises
        try:
            if fresh:
                await self._transport.send(self.subscribe_line())
            line = await self._transport.receive_line()
        except (EOFError, ConnectionLostError):  # dropped: subscribe again
            line = b""
        return self.on_line(line) if line else False

    async def _resubscribe(self) -> None:
        """Let the connection go; the next line read subscribes again, after a pause."""
        await self.aclose()
        await anyio.sleep(RESUBSCRIBE_PAUSE)

    async def _connect(self) -> Connection:
        pauses = backoff(self.retry_for)
        while True:
            try:
                return await open_connection(self.socket_path, lines=True)
            except OSError:
                pause = next(pauses, None)
                if pause is None:
                    raise
                await anyio.sleep(pause)
