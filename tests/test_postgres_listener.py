"""The LISTEN connection: one wake-up per committed batch, a poll besides, and reconnection
with backoff when the server drops the connection."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anyio
import pg
import pytest
from pg import Scribe, await_until

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_one_notification_per_batch_and_reconnection(pg_url: str) -> None:
    from sessiond_daemon.stores.postgres.listener import Listener
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    connections: list[Any] = []
    states: list[bool] = []
    wakes = 0

    def wake() -> None:
        nonlocal wakes
        wakes += 1

    async def connect() -> Any:
        con = await store.connect()
        connections.append(con)
        return con

    listener = Listener(connect, wake, poll_s=3600, backoff_s=0.01, on_state=states.append)
    scribe = Scribe()

    async def commit(*items: tuple[str, int]) -> None:
        batch = scribe.batch(*items)
        await store.commit(batch)
        scribe.adopt(batch)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.run)
            await await_until(lambda: _true(listener.connected), "the listener")
            await commit(("a", 5), ("b", 3))  # one batch of 10 events: one wake-up
            await commit(("a", 1))
            await await_until(lambda: _true(listener.notifications == 2), "two notifications")
            await commit(("c", 4))
            await await_until(lambda: _true(listener.notifications == 3), "a third")
            assert wakes == 4  # one on connecting, then one per batch

            # The server drops the connection: the listener reconnects, wakes once for
            # what it may have missed, and hears the next batch.
            await store._one("SELECT pg_terminate_backend($1)",
                             connections[-1].get_server_pid())
            await await_until(lambda: _true(listener.connects == 2), "a reconnection")
            assert states == [True, False, True]
            await commit(("a", 1))
            await await_until(lambda: _true(listener.notifications == 4), "a notification")
            assert wakes == 6
            tg.cancel_scope.cancel()
    finally:
        await store.close()


async def test_the_poll_wakes_without_notifications(pg_url: str) -> None:
    from sessiond_daemon.stores.postgres.listener import Listener
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    wakes = 0

    def wake() -> None:
        nonlocal wakes
        wakes += 1

    listener = Listener(store.connect, wake, poll_s=0.01)
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.run)
            await await_until(lambda: _true(wakes >= 5), "polls")
            assert listener.notifications == 0
            tg.cancel_scope.cancel()
    finally:
        await store.close()


async def _true(value: bool) -> bool:
    return value
