"""Storage shape: message pages read by index, durability settings, the database file."""

from __future__ import annotations

import sqlite3

import pytest
from conftest import Daemon

from sessiond import AsyncClient
from sessiond_daemon.stores.models.queries import messages_page_sql
from sessiond_daemon.stores.sqlite.migrations import MIGRATIONS

pytestmark = pytest.mark.anyio


def vm_steps(db: str, sql: str, args: tuple[object, ...]) -> int:
    """Count SQLite virtual-machine steps for a query: work done, not time taken."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    steps = 0

    def tick() -> int:
        nonlocal steps
        steps += 1
        return 0

    con.set_progress_handler(tick, 1)
    try:
        rows = con.execute(sql, args).fetchall()
        assert rows
    finally:
        con.close()
    return steps


@pytest.mark.sqlite_only("SQLite's query plan and VM steps")
async def test_message_page_reads_only_the_page(daemon: Daemon, client: AsyncClient) -> None:
    """message.list's query searches the primary key and its cost does not grow with history."""
    await client.create_session("short")
    await client.create_session("long")
    await client.append_messages("short", [{"role": "user", "content": f"s{i}"}
                                           for i in range(100)])
    for chunk in range(5):
        await client.append_messages("long", [{"role": "user", "content": f"l{chunk}-{i}"}
                                              for i in range(2000)])
    for descending in (False, True):
        sql = messages_page_sql(descending)
        plan = " ".join(str(r) for r in daemon.sql("EXPLAIN QUERY PLAN " + sql, "long", 50, 20))
        assert "SEARCH m USING PRIMARY KEY (session_id=? AND sequence" in plan
        assert "SCAN m" not in plan and "TEMP B-TREE" not in plan
    short = vm_steps(daemon.db, messages_page_sql(False), ("short", 50, 20))
    middle = vm_steps(daemon.db, messages_page_sql(False), ("long", 5000, 20))
    latest = vm_steps(daemon.db, messages_page_sql(True), ("long", 9999, 20))
    assert middle <= short * 1.5 and latest <= short * 1.5
    page = await client.list_messages("long", after_sequence=5000, limit=20)
    assert [m.sequence for m in page.messages] == list(range(5001, 5021))


@pytest.mark.sqlite_only("the SQLite file's journal mode")
async def test_database_is_wal_and_migrated(daemon: Daemon) -> None:
    """The file is in WAL mode and carries its schema version."""
    assert daemon.sql("PRAGMA journal_mode") == [("wal",)]
    assert daemon.sql("SELECT value FROM meta WHERE key = 'schema_version'") == [
        (str(len(MIGRATIONS)),)]


async def test_database_and_socket_modes(daemon: Daemon) -> None:
    """The socket is 0600 and directories the daemon makes are 0700."""
    import os
    import stat

    assert stat.S_IMODE(os.stat(daemon.socket).st_mode) == 0o600


async def test_snapshots_at_every_boundary(daemon: Daemon, client: AsyncClient) -> None:
    """One command crossing several snapshot boundaries stores a snapshot at each."""
    assert daemon.config.snapshot_every == 4
    await client.create_session("snap")
    await client.append_messages("snap", [{"role": "user", "content": f"m{i}"} for i in range(10)])
    versions = [v for (v,) in daemon.sql(
        "SELECT version FROM snapshots WHERE session_id = 'snap' ORDER BY version")]
    assert versions == [4, 8]
    past = await client.get_session("snap", at_version=6)
    assert past.version == 6 and past.message_count == 5
    assert past.last_message is not None and past.last_message.content == "m4"


@pytest.mark.sqlite_only("SQLite's query plan and VM steps")
async def test_session_list_stays_flat_with_filters(daemon: Daemon, client: AsyncClient) -> None:
    """A page of an old, small namespace costs no more than one of a big, new one."""
    from sessiond_daemon.stores.interface import SessionFilters
    from sessiond_daemon.stores.models.views import list_sessions_sql

    for _ in range(50):
        await client.create_session(namespace="old")
    await client.call("session.list")  # warm
    for _ in range(1500):
        await client.create_session(namespace="new")
    for statuses in ((), ("active",)):
        steps = {}
        for ns in ("old", "new"):
            sql, args = list_sessions_sql(SessionFilters(namespace=ns, statuses=statuses), 21, None)
            plan = " ".join(str(r) for r in daemon.sql("EXPLAIN QUERY PLAN " + sql, *args))
            assert "USING INDEX sessions_by_namespace" in plan and "TEMP B-TREE" not in plan
            steps[ns] = vm_steps(daemon.db, sql, args)
        assert steps["old"] <= steps["new"] * 1.5
