"""What a host reads on a shared database: nothing per write (it decides on its cached view;
the commit's version check under the row lock catches a view another host moved), one
view read when a decision it would refuse or answer without a commit was taken on a view
another host had moved, and nothing at all after its own commits while nobody on it
subscribes or tails (the shared log is followed only for them)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import anyio
import pg
import pytest
from conftest import daemon_config, eventually, running_daemon
from pg import Stores

from sessiond import AsyncClient
from sessiond_daemon.serve.config import Config
from sessiond_schemas.errors import VersionConflictError

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def _configs(short_dir: str, pg_url: str) -> list[Config]:
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    return configs


async def test_a_host_decides_on_its_cached_view(pg_url: str, short_dir: str) -> None:
    stores = Stores()
    a_conf, b_conf = _configs(short_dir, pg_url)
    async with (running_daemon(a_conf, stores) as a, running_daemon(b_conf, stores) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        sid = (await on_a.create_session()).session_id
        version = (await on_a.append_message(sid, "user", "a0")).version
        before = stores.reads(0)
        for i in range(20):
            version = (await on_a.append_message(sid, "user", f"a{i}")).version
        assert stores.reads(0).get("view", 0) == before.get("view", 0)  # none per write
        # b moves the session: a's cached view is stale. An append decided on it is caught
        # by the commit (Moved: one view read, decided again), never refused.
        version = (await on_b.append_message(sid, "user", "b0")).version
        reads = stores.reads(0).get("view", 0)
        result = await on_a.append_message(sid, "user", "after b")
        assert result.version == version + 1
        assert stores.reads(0)["view"] == reads + 1
        # b moves it again: a right expected_version is accepted by a (whose cached view
        # is one behind: checked again on the stored view before refusing), a wrong one
        # is refused with the stored version.
        version = (await on_b.append_message(sid, "user", "b1")).version
        ok = await on_a.call("message.append", session_id=sid, role="user", content="right",
                             expected_version=version)
        assert ok["version"] == version + 1
        await on_b.append_message(sid, "user", "b2")
        with pytest.raises(VersionConflictError) as refused:
            await on_a.call("message.append", session_id=sid, role="user", content="wrong",
                            expected_version=version)
        assert refused.value.data == {"expected": version, "actual": version + 2}
        stored = await on_b.read_events(sid)
        assert [e.version for e in stored.events] == list(range(1, version + 3))


async def test_no_reads_after_its_own_commits_without_subscribers(pg_url: str,
                                                                  short_dir: str) -> None:
    """Both hosts write, each batch of a's lands after some of b's (a gap a's writer
    cannot ring itself): with nobody subscribed on a, a reads nothing for them. A
    subscription on a then sees b's events, from the head on, and a follows again."""
    stores = Stores()
    a_conf, b_conf = _configs(short_dir, pg_url)
    async with (running_daemon(a_conf, stores) as a, running_daemon(b_conf, stores) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        mine = (await on_a.create_session()).session_id
        theirs = (await on_b.create_session()).session_id
        await on_a.append_message(mine, "user", "warm")
        before = sum(stores.reads(0).values())
        for i in range(15):
            await on_b.append_message(theirs, "user", f"b{i}")
            await on_a.append_message(mine, "user", f"a{i}")
        await on_b.append_message(theirs, "user", "last of b")
        assert sum(stores.reads(0).values()) == before, stores.reads(0)
        # A subscriber on a: b's events after it come through a's follower, live.
        seen: list[str] = []
        async with on_a.subscribe(session_id=theirs) as sub:
            async def follow() -> None:
                async for event in sub:
                    seen.append(event.data.content)
                    return

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                await eventually(lambda: sub.caught_up, "the subscription")
                await on_b.append_message(theirs, "user", "seen on a")
        assert seen == ["seen on a"]
        assert sum(stores.reads(0).values()) > before  # the follower read it
