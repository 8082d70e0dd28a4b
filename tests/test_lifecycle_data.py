"""Verify, backup and cleanup through the real client, the CLI and the database file."""

from __future__ import annotations

import json
import os
import sqlite3
import sys

import anyio
import pg
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon

from sessiond import AsyncClient, InvalidParamsError, SessionNotFoundError
from sessiond_daemon.stores.postgres import dsn

pytestmark = pytest.mark.anyio


def edit(db: str, sql: str, *args: object) -> None:
    """Change the database behind the daemon's back."""
    if dsn.is_postgres(db):
        pg.query(db, sql, *args)
        return
    con = sqlite3.connect(db)
    try:
        con.execute(sql, args)
        con.commit()
    finally:
        con.close()


class TestVerify:
    async def test_clean_then_two_kinds_of_tampering(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        """Clean store: ok. An edited view row, and an event edited in place, are found."""
        for sid in ("v1", "v2"):
            await client.create_session(sid)
            await client.append_messages(sid, [{"role": "user", "content": f"m{i}"}
                                               for i in range(6)])
        clean = await client.verify()
        assert clean.ok and clean.checked_sessions == 2 and clean.problems == []
        state = json.loads(daemon.sql("SELECT state FROM sessions WHERE session_id = 'v1'")[0][0])
        state["message_count"] = 99
        edit(daemon.db, "UPDATE sessions SET state = ? WHERE session_id = 'v1'",
             json.dumps(state).encode())
        data = json.loads(daemon.sql("SELECT data FROM events WHERE session_id = 'v2'"
                                     " AND version = 3")[0][0])
        data["content"] = "forged"
        edit(daemon.db, "UPDATE events SET data = ? WHERE session_id = 'v2' AND version = 3",
             json.dumps(data).encode())
        found = await client.verify()
        assert not found.ok
        problems = {(p.session_id, p.problem.split(" (")[0]) for p in found.problems}
        assert ("v1", "stored view differs from a fresh fold of its events") in problems
        assert ("v2", "hash chain broken at version 3") in problems

    async def test_a_view_left_behind_its_events_is_found(self, daemon: Daemon,
                                                         client: AsyncClient) -> None:
        """A view row at an older version than its events (a commit that left it behind),
        though it folds right as far as it goes: found. (Verify folds the events up to
        the stored view's version, so that a write landing meanwhile is no problem.)"""
        await client.create_session("lag")
        await client.append_messages("lag", [{"role": "user", "content": "a"}])
        old = daemon.sql("SELECT state FROM sessions WHERE session_id = 'lag'")[0][0]
        await client.append_messages("lag", [{"role": "user", "content": "b"}])
        assert (await client.verify()).ok
        edit(daemon.db, "UPDATE sessions SET state = ? WHERE session_id = 'lag'", old)
        found = await client.verify()
        assert [(p.session_id, p.problem) for p in found.problems] == [
            ("lag", "stored view differs from a fresh fold of its events")]

    async def test_cli_exits_non_zero_on_problems(self, daemon: Daemon,
                                                  client: AsyncClient) -> None:
        """`sessionctl verify` prints the problems and exits 1; 0 when clean."""
        await client.create_session("cli-v")
        cmd = [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "verify"]
        ok = await anyio.run_process(cmd, check=False)
        assert ok.returncode == 0 and b"ok: 1 sessions checked" in ok.stdout
        edit(daemon.db, "UPDATE events SET hash = 'bad' WHERE session_id = 'cli-v'")
        bad = await anyio.run_process(cmd, check=False)
        assert bad.returncode == 1 and b"hash chain broken" in bad.stdout


async def test_backup_while_writers_run(short_dir: str) -> None:
    """A backup taken while 8 writers append is a valid database a new daemon serves."""
    target = os.path.join(short_dir, "backup.db")
    async with running_daemon(daemon_config(short_dir)) as d, AsyncClient(d.socket) as c:
        for i in range(8):
            await c.create_session(f"b{i}")
        backed_up = anyio.Event()
        written = [0] * 8  # acknowledged appends, per writer

        async def writer(i: int) -> None:
            async with AsyncClient(d.socket) as own:
                while not backed_up.is_set() or written[i] < 20:
                    await own.append_message(f"b{i}", "user", f"{written[i]}")
                    written[i] += 1

        async with anyio.create_task_group() as tg:
            for i in range(8):
                tg.start_soon(writer, i)
            await eventually(lambda: min(written) >= 5, "every writer's first 5 appends")
            result = await c.backup(target)
            backed_up.set()
        # The backup holds at least the 8 creations and the 40 appends acknowledged before it.
        assert result.path == target and result.bytes > 0 and result.position >= 8 + 8 * 5
        with pytest.raises(InvalidParamsError):
            await c.backup(target)  # never overwrites
        with pytest.raises(InvalidParamsError):
            await c.backup("relative.db")
    restored = os.path.join(short_dir, "restored")
    os.mkdir(restored)
    config = daemon_config(restored, db=target)
    async with running_daemon(config) as d2, AsyncClient(d2.socket) as c2:
        check = await c2.verify()
        assert check.ok and check.checked_sessions == 8
        assert (await c2.stats()).last_position == result.position
        assert (await c2.get_session("b0")).message_count >= 5


class TestCleanup:
    async def test_removes_only_what_matches(self, daemon: Daemon, client: AsyncClient) -> None:
        """Only ended sessions of the given statuses and age go; they are gone everywhere."""
        for sid, to in (("done", "completed"), ("broke", "failed"), ("stopped", "cancelled"),
                        ("running", None)):
            await client.create_session(sid)
            await client.append_message(sid, "user", "x")
            if to:
                await client.transition(sid, to)
        assert (await client.cleanup(older_than_days=1)).deleted == 0  # all too recent
        dry = await client.cleanup(older_than_days=0, statuses=["completed", "failed"],
                                   dry_run=True)
        assert sorted(dry.session_ids) == ["broke", "done"]
        assert len((await client.list_sessions()).sessions) == 4  # a dry run deletes nothing
        done = await client.cleanup(older_than_days=0, statuses=["completed", "failed"])
        assert (done.deleted, done.session_ids) == (2, ["broke", "done"])
        left = {s.session_id for s in (await client.list_sessions()).sessions}
        assert left == {"stopped", "running"}
        for sid in ("done", "broke"):
            with pytest.raises(SessionNotFoundError):
                await client.get_session(sid)
            assert daemon.sql("SELECT COUNT(*) FROM events WHERE session_id = ?", sid) == [(0,)]
        assert {e.session_id for e in (await client.read_events()).events} == left

    async def test_cli_and_periodic_retention(self, short_dir: str) -> None:
        """`sessionctl cleanup --dry-run`, and the daemon's own periodic retention."""
        config = daemon_config(short_dir, cleanup_older_than_days=0.0000001, cleanup_every_s=0.05)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            await c.create_session("old-news")
            await c.transition("old-news", "completed")
            with anyio.fail_after(10):
                while (await c.list_sessions()).sessions:
                    await anyio.sleep(0.02)
            await c.create_session("kept")
            await c.transition("kept", "killed")
            out = await anyio.run_process(
                [sys.executable, "-m", "sessiond.cli", "--socket", d.socket, "cleanup",
                 "--older-than", "1d", "--dry-run"])
            assert b"would delete 0 sessions" in out.stdout
