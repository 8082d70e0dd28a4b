"""The PostgreSQL schema: numbered migrations, run once under the advisory lock."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import anyio
import pg
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_a_new_database_is_migrated_to_latest(pg_url: str) -> None:
    from sessiond_daemon.postgres import schema
    from sessiond_daemon.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    try:
        assert store.migrated == list(range(1, schema.LATEST + 1))
        assert store.schema_version == schema.LATEST
        assert await store.last_position() == 0
    finally:
        await store.close()
    again = PostgresStore(pg_url)
    await again.open()
    try:
        assert again.migrated == []  # already current: nothing applied twice
    finally:
        await again.close()


async def test_concurrent_opens_migrate_once(pg_url: str) -> None:
    """Daemons starting at once: one migrates, the others wait on the advisory lock, then
    find the schema current. None fails (without the lock, the second CREATE TABLE would)."""
    from sessiond_daemon.postgres import schema
    from sessiond_daemon.postgres.store import PostgresStore

    stores = [PostgresStore(pg_url) for _ in range(4)]
    async with anyio.create_task_group() as tg:
        for store in stores:
            tg.start_soon(store.open)
    try:
        applied = sorted((s.migrated for s in stores), key=len)
        assert applied == [[], [], [], list(range(1, schema.LATEST + 1))]
        assert {s.schema_version for s in stores} == {schema.LATEST}
    finally:
        for store in stores:
            await store.close()


async def test_a_newer_schema_is_refused_untouched(pg_url: str) -> None:
    import asyncpg

    from sessiond_daemon.postgres import schema
    from sessiond_daemon.postgres.store import PostgresStore
    from sessiond_daemon.stores.schema import SchemaTooNew

    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    con = await asyncpg.connect(pg_url)
    try:
        await con.execute("UPDATE meta SET value = $1 WHERE key = 'schema_version'",
                          str(schema.LATEST + 1))
        with pytest.raises(SchemaTooNew, match="newer than this sessiond"):
            await PostgresStore(pg_url).open()
        assert await con.fetchval("SELECT value FROM meta") == str(schema.LATEST + 1)
        # The lock was given back: another daemon is not stuck behind the refused one.
        assert await con.fetchval("SELECT pg_try_advisory_lock($1)", schema.ADVISORY_LOCK)
    finally:
        await con.close()


def test_a_daemon_refuses_a_newer_schema_with_its_reason(pg_url: str,
                                                         tmp_path: pathlib.Path) -> None:
    """The daemon on a database a newer sessiond migrated exits 78 (a configuration
    error: restarting cannot help) saying why, as on SQLite, never with a traceback."""
    from sessiond_daemon.postgres import schema

    socket_dir = tempfile.mkdtemp(prefix="sd-", dir="/tmp")
    migrated = subprocess.run(
        [sys.executable, "-m", "sessiond_daemon", "--db", pg_url, "--migrate-only"],
        capture_output=True, text=True, timeout=120, check=False)
    assert migrated.returncode == 0, migrated.stderr
    pg.query(pg_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'",
             str(schema.LATEST + 1))
    refused = subprocess.run(
        [sys.executable, "-m", "sessiond_daemon", "--log-format", "json", "--db", pg_url,
         "--socket", os.path.join(socket_dir, "s")],
        capture_output=True, text=True, timeout=120, check=False)
    assert refused.returncode == 78, refused.stderr
    assert "newer than this sessiond" in refused.stderr
    assert "Traceback" not in refused.stderr
