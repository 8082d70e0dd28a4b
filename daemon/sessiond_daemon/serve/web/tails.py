"""Live tails over HTTP: wait for the writer's bell to ring for one session.

The store is the buffer: a long poll or an SSE tail reads the store from its offset and,
once at the end, waits here until the writer rings a bell for its session (in fleet mode
the follower of the shared log rings the same bells with every host's events). A tail is
a follower of its one session (core/bells.py) from before its first read to its end, so
a commit to another session costs it nothing (no wake-up), and no commit to its own
falls between a read and the wait after it. What a ring leaves it is a flag: the tail
holds its offset and nothing of any batch; it reads what was rung from the store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio

from sessiond_daemon.core.bells import Bell, Flush
from sessiond_daemon.core.writer import Writer


class Tail:
    """A live tail of one session: woken by every bell that touches it (an event, or its
    deletion) since its last `mark`."""

    __slots__ = ("_rung",)

    def __init__(self) -> None:
        self._rung = anyio.Event()

    def ring(self, bell: Bell) -> Flush | None:
        self._rung.set()  # the bell itself is not kept
        return None

    def mark(self) -> None:
        """Before a read of the view and the store: the rings before it are in what that
        read sees (a batch rings once it has landed); those after it wake the next wait.
        (A ring of a batch that the read saw anyway wakes it for nothing new.)"""
        if self._rung.is_set():
            self._rung = anyio.Event()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until a bell rang for the session since the mark; False when `timeout_s`
        passes first."""
        rung = self._rung
        with anyio.move_on_after(timeout_s):
            await rung.wait()
        # A bell may ring after the timeout cancelled the wait and before this task runs
        # again: it counts (the flag is not cleared but by the next mark).
        return rung.is_set()


@asynccontextmanager
async def following(writer: Writer, session_id: str) -> AsyncIterator[Tail]:
    """A tail of `session_id`, marked: rung for every batch that lands after this is
    entered (read the view and the store after it), until the block ends."""
    async with writer.watching():  # fleet mode: the shared log is followed from here
        tail = Tail()
        writer.followers.add(session_id, tail)
        try:
            yield tail
        finally:
            writer.followers.discard(session_id, tail)
