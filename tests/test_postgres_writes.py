"""PostgresStore's batch commit and reads, against a real server: what one batch writes,
and what happens when another daemon wrote the same sessions first."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pg
import pytest
from pg import Scribe

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[object]:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    s = PostgresStore(pg_url, host_name="host-a")
    await s.open()
    yield s
    await s.close()


async def _open(url: str, host: str) -> object:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    s = PostgresStore(url, host_name=host)
    await s.open()
    return s


async def test_a_batch_round_trips(store: object) -> None:
    from sessiond_daemon.stores.interface import SessionFilters
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    scribe = Scribe()
    batch = scribe.batch(("s-1", 3), ("s-2", 1), key="k1")
    assert await store.commit(batch) is None
    scribe.adopt(batch)
    assert [e.position for e in batch.events] == list(range(1, 7))
    assert batch.views["s-1"].last_position == 4 and batch.views["s-2"].last_position == 6
    assert await store.last_position() == 6 and await store.head() == 6

    entry = await store.load_entry("s-1")
    assert entry is not None
    assert entry.state == batch.views["s-1"].state
    assert (entry.last_hash, entry.last_position) == (batch.views["s-1"].last_hash, 4)
    assert await store.load_entry("nope") is None

    assert await store.read_after(0, 6, None, None, 100) == batch.events
    assert await store.read_after(2, 5, "s-1", None, 100) == batch.events[2:4]
    assert await store.read_after(0, 6, None, frozenset({"session.created"}), 100) == [
        batch.events[0], batch.events[4]]
    page = await store.read_events(session_id="s-1", from_version=2, after_position=0,
                                   limit=10, types=None)
    assert list(page) == batch.events[1:4]
    assert await store.first_position("s-2", 1) == 5
    assert await store.idempotent_results([("s-1", "k1"), ("s-2", "k1"), ("s-1", "x")]) == {
        ("s-1", "k1"): b'{"version": 4}', ("s-2", "k1"): b'{"version": 2}'}

    messages = await store.list_messages("s-1", first=0, limit=10, descending=False)
    assert [m.content for m in messages] == ["m0", "m1", "m2"]
    assert [m.sequence for m in await store.list_messages(
        "s-1", first=2, limit=2, descending=True)] == [2, 1]
    sessions, cursor = await store.list_sessions(SessionFilters(), 1, None)
    assert len(sessions) == 1 and cursor is not None
    rest, end = await store.list_sessions(SessionFilters(), 5, cursor)
    assert {s.session_id for s in [*sessions, *rest]} == {"s-1", "s-2"} and end is None
    assert await store.resolve("s-") == ["s-1", "s-2"]
    assert await store.counts() == (2, 6)


async def test_a_paged_read_stops_at_its_byte_budget(store: object) -> None:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    scribe = Scribe()
    batch = scribe.batch(("s", 50))
    await store.commit(batch)
    page = await store.read_events(session_id="s", from_version=1, after_position=0,
                                   limit=100, types=None, max_bytes=2000)
    assert 1 < len(page) < 51 and page.cut
    assert list(page) == batch.events[:len(page)]


async def test_a_session_another_daemon_moved_is_refused_whole(pg_url: str) -> None:
    """Host B decided against version 2; host A wrote version 3 meanwhile: B's batch is
    refused (nothing of it, not even its other session), and goes through once B reloads
    and numbers after the new head."""
    from sessiond_daemon.stores.interface import Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    a, b = await _open(pg_url, "a"), await _open(pg_url, "b")
    assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
    try:
        on_a, on_b = Scribe(), Scribe()
        first = on_a.batch(("s", 1))
        assert await a.commit(first) is None
        on_a.adopt(first)
        await on_b.moved(b, Moved(frozenset({"s"}), await b.last_position()))
        assert await a.commit(on_a.batch(("s", 1))) is None
        stale = on_b.batch(("s", 1), ("other", 1))
        # B numbered after the head it knew (2) and decided against version 2 of s: both
        # moved; nothing is written, and B learns both at once.
        moved = await b.commit(stale)
        assert moved == Moved(frozenset({"s"}), 3)
        assert await b.load_entry("other") is None and await b.last_position() == 3
        await on_b.moved(b, moved)
        retry = on_b.batch(("s", 1), ("other", 1))
        assert await b.commit(retry) is None
        assert [e.position for e in retry.events] == [4, 5, 6]
        assert [e.version for e in await a.read_after(0, 6, "s", None, 10)] == [1, 2, 3, 4]
        assert b.moved == 1
    finally:
        await a.close()
        await b.close()


async def test_two_daemons_creating_one_session_one_wins(pg_url: str) -> None:
    from sessiond_daemon.stores.interface import Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    a, b = await _open(pg_url, "a"), await _open(pg_url, "b")
    assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
    try:
        assert await a.commit(Scribe().batch(("new", 1))) is None
        late = Scribe()
        late.next_position = 3
        assert await b.commit(late.batch(("new", 2))) == Moved(frozenset({"new"}), 2)
        assert (await b.counts()) == (1, 2)
        assert await b.session_host("new") == "a"  # the host that created it
        assert await b.session_host("nobody") is None
    finally:
        await a.close()
        await b.close()


async def test_two_daemons_creating_one_session_at_once(pg_url: str) -> None:
    """Both decide `new` is new, both number after the same head; the one that waits on
    the other's insert finds the session taken: one commits, the other is moved."""
    import anyio

    from sessiond_daemon.stores.interface import Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    stores = [await _open(pg_url, f"h{i}") for i in range(2)]
    results: list[Moved | None] = []
    try:
        async def create(store: object) -> None:
            assert isinstance(store, PostgresStore)
            results.append(await store.commit(Scribe().batch(("new", 1))))

        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(create, store)
        assert sorted(results, key=lambda r: r is not None) == [None, Moved(frozenset(), 2)] \
            or sorted(results, key=lambda r: r is not None) == [None,
                                                                Moved(frozenset({"new"}), 2)]
    finally:
        for store in stores:
            assert isinstance(store, PostgresStore)
            await store.close()


