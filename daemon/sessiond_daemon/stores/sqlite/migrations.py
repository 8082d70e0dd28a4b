"""The SQLite schema, as numbered migrations run in order at start (never edited once released).

`migrate` brings a database up to `LATEST`: it first copies a database that is not new
(schema version above 0) to `<db>.schema-N.bak` (SQLite's backup API), then runs every
pending migration in one transaction, so a migration that fails leaves the database as
it was. A database newer than this code is refused before anything in it is read or
changed.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Final

import structlog

from sessiond_daemon.stores.models.search_text import INDEXED_TYPES
from sessiond_daemon.stores.schema import OWNER_UID, SchemaRefused, SchemaTooNew, owner_sql

log = structlog.get_logger("sessiond.store")

_SESSION_COLUMNS: Final = (
    "session_id, version, status, namespace, actor_name, source, task, created_at,"
    " updated_at, message_count, input_tokens, output_tokens, estimated_cost,"
    " last_position, last_hash, state, expires_at")
# The indexes of `sessions` as migrations 1 and 7 made them (built again by 10).
_SESSION_INDEXES: Final = (
    "CREATE INDEX sessions_by_created ON sessions (created_at, session_id)",
    "CREATE INDEX sessions_by_status ON sessions (status, created_at, session_id)",
    "CREATE INDEX sessions_by_namespace ON sessions (namespace, created_at, session_id)",
    "CREATE INDEX sessions_by_namespace_status"
    " ON sessions (namespace, status, created_at, session_id)",
    "CREATE INDEX sessions_by_actor ON sessions (actor_name, created_at, session_id)",
    "CREATE INDEX sessions_by_expiry ON sessions (expires_at, session_id)"
    " WHERE expires_at IS NOT NULL",
)
# The `meta` key of the position up to which the search index holds every event (11).
INDEXED_UPTO: Final = "search_indexed_upto"
# The search index's text function (sqlite/search.py registers it on every connection).
SEARCH_FUNCTION: Final = "sessiond_search_text"
_TYPES_SQL: Final = ", ".join(f"'{t}'" for t in INDEXED_TYPES)
# Migration 4's search statements: the view, the FTS5 index, its backfill from the events
# already stored.
SEARCH_MIGRATION: Final[list[str]] = [
    f"""CREATE VIEW search_source AS SELECT position,
        {SEARCH_FUNCTION}(0, type, data) AS body, {SEARCH_FUNCTION}(1, type, data) AS tags
        FROM events WHERE type IN ({_TYPES_SQL})""",
    # No prefix index: prefix='2 3' made a common 3-letter prefix 15x faster (B13) but
    # cost about 30 us per appended message, past the 10% the appends may pay (B13a).
    """CREATE VIRTUAL TABLE search USING fts5(body, tags, content='search_source',
        content_rowid='position', tokenize='unicode61 remove_diacritics 2')""",
    "INSERT INTO search(search) VALUES ('rebuild')",
]

# A step is a statement, or a function of the connection for what SQL cannot say alone.
Step = str | Callable[[sqlite3.Connection], None]
MIGRATIONS: Final[list[list[Step]]] = [
    [
        """CREATE TABLE events (
            position INTEGER PRIMARY KEY,
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            event_id TEXT NOT NULL UNIQUE,
            type TEXT NOT NULL,
            schema_version INTEGER NOT NULL,
            recorded_at TEXT NOT NULL,
            data BLOB NOT NULL,
            meta BLOB NOT NULL,
            hash TEXT NOT NULL,
            UNIQUE (session_id, version)
        )""",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            status TEXT NOT NULL,
            namespace TEXT NOT NULL,
            actor_name TEXT,
            source TEXT NOT NULL,
            task TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            message_count INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            estimated_cost REAL NOT NULL,
            last_position INTEGER NOT NULL,
            last_hash TEXT NOT NULL,
            state BLOB NOT NULL
        ) WITHOUT ROWID""",
        # session.list is newest first; each index leads with a filter users combine.
        # (session_id, rowid = position): a session's events in position order, for
        # subscriptions that follow one session.
        "CREATE INDEX events_by_session ON events (session_id)",
        "CREATE INDEX sessions_by_created ON sessions (created_at, session_id)",
        "CREATE INDEX sessions_by_status ON sessions (status, created_at, session_id)",
        "CREATE INDEX sessions_by_namespace ON sessions (namespace, created_at, session_id)",
        """CREATE INDEX sessions_by_namespace_status
            ON sessions (namespace, status, created_at, session_id)""",
        "CREATE INDEX sessions_by_actor ON sessions (actor_name, created_at, session_id)",
        """CREATE TABLE messages (
            session_id TEXT NOT NULL,
            sequence INTEGER NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (session_id, sequence)
        ) WITHOUT ROWID""",
        """CREATE TABLE checkpoints (
            session_id TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            position INTEGER NOT NULL,
            version INTEGER NOT NULL,
            node_id TEXT,
            resume_from TEXT,
            created_at TEXT NOT NULL,
            size INTEGER NOT NULL,
            payload BLOB NOT NULL,
            PRIMARY KEY (session_id, checkpoint_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE idempotency (
            session_id TEXT NOT NULL,
            key TEXT NOT NULL,
            result BLOB NOT NULL,
            PRIMARY KEY (session_id, key)
        ) WITHOUT ROWID""",
        # Views at every snapshot_every-th version: time travel folds from the nearest.
        """CREATE TABLE snapshots (
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            state BLOB NOT NULL,
            PRIMARY KEY (session_id, version)
        ) WITHOUT ROWID""",
    ],
    # 2: indexes of the graph.* events (LangGraph checkpoints): each row points at the
    # event that holds the data, so the events stay the only copy.
    [
        """CREATE TABLE graph_checkpoints (
            session_id TEXT NOT NULL,
            ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            run_id TEXT,
            position INTEGER NOT NULL,
            PRIMARY KEY (session_id, ns, checkpoint_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX graph_checkpoints_by_run ON graph_checkpoints (run_id)"
        " WHERE run_id IS NOT NULL",
        # The event that stored each (channel, version) value: unchanged channels are
        # not stored again by later checkpoints.
        """CREATE TABLE graph_blobs (
            session_id TEXT NOT NULL,
            ns TEXT NOT NULL,
            channel TEXT NOT NULL,
            version TEXT NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (session_id, ns, channel, version)
        ) WITHOUT ROWID""",
        # Pending writes: `item` is the write's index in its event's list.
        """CREATE TABLE graph_writes (
            session_id TEXT NOT NULL,
            ns TEXT NOT NULL,
            checkpoint_id TEXT NOT NULL,
            task_id TEXT NOT NULL,
            idx INTEGER NOT NULL,
            position INTEGER NOT NULL,
            item INTEGER NOT NULL,
            PRIMARY KEY (session_id, ns, checkpoint_id, task_id, idx)
        ) WITHOUT ROWID""",
    ],
    # 3: app and user state (state.updated events): the latest value of each key, and
    # the event that set it. Shared by sessions, so deleting one leaves it.
    [
        """CREATE TABLE scoped_state (
            app_name TEXT NOT NULL,
            user_id TEXT NOT NULL,  -- '' for app state
            key TEXT NOT NULL,
            value BLOB NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (app_name, user_id, key)
        ) WITHOUT ROWID""",
    ],
    # 4: full-text search (sqlite/search.py: the FTS5 index over the events, backfilled from those
    # stored) and forks (forks.py: each fork's source; a source's forks by id).
    [
        *SEARCH_MIGRATION,
        """CREATE TABLE forks (
            session_id TEXT PRIMARY KEY,
            source_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            forked_at TEXT NOT NULL,
            position INTEGER NOT NULL
        ) WITHOUT ROWID""",
        "CREATE INDEX forks_by_source ON forks (source_id, session_id)",
    ],
    # 5: bounded views (protocol 1.2). progress_steps (stores/models/progress.py: one row
    # per progress.recorded, a fork's shared with its source's up to the fork point), which
    # progress.list pages, since the view no longer keeps the path; and runner_events
    # (stores/models/agents.py: the turn events and the output lines that may name a
    # resume id). Both are built here from the stored events.
    [
        """CREATE TABLE progress_steps (
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            position INTEGER NOT NULL,
            PRIMARY KEY (session_id, version)
        ) WITHOUT ROWID""",
        """INSERT INTO progress_steps (session_id, version, position)
            SELECT session_id, version, position FROM events
            WHERE type = 'progress.recorded'""",
        # A fork's steps up to its fork point are its ancestors' (a fork of a fork: each
        # link cut at the lowest fork point on the way).
        """WITH RECURSIVE up (session_id, source_id, upto) AS (
                SELECT session_id, source_id, version FROM forks
                UNION ALL
                SELECT up.session_id, f.source_id, MIN(up.upto, f.version)
                FROM up JOIN forks f ON f.session_id = up.source_id)
            INSERT OR IGNORE INTO progress_steps (session_id, version, position)
            SELECT up.session_id, e.version, e.position FROM up JOIN events e
            ON e.session_id = up.source_id AND e.version <= up.upto
            WHERE e.type = 'progress.recorded'""",
        """CREATE TABLE runner_events (
            session_id TEXT NOT NULL,
            version INTEGER NOT NULL,
            position INTEGER NOT NULL,
            type TEXT NOT NULL,
            PRIMARY KEY (session_id, version)
        ) WITHOUT ROWID""",
        # RESUME_MARKS (stores/models/agents.py): the lines that may name a resume id.
        """INSERT INTO runner_events (session_id, version, position, type)
            SELECT session_id, version, position, type FROM events
            WHERE type IN ('process.started', 'process.exited', 'process.detached')
            OR (type = 'process.output' AND (instr(CAST(data AS TEXT), 'thread_id') > 0
                OR instr(CAST(data AS TEXT), 'session_id') > 0))""",
    ],
    # 6: events_by_session (session_id) goes: the (session_id, version) key serves every
    # look-up by session, and the index cost a B-tree insert and ~41 bytes per event
    # (bench/README: "CPU per append"). Idempotent, so its place in the list is free.
    [
        "DROP INDEX IF EXISTS events_by_session",
    ],
    # 7: session idle TTLs (protocol 1.3): the view's expires_at as a column, and the
    # index the expiry sweep pages (only sessions with a TTL are in it). No session had
    # a TTL before, so NULL is every stored session's value.
    [
        lambda con: _add_column(con, "sessions", "expires_at", "TEXT"),
        """CREATE INDEX IF NOT EXISTS sessions_by_expiry ON sessions (expires_at, session_id)
            WHERE expires_at IS NOT NULL""",
    ],
    # 8: forks share their source's checkpoint payloads by reference (features/forks.py): a fork's
    # row holds an empty payload and the position of the source's checkpoint.saved, and
    # the payload is found by that position. Idempotent.
    [
        "CREATE INDEX IF NOT EXISTS checkpoints_by_position ON checkpoints (position)",
    ],
    # 9: idempotency keys scoped to the caller's uid (writer.scoped_key: "uid:key"), so
    # one peer's key never answers another's request. The keys stored before had no
    # owner: they are given the uid of the daemon that migrates (OWNER_UID, filled in).
    [
        f"UPDATE idempotency SET key = '{OWNER_UID}:' || key",
    ],
    # 10: the views in a plain rowid table (they were WITHOUT ROWID). A WITHOUT ROWID row
    # is a cell of an index B-tree, which keeps about 1 KB of it in the leaf and spills
    # the rest (a view's ~1.7 KB state) to an overflow page: each commit wrote the leaf
    # and the overflow page of every view it changed. A rowid table's leaf holds the
    # whole row (16 views changed: 24.7 -> 13.1 WAL pages per commit, bench.levers).
    # The id stays the key (its own index); the rows are copied, the indexes built again.
    [
        """CREATE TABLE sessions_rowid (
            session_id TEXT PRIMARY KEY,
            version INTEGER NOT NULL,
            status TEXT NOT NULL,
            namespace TEXT NOT NULL,
            actor_name TEXT,
            source TEXT NOT NULL,
            task TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            message_count INTEGER NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            estimated_cost REAL NOT NULL,
            last_position INTEGER NOT NULL,
            last_hash TEXT NOT NULL,
            state BLOB NOT NULL,
            expires_at TEXT
        )""",
        f"INSERT INTO sessions_rowid ({_SESSION_COLUMNS}) SELECT {_SESSION_COLUMNS}"
        " FROM sessions ORDER BY session_id",
        "DROP TABLE sessions",
        "ALTER TABLE sessions_rowid RENAME TO sessions",
        *_SESSION_INDEXES,
    ],
    # 11: the search index follows the log (store.py, INDEX_LAG_EVENTS): commits leave its
    # rows out, and a catch-up indexes them later, noting in `meta` the position up to
    # which every event is indexed. Every event stored before this was indexed in its
    # own commit. (An older sessiond must not open the file: it would never index the
    # events past the mark.)
    [
        f"INSERT OR REPLACE INTO meta (key, value) SELECT '{INDEXED_UPTO}',"
        " CAST(COALESCE(MAX(position), 0) AS TEXT) FROM events",
    ],
]


LATEST: Final = len(MIGRATIONS)


class MigrationFailed(SchemaRefused):
    """A migration failed and was rolled back: the database is as it was."""


def schema_version(con: sqlite3.Connection) -> int:
    """The database's schema version; 0 for a new database."""
    try:
        row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no meta table yet
        return 0
    if row is None:
        return 0
    try:
        version = int(row[0])
    except (TypeError, ValueError):
        version = -1
    if version < 0:
        raise SchemaRefused(f"the schema version stored in this database is {row[0]!r}, not"
                            " a version any sessiond writes: the meta table was changed by"
                            " hand; restore the database from a backup")
    return version


def refuse_newer(con: sqlite3.Connection, path: str) -> int:
    """Raise SchemaRefused for a database this code cannot read; else return its version."""
    try:
        current = schema_version(con)
    except SchemaRefused as exc:
        raise SchemaRefused(f"database {path}: {exc}") from None
    if current > LATEST:
        raise SchemaTooNew(
            f"database {path} has schema version {current}, newer than this sessiond's"
            f" {LATEST}: it was written by a newer release. Run that release (or newer), or"
            f" restore the backup taken before it migrated (<db>.schema-{LATEST}.bak);"
            " the file is left untouched")
    return current


def migrate(con: sqlite3.Connection, path: str) -> list[int]:
    """Run the pending migrations of `con` (autocommit mode); return those applied."""
    current = refuse_newer(con, path)
    pending = list(range(current + 1, LATEST + 1))
    if not pending:
        return []
    backup = None
    if current > 0:
        backup = f"{path}.schema-{current}.bak"
        _backup(con, backup)
        log.info("store.backup_before_migration", path=backup, schema_version=current)
    con.execute("BEGIN IMMEDIATE")
    try:
        con.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
        for number in pending:
            for sql in MIGRATIONS[number - 1]:
                try:
                    if callable(sql):
                        sql(con)
                    else:
                        con.execute(owner_sql(sql))
                except sqlite3.Error as exc:
                    raise MigrationFailed(
                        f"migration {number} of database {path} failed: {exc}. Nothing was"
                        f" changed: the database is still at schema version {current}"
                        + (f" (a copy is at {backup})" if backup else "")) from exc
        con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)",
                    (str(LATEST),))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    # One line for the whole run (a new database applies every migration at once).
    log.info("store.migrated", schema_version=LATEST, from_version=current, applied=pending,
             new_database=current == 0)
    return pending


def _add_column(con: sqlite3.Connection, table: str, column: str, kind: str) -> None:
    """ALTER TABLE ADD COLUMN, unless the column is there (SQLite has no IF NOT EXISTS for
    it): so that the migration, like the others, can run again."""
    if column not in {row[1] for row in con.execute(f"PRAGMA table_info({table})")}:
        con.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _backup(con: sqlite3.Connection, target: str) -> None:
    """Copy the database to `target` (0600), replacing an older copy at that path."""
    tmp = target + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.close(fd)
    dest = sqlite3.connect(tmp)
    try:
        con.backup(dest)
    finally:
        dest.close()
    os.replace(tmp, target)
