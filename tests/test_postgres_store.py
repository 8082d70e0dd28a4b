"""The store contract (tests/store_contract.py) on the PostgreSQL store, each test on a
database of its own, with a second store on the same database for the shared tests."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pg
import pytest
from store_contract import StoreContract

from sessiond_daemon.stores import registry
from sessiond_daemon.stores.interface import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def store(self, pg_url: str) -> AsyncIterator[Store]:
        store = registry.open_store(pg_url, registry.Options(host_name="host-a"))
        await store.open()
        try:
            yield store
        finally:
            await store.close()

    @pytest.fixture
    async def other(self, pg_url: str, store: Store) -> AsyncIterator[Store]:
        other = registry.open_store(pg_url, registry.Options(host_name="host-b"))
        await other.open()
        try:
            yield other
        finally:
            await other.close()
