"""The PostgreSQL store's read pool: a read costs its own statement and nothing more; no
reset query on each release (the store sets no session state to reset)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pg
import pytest

from sessiond_daemon.stores import registry

pytestmark = [pytest.mark.anyio, pytest.mark.postgresql]


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_a_pooled_read_sends_only_its_statement(pg_url: str) -> None:
    store = registry.open_store(pg_url)
    await store.open()
    try:
        sent: list[str] = []
        pool: Any = store._pool  # type: ignore[attr-defined]
        # Every connection of the pool, each with a logger of what it sends.
        held = [await pool.acquire() for _ in range(pool.get_max_size())]
        for con in held:
            con.add_query_logger(lambda record: sent.append(record.query))
        for con in held:
            await pool.release(con)
        for _ in range(10):
            await store.counts()
        async with anyio.create_task_group() as tg:  # both connections, in turn
            for _ in range(10):
                tg.start_soon(store.session_ids, "", 10)
        assert len(sent) >= 20, sent  # the loggers saw the reads
        resets = [q for q in sent if "RESET ALL" in q or "UNLISTEN" in q]
        assert not resets, f"{len(resets)} resets for {len(sent) - len(resets)} reads"
    finally:
        await store.close()
