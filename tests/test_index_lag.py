"""SQLite's search index follows the log (issue 31 §3): a commit leaves the full-text rows
out, and the store indexes what the commits left in transactions of its own, once
INDEX_LAG_EVENTS events wait or INDEX_LAG_S after the first, and before any read of the
index. A search still sees every acknowledged write; a crash loses no document (what
lies past the mark in `meta` is indexed when due, or by the first read of the index)."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import anyio
import pytest
from conftest import PATIENCE_S, daemon_config, eventually, running_daemon
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


# A daemon process whose index waits an hour (INDEX_LAG_S) before it catches up alone:
# what the commits left is indexed only by a read of the index, or as the store closes.
PATIENT = ("-c", "import sys; from sessiond_daemon.stores.sqlite import store;"
           " store.INDEX_LAG_S = 3600.0; from sessiond_daemon import __main__;"
           " __main__.main(sys.argv[1:])")


async def test_a_search_sees_every_acknowledged_write(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from sessiond_daemon.stores.sqlite import store
    monkeypatch.setattr(store, "INDEX_LAG_S", 3600.0)
    async with running_daemon(daemon_config(short_dir)) as daemon, \
            AsyncClient(daemon.socket) as c:
        await c.create_session("s", task="the wombat task")
        for i in range(5):
            await c.append_message("s", "user", f"wombat {i}")
        assert indexed(daemon.db) == (0, 0)  # acknowledged, and not in the index yet ...
        # ... yet the search finds every one: it indexes what the commits left first.
        found = (await c.search("wombat")).sessions
        assert [s.session_id for s in found] == ["s"] and found[0].matches == 6
        assert indexed(daemon.db) == (6, 6)
        # Without a search, the index catches up by itself, INDEX_LAG_S after the first.
        monkeypatch.setattr(store, "INDEX_LAG_S", 0.05)
        await c.append_message("s", "user", "wombat later")
        with anyio.fail_after(10):
            while indexed(daemon.db) != (7, 7):
                await anyio.sleep(0.02)
        assert (await c.verify()).ok


async def test_verify_finds_nothing_missing_while_writes_go_on(short_dir: str) -> None:
    """verify compares the index with the events up to the mark it caught up to: the
    events committed meanwhile are not missing."""
    async with running_daemon(daemon_config(short_dir)) as daemon, \
            AsyncClient(daemon.socket) as c, AsyncClient(daemon.socket) as writer:
        await c.create_session("v")
        stop = anyio.Event()

        async def append() -> None:
            i = 0
            while not stop.is_set():
                await writer.append_message("v", "user", f"quoll {i}")
                i += 1

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            reports = [await c.verify() for _ in range(30)]
            stop.set()
        assert [r.problems for r in reports if not r.ok] == []


async def test_a_crash_before_the_catch_up_loses_no_document(short_dir: str) -> None:
    """SIGKILL after the acks, the index not caught up: the next open finds them past the
    mark; the first search indexes them, and verify finds nothing missing."""
    daemon = DaemonProcess(short_dir, PATIENT)
    await daemon.start()
    try:
        async with AsyncClient(daemon.socket) as c:
            await c.create_session("k")
            for i in range(20):
                await c.append_message("k", "user", f"numbat {i}")
        daemon.kill()
        assert indexed(daemon.db) == (0, 0)  # the crash left them out of the index
        await daemon.start()
        async with AsyncClient(daemon.socket) as c:
            assert (await c.search("numbat")).sessions[0].matches == 20
            assert indexed(daemon.db) == (21, 21)
            assert (await c.verify()).ok
    finally:
        daemon.stop()


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


async def test_the_writer_catches_up_every_index_lag_events(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the timer (an hour here): once INDEX_LAG_EVENTS indexed events wait, the
    writer indexes them before its next batch."""
    from sessiond_daemon.stores.sqlite import store
    monkeypatch.setattr(store, "INDEX_LAG_S", 3600.0)
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
    from sessiond_daemon.stores.sqlite import store
    monkeypatch.setattr(store, "INDEX_RANGE", 40)
    monkeypatch.setattr(store, "INDEX_LAG_S", 3600.0)
    db = os.path.join(short_dir, "w.db")

    def check() -> None:
        docs, upto = indexed(db)
        assert docs == 1 and 101 - 40 < upto <= 101  # moved on with no indexed event

    await write_all(db, [created] + [tokens] * 100, check)


