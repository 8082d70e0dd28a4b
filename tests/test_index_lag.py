"""SQLite's search index follows the log (issue 31 §3): a commit leaves the full-text rows
out, and the store indexes what the commits left in one transaction of its own, once
INDEX_LAG_EVENTS events wait or INDEX_LAG_S after the first, and before any read of the
index. A search still sees every acknowledged write; a crash loses no document (the
open indexes what lies past the mark in `meta`)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from test_crash import DaemonProcess

from sessiond import AsyncClient
from sessiond_daemon.core.writer import Command, Plan, Writer
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_daemon.stores.sqlite.migrations import INDEXED_UPTO
from sessiond_daemon.stores.sqlite.store import INDEX_LAG_EVENTS
from sessiond_schemas.events import (
    EventMeta,
    MessageAppended,
    SessionCreated,
    TokensRecorded,
    new_id,
)

pytestmark = pytest.mark.anyio


def indexed(db: str) -> tuple[int, int]:
    """(documents in the index, the position `meta` says it holds every event up to),
    read from the file behind the daemon's back."""
    con = sqlite3.connect(db)
    try:
        docs = con.execute("SELECT COUNT(*) FROM search_docsize").fetchone()[0]
        upto = con.execute("SELECT value FROM meta WHERE key = ?", (INDEXED_UPTO,)).fetchone()
        return int(docs), int(upto[0])
    finally:
        con.close()


@pytest.fixture
async def daemon(short_dir: str) -> AsyncIterator[DaemonProcess]:
    d = DaemonProcess(short_dir)
    await d.start()
    try:
        yield d
    finally:
        d.stop()


async def test_a_search_sees_every_acknowledged_write(daemon: DaemonProcess) -> None:
    async with AsyncClient(daemon.socket) as c:
        await c.create_session("s", task="the wombat task")
        for i in range(5):
            await c.append_message("s", "user", f"wombat {i}")
        # Acknowledged, and (at once after the acks) not yet in the index ...
        assert indexed(daemon.db)[0] < 6
        # ... yet the search finds every one: it indexes what the commits left first.
        found = (await c.search("wombat")).sessions
        assert [s.session_id for s in found] == ["s"] and found[0].matches == 6
        assert indexed(daemon.db) == (6, 6)
        # Without a search, the index catches up by itself (INDEX_LAG_S after the first).
        await c.append_message("s", "user", "wombat later")
        with anyio.fail_after(10):
            while indexed(daemon.db) != (7, 7):
                await anyio.sleep(0.05)
        assert (await c.verify()).ok


async def test_a_crash_before_the_catch_up_loses_no_document(daemon: DaemonProcess) -> None:
    """SIGKILL right after the acks, before the index took them: the next open indexes
    them before it serves, and verify finds nothing missing."""
    async with AsyncClient(daemon.socket) as c:
        await c.create_session("k")
        for i in range(20):
            await c.append_message("k", "user", f"numbat {i}")
    daemon.kill()
    docs, upto = indexed(daemon.db)
    assert docs < 21 and upto < 21  # the crash left them out of the index
    await daemon.start()
    assert indexed(daemon.db) == (21, 21)
    async with AsyncClient(daemon.socket) as c:
        assert (await c.search("numbat")).sessions[0].matches == 20
        assert (await c.verify()).ok


def created(state: object) -> Plan:
    return Plan([("session.created", SessionCreated())], lambda s, ev: 1)


def appended(state: Any) -> Plan:
    m = MessageAppended(message_id=new_id(), sequence=state.message_count, role="user",
                        content="x")
    return Plan([("message.appended", m)], lambda s, ev: 1)


def tokens(state: object) -> Plan:
    return Plan([("tokens.recorded", TokensRecorded(input_tokens=1))], lambda s, ev: 1)


async def write_all(db: str, plans: list[Any], check: Any) -> None:
    """On a store of its own at `db`: a writer commits these plans to session "a" one by
    one; then `check()` runs while the writer still runs."""
    store = SqliteStore(db)
    await store.open()
    try:
        writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            for plan in plans:
                await writer.submit(Command(session_id="a", plan=plan, meta=EventMeta()))
            check()
            writer.close()
    finally:
        await store.close()


async def test_the_writer_catches_up_every_index_lag_events(short_dir: str) -> None:
    """Without waiting for the timer: once INDEX_LAG_EVENTS indexed events wait, the
    writer indexes them before its next batch."""
    db = os.path.join(short_dir, "w.db")

    def check() -> None:
        docs, upto = indexed(db)
        assert INDEX_LAG_EVENTS <= docs == upto < INDEX_LAG_EVENTS + 11

    await write_all(db, [created] + [appended] * (INDEX_LAG_EVENTS + 10), check)
    # Stopping, the writer indexed the rest.
    assert indexed(db) == (INDEX_LAG_EVENTS + 11, INDEX_LAG_EVENTS + 11)


async def test_the_mark_follows_events_of_other_types_too(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A session that records only unindexed events (token counts, graph checkpoints)
    still moves the mark on, every INDEX_RANGE positions: the open after a crash never
    scans more than that to find what to index."""
    from sessiond_daemon.stores.sqlite import store as sqlite_store
    monkeypatch.setattr(sqlite_store, "INDEX_RANGE", 40)
    db = os.path.join(short_dir, "w.db")

    def check() -> None:
        docs, upto = indexed(db)
        assert docs == 1 and 101 - 40 < upto <= 101  # moved on with no indexed event

    await write_all(db, [created] + [tokens] * 100, check)
