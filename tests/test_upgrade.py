"""Upgrades keep data: what every earlier release wrote opens, migrates, verifies and serves.

Each folder of tests/fixtures/releases/ was written by that release's own code
(tests/fixtures/releases/generate.py): its database, its export documents, what it
served for each session, and its wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from conftest import daemon_config, eventually, running_daemon, wait_for_daemon

from sessiond import AsyncClient, Client, MethodNotFoundError
from sessiond_daemon.stores.sqlite.migrations import LATEST, MIGRATIONS
from sessiond_schemas import rpc
from sessiond_schemas.export import link_ok, split_v2

pytestmark = pytest.mark.anyio

RELEASES = Path(__file__).resolve().parent / "fixtures" / "releases"
FOLDERS = sorted(p for p in RELEASES.iterdir() if (p / "release.json").exists())


def release(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "release.json").read_text())  # type: ignore[no-any-return]


def expected(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "expected.json").read_text())  # type: ignore[no-any-return]


def common(ours: Any, theirs: Any, where: str = "$") -> list[str]:
    """Where `ours` differs from `theirs` in the fields both have (dicts compared by their
    shared keys, all the way down); [] when they agree."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return [d for k in ours.keys() & theirs.keys()
                for d in common(ours[k], theirs[k], f"{where}.{k}")]
    if isinstance(ours, list) and isinstance(theirs, list):
        if len(ours) != len(theirs):
            return [f"{where}: {len(ours)} items, the release served {len(theirs)}"]
        return [d for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
                for d in common(a, b, f"{where}[{i}]")]
    return [] if ours == theirs else [f"{where}: {ours!r}, the release served {theirs!r}"]


