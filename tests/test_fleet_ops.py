"""Fleet mode's operations with real daemons on one per-run PostgreSQL database: executors
stay with the host that started them, and the daemons ride out a PostgreSQL restart and
terminated backends without losing an acknowledged write."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pg
import pytest
from conftest import daemon_config, eventually, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import OtherHostError, SessiondError

pytestmark = pytest.mark.anyio

TOOL = [sys.executable, str(Path(__file__).resolve().parent / "executors" / "tool.py")]


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def host_config(short_dir: str, name: str, pg_url: str, **overrides: Any) -> Any:
    """A daemon config for "host" `name`: its own socket, the shared database."""
    os.makedirs(os.path.join(short_dir, name), exist_ok=True)
    return daemon_config(os.path.join(short_dir, name), db=pg_url, host_name=name,
                         kill_grace_s=0.5, **overrides)


async def started_event(client: AsyncClient, sid: str) -> dict[str, Any]:
    events = (await client.read_events(sid)).events
    return [e.fields() for e in events if e.type == "process.started"][-1]  # as stored


async def event_types(client: AsyncClient, sid: str) -> list[str]:
    return [e.type for e in (await client.read_events(sid)).events]


async def _outputs(client: AsyncClient, sid: str, n: int) -> bool:
    return (await event_types(client, sid)).count("process.output") >= n


async def test_executors_stay_with_the_host_that_started_them(pg_url: str,
                                                              short_dir: str) -> None:
    alpha, beta = (host_config(short_dir, n, pg_url) for n in ("alpha", "beta"))
    async with (running_daemon(alpha) as a, AsyncClient(a.socket) as on_a):
        async with running_daemon(beta) as b, AsyncClient(b.socket) as on_b:
            await on_a.spawn([*TOOL, "quiet"], session_id="q")
            assert (await started_event(on_b, "q"))["host"] == "alpha"
            # Through beta: a clear error that names alpha, and nothing is written. (The
            # tool's three lines first: their events come in after process.started.)
            await eventually(lambda: _outputs(on_a, "q", 3), "the tool's three lines")
            before = await event_types(on_a, "q")
            with pytest.raises(OtherHostError, match="host alpha") as refused:
                await on_b.kill("q")
            assert refused.value.code == -32013
            assert refused.value.data == {"session_id": "q", "host": "alpha"}
            with pytest.raises(OtherHostError, match="host alpha"):
                await on_b.inject("q", "hello?")
            assert await event_types(on_a, "q") == before
            # A finished turn is continued only by its host too.
            await on_a.spawn([*TOOL, "jsonl"], task="plan it", session_id="j")
            await eventually(lambda: _ended(on_a, "j"), "j's first turn to end")
            with pytest.raises(OtherHostError) as refused:
                await on_b.inject("j", "go on")
            assert refused.value.data["host"] == "alpha"
            await on_a.inject("j", "go on")
            await eventually(lambda: _ended(on_a, "j"), "j's second turn to end")
            # Beta's own executors are beta's.
            await on_b.spawn([*TOOL, "quiet"], session_id="qb")
            assert (await started_event(on_a, "qb"))["host"] == "beta"
            with pytest.raises(OtherHostError, match="host beta"):
                await on_a.kill("qb")
            assert (await on_b.kill("qb")).status == "killed"
        # Beta restarts while alpha's process runs: its recovery leaves alpha's turn alone
        # (a host that recorded it as lost would fail a session that runs elsewhere).
        async with running_daemon(beta) as b, AsyncClient(b.socket) as on_b:
            assert (await on_b.get_session("q")).status == "active"
            assert "process.detached" not in await event_types(on_b, "q")
        assert (await on_a.kill("q")).status == "killed"


async def _ended(client: AsyncClient, sid: str) -> bool:
    return (await client.get_session(sid)).status != "active"


# --- PostgreSQL faults under load ---------------------------------------------------------

WRITERS = 8
WRITES_EACH = 30


async def _load(clients: list[AsyncClient], sids: list[str], fault: Any) -> dict[str, list[str]]:
    """WRITERS writers append WRITES_EACH messages each, spread over `clients` and `sids`,
    each with its own idempotency key, retrying a failed write (through the next daemon)
    until it is acknowledged; `fault()` runs once the load is going. Returns the
    acknowledged contents per session."""
    acknowledged: dict[str, list[str]] = {sid: [] for sid in sids}
    going = anyio.Event()
    retried = 0

    async def writer(w: int) -> None:
        nonlocal retried
        sid = sids[w % len(sids)]
        for i in range(WRITES_EACH):
            content = f"w{w}-{i}"
            attempt = 0
            while True:
                client = clients[(w + attempt) % len(clients)]
                try:
                    await client.append_message(sid, "user", content, idempotency_key=content)
                    break
                except SessiondError as exc:
                    # Retryable while the database is away (-32012) or a queue is full.
                    assert exc.code in (-32012, -32008), exc
                    retried += 1
                    attempt += 1
                    await anyio.sleep(0.05)
            acknowledged[sid].append(content)
            if w == 0 and i == 3:
                going.set()

    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for w in range(WRITERS):
                tg.start_soon(writer, w)
            await going.wait()
            await fault()
    return acknowledged


async def _check_exactly_once(client: AsyncClient, acknowledged: dict[str, list[str]]) -> None:
    for sid, contents in acknowledged.items():
        messages = (await client.list_messages(sid, limit=1000)).messages
        stored = [m.content for m in messages]
        assert sorted(stored) == sorted(contents), sid  # every acknowledged write, once
        versions = [e.version for e in (await client.read_events(sid)).events]
        assert versions == list(range(1, len(versions) + 1))
    report = await client.verify()
    assert report.ok, report


async def _terminate_backends(pg_url: str) -> int:
    import asyncpg

    name = pg_url.rsplit("/", 1)[1]
    con = await asyncpg.connect(pg.SERVER, timeout=5)
    try:
        rows = await con.fetch("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                               " WHERE datname = $1 AND pid <> pg_backend_pid()", name)
    finally:
        await con.close()
    return len(rows)


async def _run_with_fault(pg_url: str, short_dir: str, fault: Any) -> None:
    configs = [host_config(short_dir, n, pg_url) for n in ("alpha", "beta")]
    async with (running_daemon(configs[0]) as a, running_daemon(configs[1]) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        sids = [(await on_a.create_session()).session_id for _ in range(3)]
        acknowledged = await _load([on_a, on_b], sids, fault)
        # Both daemons serve again without a restart.
        for client in (on_a, on_b):
            await client.append_message(sids[0], "user", "after", idempotency_key="after")
        acknowledged[sids[0]].append("after")
        await _check_exactly_once(on_b, acknowledged)


async def test_terminated_backends_lose_no_acknowledged_write(pg_url: str,
                                                              short_dir: str) -> None:
    async def fault() -> None:
        for _ in range(3):
            assert await _terminate_backends(pg_url) > 0
            await anyio.sleep(0.2)

    await _run_with_fault(pg_url, short_dir, fault)


RESTART = os.environ.get("SESSIOND_TEST_PG_RESTART") == "1"
CLUSTER = os.environ.get("SESSIOND_TEST_PG_CLUSTER", "15 main")


def _cluster(action: str) -> None:
    subprocess.run(["pg_ctlcluster", *CLUSTER.split(), action], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# In the long suites' run, which is one process: the default run's other workers use the
# same server.
@pytest.mark.fleet
@pytest.mark.skipif(not RESTART, reason="restarts the PostgreSQL server: set"
                    " SESSIOND_TEST_PG_RESTART=1 (as .ci/run does) to allow it")
async def test_a_postgresql_restart_loses_no_acknowledged_write(pg_url: str,
                                                                short_dir: str) -> None:
    async def fault() -> None:
        await anyio.to_thread.run_sync(_cluster, "restart")

    try:
        await _run_with_fault(pg_url, short_dir, fault)
    finally:
        # The server is back whatever happened (a restart that failed midway included).
        if not await anyio.to_thread.run_sync(_online):
            await anyio.to_thread.run_sync(_cluster, "start")


def _online() -> bool:
    out = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, timeout=30)
    return any(line.split()[:2] == CLUSTER.split() and "online" in line
               for line in out.stdout.splitlines())


@pytest.mark.fleet
async def test_a_host_still_on_the_last_release_is_fenced_off_until_upgraded(
        short_dir: str, pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rolling upgrade (docs/upgrading.md): a host still serving the last release
    (9b19302, schema 5) while another starts this one (PostgreSQL migrations 6 to 9). Only
    starting hosts wait for the migration's lock; before the fence (migration 9) the old
    host went on writing past migrations 6 and 7: its events never reached search_index
    (verify reported them) and its deletes wrote no `deletions` rows. Now its writes fail,
    retryable, saying to upgrade it, nothing of them written; upgraded, it writes again."""
    from test_fleet import Host

    from sessiond import StorageError

    old = os.path.join(short_dir, "old")
    os.mkdir(old)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(["git", "-C", repo, "archive", "9b19302"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", old], input=archive, check=True)
    previous = Host(short_dir, 0, pg_url)
    upgraded = Host(short_dir, 1, pg_url)
    with monkeypatch.context() as m:
        m.setenv("PYTHONPATH", ":".join(os.path.join(old, p) for p in
                                        ("client", "daemon", "schemas", "")))
        await previous.start()  # the last release: migrates to its schema (5)
    try:
        async with AsyncClient(previous.socket) as c:
            await c.create_session("before")
            await c.append_message("before", "user", "written before the upgrade")
        await upgraded.start()  # this release: PostgreSQL migrations 6 to 9
        async with AsyncClient(upgraded.socket) as c:
            await c.create_session("new")
        async with AsyncClient(previous.socket) as c:
            for write in (c.create_session("during"),
                          c.append_message("before", "user", "written by the old host"),
                          c.delete_session("new")):
                with pytest.raises(StorageError) as refused:
                    await write
                assert refused.value.data["retryable"] is True
                assert "upgrade this host" in refused.value.message
        async with AsyncClient(upgraded.socket) as c:
            assert sorted(s.session_id for s in (await c.list_sessions()).sessions) == [
                "before", "new"]
            assert (await c.get_session("before")).version == 2
            assert [s.session_id for s in (await c.search("written")).sessions] == ["before"]
            report = await c.verify()
            assert report.ok, report.problems
        previous.stop()  # upgraded: this release, on the same socket
        previous = Host(short_dir, 0, pg_url)
        await previous.start()
        async with AsyncClient(previous.socket) as c:
            await c.create_session("during")
            await c.append_message("during", "user", "written by the upgraded host")
            assert await c.delete_session("new")
        async with AsyncClient(upgraded.socket) as c:
            found = await c.search("written")
            assert sorted(s.session_id for s in found.sessions) == ["before", "during"]
            report = await c.verify()
            assert report.ok, report.problems
    finally:
        previous.stop()
        upgraded.stop()
