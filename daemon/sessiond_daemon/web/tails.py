"""Live tails over HTTP: wait for the writer's bell to ring for one session.

The store is the buffer: a long poll or an SSE tail reads the store from its offset and,
once at the end, waits here on the bell the writer rings after each commit (in fleet mode
the follower of the shared log rings the same bells with every host's events). A waiter
holds nothing but the bell it waits on; the bells it passes are freed behind it.
"""

from __future__ import annotations

import anyio

from ..writer import Bell, Writer


def mark(writer: Writer) -> Bell:
    """The bell to wait on after a read that starts now (taken before the read, so that an
    event committed while it runs is either read or rings this bell or a later one)."""
    return writer.bell


async def wait_for(bell: Bell, session_id: str, timeout_s: float) -> bool:
    """Wait until a batch from `bell` on touches `session_id` (an event, or its deletion);
    False when `timeout_s` passes first."""
    with anyio.move_on_after(timeout_s):
        while True:
            await bell.rung.wait()
            if session_id in bell.deleted or any(e.session_id == session_id
                                                 for e in bell.events):
                return True
            assert bell.next is not None
            bell = bell.next
    return False
