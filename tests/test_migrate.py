"""`sessionctl migrate`: SQLite into PostgreSQL and back, with real daemons on each end,
run as a user runs it (a separate process); ids, versions, hashes and times kept, `verify`
ok on the copy, and a second run copies only what is missing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pg
import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def migrate(source: str, target: str) -> tuple[int, dict[str, Any], str]:
    """`sessionctl migrate SOURCE TARGET`: exit status, its report, its stderr."""
    done = subprocess.run([sys.executable, "-m", "sessiond.cli", "migrate", source, target],
                          capture_output=True, text=True, timeout=300, check=False)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, report, done.stderr


async def run_migrate(source: str, target: str) -> tuple[int, dict[str, Any], str]:
    return await anyio.to_thread.run_sync(migrate, source, target)


def config_on(directory: str, db: str) -> Any:
    os.makedirs(directory, exist_ok=True)
    return daemon_config(directory, db=db)


async def fill(client: AsyncClient, tag: str) -> list[str]:
    """Sessions with messages, memory, a checkpoint (payload) and a fork."""
    a = await client.create_session(task=f"task {tag}", namespace="moved")
    for i in range(5):
        await client.append_message(a.session_id, "user", f"{tag} message {i}",
                                    idempotency_key=f"{tag}-{i}")
    await client.update_memory(a.session_id, {"tag": tag})
    await client.save_checkpoint(a.session_id, {"step": tag}, node_id="n1")
    b = await client.fork(a.session_id, at_version=3)
    await client.append_message(b.session_id, "assistant", f"{tag} on the fork")
    return [a.session_id, b.session_id]


async def histories(client: AsyncClient, sids: list[str]) -> dict[str, list[Any]]:
    """Each session's events as stored, positions aside (the target numbers its own)."""
    out = {}
    for sid in sids:
        events = (await client.read_events(sid)).events
        out[sid] = [(e.event_id, e.version, e.type, e.recorded_at, e.hash, e.data, e.meta)
                    for e in events]
    return out


async def views(client: AsyncClient, sids: list[str]) -> dict[str, Any]:
    return {sid: await client.get_session(sid) for sid in sids}


@pytest.mark.fleet
async def test_sqlite_to_postgresql_and_back(pg_url: str, short_dir: str) -> None:
    sqlite_db = os.path.join(short_dir, "local", "sessiond.db")
    local = config_on(os.path.join(short_dir, "local"), sqlite_db)
    async with running_daemon(local) as d, AsyncClient(d.socket) as client:
        sids = await fill(client, "first")
        before = await histories(client, sids)
        seen = await views(client, sids)
    # SQLite -> PostgreSQL.
    code, report, err = await run_migrate(sqlite_db, pg_url)
    assert code == 0, err
    events = sum(len(h) for h in before.values())
    assert report["copied"] == events and report["skipped"] == 0
    fleet = config_on(os.path.join(short_dir, "fleet"), pg_url)
    async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
        assert await histories(client, sids) == before
        assert await views(client, sids) == seen
        assert (await client.verify()).ok
        got = await client.get_checkpoint(sids[0])
        assert got.payload == {"step": "first"}
        assert [f.session_id for f in (await client.forks(sids[0])).forks] == [sids[1]]
    # Resumed: the source goes on; a second run copies only what is new.
    async with running_daemon(local) as d, AsyncClient(d.socket) as client:
        await client.append_message(sids[0], "user", "after the first copy")
        sids += await fill(client, "second")
        before = await histories(client, sids)
        seen = await views(client, sids)
    code, report, err = await run_migrate(sqlite_db, pg_url)
    assert code == 0, err
    assert report["skipped"] == events
    assert report["copied"] == sum(len(h) for h in before.values()) - events
    code, report, err = await run_migrate(sqlite_db, pg_url)
    assert (code, report["copied"]) == (0, 0), err  # nothing missing: nothing copied
    async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
        assert await histories(client, sids) == before
        assert await views(client, sids) == seen
        assert (await client.verify()).ok
        # The fleet writes on; then an operator takes a local copy.
        await client.append_message(sids[2], "user", "written in the fleet")
        before = await histories(client, sids)
        seen = await views(client, sids)
    copy_db = os.path.join(short_dir, "copy", "sessiond.db")
    code, report, err = await run_migrate(pg_url, copy_db)
    assert code == 0, err
    assert report["copied"] == sum(len(h) for h in before.values())
    async with (running_daemon(config_on(os.path.join(short_dir, "copy"), copy_db)) as d,
                AsyncClient(d.socket) as client):
        assert await histories(client, sids) == before
        assert await views(client, sids) == seen
        assert (await client.verify()).ok
        # A history that went another way on each side is not copied over.
        await client.append_message(sids[3], "user", "only in the copy")
    async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
        await client.append_message(sids[3], "user", "only in the fleet")
    code, report, err = await run_migrate(pg_url, copy_db)
    assert code == 2 and report["diverged"] == [sids[3]], (code, report, err)
    assert sids[3] in err


