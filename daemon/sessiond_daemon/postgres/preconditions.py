"""A batch's preconditions, checked in PostgreSQL's commit transaction.

The store's lock statement has locked every session a precondition names (FOR UPDATE,
with the touched ones, in session_id order): a fork's source and a delete of it wait for
each other. These checks run after it, each a statement of its own: under READ COMMITTED
each statement reads a new snapshot, so a fork committed while we waited for the lock
is seen, and a source deleted meanwhile was not returned by the lock statement.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sessiond_daemon.eventstore import Batch, HasNoForks, Precondition

from . import forks

_FORKS = ("SELECT source_id, count(*) FROM forks WHERE source_id = ANY($1::text[])"
          " AND NOT session_id = ANY($2::text[]) GROUP BY source_id")


async def refused(con: Any, batch: Batch, locked: Mapping[str, int]) -> dict[Precondition, int]:
    """The batch's preconditions that do not hold, each with what was found: for
    HasNoForks the number of forks (those the batch deletes not counted), for HasVersion
    the session's stored version (0: none). `locked`: the versions of the sessions the
    lock statement returned."""
    found: dict[Precondition, int] = {}
    for p in batch.sources():
        version = locked.get(p.session_id, 0)
        if version < p.version or await forks.hash_at(con, p.session_id, p.version) != p.hash:
            found[p] = version
    unforked = batch.unforked()
    if unforked:
        for source, n in await con.fetch(_FORKS, unforked, sorted(set(batch.deletes))):
            found[HasNoForks(source)] = int(n)
    return found
