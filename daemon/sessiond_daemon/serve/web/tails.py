"""Live tails over HTTP: wait for the writer's bell to ring for one session.

The store is the buffer: a long poll or an SSE tail reads the store from its offset and,
once at the end, waits here until the writer rings a bell for its session (in fleet mode
the follower of the shared log rings the same bells with every host's events). A waiter
first walks the bells rung since its mark; then it waits as a live follower of its one
session (core/bells.py), so a commit to another session costs it nothing: no wake-up.
"""

from __future__ import annotations

import anyio

from sessiond_daemon.core.bells import Bell, Flush
from sessiond_daemon.core.writer import Writer


def mark(writer: Writer) -> Bell:
    """The bell to wait on after a read that starts now (taken before the read, so that an
    event committed while it runs is either read or rings this bell or a later one)."""
    return writer.bell


class _Waiter:
    """A tail waiting for its session: set by the first bell that touches it."""

    __slots__ = ("rung",)

    def __init__(self) -> None:
        self.rung = anyio.Event()

    def ring(self, bell: Bell) -> Flush | None:
        self.rung.set()
        return None


async def wait_for(bell: Bell, session_id: str, timeout_s: float) -> bool:
    """Wait until a batch from `bell` on touches `session_id` (an event, or its deletion);
    False when `timeout_s` passes first."""
    # The bells rung since the mark, then (no await between) the live wait from the bell
    # the writer rings next: none is missed.
    while bell.rung:
        if bell.touches(session_id):
            return True
        assert bell.next is not None
        bell = bell.next
    waiter = _Waiter()
    bell.followers.add(session_id, waiter)
    try:
        with anyio.move_on_after(timeout_s):
            await waiter.rung.wait()
    finally:
        bell.followers.discard(session_id, waiter)
    # A bell may ring after the timeout cancelled the wait and before this task runs
    # again: it counts (the caller's next mark would be past it).
    return waiter.rung.is_set()
