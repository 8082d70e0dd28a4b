"""Hive `sessions/<id>/state.json` documents (seed 000, schema 1.0 and 1.1) as events."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from ._builder import DocumentBuilder


def _state_files(path: str) -> list[str]:
    """A storage root, its sessions/ folder, or one session's folder."""
    if os.path.isfile(os.path.join(path, "state.json")):
        return [os.path.join(path, "state.json")]
    sessions = os.path.join(path, "sessions")
    folder = sessions if os.path.isdir(sessions) else path
    return sorted(os.path.join(folder, d, "state.json") for d in os.listdir(folder)
                  if os.path.isfile(os.path.join(folder, d, "state.json")))


def documents(path: str) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    for file in _state_files(path):
        with open(file, encoding="utf-8") as f:
            state = json.load(f)
        yield file, *_convert(state)


def _convert(s: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    ts, p = s.get("timestamps", {}), s.get("progress", {})
    metrics, result = s.get("metrics", {}), s.get("result", {})
    started = ts["started_at"]
    b = DocumentBuilder(s["session_id"], "hive")
    b.add("session.created", {
        "goal_id": s.get("goal_id"), "agent_id": s.get("agent_id"),
        "stream_id": s.get("stream_id"), "correlation_id": s.get("correlation_id"),
        "entry_point": s.get("entry_point", "start"),
        "isolation_level": s.get("isolation_level", "shared"),
        "checkpoint_enabled": bool(s.get("checkpoint_enabled", False)),  # absent in 1.0
        "input_data": s.get("input_data") or {}, "status": "active",
    }, started)
    # The path, one step per node; what Hive kept as totals goes on the first visit.
    path: list[str] = p.get("path") or []
    if not path and metrics.get("nodes_executed"):
        # Legacy (1.0, from_legacy_run) states list the nodes a run executed but no path.
        path = list(metrics["nodes_executed"])
        warnings.append("no progress.path: metrics.nodes_executed taken as the path")
    edges: list[str] = metrics.get("edges_traversed") or []
    retries: dict[str, int] = dict(p.get("retry_details") or {})
    failed = set(p.get("nodes_with_failures") or [])
    extra_retries = (p.get("total_retries") or 0) - sum(retries.values())
    in_tokens = metrics.get("total_input_tokens") or 0
    out_tokens = metrics.get("total_output_tokens") or 0
    step_tokens = max(0, (p.get("total_tokens") or 0) - in_tokens - out_tokens)
    seen: set[str] = set()
    for i, node in enumerate(path):
        step: dict[str, Any] = {"node_id": node}
        if i >= 1 and i - 1 < len(edges):
            step["edge"] = edges[i - 1]
        if node not in seen:
            step["retries"] = retries.pop(node, 0)
            step["failed"] = node in failed
        if i == 0:
            step.update(latency_ms=p.get("total_latency_ms") or 0, tokens=step_tokens)
            step["retries"] = step.get("retries", 0) + max(0, extra_retries)
        seen.add(node)
        b.add("progress.recorded", step, started)
    if in_tokens or out_tokens:
        b.add("tokens.recorded", {"input_tokens": in_tokens, "output_tokens": out_tokens}, started)
    memory = s.get("memory") or {}
    if memory:
        if any(v is None for v in memory.values()):
            warnings.append("memory keys whose value is null are left out (a merge patch"
                            " cannot set null)")
        b.add("memory.updated", {"patch": memory}, started)
    for problem in s.get("problems") or []:
        b.add("problem.recorded", problem, started)
    for decision in s.get("decisions") or []:
        b.add("decision.recorded", decision, started)
    if s.get("latest_checkpoint_id"):
        # Hive keeps checkpoint payloads in files of its own; the id is what state.json has.
        b.add("checkpoint.saved", {"checkpoint_id": s["latest_checkpoint_id"], "size": 0}, started)
        b.checkpoints.append({"checkpoint_id": s["latest_checkpoint_id"], "payload": None})
        warnings.append("checkpoint payloads are not in state.json and were not imported")
    if result.get("success") is not None or result.get("output") or result.get("error"):
        b.add("result.recorded", {"success": result.get("success"),
                                  "output": result.get("output") or {},
                                  "error": result.get("error")}, started)
    status = s.get("status", "active")
    if status == "paused":
        b.add("session.status_changed", {
            "from": "active", "to": "paused", "paused_at": p.get("paused_at"),
            "resume_from": p.get("resume_from")}, ts.get("paused_at_time") or ts["updated_at"])
    elif status in ("completed", "failed", "cancelled"):
        change = {"from": "active", "to": status}
        if status == "failed" and result.get("error"):
            change["error"] = result["error"]
        if p.get("resume_from"):
            change["resume_from"] = p["resume_from"]
        b.add("session.status_changed", change, ts.get("completed_at") or ts["updated_at"])
    elif ts.get("updated_at") and len(b.events) > 1:
        b.retime_last(ts["updated_at"])  # so that the view's updated_at is the source's
    return b.document(), warnings
