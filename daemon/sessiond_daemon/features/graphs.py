"""Graph checkpoints (LangGraph's BaseCheckpointSaver) as events: the graph.* methods.

A thread is a session. `graph.put` appends a graph.checkpoint event that carries the
checkpoint and only the channel values that changed; `graph.put_writes` appends pending
writes. The graph_* tables index those events (stores/models/graphs.py keeps them in
step), so reading the latest checkpoint costs a few indexed reads, not a walk over the
thread's history.
Prunes and run deletions are graph.pruned events: they leave the index, not the history.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import msgspec

from sessiond_daemon.core import access
from sessiond_daemon.core.commands import Commands, default_ttl, given, require
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.core.writer import Delete, Plan, PlanData
from sessiond_daemon.stores.interface import GraphReads
from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import (
    EventMeta,
    GraphCheckpoint,
    GraphPruned,
    GraphWrites,
    SessionCreated,
    Typed,
)
from sessiond_schemas.state import SessionState

PAGE = 200  # index rows read at a time by graph.list
_json = msgspec.json.Encoder()
NAMESPACE = "langgraph"


class Graphs:
    """The graph.* methods over the store (its graph read model) and the commands."""

    def __init__(self, store: GraphReads, commands: Commands) -> None:
        self.store = store
        self.commands = commands

    # --- writes ---------------------------------------------------------------------

    async def graph_put(self, p: rpc.GraphPutParams, meta: EventMeta) -> msgspec.Raw:
        data = _event_data(p, GraphCheckpoint)
        self.commands.check_checkpoint_size(data, "graph.checkpoint data")
        if access.is_peer() and await self.store.graph_checkpoints(
                p.session_id, p.ns, p.checkpoint_id, None, 1, 0):
            # Replacing a checkpoint takes what graph.get serves out of the view.
            access.require("graph.put", access.GRAPH_REPLACE)
        return await self._append(p.session_id, p.thread_id, p.ttl_s, meta,
                                  [("graph.checkpoint", data)])

    async def graph_put_writes(self, p: rpc.GraphPutWritesParams, meta: EventMeta) -> msgspec.Raw:
        data = _event_data(p, GraphWrites)
        self.commands.check_checkpoint_size(data, "graph.writes data")
        return await self._append(p.session_id, p.thread_id, p.ttl_s, meta,
                                  [("graph.writes", data)])

    async def _append(self, sid: str, thread_id: str, ttl_s: int | None, meta: EventMeta,
                      events: list[tuple[str, PlanData]]) -> msgspec.Raw:
        """Append to the thread's session, creating it on its first checkpoint (with the
        call's ttl_s, else the namespace's default, as session.create)."""
        if ttl_s is None:
            ttl_s = default_ttl(self.commands.limits.default_ttl_s, NAMESPACE)
        created = SessionCreated(
            namespace=NAMESPACE, source="langgraph", metadata={"thread_id": thread_id},
            ttl_s=ttl_s)

        def plan(state: SessionState | None) -> Plan:
            first: list[tuple[str, PlanData]] = (
                [("session.created", created)] if state is None else [])
            return Plan([*first, *events], lambda s, ev: {
                "session_id": s.session_id, "version": s.version, "position": ev[-1].position})

        return await self.commands.submit(sid, meta, plan)

    async def graph_delete_runs(self, p: rpc.GraphRunsParams,
                                meta: EventMeta) -> rpc.GraphChangeResult:
        rows = await self.store.graph_runs(p.run_ids) if p.run_ids else []
        by_session: dict[str, list[tuple[str, str]]] = {}
        for sid, ns, checkpoint_id in rows:
            by_session.setdefault(sid, []).append((ns, checkpoint_id))
        for sid, checkpoints in by_session.items():
            await self._prune(sid, checkpoints, "runs deleted", meta)
        return rpc.GraphChangeResult(checkpoints=len(rows), sessions=sorted(by_session))

    async def graph_prune(self, p: rpc.GraphPruneParams, meta: EventMeta) -> rpc.GraphChangeResult:
        count, touched = 0, []
        for sid in p.session_ids:
            rows = await self.store.graph_checkpoint_ids(sid)
            if not rows:
                continue
            if p.strategy == "delete":
                def delete(s: SessionState | None, sid: str = sid) -> Delete:
                    require(s, sid)
                    return Delete({"deleted": True})

                await self.commands.submit(sid, meta, delete)
                count += len(rows)
                touched.append(sid)
                continue
            latest: dict[str, str] = {}
            for ns, checkpoint_id in rows:  # newest first
                latest.setdefault(ns, checkpoint_id)
            old = [(ns, cid) for ns, cid in rows if latest[ns] != cid]
            if old:
                await self._prune(sid, old, "pruned: keep_latest", meta)
                count += len(old)
                touched.append(sid)
        return rpc.GraphChangeResult(checkpoints=count, sessions=touched)

    async def _prune(self, sid: str, checkpoints: list[tuple[str, str]], reason: str,
                     meta: EventMeta) -> None:
        data = GraphPruned(checkpoints=checkpoints, reason=reason)

        def plan(state: SessionState | None) -> Plan:
            require(state, sid)
            return Plan([("graph.pruned", data)], lambda s, ev: None)

        await self.commands.submit(sid, meta, plan)

    async def graph_copy(self, p: rpc.GraphCopyParams, meta: EventMeta) -> rpc.GraphChangeResult:
        """Copy the source thread's indexed checkpoints and writes, oldest first.

        Values move as they are stored, not resolved per checkpoint: each copied checkpoint
        carries the values its own event stored, plus those it refers to that no copied
        checkpoint before it carries (their event was pruned), so every distinct value is
        written once and the copy weighs what the source's values weigh, not that times
        its checkpoints. No copied event passes max_checkpoint_bytes (-32005 otherwise,
        before anything is written)."""
        rows, offset = [], 0
        while page := await self.store.graph_checkpoints(p.source_session_id, None, None, None,
                                                         PAGE, offset):
            rows += page
            offset += len(page)
        if not rows:
            return rpc.GraphChangeResult(checkpoints=0, sessions=[])
        sid = p.source_session_id
        picked = [(ns, cid, msgspec.json.decode(raw)) for _, ns, cid, raw in reversed(rows)]
        carried: set[tuple[str, str, str]] = set()  # (ns, channel, version) in the copy
        needs: list[dict[str, str]] = []
        for ns, _, d in picked:
            own = d.get("blobs", {})
            need = {c: v for c, v in d.get("channel_versions", {}).items()
                    if c not in own and (ns, c, v) not in carried}
            carried |= {(ns, c, d["channel_versions"][c]) for c in own
                        if c in d.get("channel_versions", {})} | {(ns, c, v)
                                                                  for c, v in need.items()}
            needs.append(need)
        values: dict[str, dict[tuple[str, str], Any]] = {}
        for ns in {ns for ns, _, _ in picked}:
            wanted = sorted({(c, v) for (n, _, _), need in zip(picked, needs, strict=True)
                             if n == ns for c, v in need.items()})
            values[ns] = await self.store.graph_values(sid, ns, wanted) if wanted else {}
        pending: dict[str, dict[str, list[dict[str, Any]]]] = {}
        for ns in values:
            pending[ns] = await self.store.graph_pending(
                sid, ns, [cid for n, cid, _ in picked if n == ns])
        # The copies carry the stored data as it is (unknown fields too): Given.
        events: list[tuple[str, PlanData]] = []
        for (ns, cid, d), need in zip(picked, needs, strict=True):
            blobs = dict(d.get("blobs", {}))
            blobs |= {c: values[ns][(c, v)] for c, v in need.items() if (c, v) in values[ns]}
            data = {**d, "thread_id": p.target_thread_id, "ns": ns, "blobs": blobs}
            self.commands.check_checkpoint_size(data, f"graph.copy of checkpoint {cid}")
            events.append(("graph.checkpoint", given("graph.checkpoint", data)))
            by_task: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for i, w in enumerate(pending[ns].get(cid, [])):
                by_task.setdefault((w["task_id"], w["task_path"]), []).append(
                    {"idx": i, "channel": w["channel"], "value": w["value"]})
            for (task_id, task_path), writes in by_task.items():
                wdata = {"thread_id": p.target_thread_id, "ns": ns, "checkpoint_id": cid,
                         "task_id": task_id, "task_path": task_path, "writes": writes}
                self.commands.check_checkpoint_size(wdata, f"graph.copy of {cid}'s writes")
                events.append(("graph.writes", given("graph.writes", wdata)))
        await self._append(p.target_session_id, p.target_thread_id, None, meta, events)
        return rpc.GraphChangeResult(checkpoints=len(rows), sessions=[p.target_session_id])

    # --- reads ----------------------------------------------------------------------

    async def graph_get(self, p: rpc.GraphGetParams, meta: EventMeta) -> rpc.GraphGetResult:
        rows = await self.store.graph_checkpoints(p.session_id, p.ns, p.checkpoint_id, None, 1, 0)
        tuples = await self._tuples(rows, None)
        return rpc.GraphGetResult(tuple=tuples[0] if tuples else None)

    async def graph_list(self, p: rpc.GraphListParams, meta: EventMeta) -> rpc.GraphListResult:
        found: list[rpc.GraphTuple] = []
        offset, used, budget, cut = 0, 0, page_budget.get(), False
        after = _cursor_position(p.cursor) if p.cursor is not None else None
        chunk = 4  # rows read (with their data) at a time: grown from the sizes seen, so
        # a page never reads much past its byte budget however large each checkpoint is
        while not cut and (p.limit is None or len(found) < p.limit):
            page = chunk if p.limit is None or p.filter else min(chunk, p.limit - len(found))
            rows = await self.store.graph_checkpoints(p.session_id, p.ns, p.checkpoint_id,
                                                      p.before, page, offset, after)
            offset += len(rows)
            for t in await self._tuples(rows, p.filter or None):
                size = len(_json.encode(t))  # a page ends at the byte budget (max_page_bytes)
                if found and used + size > budget:
                    cut = True
                    break
                found.append(t)
                used += size
            if len(rows) < page:
                break
            if found:
                chunk = max(1, min(PAGE, (budget - used) // max(1, used // len(found)) + 1))
        found = found if p.limit is None else found[:p.limit]
        last = found[-1] if cut else None
        return rpc.GraphListResult(
            tuples=found, truncated_by_bytes=cut,
            next=_cursor_of(last.session_id, last.ns, last.checkpoint_id) if last else None)

    async def graph_delta_history(self, p: rpc.GraphDeltaHistoryParams,
                                  meta: EventMeta) -> rpc.GraphDeltaHistoryResult:
        """LangGraph's get_delta_channel_history, from the index in one call: the parent
        chain is followed over pages of the thread's checkpoints (a few reads per PAGE of
        ancestors, never a round trip per ancestor). As LangGraph's default walk: from the
        parent back, each checkpoint's writes to a channel are taken, until (and with) the
        nearest one that holds a value of it, which is the seed."""
        found = {ch: rpc.ChannelHistory(writes=[]) for ch in p.channels}
        target = await self.store.graph_checkpoints(p.session_id, p.ns, p.checkpoint_id,
                                                    None, 1, 0)
        if not target or not p.channels:
            return rpc.GraphDeltaHistoryResult(channels=found)
        remaining = set(p.channels)
        picked: list[tuple[str, set[str]]] = []  # (checkpoint, the channels it gives writes)
        async for page in self._ancestors(p.session_id, p.ns, target[0]):
            # The values these ancestors hold for the channels still open: their own
            # blobs, or (one read for the page) the events that stored those versions.
            wanted = sorted({(ch, d["channel_versions"][ch]) for _, d in page
                             for ch in remaining if ch in d.get("channel_versions", {})
                             and ch not in d.get("blobs", {})})
            elsewhere = (await self.store.graph_values(p.session_id, p.ns, wanted)
                         if wanted else {})
            for checkpoint_id, d in page:
                if not remaining:
                    break
                picked.append((checkpoint_id, set(remaining)))
                own, versions = d.get("blobs", {}), d.get("channel_versions", {})
                for ch in [c for c in remaining if c in versions]:
                    value = own[ch] if ch in own else elsewhere.get((ch, versions[ch]))
                    if value is not None and value.get("type") != "empty":
                        found[ch].seed = msgspec.convert(value, Typed)
                        remaining.discard(ch)
            if not remaining:
                break
        pending = await self.store.graph_pending(p.session_id, p.ns, [c for c, _ in picked])
        for checkpoint_id, channels in reversed(picked):  # oldest first
            for w in pending.get(checkpoint_id, []):  # in writes_sort_key order
                if w["channel"] in channels:
                    found[w["channel"]].writes.append(msgspec.convert(w, rpc.PendingWrite))
        return rpc.GraphDeltaHistoryResult(channels=found)

    async def _ancestors(self, sid: str, ns: str, target: tuple[str, str, str, bytes]
                         ) -> AsyncIterator[list[tuple[str, dict[str, Any]]]]:
        """The target's parent, its parent, and so on to the root (or to a checkpoint
        pruned away), with each one's event data, a page at a time: the thread's older
        checkpoints are read newest first, PAGE at a time (parents are older)."""
        parent = msgspec.json.decode(target[3]).get("parent_id")
        seen: dict[str, dict[str, Any]] = {}
        offset, exhausted = 0, False
        while parent is not None:
            chain: list[tuple[str, dict[str, Any]]] = []
            while parent is not None and parent in seen:
                chain.append((parent, seen.pop(parent)))
                parent = chain[-1][1].get("parent_id")
            if chain:
                yield chain
            if parent is None or exhausted:
                return
            rows = await self.store.graph_checkpoints(sid, ns, None, target[2], PAGE, offset)
            offset += len(rows)
            exhausted = len(rows) < PAGE
            seen.update((r[2], msgspec.json.decode(r[3])) for r in rows)

    async def _tuples(self, rows: list[tuple[str, str, str, bytes]],
                      filter: dict[str, Any] | None) -> list[rpc.GraphTuple]:
        """Checkpoints with their channel values and pending writes: a few set reads for a
        whole page, whatever its length."""
        picked = []
        for sid, ns, checkpoint_id, raw in rows:
            d = msgspec.json.decode(raw)
            metadata = d.get("metadata", {})
            if not filter or all(_matches(metadata, k, v) for k, v in filter.items()):
                picked.append((sid, ns, checkpoint_id, d))
        groups: dict[tuple[str, str], list[Any]] = {}
        for item in picked:
            groups.setdefault((item[0], item[1]), []).append(item)
        values: dict[tuple[str, str], dict[tuple[str, str], Any]] = {}
        pending: dict[tuple[str, str], dict[str, list[dict[str, Any]]]] = {}
        for (sid, ns), items in groups.items():
            wanted = sorted({(c, v) for *_, d in items for c, v in d["channel_versions"].items()
                             if c not in d.get("blobs", {})})
            values[(sid, ns)] = await self.store.graph_values(sid, ns, wanted) if wanted else {}
            pending[(sid, ns)] = await self.store.graph_pending(sid, ns, [i[2] for i in items])
        out = []
        for sid, ns, checkpoint_id, d in picked:
            versions: dict[str, str] = d.get("channel_versions", {})
            own, elsewhere = d.get("blobs", {}), values[(sid, ns)]
            channel_values = {c: own[c] if c in own else elsewhere[(c, v)]
                              for c, v in versions.items() if c in own or (c, v) in elsewhere}
            out.append(msgspec.convert({
                "session_id": sid, "thread_id": d["thread_id"], "ns": ns,
                "checkpoint_id": checkpoint_id, "parent_id": d.get("parent_id"),
                "checkpoint": d["checkpoint"], "metadata": d.get("metadata", {}),
                "metadata_typed": d.get("metadata_typed"), "channel_versions": versions,
                "channel_values": channel_values,
                "pending_writes": pending[(sid, ns)].get(checkpoint_id, [])}, rpc.GraphTuple))
        return out


_ABSENT = object()


def _matches(metadata: dict[str, Any], key: str, value: Any) -> bool:
    """A metadata filter entry: the key itself, else (a key with dots) the path into nested
    objects, as LangGraph's SQL savers read it (`json_extract(metadata, '$.a.b')`)."""
    found = metadata.get(key, _ABSENT)
    if found is _ABSENT and "." in key:
        found = metadata
        for part in key.split("."):
            found = found.get(part, _ABSENT) if isinstance(found, dict) else _ABSENT
            if found is _ABSENT:
                break
    return bool((None if found is _ABSENT else found) == value)


def _cursor_of(session_id: str, ns: str, checkpoint_id: str) -> str:
    return base64.urlsafe_b64encode(_json.encode([session_id, ns, checkpoint_id])).decode()


def _cursor_position(cursor: str) -> tuple[str, str, str]:
    try:
        return msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode()),
                                   type=tuple[str, str, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor this daemon returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc


D = TypeVar("D", GraphCheckpoint, GraphWrites)


def _event_data(p: msgspec.Struct, kind: type[D]) -> D:
    """The event's data: the params' fields of the event's Struct (the params extend it,
    already validated as it)."""
    return kind(**{f: getattr(p, f) for f in kind.__struct_fields__})
