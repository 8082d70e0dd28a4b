"""The LangGraph saver's rules: graph_checkpoints and graph_blobs (the latest save wins),
graph_writes (a repeated (task, idx) keeps the first write, except for the special
channels, negative idx: errors, interrupts, where the latest wins, as LangGraph's savers
do), and a prune removing what came before it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiond_daemon.stores.models.ops import DeleteWhere, Insert, Keep, Op
from sessiond_schemas.events import Event, GraphCheckpoint, GraphPruned, GraphWrites


def _add(ops: list[Op], table: str, rows: list[tuple[Any, ...]], keep: Keep) -> None:
    """Rows appended to the last op when it inserts into the same table the same way."""
    last = ops[-1] if ops else None
    if isinstance(last, Insert) and last.table == table and last.keep == keep:
        last.rows.extend(rows)
    elif rows:
        ops.append(Insert(table, rows, keep))


def graphs(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    ops: list[Op] = []
    for e in events:
        d, sid = e.data, e.session_id
        if isinstance(d, GraphCheckpoint):
            run_id = d.metadata.get("run_id")
            _add(ops, "graph_checkpoints", [(sid, d.ns, d.checkpoint_id,
                                             run_id if isinstance(run_id, str) else None,
                                             e.position)], "latest")
            _add(ops, "graph_blobs", [(sid, d.ns, channel, d.channel_versions[channel],
                                       e.position) for channel in d.blobs],
                 "latest")
        elif isinstance(d, GraphWrites):
            for item, w in enumerate(d.writes):
                _add(ops, "graph_writes", [(sid, d.ns, d.checkpoint_id, d.task_id,
                                            w.idx, e.position, item)],
                     "latest" if w.idx < 0 else "first")
        elif isinstance(d, GraphPruned):
            for pruned_ns, checkpoint_id in d.checkpoints:
                for table in ("graph_checkpoints", "graph_writes"):
                    ops.append(DeleteWhere(table, (("session_id", sid), ("ns", pruned_ns),
                                                   ("checkpoint_id", checkpoint_id))))
    return ops
