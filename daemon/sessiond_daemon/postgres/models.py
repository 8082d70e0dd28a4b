"""The PostgreSQL store's reads of the feature read models: namespaces' views, executors'
output, agents' app/user state, the LangGraph indexes and forks (each as sqlite/ reads
SQLite's). Stored JSON is bytes (BYTEA, as written); the few reads that look inside it
parse it with jsonb on the rows their keys already narrowed."""

from __future__ import annotations

from typing import Any

import asyncpg
import msgspec

from ..eventstore import ForkRow, Page, add_pending_writes, repage
from . import forks
from .errors import RETRYABLE, storage_error
from .reads import Reads

_JSON = "convert_from({}, 'UTF8')::jsonb"


class ModelReads(Reads):
    # --- views by namespace, executors ----------------------------------------------------

    async def states(self, namespace: str, prefix: bool, after: str, limit: int,
                     max_bytes: int = 0) -> Page[bytes]:
        """Stored views of sessions in a namespace (or under a namespace prefix), by id."""
        if prefix:
            where, args = "namespace >= $1 AND namespace < $2", [namespace,
                                                                 namespace + "\U0010ffff"]
        else:
            where, args = "namespace = $1", [namespace]
        n = len(args)
        rows = await self._page(f"SELECT state FROM sessions WHERE {where} AND session_id >"
                                f" ${n + 1} ORDER BY session_id LIMIT ${n + 2}",
                                (*args, after, limit), max_bytes)
        return repage(rows, [bytes(r[0]) for r in rows])

    async def sessions_with_process(self) -> list[str]:
        """Active sessions whose view names a process: candidates for restart recovery."""
        rows = await self._all("SELECT session_id FROM sessions WHERE status = 'active'"
                               f" AND {_JSON.format('state')} ->> 'pid' IS NOT NULL")
        return [r[0] for r in rows]

    async def process_output(self, session_id: str, turn: int, stream: str | None,
                             after_position: int = 0,
                             max_bytes: int = 0) -> Page[tuple[int, str]]:
        """The output lines of one executor turn (one stream, or both), in order, as
        (position, line), from after `after_position`."""
        data = _JSON.format("data")
        rows = await self._page(
            "SELECT data, position FROM events WHERE session_id = $1"
            " AND type = 'process.output' AND position > $2"
            f" AND ({data} ->> 'turn') = $3::bigint::text AND ($4::text IS NULL OR"
            f" coalesce({data} ->> 'stream', 'stdout') = $4) ORDER BY position",
            (session_id, after_position, turn, stream), max_bytes)
        return repage(rows, [(r[1], msgspec.json.decode(r[0])["line"]) for r in rows])

    async def scoped_state(self, app_name: str,
                           user_ids: list[str]) -> dict[str, dict[str, Any]]:
        """App state (under '') and each listed user's state, as stored by state.updated."""
        users = ["", *user_ids]
        found: dict[str, dict[str, Any]] = {u: {} for u in users}
        rows = await self._all("SELECT user_id, key, value FROM scoped_state WHERE"
                               " app_name = $1 AND user_id = ANY($2::text[])", app_name, users)
        for user, key, value in rows:
            found[user][key] = msgspec.json.decode(value)
        return found

    # --- LangGraph ------------------------------------------------------------------------

    async def graph_checkpoints(self, session_id: str | None, ns: str | None,
                                checkpoint_id: str | None, before: str | None, limit: int,
                                offset: int, after: tuple[str, str, str] | None = None
                                ) -> list[tuple[str, str, str, bytes]]:
        """(session_id, ns, checkpoint_id, event data) of indexed checkpoints, newest id
        first (then by session_id, ns); only those past `after`, such a triple, when given."""
        where: list[str] = []
        args: list[Any] = []
        for column, op, value in (("session_id", "=", session_id), ("ns", "=", ns),
                                  ("checkpoint_id", "=", checkpoint_id),
                                  ("checkpoint_id", "<", before)):
            if value is not None:
                args.append(value)
                where.append(f"gc.{column} {op} ${len(args)}")
        if after is not None:
            args += [after[2], after[0], after[1]]
            c, s, n = (f"${len(args) - 2}", f"${len(args) - 1}", f"${len(args)}")
            where.append(f"(gc.checkpoint_id < {c} OR (gc.checkpoint_id = {c} AND"
                         f" (gc.session_id > {s} OR (gc.session_id = {s} AND gc.ns > {n}))))")
        args += [limit, offset]
        rows = await self._all(
            "SELECT gc.session_id, gc.ns, gc.checkpoint_id, e.data FROM graph_checkpoints gc"
            " JOIN events e ON e.position = gc.position"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY gc.checkpoint_id DESC, gc.session_id, gc.ns"
            f" LIMIT ${len(args) - 1} OFFSET ${len(args)}", *args)
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def graph_checkpoint_ids(self, session_id: str) -> list[tuple[str, str]]:
        rows = await self._all("SELECT ns, checkpoint_id FROM graph_checkpoints WHERE"
                               " session_id = $1 ORDER BY checkpoint_id DESC", session_id)
        return [(r[0], r[1]) for r in rows]

    async def graph_values(self, session_id: str, ns: str,
                           wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        """The stored values of these (channel, version) pairs, from the events holding them."""
        rows = await self._all(
            "SELECT gb.channel, gb.version, e.position, e.data FROM graph_blobs gb"
            " JOIN unnest($3::text[], $4::text[]) AS w(channel, version)"
            " ON gb.channel = w.channel AND gb.version = w.version"
            " JOIN events e ON e.position = gb.position WHERE gb.session_id = $1"
            " AND gb.ns = $2", session_id, ns, [w[0] for w in wanted], [w[1] for w in wanted])
        found: dict[tuple[str, str], Any] = {}
        decoded: dict[int, Any] = {}
        for channel, version, position, data in rows:
            if position not in decoded:
                decoded[position] = msgspec.json.decode(data)
            found[(channel, version)] = decoded[position]["blobs"][channel]
        return found

    async def graph_pending(self, session_id: str, ns: str,
                            checkpoint_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each checkpoint's pending writes, by task then idx."""
        rows = await self._all(
            "SELECT gw.checkpoint_id, gw.item, e.position, e.data FROM graph_writes gw"
            " JOIN events e ON e.position = gw.position WHERE gw.session_id = $1"
            " AND gw.ns = $2 AND gw.checkpoint_id = ANY($3::text[])"
            " ORDER BY gw.checkpoint_id, gw.task_id, gw.idx", session_id, ns, checkpoint_ids)
        found: dict[str, list[dict[str, Any]]] = {}
        add_pending_writes(found, rows)
        return found

    async def graph_runs(self, run_ids: list[str]) -> list[tuple[str, str, str]]:
        rows = await self._all("SELECT session_id, ns, checkpoint_id FROM graph_checkpoints"
                               " WHERE run_id = ANY($1::text[]) ORDER BY session_id", run_ids)
        return [(r[0], r[1], r[2]) for r in rows]

    # --- forks ----------------------------------------------------------------------------

    async def hash_at(self, session_id: str, version: int) -> str | None:
        """The chain hash of a session's history at `version` (an ancestor's below its
        fork point)."""
        try:
            async with self._pool.acquire() as con:
                return await forks.hash_at(con, session_id, version)
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc, read=True) from exc

    async def fork_ancestry(self, session_id: str, limit: int) -> list[str]:
        try:
            async with self._pool.acquire() as con:
                return await forks.ancestry(con, session_id, limit)
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc, read=True) from exc

    async def fork_count(self, session_id: str) -> int:
        row = await self._one("SELECT COUNT(*) FROM forks WHERE source_id = $1", session_id)
        return int(row[0])

    async def forks_page(self, source_id: str, after: str,
                         limit: int) -> tuple[int, list[ForkRow]]:
        """(how many forks `source_id` has, those after id `after`, by id)."""
        rows = await self._all("SELECT session_id, version, forked_at FROM forks WHERE"
                               " source_id = $1 AND session_id > $2 ORDER BY session_id"
                               " LIMIT $3", source_id, after, limit)
        return await self.fork_count(source_id), [
            ForkRow(session_id=r[0], version=int(r[1]), forked_at=r[2]) for r in rows]
