"""Following the shared log: every committed event, from any host, once, in position order.

The listener wakes a `Follower`; it reads the committed head (the counter row), then the
events past its cursor up to that head, in position order, page by page, and hands each
page to `deliver` with the position it reaches (the daemon rings the writer's bell with
it: serve/lifecycle.py). Every position at or below the head is committed, so reading up to it
never skips an event that commits late; a position missing below the head is one a
delete took away, not one to wait for. Wake-ups that come while it reads are folded into
one more round. `at` tells where the daemon already is (its writer rings its own
batches at once when they follow on), so those are not read again.

A delete leaves no event: each deleted session has a row in `deletions`, placed after
the position the log stood at when it committed (read under the counter row's lock, so
in commit order with every batch). With the same read as the head the follower takes
the ones placed at or past its cursor, tells the new ones (`deleted`), and remembers
those still at or past it, so each delete is told once. A delete placed below the head
is committed (the counter moved past it only after), so none is missed.

It follows only as much as someone needs (`needed`: a subscription or an HTTP tail on
this host). While nobody does, it reads nothing: wake-ups are dropped, and the writer rings
its own batches even past a gap (no one holds a bell to miss the other hosts' events; a
session another host changed or deleted is caught by the commit's version check). The
first one to need it again calls `resume` before taking its mark: one read of the head, an
empty ring up to it (what came before is in the store, where a catch-up reads it), and
the follower is live again. A NOTIFY's payload is the last position of a committed batch:
every position up to it is committed, so it is the head to read up to (`hint`), and a
hint at or below the cursor (this host's own batch, rung already) costs nothing. A
delete's NOTIFY is a plain wake-up (`wake`: a round that reads the head and the deletes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, cast

import anyio
import structlog

from sessiond_schemas.errors import StorageError
from sessiond_schemas.events import Event

log = structlog.get_logger("sessiond.store")


class LogReads(Protocol):
    async def head(self) -> int: ...
    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]: ...


class DeletionReads(LogReads, Protocol):
    async def head_and_deletions(self, after: int) -> tuple[int, list[tuple[int, str]]]:
        """The head, and (position the log stood at, session id) of the sessions other
        daemons deleted at or past `after`."""
        ...


class Follower:
    """`deleted` (with a store that records deletes, DeletionReads): told the sessions
    other daemons deleted, each delete once, before the events that come after it (the
    daemon drops its subscriptions to them: serve/lifecycle.py)."""

    def __init__(self, store: LogReads,
                 deliver: Callable[[list[Event], int], Awaitable[None]], *,
                 cursor: int = 0, page: int = 1000,
                 at: Callable[[], int] | None = None,
                 deleted: Callable[[frozenset[str]], None] | None = None,
                 needed: Callable[[], bool] | None = None) -> None:
        self.store = store
        self.deliver = deliver
        self.cursor = cursor  # the last position delivered (or passed, by `at`)
        self.page = page
        self._at = at
        self._deleted = deleted
        # Deletes told whose place is at or past the cursor: read again until it passes.
        self._told: set[tuple[int, str]] = set()
        self._needed = needed  # None: always (a follower of its own, as in the tests)
        self.active = needed is None  # following now (resumed since last needed)
        self.head = cursor  # the committed head at the last read
        self._hint = 0  # the highest committed position a NOTIFY named since the last round
        self._poll = False  # a round that reads the head is asked for
        self._woken = anyio.Event()
        self._resuming = anyio.Lock()
        self.rounds = 0  # catch-up rounds run (each reads the store at least once)

    def wake(self) -> None:
        """Ask for one more round that reads the head (the listener's poll, a reconnect,
        a delete's NOTIFY)."""
        if self._following():
            self._poll = True
            self._woken.set()

    def hint(self, position: int) -> None:
        """A batch up to `position` committed (a NOTIFY's payload, or this host's writer):
        a round up to it, unless the cursor is there already."""
        if position > self._catch_cursor() and self._following():
            self._hint = max(self._hint, position)
            self._woken.set()

    def _following(self) -> bool:
        return self.active and (self._needed is None or self._needed())

    def idle(self) -> None:
        """Nobody needs the log any more: stop following until `resume`."""
        if self._needed is not None:
            self.active = False

    async def resume(self) -> None:
        """Follow again, from the committed head (see the module's docstring)."""
        async with self._resuming:
            if self.active:
                return
            head = await self.store.head()
            await self.deliver([], head)
            self.cursor = max(self.cursor, head)
            self.head = head
            self._told.clear()
            self.active = True

    async def run(self) -> None:
        """Catch up at each wake-up until cancelled; a failed read waits for the next."""
        while True:
            await self._woken.wait()
            self._woken = anyio.Event()
            poll, hint = self._poll, self._hint
            self._poll, self._hint = False, 0
            if not self._following() or not (poll or hint > self._catch_cursor()):
                continue  # nobody needs it, or the hint's batch was rung already
            try:
                await self.catch_up(0 if poll else hint)
            except StorageError as exc:  # the database went away: the poll retries
                log.warning("store.follow_failed", cursor=self.cursor, error=exc.message)
            except Exception:  # a row this release cannot read, say: log it, never end the
                # daemon's core tasks over it; the next wake-up tries again
                log.exception("store.follow_crashed", cursor=self.cursor)

    async def catch_up(self, hint: int = 0) -> int:
        """Deliver everything committed past the cursor (up to `hint` when one is given
        and no deletes are followed, else to the head read now); return how many events."""
        if self._deleted is not None:
            await self._catch_deletes(cast(DeletionReads, self.store), self._deleted)
        elif hint > self._catch_cursor():
            self.head = max(self.head, hint)
        else:
            self.head = await self.store.head()
        self.rounds += 1
        delivered = 0
        while self._catch_cursor() < self.head:
            events = await self.store.read_after(self.cursor, self.head, None, None, self.page)
            # Fewer than a page: everything up to the head is here (the rest was deleted).
            upto = self.head if len(events) < self.page else events[-1].position
            at = self._catch_cursor()  # the daemon may have gone on while we read
            fresh = [e for e in events if e.position > at]
            if upto > at:
                await self.deliver(fresh, upto)
                delivered += len(fresh)
            self.cursor = max(self.cursor, upto)
        return delivered

    async def _catch_deletes(self, store: DeletionReads,
                             deleted: Callable[[frozenset[str]], None]) -> None:
        """Read the head and the deletes placed at or past the cursor (one statement);
        tell the new ones. They come before this round's events: what the deleted
        sessions had is gone from the log, and what comes after is another session's."""
        start = self._catch_cursor()
        self.head, found = await store.head_and_deletions(start)
        new = [d for d in found if d not in self._told]
        self._told = {d for d in self._told | set(new) if d[0] >= start}
        if new:
            deleted(frozenset(sid for _, sid in new))

    def _catch_cursor(self) -> int:
        if self._at is not None:
            self.cursor = max(self.cursor, self._at())
        return self.cursor
