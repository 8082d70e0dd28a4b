"""Following the shared log: every committed event, from any host, once, in position order.

The listener wakes a `Follower`; it reads the committed head (the counter row), then the
events past its cursor up to that head, in position order, page by page, and hands each
page to `deliver` (the integration feeds the subscription code from it). Every position
at or below the head is committed, so reading up to it never skips an event that
commits late; a position missing below the head is one a delete took away, not one to
wait for. Wake-ups that come while it reads are folded into one more round.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import structlog

from sessiond_schemas.errors import StorageError
from sessiond_schemas.events import Event

log = structlog.get_logger("sessiond.store")


class LogReads(Protocol):
    async def head(self) -> int: ...
    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]: ...


class Follower:
    def __init__(self, store: LogReads, deliver: Callable[[list[Event]], Awaitable[None]], *,
                 cursor: int = 0, page: int = 1000) -> None:
        self.store = store
        self.deliver = deliver
        self.cursor = cursor  # the last position delivered
        self.page = page
        self.head = cursor  # the committed head at the last read
        self._woken = anyio.Event()

    def wake(self) -> None:
        """Ask for one more round (the listener calls this on NOTIFY and on its poll)."""
        self._woken.set()

    async def run(self) -> None:
        """Catch up at each wake-up until cancelled; a failed read waits for the next."""
        while True:
            await self._woken.wait()
            self._woken = anyio.Event()
            try:
                await self.catch_up()
            except StorageError as exc:  # the database went away: the poll retries
                log.warning("store.follow_failed", cursor=self.cursor, error=exc.message)

    async def catch_up(self) -> int:
        """Deliver everything committed past the cursor; return how many events."""
        self.head = await self.store.head()
        delivered = 0
        while self.cursor < self.head:
            events = await self.store.read_after(self.cursor, self.head, None, None, self.page)
            if not events:  # the rest up to the head was deleted
                self.cursor = self.head
                break
            await self.deliver(events)
            self.cursor = events[-1].position
            delivered += len(events)
        return delivered
