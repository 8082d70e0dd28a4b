"""The graph read model in SQLite (graphs.py's feature): the graph_* tables that index
graph.* events, kept in the commit, and the queries of the LangGraph saver over them."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from sessiond_schemas.events import Event

from ..eventstore import Batch, add_pending_writes
from .base import SqliteReads, marks


def project(db: sqlite3.Connection, batch: Batch) -> None:
    """Keep the graph_* indexes in step with the batch's graph.* events, in order (a
    prune removes what came before it)."""
    for e in batch.events:
        if e.type.startswith("graph."):
            _index(db, e)


def _index(db: sqlite3.Connection, e: Event) -> None:
    d, sid = e.data, e.session_id
    if e.type == "graph.checkpoint":
        run_id = d.get("metadata", {}).get("run_id")
        db.execute("INSERT OR REPLACE INTO graph_checkpoints (session_id, ns, checkpoint_id,"
                   " run_id, position) VALUES (?, ?, ?, ?, ?)",
                   (sid, d.get("ns", ""), d["checkpoint_id"],
                    run_id if isinstance(run_id, str) else None, e.position))
        db.executemany("INSERT OR REPLACE INTO graph_blobs (session_id, ns, channel, version,"
                       " position) VALUES (?, ?, ?, ?, ?)",
                       [(sid, d.get("ns", ""), channel, d["channel_versions"][channel], e.position)
                        for channel in d.get("blobs", {})])
    elif e.type == "graph.writes":
        # A repeated (task, idx) keeps the first write, except for the special channels
        # (negative idx: errors, interrupts), where the latest wins, as LangGraph's savers do.
        for item, w in enumerate(d["writes"]):
            verb = "INSERT OR REPLACE" if w["idx"] < 0 else "INSERT OR IGNORE"
            db.execute(f"{verb} INTO graph_writes (session_id, ns, checkpoint_id, task_id, idx,"
                       " position, item) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (sid, d.get("ns", ""), d["checkpoint_id"], d["task_id"], w["idx"],
                        e.position, item))
    elif e.type == "graph.pruned":
        for ns, checkpoint_id in d["checkpoints"]:
            for table in ("graph_checkpoints", "graph_writes"):
                db.execute(f"DELETE FROM {table} WHERE session_id = ? AND ns = ?"
                           " AND checkpoint_id = ?", (sid, ns, checkpoint_id))


def _where(session_id: str | None, ns: str | None, checkpoint_id: str | None,
           before: str | None) -> tuple[str, list[Any]]:
    where, args = [], []
    for column, op, value in (("session_id", "=", session_id), ("ns", "=", ns),
                              ("checkpoint_id", "=", checkpoint_id),
                              ("checkpoint_id", "<", before)):
        if value is not None:
            where.append(f"gc.{column} {op} ?")
            args.append(value)
    return (" WHERE " + " AND ".join(where) if where else ""), args


class GraphIndex(SqliteReads):
    async def graph_checkpoints(self, session_id: str | None, ns: str | None,
                                checkpoint_id: str | None, before: str | None, limit: int,
                                offset: int, after: tuple[str, str, str] | None = None
                                ) -> list[tuple[str, str, str, bytes]]:
        """(session_id, ns, checkpoint_id, event data) of indexed checkpoints, newest id first
        (then by session_id, ns); only those past `after`, such a triple, when given."""
        where, args = _where(session_id, ns, checkpoint_id, before)
        if after is not None:
            where += (" AND " if where else " WHERE ") + (
                "(gc.checkpoint_id < ? OR (gc.checkpoint_id = ? AND (gc.session_id > ?"
                " OR (gc.session_id = ? AND gc.ns > ?))))")
            args += [after[2], after[2], after[0], after[0], after[1]]
        rows = await self._all(
            "SELECT gc.session_id, gc.ns, gc.checkpoint_id, e.data"
            " FROM graph_checkpoints gc JOIN events e ON e.position = gc.position" + where
            + " ORDER BY gc.checkpoint_id DESC, gc.session_id, gc.ns LIMIT ? OFFSET ?",
            (*args, limit, offset))
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def graph_checkpoint_ids(self, session_id: str) -> list[tuple[str, str]]:
        """(ns, checkpoint_id) of a thread's indexed checkpoints, newest id first."""
        rows = await self._all("SELECT ns, checkpoint_id FROM graph_checkpoints"
                               " WHERE session_id = ? ORDER BY checkpoint_id DESC", (session_id,))
        return [(r[0], r[1]) for r in rows]

    async def graph_values(self, session_id: str, ns: str,
                           wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        """The stored values of these (channel, version) pairs, from the events holding them."""
        found: dict[tuple[str, str], Any] = {}
        for start in range(0, len(wanted), 400):
            chunk = wanted[start:start + 400]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            rows = await self._all(
                "SELECT gb.channel, gb.version, e.position, e.data FROM graph_blobs gb"
                " JOIN events e ON e.position = gb.position WHERE gb.session_id = ? AND gb.ns = ?"
                f" AND (gb.channel, gb.version) IN (VALUES {pairs})",
                (session_id, ns, *(x for pair in chunk for x in pair)))
            decoded: dict[int, Any] = {}
            for channel, version, position, data in rows:
                if position not in decoded:
                    decoded[position] = msgspec.json.decode(data)
                found[(channel, version)] = decoded[position]["blobs"][channel]
        return found

    async def graph_pending(self, session_id: str, ns: str,
                            checkpoint_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each checkpoint's pending writes, by task then idx."""
        found: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(checkpoint_ids), 400):
            chunk = checkpoint_ids[start:start + 400]
            rows = await self._all(
                "SELECT gw.checkpoint_id, gw.item, e.position, e.data"
                " FROM graph_writes gw JOIN events e ON e.position = gw.position"
                " WHERE gw.session_id = ? AND gw.ns = ?"
                f" AND gw.checkpoint_id IN ({marks(len(chunk))})"
                " ORDER BY gw.checkpoint_id, gw.task_id, gw.idx", (session_id, ns, *chunk))
            add_pending_writes(found, rows)
        return found

    async def graph_runs(self, run_ids: list[str]) -> list[tuple[str, str, str]]:
        """(session_id, ns, checkpoint_id) of checkpoints made by any of these runs."""
        rows = await self._all(
            "SELECT session_id, ns, checkpoint_id FROM graph_checkpoints WHERE run_id"
            f" IN ({marks(len(run_ids))}) ORDER BY session_id", tuple(run_ids))
        return [(r[0], r[1], r[2]) for r in rows]
