"""The writer and the SQLite thread (issue 31 §2): a batch costs one hop to read what it
needs and one to commit, whatever its size."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import pytest

from sessiond_daemon.core.writer import Command, Plan, Writer
from sessiond_daemon.stores.interface import Batch, Moved
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_schemas.events import EventMeta, MessageAppended, SessionCreated, new_id

pytestmark = pytest.mark.anyio
T = TypeVar("T")


class GatedStore(SqliteStore):
    """The real SQLite store; once `armed`, its next commit waits for `gate`, and every
    commit is logged when it starts and when it has returned (written and synced)."""

    def __init__(self, path: str, order: list[tuple[str, str]]) -> None:
        super().__init__(path)
        self.order = order
        self.gate = anyio.Event()
        self.first_started = anyio.Event()
        self.armed = False
        self.hops: list[str] = []  # the calls run on the write connection's thread

    async def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        self.hops.append(getattr(fn, "__name__", "?"))
        return await super()._on_writer(fn, *args)

    async def commit(self, batch: Batch) -> Moved | None:
        names = ",".join(sorted(batch.views))
        self.order.append(("commit", names))
        if self.armed and not self.first_started.is_set():
            self.first_started.set()
            await self.gate.wait()
        moved = await super().commit(batch)
        self.order.append(("committed", names))
        return moved


def creating(state: Any) -> Plan:
    return Plan([("session.created", SessionCreated())], lambda s, events: {"version": s.version})


def appending(state: Any) -> Plan:
    appended = MessageAppended(message_id=new_id(), sequence=state.message_count, role="user",
                               content="hi")
    return Plan([("message.appended", appended)], lambda s, events: {"version": s.version})


async def test_a_batch_reads_its_views_in_one_hop(short_dir: str) -> None:
    """Sixteen sessions the writer has not cached, in one batch: their views and keys are
    read in one hop, then the batch commits in one (it was a hop a view, then the key
    look-up, then the commit)."""
    db = os.path.join(short_dir, "w.db")
    order: list[tuple[str, str]] = []
    store = GatedStore(db, order)
    await store.open()
    sids = [f"s{i:02}" for i in range(16)]
    try:
        first = Writer(store, max_queue=32, max_batch=32, cache_size=32)
        async with anyio.create_task_group() as tg:
            await tg.start(first.run)
            for sid in [*sids, "gate"]:
                await first.submit(Command(session_id=sid, plan=creating, meta=EventMeta()))
            first.close()
        writer = Writer(store, max_queue=32, max_batch=32, cache_size=32)  # nothing cached
        results: dict[str, bytes] = {}

        async def submit(sid: str, key: str | None = None) -> None:
            results[sid] = await writer.submit(Command(
                session_id=sid, plan=appending, meta=EventMeta(), idempotency_key=key))

        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            store.armed = True
            async with anyio.create_task_group() as clients:
                clients.start_soon(submit, "gate")
                await store.first_started.wait()
                for i, sid in enumerate(sids):
                    clients.start_soon(submit, sid, f"k{i}" if i % 2 else None)
                await anyio.wait_all_tasks_blocked()
                store.hops.clear()
                store.gate.set()
            writer.close()
        hops = list(store.hops)
    finally:
        await store.close()
    # The gate's commit (already under way), then the sixteen: one read, one commit.
    assert hops == ["_commit", "read", "_commit"], hops
    assert order[-2:] == [("commit", ",".join(sids)), ("committed", ",".join(sids))]
    assert {sid: results[sid] for sid in sids} == dict.fromkeys(sids, b'{"version":2}')
