"""A PostgreSQL database of its own for each test that asks for one (`pg_url`).

The server is $SESSIOND_TEST_POSTGRES (default postgresql://postgres@127.0.0.1:5432/test,
trust auth, as on this project's machines). Each `pg_url` is a new database,
sessiond_test_<pid>_<random>, dropped after the test. With no server the test skips,
unless SESSIOND_REQUIRE_POSTGRES=1 (as .ci/run sets), where it fails.

The daemon tests that run on both stores (conftest's `store`) share one database per
test module instead, emptied (`empty`) before each test: creating and dropping a
database costs 100-700 ms on this machine's server, emptying the migrated tables about
a millisecond, and a daemon opening an already-migrated database skips the migration.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec
import pytest

from sessiond_daemon.core import projection
from sessiond_daemon.stores.interface import Batch, Entry, Template
from sessiond_schemas.events import CURRENT_SCHEMA_VERSION, Event, EventMeta, new_id, now
from sessiond_schemas.export import canonical, chain_hash

SERVER = os.environ.get("SESSIOND_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
REQUIRED = os.environ.get("SESSIOND_REQUIRE_POSTGRES") == "1"


def _with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


async def _admin(sql: str) -> None:
    import asyncpg

    con = await asyncpg.connect(SERVER, timeout=5)
    try:
        await con.execute(sql)
    finally:
        await con.close()


def _unavailable(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"PostgreSQL is required (SESSIOND_REQUIRE_POSTGRES=1): {why}")
    pytest.skip(f"no PostgreSQL server ({why}); set SESSIOND_TEST_POSTGRES to point at one")


def database() -> Iterator[str]:
    """A new, empty database's URL, dropped after the test: the body of each test
    module's `pg_url` fixture (a fixture imported from here would be a name the test's
    argument shadows)."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        _unavailable("asyncpg is not installed: pip install -e '.[fleet]'")
    name = f"sessiond_test_{os.getpid()}_{secrets.token_hex(4)}"
    try:
        asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    except (TimeoutError, OSError) as exc:
        _unavailable(f"{SERVER}: {exc}")
    try:
        yield _with_database(SERVER, name)
    finally:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def empty(url: str) -> None:
    """Make the database at `url` as a freshly migrated one: every table's rows deleted
    but the schema's own (`meta`), the log's head back to 0. (DELETE, not TRUNCATE:
    TRUNCATE's per-table file swap costs ~20 ms a table here.)"""
    asyncio.run(_empty(url))


async def _empty(url: str) -> None:
    import asyncpg

    from sessiond_daemon.stores.postgres import schema

    # As the daemon's connections say: this code's schema (the fence lets it delete events).
    con = await asyncpg.connect(url, timeout=5,
                                server_settings={schema.SETTING: str(schema.LATEST)})
    try:
        tables = await con.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            " AND tablename NOT IN ('meta', 'log_head')")
        async with con.transaction():
            for (table,) in tables:
                await con.execute(f'DELETE FROM "{table}"')
            if await con.fetchval("SELECT to_regclass('log_head') IS NOT NULL"):
                await con.execute("UPDATE log_head SET position = 0")
    finally:
        await con.close()


def query(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run one query on the database at `url`, on a connection of its own, from sync code
    (a test's event loop may be running: the query runs on a thread of its own). SQLite's
    `?` placeholders become PostgreSQL's `$1, $2, ...`."""
    parts = sql.split("?")
    numbered = parts[0] + "".join(f"${i}{part}" for i, part in enumerate(parts[1:], 1))

    async def run() -> list[tuple[Any, ...]]:
        import asyncpg

        con = await asyncpg.connect(url, timeout=5)
        try:
            return [tuple(row) for row in await con.fetch(numbered, *args)]
        finally:
            await con.close()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, run()).result()


# --- a stand-in for the writer: batches decided against the entries it holds ---------------


class Scribe:
    """Builds batches as the writer does (versions, hash chain, folded views) for the
    sessions it holds; `positions` are provisional, as the writer's are."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}
        self.next_position = 1

    def batch(self, *items: tuple[str, int], key: str | None = None) -> Batch:
        """A batch appending, to each (session_id, n), n messages (a new session starts
        with session.created); `key` is an idempotency key for every session in it."""
        batch = Batch()
        for sid, n in items:
            entry = self.entries.get(sid)
            count = entry.state.message_count if entry else 0
            self.add(batch, sid, [("message.appended", {
                "message_id": new_id(), "sequence": count + i, "role": "user",
                "content": f"m{count + i}"}) for i in range(n)], key=key)
        return batch

    def add(self, batch: Batch, sid: str, specs: list[tuple[str, dict[str, Any]]],
            key: str | None = None, *, prev_hash: str = "", version: int = 0) -> None:
        """Add events of these (type, data) to `batch` for `sid` (a session this scribe
        does not hold starts with session.created, unless specs start it otherwise)."""
        entry = self.entries.get(sid) or batch.views.get(sid)
        if entry is None and specs[0][0] != "session.forked":
            specs = [("session.created", {}), *specs]
        prev = entry.last_hash if entry else prev_hash
        version = entry.state.version if entry else version
        events = []
        for event_type, data in specs:
            version += 1
            e = Event(position=self.next_position, session_id=sid, version=version,
                      event_id=new_id(), type=event_type, schema_version=CURRENT_SCHEMA_VERSION,
                      recorded_at=now(), data_json=msgspec.Raw(canonical(data)),
                      meta=EventMeta(idempotency_key=key),
                      hash="")
            prev = chain_hash(prev, e)
            events.append(msgspec.structs.replace(e, hash=prev))
            self.next_position += 1
        state = projection.fold(entry.state if entry else None, events)
        batch.events += events
        batch.views[sid] = Entry(state, events[-1].hash, events[-1].position)
        if key is not None:
            result = b'{"version": %d}' % state.version
            batch.idempotency.append((sid, key, result))
            # No position in it: its template is the text (the one-call commit takes it).
            batch.templates[(sid, key)] = Template((result.decode(),), ())
        batch.templated = True  # no result here quotes a position

    def adopt(self, batch: Batch) -> None:
        """The batch committed: hold its views."""
        self.entries.update(batch.views)

    async def moved(self, store: Any, moved: Any) -> None:
        """What the writer does on `Moved`: reload the stale sessions, number after the
        head."""
        for sid in moved.stale:
            entry = await store.load_entry(sid)
            if entry is None:
                self.entries.pop(sid, None)
            else:
                self.entries[sid] = entry
        self.next_position = moved.head + 1

    def forget(self, session_id: str) -> None:
        self.entries.pop(session_id, None)


async def await_until(ready: Callable[[], Awaitable[Any]], what: str) -> Any:
    """Poll the coroutine `ready` until it returns something other than None or False;
    fail (not flake) after a generous while."""
    with anyio.fail_after(60):
        while not (value := await ready()):
            await anyio.sleep(0.01)
    return value


class Stores:
    """A store factory for running_daemon that keeps the stores it made, to read the
    PostgreSQL store's own counters (`reads`, `figures`) of each daemon."""

    def __init__(self) -> None:
        self.made: list[Any] = []

    def __call__(self, config: Any) -> Any:
        from sessiond_daemon.serve import lifecycle

        self.made.append(lifecycle.default_store(config))
        return self.made[-1]

    def reads(self, i: int) -> dict[str, int]:
        return dict(self.made[i].reads)

    def figures(self, i: int) -> dict[str, float]:
        return dict(self.made[i].figures)
