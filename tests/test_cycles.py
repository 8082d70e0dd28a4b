"""The write path leaves no reference cycles: what a batch holds (its commands, events,
views, results) is freed by reference counting once the batch is answered, not left with
all it holds for the garbage collector (bench/README, "Reference cycles"). A real daemon
in this process on each store, a real client; the collector is told to keep what it
finds unreachable, and none of it may be the daemon's or the schemas' objects."""

from __future__ import annotations

import contextlib
import gc
from collections import Counter
from typing import Any

import pytest

from sessiond import AsyncClient, VersionConflictError

pytestmark = pytest.mark.anyio
OURS = ("sessiond_daemon", "sessiond_schemas")


async def test_writes_refusals_and_reads_leave_no_cycles(client: AsyncClient) -> None:
    sid = (await client.create_session()).session_id
    await client.append_message(sid, "user", "warm")  # imports, caches: before the count
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable goes to gc.garbage
    try:
        for i in range(40):
            await client.append_message(sid, "user" if i % 2 else "assistant", f"m{i}")
        await client.append_messages(sid, [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b"}],
                                     idempotency_key="k")
        await client.append_messages(sid, [{"role": "user", "content": "a"},
                                           {"role": "assistant", "content": "b"}],
                                     idempotency_key="k")  # answered from the first
        await client.get_session(sid)
        await client.call("events.read", Any, session_id=sid)
        for _ in range(20):  # refused writes: optimistic writers retry on these
            with contextlib.suppress(VersionConflictError):
                await client.append_message(sid, "user", "stale", expected_version=1)
        gc.collect()
        found = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                        if type(o).__module__.startswith(OURS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not found, f"cyclic garbage of the write path: {dict(found)}"
