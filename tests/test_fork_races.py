"""Rules that span sessions hold inside the commit, not in one daemon's memory.

A fork's source and the fork share history: the fork's commit requires its source to
hold the version it was read at (HasVersion), a delete that the session has no forks
(HasNoForks), and each store checks both under its own locks. So a fork raced against
a delete of its source, through two daemons on one PostgreSQL database, or against a
session.cleanup on one SQLite daemon, never leaves a fork whose source is gone: one of
the two wins, the other is refused, and daemon.verify finds nothing wrong.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

import anyio
import pg
import pytest
from conftest import daemon_config, running_daemon
from test_fleet import Host

from sessiond import AsyncClient
from sessiond_schemas.errors import (
    InvalidTransitionError,
    SessiondError,
    SessionNotFoundError,
)

pytestmark = pytest.mark.anyio

TRIES = 150


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def _outcome(results: dict[str, Any], name: str, call: Awaitable[Any]) -> None:
    try:
        results[name] = await call
    except SessiondError as exc:
        results[name] = exc


async def _no_orphans(client: AsyncClient) -> int:
    """Every fork's source is there, and the fork reads its shared messages; how many
    forks there are."""
    forks, cursor = 0, None
    while True:
        page = await client.list_sessions(limit=500, cursor=cursor)
        for summary in page.sessions:
            state = await client.get_session(summary.session_id)
            if state.forked_from is None:
                continue
            forks += 1
            await client.get_session(state.forked_from.session_id)  # -32001 if orphaned
            messages = (await client.list_messages(state.session_id)).messages
            assert [m.content for m in messages] == ["shared"], state.session_id
        cursor = page.next_cursor
        if cursor is None:
            return forks


@pytest.fixture
async def two_hosts(pg_url: str, short_dir: str) -> AsyncIterator[tuple[Host, Host]]:
    """Two daemon processes on one database (processes: nothing in one's memory can
    stand for a rule the other must keep)."""
    hosts = (Host(short_dir, 0, pg_url), Host(short_dir, 1, pg_url))
    try:
        for host in hosts:
            await host.start()
        yield hosts
    finally:
        for host in hosts:
            host.stop()


@pytest.mark.fleet
async def test_fork_and_delete_of_its_source_on_two_daemons(
        two_hosts: tuple[Host, Host]) -> None:
    """Two daemons on one database: a fork through one and a delete of its source
    through the other, sent together, 150 times (each way round in turn). Exactly one
    wins each time: the fork (the delete is -32003) or the delete (the fork is -32001)."""
    a, b = two_hosts
    async with AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b:
        won = {"fork": 0, "delete": 0}
        for i in range(TRIES):
            src = f"src-{i}"
            await on_a.create_session(src)
            await on_a.append_message(src, "user", "shared")
            forker, deleter = (on_a, on_b) if i % 2 == 0 else (on_b, on_a)
            results: dict[str, Any] = {}

            async def delete(deleter: AsyncClient = deleter, src: str = src,
                             reads: int = i % 24) -> bool:
                # 0 to 23 reads first: the delete meets the fork at another moment each time
                for _ in range(reads):
                    await deleter.get_session(src)
                return await deleter.delete_session(src)

            async with anyio.create_task_group() as tg:
                tg.start_soon(_outcome, results, "fork",
                              forker.fork(src, new_session_id=f"{src}-f"))
                tg.start_soon(_outcome, results, "delete", delete())
            if results["delete"] is True:
                assert isinstance(results["fork"], SessionNotFoundError), results
                won["delete"] += 1
            else:
                assert isinstance(results["delete"], InvalidTransitionError), results
                assert results["delete"].data["forks"] == 1
                assert not isinstance(results["fork"], SessiondError), results
                won["fork"] += 1
        assert won["fork"] and won["delete"], won  # the race went both ways
        assert await _no_orphans(on_a) == won["fork"]
        for client in (on_a, on_b):
            assert (await client.verify()).ok


async def test_cleanup_and_fork_on_one_sqlite_daemon(short_dir: str) -> None:
    """session.cleanup of ended sessions, sent together with a fork of one of them, 150
    times on one SQLite daemon: the source is deleted and the fork is -32001, or the
    fork is made and the source kept; never a fork whose source is gone. Before each
    try, 0 to 7 other ended sessions (ordered before the source) give the cleanup more
    to count first, so its delete of the source comes at another moment of the fork."""
    config = daemon_config(short_dir)
    async with running_daemon(config), AsyncClient(config.socket) as client:
        kept = deleted = 0
        for i in range(TRIES):
            src = f"src-{i}"
            for j in range(i % 8):
                await client.create_session(f"ballast-{i}-{j}")
                await client.transition(f"ballast-{i}-{j}", "completed")
            await client.create_session(src)
            await client.append_message(src, "user", "shared")
            await client.transition(src, "completed")
            results: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(_outcome, results, "fork",
                              client.fork(src, new_session_id=f"{src}-f"))
                tg.start_soon(_outcome, results, "cleanup",
                              client.cleanup(older_than_days=0, statuses=["completed"]))
            cleanup = results["cleanup"]
            assert not isinstance(cleanup, SessiondError), cleanup
            if src in cleanup.session_ids:
                assert isinstance(results["fork"], SessionNotFoundError), results
                deleted += 1
            else:
                assert not isinstance(results["fork"], SessiondError), results
                kept += 1
        assert kept and deleted, (kept, deleted)  # the race went both ways
        await _no_orphans(client)
        assert (await client.verify()).ok


async def test_every_delete_of_a_source_is_refused_while_it_has_forks(
        client: AsyncClient) -> None:
    """graph.prune `delete` and session.import `replace` of a source with forks are
    -32003 like session.delete (graph.prune deleted it before, leaving its fork with no
    source); nothing is written, and each goes through once the fork is gone."""
    await client.call("graph.put", session_id="g", thread_id="g", checkpoint_id="0001",
                      checkpoint={"type": "json", "data": "e30="}, channel_versions={})
    await client.append_message("g", "user", "shared")
    doc = await client.export_session("g")
    await client.fork("g", new_session_id="g-f")
    version = (await client.get_session("g")).version
    with pytest.raises(InvalidTransitionError) as pruned:
        await client.call("graph.prune", session_ids=["g"], strategy="delete")
    assert pruned.value.data == {"session_id": "g", "forks": 1}
    with pytest.raises(InvalidTransitionError) as replaced:
        await client.import_session(doc, on_conflict="replace")
    assert "replaced by an import" in replaced.value.message
    assert (await client.get_session("g")).version == version
    assert await _no_orphans(client) == 1
    assert (await client.verify()).ok
    await client.delete_session("g-f")
    await client.import_session(doc, on_conflict="replace")
    assert (await client.call("graph.prune", session_ids=["g"], strategy="delete"))[
        "sessions"] == ["g"]