def assert_whole(whole: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    """The whole state (client.session_state_dict) serves what the release's view held,
    the lists it no longer keeps included; and it has every one of them."""
    assert common(whole, theirs, where) == []
    assert whole["progress"]["path"] == theirs["progress"]["path"], where
    assert whole["metrics"]["edges_traversed"] == theirs["metrics"]["edges_traversed"], where


def builtins(value: Any) -> Any:
    """As JSON decoded (an event's data as it is stored: its JSON is kept, not typed)."""
    return msgspec.json.decode(msgspec.json.encode(value))


async def sessions_found(c: AsyncClient, content: str) -> set[str]:
    """Every session that session.search finds for the words of `content` (as a phrase)."""
    words = re.findall(r"\w+", content)
    found: set[str] = set()
    cursor = None
    while True:
        page = await c.search('"' + " ".join(words) + '"', limit=100, cursor=cursor)
        found |= {s.session_id for s in page.sessions}
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


@pytest.fixture(params=FOLDERS, ids=[p.name for p in FOLDERS])
def old(request: pytest.FixtureRequest, short_dir: str) -> Iterator[tuple[Path, str]]:
    """(release folder, a copy of its database in a private directory)."""
    folder: Path = request.param
    db = os.path.join(short_dir, "sessiond.db")
    shutil.copyfile(folder / "sessiond.db", db)
    yield folder, db


def test_every_release_has_a_folder() -> None:
    """The folders hold what the upgrade tests need (a release without them is untested)."""
    assert FOLDERS, "no release fixtures"
    for folder in FOLDERS:
        for name in ("sessiond.db", "expected.json", *(f"exports/{e}" for e in
                                                      release(folder)["exports"])):
            assert (folder / name).is_file(), f"{folder.name}: {name} is missing"
        assert list(folder.glob("sessiond-*.whl")), f"{folder.name}: no wheel"


async def test_upgrade_serves_what_the_release_served(old: tuple[Path, str],
                                                      short_dir: str) -> None:
    """Open, migrate, verify (old hashes), serve the same, accept new writes, restart."""
    folder, db = old
    was = expected(folder)
    config = daemon_config(short_dir, db=db)
    old_version = release(folder)["schema_version"]
    async with running_daemon(config), AsyncClient(config.socket) as c:
        stats = await c.stats()
        assert stats.schema_version == LATEST
        if old_version < LATEST:  # migrated: the copy from before is the release's file
            assert schema_of(db + f".schema-{old_version}.bak")[0] == old_version
        assert (stats.sessions, stats.events, stats.last_position) == (
            was["stats"]["sessions"], was["stats"]["events"], was["stats"]["last_position"])
        report = await c.verify()
        assert report.ok, report.problems
        assert report.checked_sessions == len(was["sessions"])
        for sid, served in was["sessions"].items():
            state = await c.get_session(sid)
            assert common(builtins(state), served["state"], sid) == []
            # The lists the view no longer keeps (protocol 1.2), rebuilt whole from
            # progress.list, are the release's lists.
            assert_whole(await c.session_state_dict(sid), served["state"], sid)
            for version, past in served["at_version"].items():
                then = await c.get_session(sid, at_version=int(version))
                assert common(builtins(then), past, f"{sid}@{version}") == []
                assert_whole(await c.session_state_dict(sid, at_version=int(version)), past,
                             f"{sid}@{version}")
            messages = (await c.list_messages(sid, limit=1000)).messages
            assert common(builtins(messages), served["messages"], f"{sid} messages") == []
            # Migration 4 indexed the old messages: search finds each one's session.
            for m in messages[:3]:
                assert sid in await sessions_found(c, m.content), (sid, m.content)
            events = (await c.read_events(sid, limit=1000)).events
            assert common(builtins(events), served["events"], f"{sid} events") == []
            for cp in served["checkpoints"]:
                got = await c.get_checkpoint(sid, cp["checkpoint_id"])
                assert common(builtins(got), cp, f"{sid} {cp['checkpoint_id']}") == []
            graph = await c.call("graph.list", rpc.GraphListResult, session_id=sid)
            assert common(builtins(graph.tuples), served["graph"], f"{sid} graph") == []
        scoped = await c.call("state.get", rpc.StateGetResult, app_name="fx", user_ids=["u1"])
        assert common(builtins(scoped), was["scoped_state"], "state.get") == []

        # New writes on old sessions carry their hash chains on.
        for sid in was["sessions"]:
            result = await c.append_message(sid, "user", f"after the upgrade: {sid}")
            [last, new] = (await c.read_events(sid, from_version=result.version - 1)).events
            # in the keyed version (2), on the release's unkeyed hashes
            assert split_v2(new.hash) is not None and link_ok(last.hash, new)
        assert (await c.verify()).ok
    # And it starts again on what it migrated and wrote.
    async with running_daemon(config), AsyncClient(config.socket) as c:
        assert (await c.verify()).ok


async def test_old_sessions_take_a_ttl_after_the_upgrade(old: tuple[Path, str],
                                                         short_dir: str) -> None:
    """Migration 7 (idle TTLs) keeps every session and gives none a TTL; an old session
    given one expires through the expiry index, and verifies."""
    folder, db = old
    config = daemon_config(short_dir, db=db, expire_every_s=0.01)
    async with running_daemon(config), AsyncClient(config.socket) as c:
        sids = sorted(expected(folder)["sessions"])
        before = {sid: await c.get_session(sid) for sid in sids}
        assert all((s.ttl_s, s.expires_at) == (None, None) for s in before.values())
        assert schema_of(db)[0] == LATEST
        running = [sid for sid, s in before.items()
                   if s.status in ("pending", "active", "paused")]
        assert running, "the fixture has no running session"
        await c.set_ttl(running[0], 1)
        await eventually(lambda: _status(c, running[0], "expired"), "the old session to expire")
        assert (await c.verify()).ok
        for sid in running[1:]:
            assert (await c.get_session(sid)).status == before[sid].status


async def _status(c: AsyncClient, sid: str, status: str) -> bool:
    return (await c.get_session(sid)).status == status


async def test_old_exports_import(short_dir: str) -> None:
    """Every export document of every release imports and verifies in a fresh daemon."""
    async with running_daemon(daemon_config(short_dir)) as d, AsyncClient(d.socket) as c:
        for folder in FOLDERS:
            for name in release(folder)["exports"]:
                doc = json.loads((folder / "exports" / name).read_text())
                state = await c.import_session(doc, on_conflict="replace")
                if doc["session"] is not None:
                    # An executor's imported history gains one mark that its processes
                    # are not ours to act on (docs/security.md); the rest is as exported.
                    extra = state.version - doc["session"]["version"]
                    assert extra in (0, 1), name
                    ours = await c.session_state_dict(state.session_id)
                    del ours["version"]
                    assert common(ours, doc["session"], name) == []
                    for lists, key in (("progress", "path"), ("metrics", "edges_traversed")):
                        assert ours[lists][key] == doc["session"][lists][key], (name, key)
                # Positions are the store's own; ids, versions, times and hashes are kept.
                events = [{k: v for k, v in builtins(e).items() if k != "position"}
                          for e in (await c.read_events(state.session_id, limit=1000)).events]
                assert common(events[:len(doc["events"])], doc["events"], name) == []
        report = await c.verify()
        assert report.ok, report.problems


def run_daemon(*args: str, env: dict[str, str] | None = None,
               timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sessiond_daemon", "--log-format", "json",
                           *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def logged(result: subprocess.CompletedProcess[str], event: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in result.stderr.splitlines() + result.stdout.splitlines()
             if line.startswith("{")]
    return [line for line in lines if line.get("event") == event]


def schema_of(db: str) -> tuple[int, set[str]]:
    con = sqlite3.connect(db)
    try:
        (version,) = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        con.close()
    return int(version), tables


def old_schema(db: str, version: int) -> None:
    """A database as schema `version` left it (the first migrations only, no rows)."""
    con = sqlite3.connect(db, isolation_level=None)
    con.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    for statements in MIGRATIONS[:version]:
        for sql in statements:
            con.execute(sql)
    con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(version),))
    con.close()