async def test_an_idempotency_key_is_shared_by_every_daemon(pg_url: str) -> None:
    """A retry through another daemon finds the first result; committing the key again
    (a writer that had not looked) is refused as moved, never appended twice."""
    from sessiond_daemon.stores.interface import Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    a, b = await _open(pg_url, "a"), await _open(pg_url, "b")
    assert isinstance(a, PostgresStore) and isinstance(b, PostgresStore)
    try:
        scribe = Scribe()
        first = scribe.batch(("s", 1), key="retry-me")
        assert await a.commit(first) is None
        assert await b.idempotent_results([("s", "retry-me")]) == {
            ("s", "retry-me"): b'{"version": 2}'}
        again = Scribe()
        await again.moved(b, Moved(frozenset({"s"}), 2))
        # Decided against the current version, but the key is taken: stale, not appended.
        assert await b.commit(again.batch(("s", 1), key="retry-me")) == Moved(
            frozenset({"s"}), 2)
        assert await b.last_position() == 2
    finally:
        await a.close()
        await b.close()


async def test_delete_takes_every_row_of_the_session(store: object) -> None:
    from sessiond_daemon.stores.interface import Batch
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    scribe = Scribe()
    await store.commit(scribe.batch(("gone", 2), ("kept", 1), key="k"))
    await store.commit(Batch(deletes=["gone"]))
    assert await store.load_entry("gone") is None
    assert await store.read_after(0, 100, "gone", None, 10) == []
    assert await store.list_messages("gone", first=0, limit=5, descending=False) == []
    assert await store.idempotent_results([("gone", "k"), ("kept", "k")]) == {
        ("kept", "k"): b'{"version": 2}'}
    assert await store.last_position() == 5  # positions are never given back


@pytest.mark.parametrize("path", ["one call", "multi-statement"])
async def test_the_tsvector_is_built_before_the_counter_row_is_locked(
        client: Any, store_kind: str, db_url: str, monkeypatch: pytest.MonkeyPatch,
        path: str) -> None:
    """postgres/search.py's tsvector (Python tokenizing up to max_message_bytes of text)
    runs before the commit locks log_head, the one row every host's commit needs: on the
    one-call path (an append) and on the multi-statement one (a fork: its preconditions
    and shares; its session.forked task is indexed). Seen from another connection: while
    tsvector() runs, log_head can be locked."""
    if store_kind != "postgresql":
        pytest.skip("the counter row is PostgreSQL's")
    import asyncio
    import threading

    import asyncpg

    from sessiond_daemon.stores.postgres import search as pg_search

    real = pg_search.tsvector
    seen: list[bool] = []

    async def locked() -> bool:
        con = await asyncpg.connect(db_url)
        try:
            async with con.transaction():
                await con.execute("SET LOCAL lock_timeout = '1ms'")
                try:
                    await con.execute("SELECT 1 FROM log_head WHERE id = 1 FOR UPDATE")
                    return False
                except asyncpg.LockNotAvailableError:
                    return True
        finally:
            await con.close()

    def probe() -> list[bool]:
        out: list[bool] = []
        t = threading.Thread(target=lambda: out.append(asyncio.run(locked())))
        t.start()
        t.join()
        return out

    def probing(body: str | None, tags: str | None) -> str:
        seen.extend(probe())
        return real(body, tags)

    await client.create_session("big", task="a task to index " * 100)
    monkeypatch.setattr(pg_search, "tsvector", probing)
    if path == "one call":
        await client.append_message("big", "user", "a message to index " * 1000)
    else:
        await client.fork("big", new_session_id="f1")
    assert seen, "tsvector was not called"
    assert probe() == [False]  # the probe sees the row free between commits
    assert not any(seen), "the counter row was locked while the tsvector was built"
