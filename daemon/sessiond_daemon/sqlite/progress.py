"""The progress read model in SQLite: `progress_steps`, one row per graph step
(progress.recorded event) of a session, keyed by (session_id, version), kept in the commit.
progress.list pages through it; the session view keeps only counts and current values.

A fork gets its source's rows up to the fork point (rows pointing at the source's events),
as it gets its messages: its versions up to there are its source's.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from sessiond_schemas.events import ProgressRecorded
from sessiond_schemas.state import ProgressStep

from ..eventstore import Batch, Page, repage
from .base import SqliteReads

_step_decoder = msgspec.json.Decoder(ProgressRecorded)

_INSERT = "INSERT INTO progress_steps (session_id, version, position) VALUES (?, ?, ?)"


def project(db: sqlite3.Connection, batch: Batch) -> None:
    """The batch's steps, in event order: a fork copies its source's rows as they are."""
    rows: list[tuple[str, int, int]] = []
    for e in batch.events:
        if e.type == "progress.recorded":
            rows.append((e.session_id, e.version, e.position))
        elif e.type == "session.forked":
            db.executemany(_INSERT, rows)
            rows = []
            source = e.data["from"]
            db.execute("INSERT OR IGNORE INTO progress_steps (session_id, version, position)"
                       " SELECT ?, version, position FROM progress_steps"
                       " WHERE session_id = ? AND version <= ?",
                       (e.session_id, source["session_id"], source["version"]))
    if rows:
        db.executemany(_INSERT, rows)


# Page query of progress.list: a range on the (session_id, version) key, then LIMIT.
PAGE_SQL = ("SELECT p.version, e.recorded_at, e.data FROM progress_steps p"
            " JOIN events e ON e.position = p.position"
            " WHERE p.session_id = ? AND p.version > ? AND p.version <= ?"
            " ORDER BY p.version LIMIT ?")


def steps_of(rows: list[Any]) -> list[ProgressStep]:
    """ProgressSteps of (version, recorded_at, progress.recorded data) rows."""
    out = []
    for version, recorded_at, data in rows:
        d = _step_decoder.decode(data)
        out.append(ProgressStep(version=version, node_id=d.node_id, edge=d.edge,
                                latency_ms=d.latency_ms, tokens=d.tokens, retries=d.retries,
                                failed=d.failed, recorded_at=recorded_at))
    return out


class ProgressReads(SqliteReads):
    async def progress_steps(self, session_id: str, after_version: int, upto: int,
                             limit: int, max_bytes: int = 0) -> Page[ProgressStep]:
        """Up to `limit` steps (or `max_bytes` of them) with after_version < version <= upto,
        oldest first."""
        rows = await self._page(PAGE_SQL, (session_id, after_version, upto, limit), max_bytes)
        return repage(rows, steps_of(list(rows)))
