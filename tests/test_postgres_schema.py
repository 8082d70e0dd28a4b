"""The PostgreSQL schema: numbered migrations, run once under the advisory lock."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio
import pg
import pytest

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_a_new_database_is_migrated_to_latest(pg_url: str) -> None:
    from sessiond_daemon.stores.postgres import schema
    from sessiond_daemon.stores.postgres.store import PostgresStore

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


async def test_tables_names_every_table_the_migrations_create(pg_url: str) -> None:
    """schema.TABLES (what daemon.stats' db_bytes counts) is what the migrations make."""
    import asyncpg

    from sessiond_daemon.stores.postgres import schema
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    con = await asyncpg.connect(pg_url)
    try:
        made = {r[0] for r in await con.fetch(
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p', 'm')"
            " AND relnamespace = current_schema()::regnamespace")}
    finally:
        await con.close()
    assert made == set(schema.TABLES)
    assert len(schema.TABLES) == len(made)


async def test_concurrent_opens_migrate_once(pg_url: str) -> None:
    """Daemons starting at once: one migrates, the others wait on the advisory lock, then
    find the schema current. None fails (without the lock, the second CREATE TABLE would)."""
    from sessiond_daemon.stores.postgres import schema
    from sessiond_daemon.stores.postgres.store import PostgresStore

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

    from sessiond_daemon.stores.postgres import schema
    from sessiond_daemon.stores.postgres.store import PostgresStore
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
    from sessiond_daemon.stores.postgres import schema

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


async def test_past_a_newer_releases_fence_writes_fail_retryable_and_reads_go_on(
        client: Any, store_kind: str, db_url: str) -> None:
    """A newer release's migration moves the fence (schema.fence) past this code's schema:
    this host's writes then fail, -32012 retryable, saying to upgrade it, and write
    nothing; its reads go on."""
    if store_kind != "postgresql":
        pytest.skip("the fence is PostgreSQL's")
    import asyncpg

    from sessiond import StorageError
    from sessiond_daemon.stores.postgres import schema

    await client.create_session("s")
    con = await asyncpg.connect(db_url)
    try:
        for sql in schema.fence(schema.LATEST + 1):
            await con.execute(sql)
    finally:
        await con.close()
    for write in (client.append_message("s", "user", "past the fence"),
                  client.create_session("t"), client.delete_session("s")):
        with pytest.raises(StorageError) as refused:
            await write
        assert refused.value.data["retryable"] is True
        assert f"migrated to schema {schema.LATEST + 1} by a newer sessiond" in (
            refused.value.message)
        assert "upgrade this host" in refused.value.message
    assert (await client.get_session("s")).version == 1
    assert [s.session_id for s in (await client.list_sessions()).sessions] == ["s"]


async def test_the_fence_goes_up_before_the_migrations_it_guards(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Migrating a schema-6 database: while migration 7 (the search index's backfill, the
    long one) runs, an older release's write (a connection not saying it speaks this
    schema) must already wait for the fence, not slip in unindexed; after, it is refused."""
    import asyncpg

    from sessiond_daemon.stores.postgres import schema
    from sessiond_daemon.stores.postgres.store import PostgresStore

    store = PostgresStore(pg_url)
    await store.open()
    await store.close()
    con = await asyncpg.connect(pg_url)
    try:
        for sql in ("DROP TRIGGER events_fence ON events", "DROP FUNCTION sessiond_fence()",
                    "DROP TABLE search_index",
                    "UPDATE meta SET value = '6' WHERE key = 'schema_version'"):
            await con.execute(sql)
    finally:
        await con.close()

    async def old_host_write() -> str:
        other = await asyncpg.connect(pg_url)
        try:
            await other.execute("SET lock_timeout = '200ms'")
            await other.execute("DELETE FROM events WHERE false")  # the trigger still fires
            return "written"
        except asyncpg.LockNotAvailableError:
            return "waits"
        except asyncpg.CannotConnectNowError as exc:
            return "refused: " + str(exc)
        finally:
            await other.close()

    seen: list[str] = []
    backfill = schema.MIGRATIONS[6][-1]
    assert callable(backfill)

    async def probing(con: Any) -> None:
        seen.append(await old_host_write())
        await backfill(con)

    migrations = [list(m) for m in schema.MIGRATIONS]
    migrations[6][-1] = probing
    monkeypatch.setattr(schema, "MIGRATIONS", migrations)
    again = PostgresStore(pg_url)
    await again.open()
    await again.close()
    assert again.migrated == list(range(7, schema.LATEST + 1))
    assert seen == ["waits"]
    after = await old_host_write()
    assert after.startswith("refused: this database was migrated to schema 9"), after
