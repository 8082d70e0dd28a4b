"""The SQLite schema, as numbered migrations run in order at start (never edited once released)."""

from __future__ import annotations

from typing import Final

MIGRATIONS: Final[list[list[str]]] = [
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
        "CREATE INDEX graph_checkpoints_by_run ON graph_checkpoints (run_id) WHERE run_id IS NOT NULL",
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
]


SESSION_TABLES: Final = ("events", "messages", "checkpoints", "idempotency", "snapshots",
                         "graph_checkpoints", "graph_blobs", "graph_writes", "sessions")
