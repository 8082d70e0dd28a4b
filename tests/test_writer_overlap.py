"""The writer hands the next batch to the SQLite thread before it answers the last one
(issue 31 §4): the answers go out while the next batch commits; none before its own
batch is on disk."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import anyio
import pytest
from store_contract import message

from sessiond_daemon.eventstore import Batch, Moved
from sessiond_daemon.sqlite import SqliteStore
from sessiond_daemon.writer import Command, Plan, Writer
from sessiond_schemas.events import EventMeta

pytestmark = pytest.mark.anyio


class GatedStore(SqliteStore):
    """The real SQLite store; once `armed`, its next commit waits for `gate`, and every
    commit is logged when it starts and when it has returned (written and synced)."""

    def __init__(self, path: str, order: list[tuple[str, str]]) -> None:
        super().__init__(path)
        self.order = order
        self.gate = anyio.Event()
        self.first_started = anyio.Event()
        self.armed = False

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
    return Plan([("session.created", {})], lambda s, events: {"version": s.version})


def appending(state: Any) -> Plan:
    return Plan([message(state.message_count)], lambda s, events: {"version": s.version})


async def test_the_next_batch_commits_before_the_last_is_answered(short_dir: str) -> None:
    db = os.path.join(short_dir, "w.db")
    order: list[tuple[str, str]] = []
    store = GatedStore(db, order)
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)

    async def submit(sid: str) -> None:
        await writer.submit(Command(session_id=sid, plan=appending, meta=EventMeta()))
        order.append(("answered", sid))

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            for sid in "abc":  # views in the writer's cache: deciding them reads nothing
                await writer.submit(Command(session_id=sid, plan=creating, meta=EventMeta()))
            order.clear()
            store.armed = True
            async with anyio.create_task_group() as clients:
                clients.start_soon(submit, "a")
                await store.first_started.wait()  # a's batch is committing, held
                clients.start_soon(submit, "b")
                clients.start_soon(submit, "c")
                await anyio.wait_all_tasks_blocked()  # b and c are queued behind it
                store.gate.set()
            writer.close()
    finally:
        await store.close()
    # b and c, queued while a committed, are one batch, handed over before a's answer
    # runs; a is answered only once its commit has returned, b and c once theirs has.
    assert order.index(("committed", "a")) < order.index(("commit", "b,c"))
    assert order.index(("commit", "b,c")) < order.index(("answered", "a"))
    assert order.index(("committed", "b,c")) < min(order.index(("answered", "b")),
                                                   order.index(("answered", "c")))
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT session_id, version FROM events WHERE position > 3"
                           " ORDER BY position").fetchall() == [("a", 2), ("b", 2), ("c", 2)]
    finally:
        con.close()
