"""Following the shared log across hosts: a follower woken by the listener sees every
host's events once, in position order, while several hosts commit at once."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import pg
import pytest
from pg import Scribe, await_until

from sessiond_schemas.events import Event

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_a_follower_sees_every_hosts_events_once_in_order(pg_url: str) -> None:
    from sessiond_daemon.stores.postgres.follow import Follower
    from sessiond_daemon.stores.postgres.listener import Listener
    from sessiond_daemon.stores.postgres.store import PostgresStore

    hosts = [PostgresStore(pg_url, host_name=f"h{i}") for i in range(3)]
    here = PostgresStore(pg_url)
    for s in [*hosts, here]:
        await s.open()
    seen: list[Event] = []

    async def deliver(events: list[Event], _upto: int) -> None:
        seen.extend(events)

    follower = Follower(here, deliver, page=7)
    listener = Listener(here.connect, follower.wake, poll_s=3600)

    async def write(i: int, store: PostgresStore) -> None:
        scribe = Scribe()
        for n in range(25):
            items = [(f"h{i}-{n % 4}", 1 + n % 3), ("shared", 1)]
            while (moved := await store.commit(batch := scribe.batch(*items))) is not None:
                await scribe.moved(store, moved)
            scribe.adopt(batch)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(listener.run)
            tg.start_soon(follower.run)
            await await_until(lambda: _true(listener.connected), "the listener")
            async with anyio.create_task_group() as writers:
                for i, store in enumerate(hosts):
                    writers.start_soon(write, i, store)
            total = await here.last_position()
            await await_until(lambda: _true(follower.cursor == total), "the follower")
            tg.cancel_scope.cancel()
        assert [e.position for e in seen] == list(range(1, total + 1))
        assert seen == await here.read_after(0, total, None, None, total)
        assert listener.notifications >= 1
    finally:
        for s in [*hosts, here]:
            await s.close()


async def test_positions_a_delete_took_are_passed_over(pg_url: str) -> None:
    from sessiond_daemon.stores.interface import Batch
    from sessiond_daemon.stores.postgres.follow import Follower
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    seen: list[int] = []

    async def deliver(events: list[Event], _upto: int) -> None:
        seen.extend(e.position for e in events)

    try:
        scribe = Scribe()
        for items in ([("a", 1)], [("gone", 3)], [("a", 1)], [("late", 2)]):
            batch = scribe.batch(*items)
            assert await store.commit(batch) is None
            scribe.adopt(batch)
        assert await store.commit(Batch(deletes=["gone"])) is None
        follower = Follower(store, deliver, page=2)
        assert await follower.catch_up() == 6  # a: 1, 2; gone: 3-6; a: 7; late: 8-10
        assert seen == [1, 2, 7, 8, 9, 10] and follower.cursor == 10
        await store.commit(Batch(deletes=["late"]))
        assert await follower.catch_up() == 0 and follower.cursor == 10
    finally:
        await store.close()


async def _true(value: bool) -> bool:
    return value
