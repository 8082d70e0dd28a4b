"""LangGraph's summarization as sessiond compactions (issue 48), where it can be told
apart: a write to the `messages` channel that replaces the whole list, a RemoveMessage
of every message (`REMOVE_ALL_MESSAGES`) followed by the messages the graph goes on with
(what langmem's SummarizationNode writes with `output_messages_key="messages"`, and any
node that summarizes and replaces the history). Those messages become the summary of a
session.compacted (by "langgraph") in the thread's session. A summary kept in another
channel beside RemoveMessages of some messages (LangGraph's how-to pattern) is not told
apart from an edit: nothing is recorded for it. The checkpoints themselves are stored as
before; the compaction is a mark for session.context and `sessionctl context`."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage

REMOVE_ALL = "__remove_all__"  # langgraph's REMOVE_ALL_MESSAGES
MAX_SUMMARY = 1000
_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def _message(m: BaseMessage) -> dict[str, Any]:
    text = m.content if isinstance(m.content, str) else " ".join(
        str(b.get("text", "")) if isinstance(b, dict) else str(b) for b in m.content)
    out: dict[str, Any] = {"role": _ROLES.get(m.type, "assistant"),
                           "content": text if text.strip() else f"[{m.type} message]"}
    if out["role"] == "tool":
        out["tool_call_id"] = str(getattr(m, "tool_call_id", "") or "unknown")
    if m.id:
        out["metadata"] = {"langgraph_id": m.id}
    return out


def compactions(thread: dict[str, Any], writes: Sequence[tuple[str, Any]],
                task_id: str) -> list[dict[str, Any]]:
    """session.compact params for each whole-history replacement among a task's writes,
    keyed by the checkpoint, task and write (stored again, they are recorded once)."""
    found = []
    for i, (channel, value) in enumerate(writes):
        if channel != "messages" or not isinstance(value, (list, tuple)) or not value:
            continue
        first, rest = value[0], [m for m in value[1:] if isinstance(m, BaseMessage)
                                 and not isinstance(m, RemoveMessage)]
        if not (isinstance(first, RemoveMessage) and first.id == REMOVE_ALL and rest):
            continue
        key = "\0".join((thread.get("checkpoint_ns", ""), str(thread["checkpoint_id"]),
                         task_id, str(i))).encode()
        found.append({"summary": [_message(m) for m in rest[-MAX_SUMMARY:]], "by": "langgraph",
                      "idempotency_key": "lg-compact:" + hashlib.sha256(key).hexdigest()})
    return found
