"""The read models' executor in PostgreSQL: runs the rules' row operations
(stores/models) on the writer's connection inside the commit's transaction.

The ops are built before the batch's positions are taken (the counter row's lock is then
not held while Python builds them); their rows point at events by the writer's numbering,
shifted here by what the commit's numbering moved them (`shift`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from sessiond_daemon.stores.models.ops import Insert, Op, TrimHistory
from sessiond_daemon.stores.models.sql import POSTGRES, insert_sql, steps
from sessiond_daemon.stores.models.tables import TABLES
from sessiond_daemon.stores.postgres import search

# The full-text index's rows go to this store's own table (postgres/search.py: the rule's
# (position, body, tags) and the tsvector built from them).
FULL_TEXT: Final = "search"


def _shifted(op: Insert, shift: int) -> list[tuple[Any, ...]]:
    if not shift:
        return op.rows
    i = TABLES[op.table].event_index
    return [(*r[:i], r[i] + shift, *r[i + 1:]) for r in op.rows]


def documents(ops: list[Op]) -> list[Op]:
    """The ops with the full-text rows' tsvectors built, as (position, body, tags, doc):
    called before the commit takes its locks, so Python's tokenizing of a long message
    does not hold the counter row every host's commit needs (search.insert uses them)."""
    return [replace(op, rows=[(*r[:3], search.tsvector(r[1], r[2])) for r in op.rows])
            if type(op) is Insert and op.table == FULL_TEXT else op for op in ops]


async def run(con: Any, ops: Sequence[Op], shift: int = 0) -> None:
    """Apply the ops in order, on an asyncpg connection in a transaction."""
    for op in ops:
        if type(op) is Insert:
            if op.table == FULL_TEXT:
                await search.insert(con, _shifted(op, shift))
                continue
            await con.executemany(insert_sql(op.table, op.keep, POSTGRES), _shifted(op, shift))
            continue
        if type(op) is TrimHistory:
            await search.forget_trimmed(con, op.session_id, op.version)
        plan = steps(op, POSTGRES)
        try:
            stmt = next(plan)
            while True:
                if stmt.many is not None:
                    if stmt.many:
                        await con.executemany(stmt.sql, stmt.many)
                    stmt = plan.send([])
                elif stmt.fetch:
                    stmt = plan.send(list(await con.fetch(stmt.sql, *stmt.args)))
                else:
                    await con.execute(stmt.sql, *stmt.args)
                    stmt = plan.send([])
        except StopIteration:
            pass
