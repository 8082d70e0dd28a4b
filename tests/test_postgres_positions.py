"""The global position on PostgreSQL: gapless and in commit order, with many committers.

Positions come from one counter row updated by the last statement before COMMIT, so a
reader of `position > cursor` never skips an event that commits late: a later batch
cannot even take its positions before the earlier one committed (or rolled back, giving
its positions back); the batch's events are numbered in the commit (`Batch.renumber`),
whatever the writer thought the head was. These tests commit from several connections at once
and read as a subscriber does.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import anyio
import pg
import pytest
from pg import Scribe, await_until

pytestmark = pytest.mark.anyio
FAR = 1 << 62  # no upper bound: read everything visible past the cursor


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_concurrent_committers_leave_no_gap_and_no_reader_skips(pg_url: str) -> None:
    """6 daemons' stores commit 40 batches each, on their own sessions and on one shared
    session (re-deciding when another moved it), while two readers follow: one reads up
    to the counter row, one past its cursor with no bound. Each read must continue its
    cursor exactly (a gap would be an event committed late and skipped), and in the end
    every event is there once, each batch's events adjacent, versions gapless."""
    from sessiond_daemon.stores.postgres.store import PostgresStore

    writers = [PostgresStore(pg_url, host_name=f"h{i}") for i in range(6)]
    reader = PostgresStore(pg_url, readers=4)
    for s in [*writers, reader]:
        await s.open()
    committed: list[list[int]] = []  # each batch's positions
    attempts = [0] * len(writers)
    done = anyio.Event()
    seen: dict[str, list[int]] = {"bounded": [], "unbounded": []}

    async def write(i: int, store: PostgresStore) -> None:
        rng = random.Random(i)
        scribe = Scribe()
        for n in range(40):
            items = [(f"own-{i}-{n % 3}", rng.randint(1, 4))]
            if rng.random() < 0.3:
                items.append(("shared", 1))
            while True:
                batch = scribe.batch(*items)
                attempts[i] += 1
                moved = await store.commit(batch)
                if moved is None:
                    break
                await scribe.moved(store, moved)
            scribe.adopt(batch)
            committed.append([e.position for e in batch.events])

    async def follow(name: str) -> None:
        cursor = 0
        while True:
            finished = done.is_set()  # read once more after the writers are done
            upto = await reader.head() if name == "bounded" else FAR
            events = await reader.read_after(cursor, upto, None, None, 10_000)
            positions = [e.position for e in events]
            assert positions == list(range(cursor + 1, cursor + 1 + len(positions))), (
                f"{name} reader skipped past {cursor}: {positions[:5]}")
            if name == "bounded":
                assert cursor + len(positions) == upto  # everything up to the head is there
            seen[name] += positions
            cursor += len(positions)
            if finished and not positions:
                return

    try:
        async with anyio.create_task_group() as readers:
            readers.start_soon(follow, "bounded")
            readers.start_soon(follow, "unbounded")
            async with anyio.create_task_group() as tg:
                for i, store in enumerate(writers):
                    tg.start_soon(write, i, store)
            done.set()
        total = await reader.last_position()
        assert sorted(p for batch in committed for p in batch) == list(range(1, total + 1))
        assert all(b == list(range(b[0], b[0] + len(b))) for b in committed)
        assert seen["bounded"] == seen["unbounded"] == list(range(1, total + 1))
        events = await reader.read_after(0, total, None, None, total)
        versions: dict[str, list[int]] = {}
        for e in events:
            versions.setdefault(e.session_id, []).append(e.version)
        assert all(v == list(range(1, len(v) + 1)) for v in versions.values())
        assert sum(s.moved for s in writers) == sum(attempts) - len(committed) > 0
        print(f"{len(committed)} batches in {sum(attempts)} attempts")
    finally:
        for s in [*writers, reader]:
            await s.close()


@pytest.mark.parametrize("outcome", ["COMMIT", "ROLLBACK"])
async def test_an_event_that_commits_late_is_not_skipped(pg_url: str, outcome: str) -> None:
    """A slow transaction took position 1 and has not committed. Another daemon's batch
    waits for it (it cannot take position 2 before 1 is decided) and a reader sees
    nothing yet. If the slow one commits, the reader gets 1 then the batch; if it rolls
    back, the batch gets position 1: no hole either way."""
    import asyncpg

    from sessiond_daemon.stores.interface import Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store, reader = PostgresStore(pg_url), PostgresStore(pg_url)
    await store.open()
    await reader.open()
    from sessiond_daemon.stores.postgres import schema

    # Another daemon of this release (its connection says its schema: the fence's setting).
    slow = await asyncpg.connect(pg_url, server_settings={schema.SETTING: str(schema.LATEST)})
    try:
        tx = slow.transaction()
        await tx.start()
        await slow.execute(
            "WITH head AS (UPDATE log_head SET position = position + 1 RETURNING position)"
            " INSERT INTO events SELECT position, 'slow', 1, 'ev-slow', 'session.created', 1,"
            " 'then', '{}', '{}', 'h' FROM head")
        scribe = Scribe()
        batch = scribe.batch(("fast", 2))
        outcomes: list[Moved | None] = []

        async def commit() -> None:
            outcomes.append(await store.commit(batch))

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit)

            async def waiting() -> bool:  # (not on `slow`: its transaction's stats are frozen)
                row = await reader._one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND (query LIKE '%log_head%'"
                    " OR query LIKE '%sessiond_commit(%')")  # the one-call commit
                return bool(row[0])

            await await_until(waiting, "the fast batch waiting for the counter row")
            assert await reader.read_after(0, FAR, None, None, 100) == []
            await (tx.commit() if outcome == "COMMIT" else tx.rollback())
        # Numbered by the writer after head 0; the commit takes its positions from the
        # counter row once the slow one is decided: after it, or in its place.
        assert outcomes == [None]
        positions = [e.position for e in await reader.read_after(0, FAR, None, None, 100)]
        if outcome == "COMMIT":
            assert positions == [1, 2, 3, 4] and [e.position for e in batch.events] == [2, 3, 4]
        else:
            assert positions == [1, 2, 3] and [e.position for e in batch.events] == [1, 2, 3]
    finally:
        await slow.close()
        await store.close()
        await reader.close()


async def test_a_failed_batch_gives_its_positions_back(pg_url: str) -> None:
    """A batch that fails in its last statement (an event id another session holds)
    writes nothing, and the next batch's positions follow on with no hole."""
    import msgspec

    from sessiond_daemon.stores.postgres.store import PostgresStore
    from sessiond_schemas.errors import StorageError

    store = PostgresStore(pg_url)
    await store.open()
    try:
        scribe = Scribe()
        first = scribe.batch(("a", 1))
        await store.commit(first)
        bad = scribe.batch(("b", 2))
        bad.events[-1] = msgspec.structs.replace(bad.events[-1],
                                                 event_id=first.events[0].event_id)
        with pytest.raises(StorageError, match="nothing was written"):
            await store.commit(bad)
        assert await store.last_position() == 2 and await store.load_entry("b") is None
        scribe.forget("b")
        scribe.next_position = 3
        good = scribe.batch(("c", 1))
        await store.commit(good)
        assert [e.position for e in good.events] == [3, 4]
    finally:
        await store.close()