def test_migrate_only_logs_one_line_and_keeps_a_backup(short_dir: str) -> None:
    db = os.path.join(short_dir, "sessiond.db")
    old_schema(db, 1)
    done = run_daemon("--migrate-only", "--db", db, "--socket", os.path.join(short_dir, "s"))
    assert done.returncode == 0, done.stderr
    [migrated] = logged(done, "store.migrated")  # one line for the run
    assert migrated["applied"] == list(range(2, LATEST + 1))
    assert (migrated["from_version"], migrated["schema_version"]) == (1, LATEST)
    assert migrated["new_database"] is False
    assert schema_of(db)[0] == LATEST
    backup = db + ".schema-1.bak"
    assert schema_of(backup)[0] == 1 and os.stat(backup).st_mode & 0o777 == 0o600
    assert not os.path.exists(os.path.join(short_dir, "s")), "--migrate-only must not serve"
    again = run_daemon("--migrate-only", "--db", db, "--socket", os.path.join(short_dir, "s"))
    assert again.returncode == 0 and logged(again, "store.migrated") == []


def test_a_failed_migration_leaves_the_database_as_it_was(short_dir: str) -> None:
    """All pending migrations run in one transaction: one bad statement rolls back all."""
    db = os.path.join(short_dir, "sessiond.db")
    old_schema(db, 1)
    before = schema_of(db)
    code = ("import sys; from sessiond_daemon import __main__;"
            " from sessiond_daemon.stores.sqlite import migrations;"
            " migrations.MIGRATIONS.append(['CREATE TABLE extra (x)', 'CREATE TABLE nope ((']);"
            " migrations.LATEST = len(migrations.MIGRATIONS);"
            " __main__.main(sys.argv[1:])")
    failed = subprocess.run([sys.executable, "-c", code, "--migrate-only", "--db", db,
                             "--socket", os.path.join(short_dir, "s"), "--log-format", "json"],
                            capture_output=True, text=True, timeout=60)
    assert failed.returncode == 78, failed.stderr
    assert f"migration {LATEST + 1}" in failed.stderr
    assert "still at schema version 1" in failed.stderr
    assert schema_of(db) == before  # not even migrations 2 to LATEST, nor `extra`
    assert os.path.exists(db + ".schema-1.bak")


def test_a_newer_database_is_refused_untouched(short_dir: str) -> None:
    db = os.path.join(short_dir, "sessiond.db")
    shutil.copyfile(FOLDERS[-1] / "sessiond.db", db)
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(LATEST + 1),))
    con.commit()
    con.close()
    with open(db, "rb") as f:
        content = f.read()
    refused = run_daemon("--db", db, "--socket", os.path.join(short_dir, "s"))
    assert refused.returncode == 78
    assert f"schema version {LATEST + 1}, newer than this sessiond's {LATEST}" in refused.stderr
    with open(db, "rb") as f:
        assert f.read() == content
    assert not os.path.exists(db + "-wal") or os.path.getsize(db + "-wal") == 0


@pytest.mark.parametrize("stored", ["abc", "-1"])
def test_a_schema_version_changed_by_hand_is_refused(short_dir: str, stored: str) -> None:
    db = os.path.join(short_dir, "sessiond.db")
    shutil.copyfile(FOLDERS[-1] / "sessiond.db", db)
    con = sqlite3.connect(db)
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (stored,))
    con.commit()
    con.close()
    refused = run_daemon("--db", db, "--socket", os.path.join(short_dir, "s"))
    assert refused.returncode == 78, refused.stderr
    assert f"is {stored!r}, not a version any sessiond writes" in refused.stderr
    assert "Traceback" not in refused.stderr


