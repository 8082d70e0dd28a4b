"""The write path leaves no reference cycles: what a batch holds (its commands, events,
views, results) is freed by reference counting once the batch is answered, not left with
all it holds for the garbage collector (bench/README, "Reference cycles"). A real daemon
in this process on each store, a real client (and the writer alone on a SQLite file, for
a submitter cancelled while its write is queued, or once it is answered); the collector
is told to keep what it finds unreachable, and none of it may be the daemon's or the
schemas' objects."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import PATIENCE_S

from sessiond import AsyncClient, VersionConflictError
from sessiond_daemon.core.writer import Command, Plan, Writer
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_schemas.events import EventMeta

pytestmark = pytest.mark.anyio
OURS = ("sessiond_daemon", "sessiond_schemas")


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[Counter[str]]:
    """Count, by type, the daemon's and the schemas' objects that the block leaves to the
    collector (filled when the block ends)."""
    found: Counter[str] = Counter()
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable goes to gc.garbage
    try:
        yield found
        gc.collect()
        found.update(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage
                     if type(o).__module__.startswith(OURS))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


async def test_writes_refusals_and_reads_leave_no_cycles(client: AsyncClient) -> None:
    sid = (await client.create_session()).session_id
    await client.append_message(sid, "user", "warm")  # imports, caches: before the count
    with cyclic_garbage() as found:
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
    assert not found, f"cyclic garbage of the write path: {dict(found)}"


@pytest.mark.parametrize("when", ["queued", "answered"])
async def test_a_refused_write_whose_submitter_was_cancelled_leaves_no_cycle(
        short_dir: str, when: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A submitter cancelled (its connection cut) while its write waits in the queue, or
    once it is answered but before it has run again: the write is decided all the same,
    and refused; nobody raises that error, and it must not stay on the command, whose
    frames its traceback holds. The writer on a real SQLite file, driven directly: the
    cancels have to fall at those two points."""
    store = SqliteStore(os.path.join(short_dir, "w.db"))
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
    # The submitter's task, held only here: once done, a task holds its frames, and so
    # what they hold (the command), which would hide a cycle from the collector.
    submitters = [asyncio.ensure_future(writer.submit(Command(
        session_id="gone", plan=lambda state: Plan([], dict), meta=EventMeta(),
        expected_version=5)))]  # no such session: refused
    if when == "answered":
        finish = Writer._finish

        def cancel_once_answered(commands: list[Command]) -> None:
            finish(commands)
            submitters[0].cancel()  # its answer is set; it has not run since

        monkeypatch.setattr(Writer, "_finish", staticmethod(cancel_once_answered))
    try:
        with cyclic_garbage() as found:
            with anyio.fail_after(PATIENCE_S):  # a guard: submit queues before it waits
                while not writer.queue_depth:
                    await anyio.sleep(0)
            if when == "queued":
                submitters[0].cancel()
            async with anyio.create_task_group() as tg:
                await tg.start(writer.run)
                writer.close()
            await asyncio.wait(submitters)
            cancelled = submitters.pop().cancelled()
    finally:
        await store.close()
    assert cancelled
    assert writer.commands == 1  # decided (and refused), though nobody waited for it
    assert not found, f"cyclic garbage of a cancelled refusal: {dict(found)}"
