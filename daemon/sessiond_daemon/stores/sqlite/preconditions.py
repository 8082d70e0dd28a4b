"""A batch's preconditions (stores/preconditions.py), run in SQLite's write transaction:
BEGIN IMMEDIATE, and the one writer holds the file, so what they read stays true until
COMMIT."""

from __future__ import annotations

import sqlite3

from sessiond_daemon.stores.interface import Batch, Precondition
from sessiond_daemon.stores.models.sql import SQLITE
from sessiond_daemon.stores.preconditions import check


def refused(db: sqlite3.Connection, batch: Batch) -> dict[Precondition, int]:
    """The batch's preconditions that do not hold, with what was found."""
    steps = check(batch, SQLITE)
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(db.execute(sql, args).fetchall())
    except StopIteration as done:
        found: dict[Precondition, int] = done.value
        return found
