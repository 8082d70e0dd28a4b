"""A batch's preconditions (stores/preconditions.py), run in PostgreSQL's commit.

The store's lock statement has locked every session a precondition names (FOR UPDATE,
with the touched ones, in session_id order): a fork's source and a delete of it wait for
each other. These checks run after it, each a statement of its own: under READ COMMITTED
each statement reads a new snapshot, so a fork committed while we waited for the lock
is seen, and a source deleted meanwhile was not returned by the lock statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessiond_daemon.stores.interface import Batch, Precondition
from sessiond_daemon.stores.models.sql import POSTGRES
from sessiond_daemon.stores.preconditions import check


async def refused(con: Any, batch: Batch, locked: Mapping[str, int]) -> dict[Precondition, int]:
    """The batch's preconditions that do not hold, with what was found. `locked`: the
    versions of the sessions the lock statement returned."""
    steps = check(batch, POSTGRES, locked)
    try:
        sql, args = next(steps)
        while True:
            sql, args = steps.send(list(await con.fetch(sql, *args)))
    except StopIteration as done:
        found: dict[Precondition, int] = done.value
        return found
