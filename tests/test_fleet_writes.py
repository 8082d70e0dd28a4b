"""Two daemons on one PostgreSQL database: a delete is decided against the database's
version (another host's append makes a stale expected_version -32004), results quote the
positions the commit gave, and a subscriber on one host sees the other's events."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pg
import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import VersionConflictError

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_deletes_results_and_subscriptions_across_hosts(pg_url: str,
                                                             short_dir: str) -> None:
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with (running_daemon(configs[0]) as a, running_daemon(configs[1]) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        s = await on_a.create_session()
        await on_a.append_message(s.session_id, "user", "a1")  # a holds version 2
        # Results quote the positions the commit took, whichever host numbered last.
        results = []
        for i in range(3):
            results.append(await on_b.append_message(s.session_id, "user", f"b{i}"))
            results.append(await on_a.append_message(s.session_id, "user", f"a{i}"))
        stored = {e.version: e.position for e in (await on_b.read_events(s.session_id)).events}
        assert [(r.version, r.position) for r in results] == [
            (r.version, stored[r.version]) for r in results]
        # A subscriber on a sees b's events too, in position order, once.
        seen: list[int] = []
        async with on_a.subscribe(from_position=0) as sub:
            async for event in sub:
                seen.append(event.position)
                if event.position == max(stored.values()):
                    break
        assert seen == sorted(stored.values())
        # b appended after a's last write: a's delete at a's old version is refused.
        top = results[-1].version
        await on_b.append_message(s.session_id, "user", "late")
        with pytest.raises(VersionConflictError):
            await on_a.call("session.delete", session_id=s.session_id, expected_version=top)
        await on_a.call("session.delete", session_id=s.session_id, expected_version=top + 1)
        assert (await on_b.list_sessions()).sessions == []


async def test_a_delete_decided_from_an_old_version_is_moved(pg_url: str) -> None:
    """The store checks a deleted session's version too: a host that decided a delete
    from version 2 while another host wrote version 3 gets `Moved`, and decides again
    (where a client's expected_version of 2 is -32004)."""
    from pg import Scribe

    from sessiond_daemon.stores.interface import Batch, Moved
    from sessiond_daemon.stores.postgres.store import PostgresStore

    a, b = PostgresStore(pg_url), PostgresStore(pg_url)
    await a.open()
    await b.open()
    try:
        on_a, on_b = Scribe(), Scribe()
        first = on_a.batch(("s", 1))
        assert await a.commit(first) is None
        on_a.adopt(first)
        on_b.entries["s"] = on_a.entries["s"]
        later = on_b.batch(("s", 1))
        assert await b.commit(later) is None
        delete = Batch(deletes=["s"], bases={"s": 2})
        assert await a.commit(delete) == Moved(frozenset({"s"}), 3)
        assert (await a.load_entry("s")) is not None
        assert await a.commit(Batch(deletes=["s"], bases={"s": 3})) is None
        assert await a.load_entry("s") is None
    finally:
        await a.close()
        await b.close()


async def test_each_host_decides_and_reads_on_the_stored_view(pg_url: str,
                                                              short_dir: str) -> None:
    """A host never decides or answers from a view another host has moved past: an
    expected_version that is right in the database is accepted whichever host wrote
    last, and a session deleted through one host is gone on the other at once."""
    from sessiond_schemas.errors import SessionNotFoundError

    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with (running_daemon(configs[0]) as a, running_daemon(configs[1]) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        sid = (await on_a.create_session()).session_id
        version = (await on_a.append_message(sid, "user", "a0")).version  # a caches it
        for i in range(20):  # hosts alternate, each naming the version the other wrote
            host = on_b if i % 2 == 0 else on_a
            version = (await host.call("message.append", session_id=sid, role="user",
                                       content=f"m{i}", expected_version=version))["version"]
            assert (await on_a.get_session(sid)).version == version
            assert (await on_b.get_session(sid)).version == version
        await on_b.delete_session(sid)
        with pytest.raises(SessionNotFoundError):
            await on_a.get_session(sid)
        with pytest.raises(SessionNotFoundError):
            await on_a.append_message(sid, "user", "after the delete")
