"""The PostgreSQL schema, as numbered migrations run at start under an advisory lock.

Two daemons starting at once against one database must not both migrate: `migrate`
takes a session-level advisory lock (`pg_advisory_lock`), so the second waits, then
finds the schema current and applies nothing. Each pending migration runs with the
bump of `meta.schema_version` in one transaction (PostgreSQL's DDL is transactional),
so a failed migration leaves the database as it was. A database newer than this code
is refused before anything in it is changed.

How this schema differs from SQLite's (stores/sqlite/migrations.py), and why:
- `log_head` is the one counter row positions come from (gapless, in commit order;
  see store.py). `events.position` is a plain BIGINT key, never a sequence.
- Index rows point at their event by position, as in SQLite: the writer numbers the
  batch, and the counter update, the last statement, checks that numbering (store.py).
- A session's last position is not stored in its row: it is its last event's
  position, read through the (session_id, version) key.
- Text is compared byte by byte (COLLATE "C"), as SQLite does: orders, cursors and
  prefix ranges come out the same in both stores, whatever the server's locale.
- `sessions.host` names the host whose daemon wrote the session first (executors stay
  per host).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog

from sessiond_daemon.stores.models.tables import TABLES as MODEL_TABLES
from sessiond_daemon.stores.postgres import onecall, search
from sessiond_daemon.stores.schema import LOG_TABLES, OWNER_UID, SchemaTooNew, owner_sql

# A migration step: a statement, or a function run on the migrating connection inside the
# migration's transaction (a backfill whose values only Python computes).
Step = str | Callable[[Any], Awaitable[None]]

log = structlog.get_logger("sessiond.store")

# Every sessiond daemon migrating this database takes this lock first (an arbitrary
# constant, a signed int64 as pg_advisory_lock takes it).
ADVISORY_LOCK: Final = 0x5E55_10D0_5C4E_3A01 - (1 << 63)

# The setting by which a daemon's connections say which schema its code writes
# (store.py's server_settings): the fence lets through only the writes of code that
# knows the database's schema.
SETTING: Final = "sessiond.schema"
# The fence's error, as a host that must be upgraded gets it: "cannot connect now",
# which every release takes for a retryable connection failure (postgres/errors.py).
FENCED: Final = "57P03"


def fence(at: int) -> list[str]:
    """A fence at schema `at`: every statement inserting or deleting events fails unless
    its connection says (SETTING) it writes schema `at` or newer. One check per statement
    (FOR EACH STATEMENT), not per row. During a fleet's upgrade a host still on an older
    release keeps serving; the first host to start the new release migrates, and from then
    on the older hosts' writes fail, retryable, saying to upgrade them, instead of writing
    past what the migrations added (docs/upgrading.md). A later migration that older code
    must not write past calls this again with its own number: the fence moves."""
    return [
        f"""CREATE OR REPLACE FUNCTION sessiond_fence() RETURNS trigger
        LANGUAGE plpgsql AS $fn$
        BEGIN
            IF coalesce(nullif(current_setting('{SETTING}', true), ''), '0') !~ '^[0-9]{{1,9}}$'
                OR coalesce(nullif(current_setting('{SETTING}', true), ''), '0')::int < {at}
            THEN
                RAISE EXCEPTION 'this database was migrated to schema {at} by a newer'
                    ' sessiond: upgrade this host (docs/upgrading.md)'
                    USING ERRCODE = '{FENCED}', DETAIL = 'sessiond fence {at}';
            END IF;
            RETURN NULL;
        END $fn$""",
        "DROP TRIGGER IF EXISTS events_fence ON events",
        "CREATE TRIGGER events_fence BEFORE INSERT OR DELETE ON events"
        " FOR EACH STATEMENT EXECUTE FUNCTION sessiond_fence()",
    ]


MIGRATIONS: Final[list[list[Step]]] = [
    [
        """CREATE TABLE log_head (
            id INT PRIMARY KEY CHECK (id = 1),
            position BIGINT NOT NULL CHECK (position >= 0)
        )""",
        "INSERT INTO log_head (id, position) VALUES (1, 0)",
        """CREATE TABLE events (
            position BIGINT PRIMARY KEY,
            session_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL,
            event_id TEXT COLLATE "C" NOT NULL UNIQUE,
            type TEXT COLLATE "C" NOT NULL,
            schema_version INT NOT NULL,
            recorded_at TEXT COLLATE "C" NOT NULL,
            data BYTEA NOT NULL,
            meta BYTEA NOT NULL,
            hash TEXT COLLATE "C" NOT NULL,
            CONSTRAINT events_session_version UNIQUE (session_id, version)
        )""",
        """CREATE TABLE sessions (
            session_id TEXT COLLATE "C" PRIMARY KEY,
            version BIGINT NOT NULL,
            status TEXT COLLATE "C" NOT NULL,
            namespace TEXT COLLATE "C" NOT NULL,
            actor_name TEXT COLLATE "C",
            source TEXT COLLATE "C" NOT NULL,
            task TEXT COLLATE "C",
            created_at TEXT COLLATE "C" NOT NULL,
            updated_at TEXT COLLATE "C" NOT NULL,
            message_count BIGINT NOT NULL,
            input_tokens BIGINT NOT NULL,
            output_tokens BIGINT NOT NULL,
            estimated_cost DOUBLE PRECISION NOT NULL,
            last_hash TEXT COLLATE "C" NOT NULL,
            host TEXT COLLATE "C",
            state BYTEA NOT NULL
        )""",
        # session.list is newest first; each index leads with a filter users combine.
        "CREATE INDEX sessions_by_created ON sessions (created_at, session_id)",
        "CREATE INDEX sessions_by_status ON sessions (status, created_at, session_id)",
        "CREATE INDEX sessions_by_namespace ON sessions (namespace, created_at, session_id)",
        """CREATE INDEX sessions_by_namespace_status
            ON sessions (namespace, status, created_at, session_id)""",
        "CREATE INDEX sessions_by_actor ON sessions (actor_name, created_at, session_id)",
        """CREATE TABLE messages (
            session_id TEXT COLLATE "C" NOT NULL,
            sequence BIGINT NOT NULL,
            position BIGINT NOT NULL,
            PRIMARY KEY (session_id, sequence)
        )""",
        """CREATE TABLE checkpoints (
            session_id TEXT COLLATE "C" NOT NULL,
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            position BIGINT NOT NULL,
            version BIGINT NOT NULL,
            node_id TEXT COLLATE "C",
            resume_from TEXT COLLATE "C",
            created_at TEXT COLLATE "C" NOT NULL,
            size BIGINT NOT NULL,
            payload BYTEA NOT NULL,
            PRIMARY KEY (session_id, checkpoint_id)
        )""",
        "CREATE INDEX checkpoints_by_version ON checkpoints (session_id, version)",
        # Shared by every host: a retry through another daemon finds the first result.
        """CREATE TABLE idempotency (
            session_id TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            result BYTEA NOT NULL,
            PRIMARY KEY (session_id, key)
        )""",
        """CREATE TABLE snapshots (
            session_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL,
            state BYTEA NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        # The graph.* events' indexes (LangGraph checkpoints), as SQLite's migration 2.
        """CREATE TABLE graph_checkpoints (
            session_id TEXT COLLATE "C" NOT NULL,
            ns TEXT COLLATE "C" NOT NULL,
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            run_id TEXT COLLATE "C",
            position BIGINT NOT NULL,
            PRIMARY KEY (session_id, ns, checkpoint_id)
        )""",
        """CREATE INDEX graph_checkpoints_by_run ON graph_checkpoints (run_id)
            WHERE run_id IS NOT NULL""",
        """CREATE TABLE graph_blobs (
            session_id TEXT COLLATE "C" NOT NULL,
            ns TEXT COLLATE "C" NOT NULL,
            channel TEXT COLLATE "C" NOT NULL,
            version TEXT COLLATE "C" NOT NULL,
            position BIGINT NOT NULL,
            PRIMARY KEY (session_id, ns, channel, version)
        )""",
        """CREATE TABLE graph_writes (
            session_id TEXT COLLATE "C" NOT NULL,
            ns TEXT COLLATE "C" NOT NULL,
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            task_id TEXT COLLATE "C" NOT NULL,
            idx BIGINT NOT NULL,
            position BIGINT NOT NULL,
            item BIGINT NOT NULL,
            PRIMARY KEY (session_id, ns, checkpoint_id, task_id, idx)
        )""",
        # App and user state (state.updated), shared by sessions: the latest of each key.
        """CREATE TABLE scoped_state (
            app_name TEXT COLLATE "C" NOT NULL,
            user_id TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            value BYTEA NOT NULL,
            position BIGINT NOT NULL,
            PRIMARY KEY (app_name, user_id, key)
        )""",
        # Forks: each fork's source (features/forks.py).
        """CREATE TABLE forks (
            session_id TEXT COLLATE "C" PRIMARY KEY,
            source_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL,
            forked_at TEXT COLLATE "C" NOT NULL,
            position BIGINT NOT NULL
        )""",
        "CREATE INDEX forks_by_source ON forks (source_id, session_id)",
    ],
    # 2: bounded views (protocol 1.2), as SQLite's migration 5: progress_steps, which
    # progress.list pages (a fork's shared with its ancestors up to its fork point), and
    # runner_events, the turn events and the output lines that may name a resume id
    # (RESUME_MARKS, stores/models/agents.py). Both built from the stored events.
    [
        """CREATE TABLE progress_steps (
            session_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL,
            position BIGINT NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        """INSERT INTO progress_steps (session_id, version, position)
            SELECT session_id, version, position FROM events
            WHERE type = 'progress.recorded'""",
        """WITH RECURSIVE up (session_id, source_id, upto) AS (
                SELECT session_id, source_id, version FROM forks
                UNION ALL
                SELECT up.session_id, f.source_id, LEAST(up.upto, f.version)
                FROM up JOIN forks f ON f.session_id = up.source_id)
            INSERT INTO progress_steps (session_id, version, position)
            SELECT up.session_id, e.version, e.position FROM up JOIN events e
            ON e.session_id = up.source_id AND e.version <= up.upto
            WHERE e.type = 'progress.recorded' ON CONFLICT DO NOTHING""",
        """CREATE TABLE runner_events (
            session_id TEXT COLLATE "C" NOT NULL,
            version BIGINT NOT NULL,
            position BIGINT NOT NULL,
            type TEXT COLLATE "C" NOT NULL,
            PRIMARY KEY (session_id, version)
        )""",
        """INSERT INTO runner_events (session_id, version, position, type)
            SELECT session_id, version, position, type FROM events
            WHERE type IN ('process.started', 'process.exited', 'process.detached')
            OR (type = 'process.output' AND (position('thread_id'::bytea IN data) > 0
                OR position('session_id'::bytea IN data) > 0))""",
    ],
    # 3: session idle TTLs (protocol 1.3), as SQLite's migration 7: expires_at and the
    # partial index the expiry sweep pages.
    [
        'ALTER TABLE sessions ADD COLUMN expires_at TEXT COLLATE "C"',
        """CREATE INDEX sessions_by_expiry ON sessions (expires_at, session_id)
            WHERE expires_at IS NOT NULL""",
    ],
    # 4: forks share their source's checkpoint payloads by reference (features/forks.py), as
    # SQLite's migration 8: a fork's row holds an empty payload, found by its position.
    [
        "CREATE INDEX IF NOT EXISTS checkpoints_by_position ON checkpoints (position)",
    ],
    # 5: idempotency keys scoped to the caller's uid, as SQLite's migration 9: the keys
    # stored before get the uid of the daemon that migrates (in fleet mode: the first
    # host to start the new release; uids are taken to mean the same user on every host).
    [
        f"UPDATE idempotency SET key = '{OWNER_UID}:' || key",
    ],
    # 6: deletes in the shared log, for the other hosts' subscribers (store.py, follow.py):
    # a delete leaves no event, so each deleted session gets a row, placed in commit order
    # by the position the log stood at (read under the counter row's lock); `origin` is
    # the daemon that deleted it (its own subscribers heard at once).
    [
        """CREATE TABLE IF NOT EXISTS deletions (
            after_position BIGINT NOT NULL,
            session_id TEXT COLLATE "C" NOT NULL,
            origin TEXT COLLATE "C" NOT NULL,
            PRIMARY KEY (after_position, session_id)
        )""",
    ],
    # 7: full-text search (postgres/search.py, as SQLite's migration 4): the index table,
    # its GIN index, and the events already stored indexed by the same rule (text_of).
    [
        *search.MIGRATION,
        search.backfill,
    ],
    # 8: the commit as one server-side function (onecall.py): one round trip per batch.
    [
        onecall.CREATE,
    ],
    # 9: the fence (see `fence`): hosts of a release before this one stop writing, as their
    # writes would pass migrations 6 and 7 by (no search_index rows, no deletions rows).
    # `migrate` puts it up first, with the first pending migration.
    [
        *fence(9),
    ],
]

LATEST: Final = len(MIGRATIONS)
FENCE: Final = 9  # the migration whose fence is the latest (the one `migrate` puts up first)

# Every table the migrations create (daemon.stats' db_bytes is theirs, not the schema's:
# other applications may keep tables beside them). tests/test_postgres_schema.py checks it.
# The search read model's table is search_index here.
TABLES: Final = (*LOG_TABLES, *("search_index" if name == "search" else name
                                for name in MODEL_TABLES), "log_head", "deletions", "meta")


async def schema_version(con: Any) -> int:
    """The database's schema version; 0 for a database sessiond never migrated."""
    exists = await con.fetchval("SELECT to_regclass('meta') IS NOT NULL")
    if not exists:
        return 0
    value = await con.fetchval("SELECT value FROM meta WHERE key = 'schema_version'")
    return int(value) if value is not None else 0


async def migrate(con: Any, where: str) -> list[int]:
    """Bring the database of `con` (an asyncpg connection, outside any transaction) to
    LATEST under the advisory lock; return the migrations this call applied."""
    await con.execute("SELECT pg_advisory_lock($1)", ADVISORY_LOCK)
    try:
        current = await schema_version(con)
        if current > LATEST:
            raise SchemaTooNew(
                f"database {where} has schema version {current}, newer than this sessiond's"
                f" {LATEST}: it was migrated by a newer release; run that release (or newer)."
                " Nothing was changed")
        pending = list(range(current + 1, LATEST + 1))
        for number in pending:
            async with con.transaction():
                await con.execute(
                    "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
                if number == current + 1 and 1 <= current < FENCE:
                    # The fence first, in the first pending migration's transaction: an
                    # older host's write waits for it (the trigger's lock on events), then
                    # is refused; none is written past a migration it does not know.
                    for sql in fence(FENCE):
                        await con.execute(sql)
                for step in MIGRATIONS[number - 1]:
                    if isinstance(step, str):
                        await con.execute(owner_sql(step))
                    else:
                        await step(con)
                await con.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', $1)"
                    " ON CONFLICT (key) DO UPDATE SET value = excluded.value", str(number))
        if pending:  # one line for the whole run, as on SQLite
            log.info("store.migrated", schema_version=LATEST, from_version=current,
                     applied=pending, new_database=current == 0)
        return pending
    finally:
        await con.execute("SELECT pg_advisory_unlock($1)", ADVISORY_LOCK)
