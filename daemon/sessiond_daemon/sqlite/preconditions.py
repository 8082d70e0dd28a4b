"""A batch's preconditions, checked in SQLite's write transaction (BEGIN IMMEDIATE: the
one writer holds the file, so what the checks read stays true until COMMIT)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

from sessiond_daemon.eventstore import Batch, HasNoForks, Precondition

from .base import marks

# The chain hash of a session's history at a version (forks.hash_at_sql).
HashAt = Callable[[sqlite3.Connection, str, int], str | None]


def refused(db: sqlite3.Connection, batch: Batch, hash_at: HashAt) -> dict[Precondition, int]:
    """The batch's preconditions that do not hold, each with what was found: for
    HasNoForks the number of forks (those the batch deletes not counted), for HasVersion
    the session's stored version (0: none)."""
    found: dict[Precondition, int] = {}
    for p in batch.sources():
        row = db.execute("SELECT version FROM sessions WHERE session_id = ?",
                         (p.session_id,)).fetchone()
        version = int(row[0]) if row else 0
        if version < p.version or hash_at(db, p.session_id, p.version) != p.hash:
            found[p] = version
    unforked = batch.unforked()
    if unforked:
        deleted = sorted(set(batch.deletes))
        for source, n in db.execute(
                f"SELECT source_id, COUNT(*) FROM forks WHERE source_id IN ({marks(len(unforked))})"
                f" AND session_id NOT IN ({marks(len(deleted))}) GROUP BY source_id",
                (*unforked, *deleted)):
            found[HasNoForks(source)] = int(n)
    return found
