"""The PostgreSQL store when the server drops its connections: a write in flight fails
with a retryable -32012 and leaves nothing half-written; the next one reconnects."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pg
import pytest
from pg import Scribe, await_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_a_batch_cut_off_mid_transaction_leaves_nothing(pg_url: str) -> None:
    """The writer's backend is terminated while its batch waits in the last statement:
    the commit fails as retryable, nothing of the batch is stored, and the same batch
    commits on a new connection."""
    import asyncpg

    from sessiond_daemon.stores.postgres.store import PostgresStore
    from sessiond_schemas.errors import StorageError

    store, admin = PostgresStore(pg_url), PostgresStore(pg_url)
    await store.open()
    await admin.open()
    blocker = await asyncpg.connect(pg_url)
    try:
        scribe = Scribe()
        batch = scribe.batch(("s", 2), key="k")
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT position FROM log_head FOR UPDATE")
        failures: list[StorageError] = []

        async def commit() -> None:
            with pytest.raises(StorageError) as failed:
                await store.commit(batch)
            failures.append(failed.value)

        async with anyio.create_task_group() as tg:
            tg.start_soon(commit)

            async def waiting() -> int | None:
                row = await admin._one(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                    " AND wait_event_type = 'Lock' AND (query LIKE '%log_head%'"
                    " OR query LIKE '%sessiond_commit(%')")  # the one-call commit
                return row[0] if row else None

            pid = await await_until(waiting, "the batch waiting for the counter row")
            await admin._one("SELECT pg_terminate_backend($1)", pid)
        await tx.rollback()
        assert failures[0].data is not None and failures[0].data["retryable"] is True
        assert "retry it" in failures[0].message
        for table in ("events", "sessions", "messages", "idempotency"):
            assert (await admin._one(f"SELECT count(*) FROM {table}"))[0] == 0, table
        assert await store.commit(batch) is None  # reconnected
        assert await admin.last_position() == 3
    finally:
        await blocker.close()
        await store.close()
        await admin.close()
