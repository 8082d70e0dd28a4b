"""The read models' executor in SQLite: runs the rules' row operations
(stores/models) on the write connection, inside the commit's transaction (the writer
thread), so a read right after a write sees them."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sessiond_daemon.stores.models.ops import Insert, Op
from sessiond_daemon.stores.models.sql import SQLITE, insert_sql, steps


def run(db: sqlite3.Connection, ops: Sequence[Op]) -> None:
    """Apply the ops in order. The writer's positions are final here (one writer)."""
    for op in ops:
        if type(op) is Insert:  # the common case, without a generator
            db.executemany(insert_sql(op.table, op.keep, SQLITE), op.rows)
            continue
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
