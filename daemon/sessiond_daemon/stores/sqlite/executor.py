"""The read models' executor in SQLite: runs the rules' row operations
(stores/models) on the write connection, inside the commit's transaction (the writer
thread), so a read right after a write sees them."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sessiond_daemon.stores.models.ops import Insert, Op, TrimHistory
from sessiond_daemon.stores.models.sql import SQLITE, insert_sql, steps
from sessiond_daemon.stores.sqlite import search

# (table, keep) -> its INSERT: a plain dict, cheaper per append than insert_sql's cache.
_INSERTS: dict[tuple[str, str], str] = {}


def run(db: sqlite3.Connection, ops: Sequence[Op]) -> None:
    """Apply the ops in order. The writer's positions are final here (one writer)."""
    for op in ops:
        if type(op) is Insert:  # the common case, without a generator
            sql = _INSERTS.get((op.table, op.keep))
            if sql is None:
                sql = _INSERTS[(op.table, op.keep)] = insert_sql(op.table, op.keep, SQLITE)
            db.executemany(sql, op.rows)
            continue
        if type(op) is TrimHistory:  # the index is told the text first (external content)
            search.forget_trimmed(db, op.session_id, op.version)
        plan = steps(op, SQLITE)
        try:
            stmt = next(plan)
            while True:
                if stmt.many is not None:
                    db.executemany(stmt.sql, stmt.many)
                    stmt = plan.send([])
                else:
                    cur = db.execute(stmt.sql, stmt.args)
                    stmt = plan.send(cur.fetchall() if stmt.fetch else [])
        except StopIteration:
            pass
