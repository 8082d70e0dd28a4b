"""A batch's preconditions (stores.interface.HasVersion, HasNoForks), checked inside a store's
commit: the statements written once, rendered per driver.

`check` is a generator, as the read models' steps are (stores/models/sql.py): it yields
(statement, args) and is sent back the rows, then returns the preconditions that do not
hold with what was found, so one algorithm runs on sqlite3 and on asyncpg. The store
runs it inside its transaction before it writes anything, under the locks that order
the commit with every other writer (sqlite/store.py, postgres/store.py say which).
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from sessiond_daemon.stores.interface import Batch, HasNoForks, Precondition
from sessiond_daemon.stores.models.sql import Dialect, at_args, at_sql, marks, render

# Yields (statement, args), is sent the rows; returns {precondition: found}.
Check = Generator[tuple[str, tuple[Any, ...]], list[Any], dict[Precondition, int]]


def check(batch: Batch, d: Dialect, versions: Mapping[str, int] | None = None) -> Check:
    """The batch's preconditions that do not hold, each with what was found: for
    HasNoForks the number of forks (those the batch deletes not counted), for HasVersion
    the session's stored version (0: none). `versions`: the stored versions of the named
    sessions when the store has read them already (its lock statement); else read here."""
    found: dict[Precondition, int] = {}
    sources = batch.sources()
    if sources and versions is None:
        ids = sorted({p.session_id for p in sources})
        rows = yield (render("SELECT session_id, version FROM sessions WHERE session_id"
                             f" IN ({marks(len(ids))})", d), tuple(ids))
        versions = {r[0]: int(r[1]) for r in rows}
    for p in sources:
        version = (versions or {}).get(p.session_id, 0)
        if version >= p.version:
            rows = yield (at_sql("hash", d), at_args(p.session_id, p.version))
            if rows and rows[0][0] == p.hash:
                continue
        found[p] = version
    unforked = batch.unforked()
    if unforked:
        deleted = sorted(set(batch.deletes))
        rows = yield (render(
            f"SELECT source_id, COUNT(*) FROM forks WHERE source_id IN ({marks(len(unforked))})"
            + (f" AND session_id NOT IN ({marks(len(deleted))})" if deleted else "")
            + " GROUP BY source_id", d), (*unforked, *deleted))
        found.update({HasNoForks(r[0]): int(r[1]) for r in rows})
    return found
