"""The PostgreSQL store's read models, kept in the commit: app/user state, executor
output, views by namespace, and forks sharing their source's history."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import msgspec
import pg
import pytest
from pg import Scribe

from sessiond_daemon.stores.interface import Batch, ForkRow

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


@pytest.fixture
async def store(pg_url: str) -> AsyncIterator[object]:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    s = PostgresStore(pg_url)
    await s.open()
    yield s
    await s.close()


async def test_app_and_user_state_keep_the_latest_value(store: object) -> None:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    scribe = Scribe()
    batch = Batch()
    scribe.add(batch, "s", [
        ("state.updated", {"scope": "app", "app_name": "app", "delta": {"k": 1, "j": "x"}}),
        ("state.updated", {"scope": "user", "app_name": "app", "user_id": "u",
                           "delta": {"k": [2]}}),
        ("state.updated", {"scope": "app", "app_name": "app", "delta": {"k": 3}}),
        ("state.updated", {"scope": "session", "delta": {"mine": True}}),
    ])
    assert await store.commit(batch) is None
    scribe.adopt(batch)
    assert await store.scoped_state("app", ["u", "v"]) == {
        "": {"k": 3, "j": "x"}, "u": {"k": [2]}, "v": {}}
    later = Batch()
    scribe.add(later, "other", [("state.updated", {"scope": "app", "app_name": "app",
                                                   "delta": {"j": None}})])
    assert await store.commit(later) is None
    assert (await store.scoped_state("app", []))[""] == {"k": 3, "j": None}


async def test_process_output_by_turn_and_stream(store: object) -> None:
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    batch = Batch()
    Scribe().add(batch, "p", [
        ("process.output", {"turn": 1, "line": "out 1"}),
        ("process.output", {"turn": 1, "stream": "stderr", "line": "err 1"}),
        ("process.output", {"turn": 2, "line": "out 2"}),
        ("process.output", {"turn": 1, "stream": "stdout", "line": "out 1b"}),
    ])
    assert await store.commit(batch) is None
    assert [line for _, line in await store.process_output("p", 1, None)] == [
        "out 1", "err 1", "out 1b"]
    assert [line for _, line in await store.process_output("p", 1, "stdout")] == [
        "out 1", "out 1b"]
    assert list(await store.process_output("p", 1, "stdout", after_position=2)) == [
        (5, "out 1b")]
    assert await store.sessions_with_process() == []
    assert [msgspec.json.decode(s)["session_id"]
            for s in await store.states("local", False, "", 10)] == ["p"]
    assert list(await store.states("loc", True, "", 10)) == list(
        await store.states("local", False, "", 10))
    assert list(await store.states("loc", False, "", 10)) == []


async def test_a_fork_shares_its_sources_history(store: object) -> None:
    """The fork's messages and its hash below the fork point are its source's."""
    from sessiond_daemon.stores.postgres.store import PostgresStore

    assert isinstance(store, PostgresStore)
    scribe = Scribe()
    source = scribe.batch(("src", 3))
    assert await store.commit(source) is None
    scribe.adopt(source)
    at = source.events[2]  # version 3: created, m0, m1
    view = projection_at(source, 3)
    fork = Batch()
    scribe.add(fork, "fork", [("session.forked", {
        "from": {"session_id": "src", "version": 3, "hash": at.hash},
        "state": msgspec.to_builtins(view)})], prev_hash=at.hash, version=3)
    assert await store.commit(fork) is None
    scribe.adopt(fork)
    more = scribe.batch(("fork", 1), ("src", 1))
    assert await store.commit(more) is None
    assert [m.content for m in await store.list_messages(
        "fork", first=0, limit=10, descending=False)] == ["m0", "m1", "m2"]
    assert [m.content for m in await store.list_messages(
        "src", first=0, limit=10, descending=False)] == ["m0", "m1", "m2", "m3"]
    assert await store.hash_at("fork", 3) == at.hash
    assert await store.hash_at("fork", 4) == fork.events[0].hash
    assert await store.fork_count("src") == 1
    assert await store.forks_page("src", "", 10) == (
        1, [ForkRow(session_id="fork", version=3, forked_at=fork.events[0].recorded_at)])


def projection_at(batch: Batch, version: int) -> object:
    from sessiond_daemon.core import projection

    return projection.fold(None, [e for e in batch.events if e.version <= version])
