"""The store contract on the SQLite store, and what only the SQLite store does."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import AsyncIterator

import pytest
from store_contract import Log, StoreContract, created, message

from sessiond_daemon.stores import registry
from sessiond_daemon.stores.interface import Store
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_schemas.errors import StorageError

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sqlite_store(short_dir: str) -> AsyncIterator[SqliteStore]:
    """A fresh store on a new file, opened; closed after the test."""
    store = registry.open_store(os.path.join(short_dir, "s.db"))
    assert isinstance(store, SqliteStore)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


class TestSqliteStore(StoreContract):
    @pytest.fixture
    def store(self, sqlite_store: SqliteStore) -> Store:
        return sqlite_store


async def test_capabilities_are_all_there(sqlite_store: SqliteStore) -> None:
    caps = sqlite_store.capabilities
    assert caps.engine == "sqlite"
    assert caps.integrity is caps.backup is caps.size is sqlite_store
    assert caps.full_text is not None and caps.shared_log is None


async def test_a_driver_error_midway_rolls_back_every_row(sqlite_store: SqliteStore) -> None:
    """The batch's events, read models, views: none stays when the transaction fails."""
    log = Log()
    await sqlite_store.commit(log.batch(("a", [created()])))
    good = log.batch(("b", [created(), message(0)]), ("a", [message(0)]), key="k",
                     snapshot=True)
    good.events.append(good.events[0])  # fails on the events' key, after the others
    with pytest.raises(StorageError) as err:
        await sqlite_store.commit(good)
    assert "UNIQUE" in err.value.data["detail"]

    def counts(con: sqlite3.Connection) -> list[int]:
        return [con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("events", "sessions", "messages", "idempotency", "snapshots")]
    assert await sqlite_store.on_reader(counts) == [1, 1, 0, 0, 0]


async def test_the_size_cap_refuses_writes(short_dir: str) -> None:
    store = SqliteStore(os.path.join(short_dir, "cap.db"), max_bytes=256 * 1024)
    await store.open()
    log = Log()
    try:
        with pytest.raises(StorageError) as err:
            for i in range(200):
                await store.commit(log.batch((f"s{i}", [created()] + [
                    message(n, "x" * 4000) for n in range(4)])))
        assert "full" in err.value.message
        assert store.capabilities.size is not None
        assert store.capabilities.size.max_bytes == 256 * 1024
    finally:
        await store.close()
