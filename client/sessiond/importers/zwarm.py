"""zwarm `.zwarm/sessions/<id>/meta.json` and `turns/turn_N.jsonl` (seed 004) as events.

The history is written in the order zwarm lived it: each turn is its user message, the
executor's process (its output lines), then the assistant's answer, so `trajectory` shows
the task first. zwarm keeps no time per output line: a turn's lines carry its start.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from sessiond_schemas.events import new_id

from ._builder import (
    DocumentBuilder,
    Found,
    Problem,
    TDict,
    load_json,
    problem_of,
    root_object,
)

_STATUS = {"completed": "completed", "failed": "failed", "killed": "killed"}


def _session_dirs(path: str) -> list[str]:
    """A project (with .zwarm/), the .zwarm or sessions folder, or one session's folder.
    Every folder of a sessions folder is a session: one without meta.json fails."""
    if os.path.lexists(os.path.join(path, "meta.json")):
        return [path]
    for sub in (os.path.join(path, ".zwarm", "sessions"), os.path.join(path, "sessions"), path):
        if os.path.isdir(sub):
            found = sorted(os.path.join(sub, d) for d in os.listdir(sub)
                           if os.path.isdir(os.path.join(sub, d)))
            if found and (sub != path or any(
                    os.path.lexists(os.path.join(d, "meta.json")) for d in found)):
                return found
    return []


def documents(path: str, strict: bool = False) -> Iterator[Found]:
    if os.path.basename(path) == "meta.json" and os.path.isfile(path):
        path = os.path.dirname(path) or "."  # one session's meta.json
    if not os.path.isdir(path):
        yield Found(path, problem=Problem("no such directory" if not os.path.lexists(path)
                                          else "not a directory"))
        return
    try:
        folders = _session_dirs(path)
    except OSError as exc:
        yield Found(path, problem=problem_of(exc))
        return
    for folder in folders:
        file = os.path.join(folder, "meta.json")
        try:
            meta = load_json(file)
            yield Found(file, *_convert(folder, root_object(meta, "a zwarm meta.json")))
        except _TurnProblem as exc:
            yield Found(exc.file, problem=exc.problem)
        except Exception as exc:  # every failure is this file's result
            yield Found(file, problem=problem_of(exc))


class _TurnProblem(Exception):
    def __init__(self, file: str, problem: Problem) -> None:
        super().__init__(problem.reason)
        self.file, self.problem = file, problem


def _turn_lines(file: str) -> list[str]:
    if not os.path.lexists(file):
        return []
    try:
        with open(file, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    except OSError as exc:
        raise _TurnProblem(file, problem_of(exc)) from None


def _convert(folder: str, m: TDict) -> tuple[dict[str, Any], list[str]]:
    warnings: list[str] = []
    created = m.time("created_at", required=True)
    updated = m.time("updated_at") or created
    b = DocumentBuilder(m.text("id", required=True), "zwarm")
    b.add("session.created", {
        "task": m.text("task"), "working_dir": m.text("working_dir"),
        "model": m.text("model") or None, "adapter": m.text("adapter"),
        "source": m.text("source", "user"),
        "status": "pending" if m.get("status") == "pending" else "active",
    }, created)
    pid = m.number("pid")
    turns = max(1, int(m.number("turn", 1)))
    # Messages by turn: the k-th user message opens turn k; what follows it is its answer.
    by_turn: dict[int, list[tuple[str, dict[str, Any], str]]] = {}
    turn, users = 1, 0
    for i, msg in enumerate(m.seq("messages")):
        where = f"$.messages[{i}]"
        if not isinstance(msg, TDict):
            raise Problem("expected an object", where)
        role, content = msg.get("role"), msg.text("content") or ""
        if role not in ("user", "assistant", "system", "tool") or not content.strip():
            warnings.append(f"{where}: skipped a message with role {role!r} or no content")
            continue
        if role == "user":
            users += 1
            turn = min(users, turns)
        data = {"message_id": new_id(), "role": role, "content": content,
                "metadata": msg.obj("metadata")}
        if role == "tool":
            data["tool_call_id"] = str(msg.obj("metadata").get("tool_call_id") or "unknown")
        by_turn.setdefault(turn, []).append((role, data, msg.time("timestamp") or created))
    sequence = 0

    def message(data: dict[str, Any], at: str) -> None:
        nonlocal sequence
        b.add("message.appended", {**data, "sequence": sequence}, at)
        sequence += 1

    for turn in range(1, turns + 1):
        held = by_turn.get(turn, [])
        first_user = next((i for i, x in enumerate(held) if x[0] == "user"), -1)
        opening, rest = held[:first_user + 1], held[first_user + 1:]
        start = opening[-1][2] if opening else created
        for _, data, at in opening:
            message(data, at)
        b.add("process.started", {"pid": pid, "argv": [m.text("adapter") or "executor"],
                                  "cwd": m.text("working_dir"), "turn": turn}, start)
        for line in _turn_lines(os.path.join(folder, "turns", f"turn_{turn}.jsonl")):
            b.add("process.output", {"turn": turn, "stream": "stdout", "line": line}, start)
        last = turn == turns and m.get("status") != "running"
        if turn < turns or last:
            end = rest[0][2] if rest else start
            b.add("process.exited", {"pid": pid, "turn": turn,
                                     "exit_code": m.get("exit_code") if last else None}, end)
        for _, data, at in rest:
            message(data, at)
    usage = m.obj("token_usage")
    b.add("tokens.recorded", {"input_tokens": usage.number("input_tokens"),
                              "output_tokens": usage.number("output_tokens")}, updated)
    status = _STATUS.get(m.text("status") or "")
    if status:
        change = {"from": "active", "to": status}
        if m.get("error"):
            change["error"] = m.text("error")
        b.add("session.status_changed", change, updated)
    return b.document(), warnings
