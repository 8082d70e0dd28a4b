"""Messages that say what happened (issue 27, section 5): whose PATH a spawn searched, why a
session has no executor turn to continue or read, search on PostgreSQL, and the daemon's
migration and database log lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pg
import pytest
from conftest import Daemon, eventually, wait_for_daemon, wait_until

from sessiond import AsyncClient, InvalidParamsError
from sessiond_daemon.stores.sqlite.migrations import LATEST

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).parent.parent
NO_SUCH = "no-such-agent-cli-b27"


async def sessionctl(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                    daemon.socket, *args], check=False)


async def ended(client: AsyncClient, sid: str) -> None:
    async def done() -> bool:
        return (await client.get_session(sid)).status != "active"
    await eventually(done, f"session {sid}'s turn to end")


class TestWhosePath:
    async def test_the_daemon_s_path_is_named_with_what_it_held(self, client: AsyncClient) -> None:
        """A bare name not on the daemon's PATH: the message says it was the daemon's PATH,
        what it held, and that the caller's PATH is not used."""
        state = await client.spawn([NO_SUCH, "exec"])
        assert state.status == "failed"
        assert state.error == (
            f"executable not found on the daemon's PATH: {NO_SUCH} (searched"
            f" PATH={os.environ['PATH']}; the caller's PATH is not used: give an absolute"
            " path, or PATH in env)")

    async def test_a_path_given_in_env_is_named_as_that(self, client: AsyncClient) -> None:
        """With PATH in the spawn's env, that one is searched, and the message says so."""
        state = await client.spawn([NO_SUCH], env={"PATH": "/nonexistent-b27:/also-not"})
        assert state.error == (f"executable not found on the PATH the spawn's env gave:"
                               f" {NO_SUCH} (searched PATH=/nonexistent-b27:/also-not)")


class TestNeverStarted:
    async def test_inject_says_the_executor_never_started(self, client: AsyncClient) -> None:
        """inject on a spawn whose process never started says that, with the reason, not
        that the session was not spawned."""
        state = await client.spawn([NO_SUCH], task="go")
        with pytest.raises(InvalidParamsError) as refused:
            await client.inject(state.session_id, "again")
        message = refused.value.message
        assert message.startswith(f"session {state.session_id} has no executor to continue:"
                                  f" its executor never started (executable not found on the"
                                  f" daemon's PATH: {NO_SUCH} (searched PATH=")
        assert message.endswith("); spawn it again")
        assert "session.spawn" not in message
        assert refused.value.data == {"detail": "no executor", "path": "$.session_id"}

    async def test_inject_on_a_session_no_spawn_made(self, client: AsyncClient) -> None:
        s = await client.create_session()
        await client.transition(s.session_id, "completed")
        with pytest.raises(InvalidParamsError, match="no executor was ever started for it"):
            await client.inject(s.session_id, "hello")

    async def test_output_of_a_turn_that_never_ran(self, client: AsyncClient,
                                                   daemon: Daemon) -> None:
        """session.output of a spawn that never started is -32602 saying so; sessionctl
        output exits 1 with that line and prints nothing on stdout."""
        sid = (await client.spawn([NO_SUCH])).session_id
        for turn, path in ((1, "$.turn"), (None, "$.session_id")):
            with pytest.raises(InvalidParamsError) as refused:
                await client.output(sid, turn=turn)
            assert refused.value.message.startswith(
                f"session {sid} has no turn {turn or 0}: its executor never started"
                f" (executable not found on the daemon's PATH: {NO_SUCH}")
            assert refused.value.data == {"detail": "no such turn", "path": path, "turns": 0}
        shown = await sessionctl(daemon, "output", sid, "--turn", "1")
        assert (shown.returncode, shown.stdout) == (1, b"")
        assert b"its executor never started" in shown.stderr
        assert b"Traceback" not in shown.stderr

    async def test_output_past_the_last_turn_and_of_a_silent_one(self, client: AsyncClient,
                                                                 daemon: Daemon) -> None:
        """A turn past the last one names the turns there are; a turn that ran and printed
        nothing prints nothing (no empty line) and exits 0."""
        sid = (await client.spawn([sys.executable, "-c", "pass"])).session_id
        await ended(client, sid)
        with pytest.raises(InvalidParamsError, match=f"session {sid} has no turn 3: its turns"
                                                     " are 1 to 1"):
            await client.output(sid, turn=3)
        assert (await client.output(sid, turn=1)).lines == []
        shown = await sessionctl(daemon, "output", sid, "--turn", "1")
        assert (shown.returncode, shown.stdout, shown.stderr) == (0, b"", b"")


async def test_search_says_where_it_is_served(client: AsyncClient, store_kind: str) -> None:
    """Search answers on both stores, as the README says plainly."""
    s = await client.create_session(task="find the needle")
    found = await client.search("needle")
    assert [hit.session_id for hit in found.sessions] == [s.session_id]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "Search works on both stores" in readme


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_a_new_sqlite_database_logs_one_migration_line(short_dir: str) -> None:
    """A new database: one `store.migrated` line naming every migration applied."""
    db = os.path.join(short_dir, "new.db")
    done = subprocess.run([sys.executable, "-m", "sessiond_daemon", "--log-format", "json",
                           "--migrate-only", "--db", db, "--socket",
                           os.path.join(short_dir, "s")], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    migrated = [e for e in json_lines(done.stderr) if e.get("event") == "store.migrated"]
    assert len(migrated) == 1, migrated
    assert migrated[0]["applied"] == list(range(1, LATEST + 1))
    assert (migrated[0]["from_version"], migrated[0]["schema_version"]) == (0, LATEST)
    assert migrated[0]["new_database"] is True


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def terminate_backends(url: str) -> int:
    """Cut every connection to the database `url` but this one (as a failover would)."""
    import asyncpg

    async def run() -> int:
        con = await asyncpg.connect(pg.SERVER, timeout=5)
        try:
            rows = await con.fetch("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                   " WHERE datname = $1 AND pid <> pg_backend_pid()",
                                   url.rsplit("/", 1)[1])
        finally:
            await con.close()
        return len(rows)
    return anyio.run(run)


def log_events(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [e.get("event", "") for e in json_lines(f.read())]


def test_a_fleet_daemon_s_first_start_logs_no_return(pg_url: str) -> None:
    """A fleet daemon's first start logs one `store.migrated` line and no
    `daemon.database_back`; once its connections are cut it logs database_lost, then
    database_back, once each."""
    with tempfile.TemporaryDirectory(prefix="sd-") as d:
        sock, log = os.path.join(d, "s.sock"), os.path.join(d, "daemon.log")
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--log-format",
                                     "json", "--log-level", "info", "--db", pg_url,
                                     "--socket", sock, "--host-name", "b27"], stderr=out)
        try:
            wait_for_daemon(sock, proc)
            wait_until(lambda: "store.listening" in log_events(log), "the store to listen")
            first = log_events(log)
            assert first.count("store.migrated") == 1
            assert "daemon.database_back" not in first and "daemon.database_lost" not in first
            assert terminate_backends(pg_url) > 0

            def listening_again() -> bool:
                assert proc.poll() is None, log_events(log)
                return log_events(log).count("store.listening") >= 2

            wait_until(listening_again, "the store to listen again")
            after = log_events(log)[len(first):]
            assert [e for e in after if e.startswith("daemon.database_")] == [
                "daemon.database_lost", "daemon.database_back"]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