async def test_when_the_index_cannot_take_them_reads_go_on(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk refuses the catch-up's transaction (as it would refuse writes): a search
    still answers, with what the index holds; verify says the latest events wait; once
    there is room, the next read indexes them."""
    from sessiond_daemon.stores.sqlite import search, store
    monkeypatch.setattr(store, "INDEX_LAG_S", 3600.0)
    async with running_daemon(daemon_config(short_dir)) as daemon, \
            AsyncClient(daemon.socket) as c:
        await c.create_session("f")
        await c.append_message("f", "user", "bilby one")
        assert (await c.search("bilby")).sessions[0].matches == 1
        await c.append_message("f", "user", "bilby two")
        index_range = search.index_range

        def full(db: sqlite3.Connection, after: int, upto: int) -> None:
            raise sqlite3.OperationalError("database or disk is full")

        monkeypatch.setattr(search, "index_range", full)
        monkeypatch.setattr(store, "INDEX_LAG_S", 0.05)  # the back-off after a failure
        assert (await c.search("bilby")).sessions[0].matches == 1  # what the index holds
        report = await c.verify()
        assert not report.ok
        assert "not indexed yet" in report.problems[0].problem
        assert "disk is full" in report.problems[0].problem
        monkeypatch.setattr(search, "index_range", index_range)
        with anyio.fail_after(10):  # once the back-off has passed
            while (await c.search("bilby")).sessions[0].matches != 2:
                await anyio.sleep(0.02)
        assert (await c.verify()).ok


async def test_a_catch_up_that_keeps_failing_is_not_retried_in_a_loop(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the catch-up fails with (here a bug's ValueError), the writer tries again
    only once INDEX_LAG_S has passed, and serves the writes meanwhile."""
    from sessiond_daemon.stores.sqlite import search, store
    monkeypatch.setattr(store, "INDEX_LAG_S", 0.05)
    tries: list[int] = []
    index_range = search.index_range

    def broken(db: sqlite3.Connection, after: int, upto: int) -> None:
        tries.append(upto)
        raise ValueError("a bug")

    async with running_daemon(daemon_config(short_dir)) as daemon, \
            AsyncClient(daemon.socket) as c:
        monkeypatch.setattr(search, "index_range", broken)
        await c.create_session("b")
        for i in range(20):
            await c.append_message("b", "user", f"bandicoot {i}")
            await anyio.sleep(0.01)
        with anyio.fail_after(10):
            while len(tries) < 2:  # it was tried, and tried again
                await anyio.sleep(0.01)
        await anyio.sleep(0.3)
        # Every write was served; a try per back-off at most (a loop makes thousands).
        assert (await c.get_session("b")).message_count == 20
        assert len(tries) < 40, len(tries)
        monkeypatch.setattr(search, "index_range", index_range)  # the stop catches up
    assert indexed(daemon.db) == (21, 21)


async def test_one_large_append_does_not_stall_the_writes_behind_it(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 45 §6: seven large messages of distinct words in one append_many, then a
    read of the index makes the store catch up. It does so in steps bounded by bytes and
    time (INDEX_STEP_BYTES, INDEX_STEP_S), a transaction each, not in one range of
    positions holding all seven: the mark moves past some and not all of them, and
    another client's write, sent then, is acknowledged before the index holds them all
    (the writer's batches go between the steps)."""
    import random
    import string

    from sessiond_daemon.stores.sqlite import store
    monkeypatch.setattr(store, "INDEX_LAG_S", 3600.0)  # only the search catches it up
    rng = random.Random(45)

    def distinct() -> str:  # ~1 MiB of distinct words: the index's costliest text
        return " ".join("".join(rng.choices(string.ascii_lowercase, k=7))
                        for _ in range(1 << 17))

    # The search waits for the whole catch-up: more than its default time on a slow box.
    config = daemon_config(short_dir, search_timeout_s=PATIENCE_S)
    async with running_daemon(config) as daemon, \
            AsyncClient(daemon.socket) as c, AsyncClient(daemon.socket) as other:
        await c.create_session("big")
        await other.create_session("small")
        await c.append_messages("big", [{"role": "user", "content": distinct()}
                                        for _ in range(7)])
        [(last,)] = daemon.sql("SELECT MAX(position) FROM events")
        assert indexed(daemon.db) == (0, 0)
        async with anyio.create_task_group() as tg:
            tg.start_soon(c.search, "wombat")  # catches the index up first
            await eventually(lambda: 0 < indexed(daemon.db)[0] < 2 + 7,
                             "the index takes some of the seven, in a step of its own")
            await other.append_message("small", "user", "a small write")
            assert indexed(daemon.db)[1] < last, "the write waited for the whole catch-up"
        assert (await c.verify()).ok  # which catches the index up again
        assert indexed(daemon.db)[0] == 2 + 7 + 1  # all, the small one too, at last
