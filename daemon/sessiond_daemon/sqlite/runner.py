"""The executor runner's read model in SQLite: `runner_events`, a small index of the
events that decide a turn (process.started, .exited, .detached) and of the output lines
that may name the executor's resume id (adapters.RESUME_MARKS), kept in the commit.

`session.inject` and restart recovery read it instead of every `process.output` line of
the session, so their cost does not grow with the output history.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from sessiond_schemas.events import Data

from ..adapters import RESUME_MARKS
from ..eventstore import Batch
from .base import SqliteReads, marks

_dict_decoder = msgspec.json.Decoder(dict[str, Any])

# The event types always indexed; process.output only when its line holds a mark.
TURN_TYPES = ("process.started", "process.exited", "process.detached")


def indexed(event_type: str, data: dict[str, Any] | Data) -> bool:
    """Whether an event belongs in the runner index."""
    if event_type in TURN_TYPES:
        return True
    if event_type != "process.output":
        return False
    line = data.get("line")
    return isinstance(line, str) and any(m in line for m in RESUME_MARKS)


def project(db: sqlite3.Connection, batch: Batch) -> None:
    rows = [(e.session_id, e.version, e.position, e.type) for e in batch.events
            if e.type.startswith("process.") and indexed(e.type, e.data)]
    if rows:
        db.executemany("INSERT INTO runner_events (session_id, version, position, type)"
                       " VALUES (?, ?, ?, ?)", rows)


class RunnerReads(SqliteReads):
    async def runner_events(self, session_id: str, types: tuple[str, ...], *,
                            newest_first: bool = False, before_version: int | None = None,
                            limit: int = -1) -> list[tuple[str, int, dict[str, Any]]]:
        """(type, version, data) of a session's indexed events of `types`, in version order
        (or newest first), below `before_version` when given; at most `limit` (-1: all)."""
        rows = await self._all(
            "SELECT r.type, r.version, e.data FROM runner_events r"
            " JOIN events e ON e.position = r.position WHERE r.session_id = ?"
            f" AND r.type IN ({marks(len(types))}) AND r.version < ?"
            f" ORDER BY r.version {'DESC' if newest_first else 'ASC'} LIMIT ?",
            (session_id, *types, before_version if before_version is not None else 1 << 62,
             limit))
        return [(r[0], r[1], _dict_decoder.decode(r[2])) for r in rows]
