"""Hive `sessions/<id>/state.json` documents (seed 000, schema 1.0 and 1.1) as events."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from ._builder import (
    DocumentBuilder,
    Found,
    Problem,
    TDict,
    load_json,
    problem_of,
    root_object,
)


def _state_files(path: str) -> list[str]:
    """A storage root, its sessions/ folder, or one session's folder (or its state.json).
    A folder of sessions/ whose state.json is missing or not a file is listed too: its
    result says so."""
    if os.path.isfile(path) or os.path.basename(path) == "state.json":
        return [path]
    if os.path.lexists(os.path.join(path, "state.json")):
        return [os.path.join(path, "state.json")]
    sessions = os.path.join(path, "sessions")
    if os.path.isdir(sessions) or os.path.basename(os.path.normpath(path)) == "sessions":
        folder = sessions if os.path.isdir(sessions) else path
        return sorted(os.path.join(folder, d, "state.json") for d in os.listdir(folder)
                      if os.path.isdir(os.path.join(folder, d)))
    # Some other folder: its subfolders that hold a state.json are sessions.
    return sorted(os.path.join(path, d, "state.json") for d in os.listdir(path)
                  if os.path.lexists(os.path.join(path, d, "state.json")))


def documents(path: str, strict: bool = False) -> Iterator[Found]:
    if not os.path.isdir(path) and not os.path.isfile(path):
        yield Found(path, problem=Problem("no such directory" if not os.path.lexists(path)
                                          else "not a directory or a file"))
        return
    try:
        files = _state_files(path)
    except OSError as exc:
        yield Found(path, problem=problem_of(exc))
        return
    for file in files:
        try:
            state = load_json(file)
            yield Found(file, *_convert(root_object(state, "a Hive state")))
        except Exception as exc:  # every failure is this file's result
            yield Found(file, problem=problem_of(exc))


def _convert(s: TDict) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    ts, p = s.obj("timestamps"), s.obj("progress")
    metrics, result = s.obj("metrics"), s.obj("result")
    started = ts.time("started_at", required=True)
    b = DocumentBuilder(s.text("session_id", required=True), "hive")
    b.add("session.created", {
        "goal_id": s.get("goal_id"), "agent_id": s.get("agent_id"),
        "stream_id": s.get("stream_id"), "correlation_id": s.get("correlation_id"),
        "entry_point": s.get("entry_point", "start"),
        "isolation_level": s.get("isolation_level", "shared"),
        "checkpoint_enabled": bool(s.get("checkpoint_enabled", False)),  # absent in 1.0
        "input_data": s.obj("input_data"), "status": "active",
    }, started)
    # The path, one step per node; what Hive kept as totals goes on the first visit.
    path: list[str] = p.seq("path")
    if not path and metrics.get("nodes_executed"):
        # Legacy (1.0, from_legacy_run) states list the nodes a run executed but no path.
        path = list(metrics["nodes_executed"])
        warnings.append("no progress.path: metrics.nodes_executed taken as the path")
    edges: list[str] = metrics.seq("edges_traversed")
    retries: dict[str, int] = dict(p.obj("retry_details"))
    failed = set(p.seq("nodes_with_failures"))
    extra_retries = p.number("total_retries") - sum(retries.values())
    in_tokens = metrics.number("total_input_tokens")
    out_tokens = metrics.number("total_output_tokens")
    step_tokens = max(0, p.number("total_tokens") - in_tokens - out_tokens)
    seen: set[str] = set()
    for i, node in enumerate(path):
        step: dict[str, Any] = {"node_id": node}
        if i >= 1 and i - 1 < len(edges):
            step["edge"] = edges[i - 1]
        if node not in seen:
            step["retries"] = retries.pop(node, 0)
            step["failed"] = node in failed
        if i == 0:
            step.update(latency_ms=p.number("total_latency_ms"), tokens=step_tokens)
            step["retries"] = step.get("retries", 0) + max(0, extra_retries)
        seen.add(node)
        b.add("progress.recorded", step, started)
    if in_tokens or out_tokens:
        b.add("tokens.recorded", {"input_tokens": in_tokens, "output_tokens": out_tokens}, started)
    memory = s.obj("memory")
    if memory:
        if any(v is None for v in memory.values()):
            warnings.append("memory keys whose value is null are left out (a merge patch"
                            " cannot set null)")
        b.add("memory.updated", {"patch": memory}, started)
    for problem in s.seq("problems"):
        b.add("problem.recorded", problem, started)
    for decision in s.seq("decisions"):
        b.add("decision.recorded", decision, started)
    if s.get("latest_checkpoint_id"):
        # Hive keeps checkpoint payloads in files of its own; the id is what state.json has.
        b.add("checkpoint.saved", {"checkpoint_id": s["latest_checkpoint_id"], "size": 0}, started)
        b.checkpoints.append({"checkpoint_id": s["latest_checkpoint_id"], "payload": None})
        warnings.append("checkpoint payloads are not in state.json and were not imported")
    if result.get("success") is not None or result.get("output") or result.get("error"):
        b.add("result.recorded", {"success": result.get("success"),
                                  "output": result.obj("output"),
                                  "error": result.get("error")}, started)
    status = s.text("status", "active")
    if status == "paused":
        b.add("session.status_changed", {
            "from": "active", "to": "paused", "paused_at": p.get("paused_at"),
            "resume_from": p.get("resume_from")},
            ts.time("paused_at_time") or ts.time("updated_at", required=True))
    elif status in ("completed", "failed", "cancelled"):
        change = {"from": "active", "to": status}
        if status == "failed" and result.get("error"):
            change["error"] = result["error"]
        if p.get("resume_from"):
            change["resume_from"] = p["resume_from"]
        b.add("session.status_changed", change,
              ts.time("completed_at") or ts.time("updated_at", required=True))
    elif ts.time("updated_at") and len(b.events) > 1:
        b.retime_last(ts.time("updated_at"))  # so that the view's updated_at is the source's
    return b.document(), warnings
