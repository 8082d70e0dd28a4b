"""zwarm `.zwarm/sessions/<id>/meta.json` and `turns/turn_N.jsonl` (seed 004) as events."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from sessiond_schemas.events import new_id

from ._builder import DocumentBuilder

_STATUS = {"completed": "completed", "failed": "failed", "killed": "killed"}


def _session_dirs(path: str) -> list[str]:
    """A project (with .zwarm/), the .zwarm or sessions folder, or one session's folder."""
    if os.path.isfile(os.path.join(path, "meta.json")):
        return [path]
    for sub in (os.path.join(path, ".zwarm", "sessions"), os.path.join(path, "sessions"), path):
        if os.path.isdir(sub):
            found = sorted(os.path.join(sub, d) for d in os.listdir(sub)
                           if os.path.isfile(os.path.join(sub, d, "meta.json")))
            if found:
                return found
    return []


def documents(path: str) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    for folder in _session_dirs(path):
        with open(os.path.join(folder, "meta.json"), encoding="utf-8") as f:
            meta = json.load(f)
        yield os.path.join(folder, "meta.json"), *_convert(folder, meta)


def _convert(folder: str, m: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    created, updated = m["created_at"], m.get("updated_at") or m["created_at"]
    b = DocumentBuilder(m["id"], "zwarm")
    b.add("session.created", {
        "task": m.get("task"), "working_dir": m.get("working_dir"), "model": m.get("model") or None,
        "adapter": m.get("adapter"), "source": m.get("source", "user"),
        "status": "pending" if m.get("status") == "pending" else "active",
    }, created)
    pid = m.get("pid") or 0
    turns = m.get("turn") or 1
    for turn in range(1, turns + 1):
        b.add("process.started", {"pid": pid, "argv": [m.get("adapter") or "executor"],
                                  "cwd": m.get("working_dir"), "turn": turn}, created)
        output = os.path.join(folder, "turns", f"turn_{turn}.jsonl")
        if os.path.isfile(output):
            with open(output, encoding="utf-8", errors="replace") as f:
                for line in f:
                    b.add("process.output", {"turn": turn, "stream": "stdout",
                                             "line": line.rstrip("\n")}, created)
        last = turn == turns and m.get("status") != "running"
        if turn < turns or last:
            b.add("process.exited", {"pid": pid, "turn": turn,
                                     "exit_code": m.get("exit_code") if last else None}, created)
    sequence = 0
    for msg in m.get("messages") or []:
        role, content = msg.get("role"), msg.get("content") or ""
        if role not in ("user", "assistant", "system", "tool") or not content.strip():
            warnings.append(f"skipped a message with role {role!r} or no content")
            continue
        data = {"message_id": new_id(), "sequence": sequence, "role": role, "content": content,
                "metadata": msg.get("metadata") or {}}
        if role == "tool":
            data["tool_call_id"] = (msg.get("metadata") or {}).get("tool_call_id", "unknown")
        b.add("message.appended", data, msg.get("timestamp") or created)
        sequence += 1
    usage = m.get("token_usage") or {}
    b.add("tokens.recorded", {"input_tokens": usage.get("input_tokens", 0),
                              "output_tokens": usage.get("output_tokens", 0)}, updated)
    status = _STATUS.get(m.get("status", ""))
    if status:
        change = {"from": "active", "to": status}
        if m.get("error"):
            change["error"] = m["error"]
        b.add("session.status_changed", change, updated)
    return b.document(), warnings
