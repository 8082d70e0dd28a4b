"""The read models' tables, as every store keeps them: columns in row order, the key a
conflict is decided on, and the column that points at the row's event.

The tables themselves are created by each store's migrations (stores/sqlite/migrations.py,
stores/postgres/schema.py); this is what the rules and the shared SQL need to know of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    # The column holding the position of the event a row comes from: an Insert's rows
    # hold the writer's numbering there, which a store that renumbers shifts.
    event_column: str = "position"
    # Whether its rows belong to one session (session_id): a delete removes them.
    by_session: bool = True

    @property
    def event_index(self) -> int:
        return self.columns.index(self.event_column)


TABLES: Final[dict[str, Table]] = {t.name: t for t in (
    # message.list: a conversation's current messages by sequence.
    Table("messages", ("session_id", "sequence", "position"), ("session_id", "sequence")),
    # checkpoint.get/list, session.resume. A fork's rows hold an empty payload: they
    # share the one of the row at the same position (the source's).
    Table("checkpoints", ("session_id", "checkpoint_id", "position", "version", "node_id",
                          "resume_from", "created_at", "size", "payload"),
          ("session_id", "checkpoint_id")),
    # A fork's link to its source (session.forks, time travel, the shares).
    Table("forks", ("session_id", "source_id", "version", "forked_at", "position"),
          ("session_id",)),
    # The LangGraph saver's indexes.
    Table("graph_checkpoints", ("session_id", "ns", "checkpoint_id", "run_id", "position"),
          ("session_id", "ns", "checkpoint_id")),
    Table("graph_blobs", ("session_id", "ns", "channel", "version", "position"),
          ("session_id", "ns", "channel", "version")),
    Table("graph_writes", ("session_id", "ns", "checkpoint_id", "task_id", "idx", "position",
                           "item"), ("session_id", "ns", "checkpoint_id", "task_id", "idx")),
    # ADK's app ('' user) and user state: shared by sessions.
    Table("scoped_state", ("app_name", "user_id", "key", "value", "position"),
          ("app_name", "user_id", "key"), by_session=False),
    # progress.list: one row per graph step.
    Table("progress_steps", ("session_id", "version", "position"), ("session_id", "version")),
    # The executor runner's index: turn events and output lines that may name a resume id.
    Table("runner_events", ("session_id", "version", "position", "type"),
          ("session_id", "version")),
    # The full-text index's rows (SQLite's FTS5 table: rowid is the position). A store
    # without full-text search keeps no such table and skips its ops.
    Table("search", ("rowid", "body", "tags"), (), event_column="rowid", by_session=False),
)}

# The tables a session's delete empties of its rows (the log's own tables aside).
SESSION_MODEL_TABLES: Final = tuple(t.name for t in TABLES.values() if t.by_session)