async def test_refusals(short_dir: str) -> None:
    db = os.path.join(short_dir, "d", "sessiond.db")
    async with running_daemon(config_on(os.path.join(short_dir, "d"), db)):
        code, _, err = await run_migrate(db, os.path.join(short_dir, "other.db"))
        assert code == 1 and "in use by another sessiond" in err  # a served SQLite file
    code, _, err = await run_migrate(db, db)
    assert code == 1 and "the same database" in err


async def test_keyed_writes_retried_after_the_move_answer_their_first_result(
        pg_url: str, short_dir: str) -> None:
    """The stored first results of keyed writes are copied (either way): a retry on the
    target answers the first result and writes nothing; the position it quotes is the
    target's (which numbers the copy after what it held)."""
    sqlite_db = os.path.join(short_dir, "local", "sessiond.db")
    async with running_daemon(config_on(os.path.join(short_dir, "local"), sqlite_db)) as d, \
            AsyncClient(d.socket) as client:
        await client.create_session("k", idempotency_key="made")
        first = [await client.append_message("k", "user", f"m{i}", idempotency_key=f"key-{i}")
                 for i in range(3)]
        popped = await client.pop_message("k", idempotency_key="pop")
    fleet = config_on(os.path.join(short_dir, "fleet"), pg_url)
    async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
        await client.create_session("already-there")  # the copy's positions come after
        await client.append_message("already-there", "user", "x")
    code, report, err = await run_migrate(sqlite_db, pg_url)
    assert code == 0 and report["results"] == 5, (report, err)

    async def retried(client: AsyncClient) -> None:
        positions = {e.version: e.position for e in (await client.read_events("k")).events}
        for i, r in enumerate(first):
            again = await client.append_message("k", "user", f"m{i}",
                                                idempotency_key=f"key-{i}")
            assert (again.session_id, again.version) == (r.session_id, r.version)
            assert again.position == positions[r.version]
        again_pop = await client.pop_message("k", idempotency_key="pop")
        assert again_pop.message == popped.message and again_pop.version == popped.version
        state = await client.get_session("k")
        assert (state.version, state.message_count) == (5, 2)  # nothing written again
        assert (await client.verify()).ok

    async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
        assert (await client.read_events("k")).events[0].position == 3  # moved
        await retried(client)
    again_code, again_report, err = await run_migrate(sqlite_db, pg_url)
    assert (again_code, again_report["results"]) == (0, 0), err  # the target has them all
    copy_db = os.path.join(short_dir, "copy", "sessiond.db")
    code, report, err = await run_migrate(pg_url, copy_db)
    assert code == 0 and report["results"] == 5, (report, err)
    async with running_daemon(config_on(os.path.join(short_dir, "copy"), copy_db)) as d, \
            AsyncClient(d.socket) as client:
        await retried(client)