async def test_ping_names_protocol_and_methods(short_dir: str) -> None:
    async with running_daemon(daemon_config(short_dir)) as d, AsyncClient(d.socket) as c:
        ping = await c.ping()
        assert ping.protocol == rpc.PROTOCOL_VERSION
        assert ping.methods == sorted(rpc.METHODS)
        with pytest.raises(MethodNotFoundError) as same:
            await c.call("session.nonexistent")
        assert "no method 'session.nonexistent'" in same.value.message
        assert "check its name" in same.value.message
        assert same.value.data["daemon_version"] == ping.version
        shown = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                         d.socket, "stats"])
        assert f"schema_version: {LATEST}" in shown.stdout.decode()


@pytest.fixture
def old_daemon(short_dir: str) -> Iterator[tuple[str, dict[str, Any], str]]:
    """The oldest release's own daemon, from its wheel, on a copy of its database.

    The wheel is unpacked and put first on PYTHONPATH, so `python -m sessiond_daemon`
    runs that release's code (its metadata names its version) with this environment's
    dependencies, which satisfy its requirements: no network, no second venv.
    """
    folder = FOLDERS[0]
    [wheel] = folder.glob("sessiond-*.whl")
    code = os.path.join(short_dir, "code")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(code)
    db, sock = os.path.join(short_dir, "old.db"), os.path.join(short_dir, "old.sock")
    shutil.copyfile(folder / "sessiond.db", db)
    proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                             "--db", db, "--log-level", "warning"],
                            env={**os.environ, "PYTHONPATH": code})
    try:
        wait_for_daemon(sock, proc)
        yield sock, release(folder), folder.name
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


async def test_current_client_against_the_oldest_release(
        old_daemon: tuple[str, dict[str, Any], str]) -> None:
    """The current client reads an old daemon, and a method it lacks names both releases."""
    sock, info, _ = old_daemon
    async with AsyncClient(sock) as c:
        ping = await c.ping()
        assert ping.version == info["daemon_version"] and ping.protocol == info["protocol"]
        assert ping.protocol != rpc.PROTOCOL_VERSION
        stats = await c.stats()  # what an old daemon does not report is unknown, not 0
        assert stats.schema_version is None and stats.sessions_by_status is None
        state = await c.get_session("all-types")
        assert state.status == "completed" and state.message_count == 4
        with pytest.raises(MethodNotFoundError) as skew:
            await c.call("session.search", query="login test")
    message = skew.value.message
    assert "'session.search'" in message and f"sessiond {info['daemon_version']}" in message
    assert f"protocol {rpc.PROTOCOL_VERSION}" in message and "upgrade the daemon" in message
    assert skew.value.data["daemon_version"] == info["daemon_version"]
    with Client(sock) as c:
        with pytest.raises(MethodNotFoundError) as blocking:
            c.call("session.search", query="login test")
        assert "upgrade the daemon" in blocking.value.message
        with pytest.raises(MethodNotFoundError) as typo:  # a name no release has
            c.call("session.serch", query="login test")
        assert "check its name" in typo.value.message


async def test_an_old_client_reads_the_moved_lists_as_empty(short_dir: str) -> None:
    """docs/upgrading.md: the oldest release's client, against the current daemon, reads
    `progress.path` and `metrics.edges_traversed` (gone from the view in protocol 1.2) as
    empty lists, its other fields right; the current client has no such attributes and
    gets the steps from progress.list."""
    [wheel] = FOLDERS[0].glob("sessiond-*.whl")
    code = os.path.join(short_dir, "code")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(code)
    async with running_daemon(daemon_config(short_dir)) as d, AsyncClient(d.socket) as c:
        s = await c.create_session(task="graph")
        await c.record_progress(s.session_id, "plan", edge="start-plan")
        await c.record_progress(s.session_id, "code", edge="plan-code")
        program = ("import sys, sessiond\n"
                   "s = sessiond.Client(sys.argv[1]).get_session(sys.argv[2])\n"
                   "print(s.progress.path, s.metrics.edges_traversed, s.progress.steps_executed,"
                   " s.progress.current_node)\n")
        old = await anyio.run_process([sys.executable, "-c", program, d.socket, s.session_id],
                                      env={**os.environ, "PYTHONPATH": code}, check=False)
        assert old.returncode == 0, old.stderr.decode()
        assert old.stdout.decode().split() == ["[]", "[]", "2", "code"]
        state = await c.get_session(s.session_id)
        with pytest.raises(AttributeError):
            state.progress.path  # type: ignore[attr-defined]  # noqa: B018
        assert [p.node_id for p in (await c.list_progress(s.session_id)).steps] == [
            "plan", "code"]
        whole = await c.session_state_dict(s.session_id)
        assert whole["progress"]["path"] == ["plan", "code"]
        assert whole["metrics"]["edges_traversed"] == ["start-plan", "plan-code"]
