"""Executor adapters: each turns one line of an agent CLI's stdout into events and steps.

An adapter is pure: `parse(line)` returns what the line means (events to append, trajectory
steps, whether it is an assistant reply, an error, the id to resume with), or None for a
line it does not know, which is then kept only as `process.output`. `resume_argv` builds
the command of a follow-up turn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sessiond_daemon.stores.models.agents import RESUME_MARKS  # noqa: F401  (adapters.RESUME_MARKS)
from sessiond_schemas.events import DATA_TYPES

# The event types an executor may write through the jsonl adapter. Status, process and
# checkpoint events belong to the daemon or have their own methods.
JSONL_TYPES = frozenset({
    "message.appended", "tokens.recorded", "progress.recorded", "memory.updated",
    "metadata.updated", "result.recorded", "problem.recorded", "decision.recorded",
    "plan.linked",
})

# An adapter's resume id must come on a stdout line holding one of RESUME_MARKS, defined
# with the runner index's rule (stores/models/agents.py): session.inject reads only those.


@dataclass
class Parsed:
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    steps: list[dict[str, Any]] = field(default_factory=list)
    response: bool = False  # an assistant reply: the turn produced an answer
    error: str | None = None
    resume_id: str | None = None  # codex thread id / claude session id


def _step(kind: str, summary: Any, **details: Any) -> dict[str, Any]:
    return {"type": kind, "summary": "" if summary is None else str(summary),
            "details": {k: v for k, v in details.items() if v is not None}}


def _object(line: str) -> dict[str, Any] | None:
    if not line.lstrip().startswith("{"):  # most plain output: no exception raised and caught
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _message(role: str, content: str, **extra: Any) -> tuple[str, dict[str, Any]]:
    return ("message.appended", {"role": role, "content": content,
                                 **{k: v for k, v in extra.items() if v is not None}})


class JsonlAdapter:
    """Lines that are already sessiond events: {"type": ..., "data": {...}}."""

    name = "jsonl"
    message_on_stdin = True  # a follow-up turn reruns the command with the message on stdin

    def parse(self, line: str) -> Parsed | None:
        obj = _object(line)
        # Any sessiond event type is taken here; the runner refuses (with a problem event)
        # the types an executor may not write, so their author learns why.
        if (obj is None or obj.get("type") not in DATA_TYPES
                or not isinstance(obj.get("data"), dict)):
            return None
        kind, data = obj["type"], obj["data"]
        out = Parsed(events=[(kind, data)])
        if kind == "message.appended":
            role = data.get("role")
            out.response = role == "assistant"
            out.steps.append(_step("user" if role == "user" else "message", data.get("content"),
                                   role=role))
        elif kind == "result.recorded":
            if data.get("success") is False:
                out.error = str(data.get("error") or "the executor reported failure")
            out.steps.append(_step("result", data.get("error") or data.get("success"),
                                   output=data.get("output")))
        elif kind in ("progress.recorded", "problem.recorded", "decision.recorded"):
            out.steps.append(_step(kind.split(".")[0], data.get("node_id") or
                                   json.dumps(data, sort_keys=True), **data))
        return out

    def resume_argv(self, argv: list[str], resume_id: str | None, message: str,
                    model: str | None) -> list[str]:
        return list(argv)


class _EventStream:
    """An agent CLI printing one JSON object per line, told apart by its `type`."""

    message_on_stdin = False  # the message of a follow-up turn goes in its argv

    def parse(self, line: str) -> Parsed | None:
        obj = _object(line)
        if obj is None:
            return None
        out = Parsed()
        return out if self._parse(obj.get("type"), obj, out) else None

    def _parse(self, kind: Any, obj: dict[str, Any], out: Parsed) -> bool:
        """Fill `out` from one object; False for a type this adapter does not know."""
        raise NotImplementedError


class CodexAdapter(_EventStream):
    """`codex exec --json`: thread/turn/item events."""

    name = "codex"

    def _parse(self, kind: Any, obj: dict[str, Any], out: Parsed) -> bool:
        if kind == "thread.started":
            out.resume_id = obj.get("thread_id")
        elif kind in ("turn.started", "item.started", "item.updated"):
            pass  # progress of an item; its completed form carries the content
        elif kind == "item.completed" and isinstance(obj.get("item"), dict):
            self._item(obj["item"], out)
        elif kind == "turn.completed":
            usage = obj.get("usage") or {}
            out.events.append(("tokens.recorded", {
                "input_tokens": int(usage.get("input_tokens") or 0),
                "output_tokens": int(usage.get("output_tokens") or 0),
                "cached_input_tokens": int(usage.get("cached_input_tokens") or 0)}))
        elif kind == "turn.failed":
            out.error = str((obj.get("error") or {}).get("message") or "turn failed")
            out.steps.append(_step("error", out.error))
        elif kind == "error":
            out.error = str(obj.get("message") or "error")
            out.steps.append(_step("error", out.error))
        else:
            return False
        return True

    @staticmethod
    def _item(item: dict[str, Any], out: Parsed) -> None:
        kind = item.get("type") or item.get("item_type")
        if kind == "agent_message":
            text = item.get("text") or ""
            if text.strip():
                out.events.append(_message("assistant", text))
                out.response = True
            out.steps.append(_step("message", text))
        elif kind == "reasoning":
            out.steps.append(_step("reasoning", item.get("text")))
        elif kind == "command_execution":
            out.steps.append(_step("command", item.get("command"),
                                   output=item.get("aggregated_output"),
                                   exit_code=item.get("exit_code"), status=item.get("status")))
        elif kind == "file_change":
            changes = item.get("changes") or []
            summary = ", ".join(f"{c.get('kind', 'change')} {c.get('path', '?')}"
                                for c in changes if isinstance(c, dict))
            out.steps.append(_step("file_change", summary, changes=changes,
                                   status=item.get("status")))
        elif kind == "mcp_tool_call":
            out.steps.append(_step("tool_call", f"{item.get('server')}.{item.get('tool')}",
                                   arguments=item.get("arguments"), status=item.get("status")))
        elif kind == "web_search":
            out.steps.append(_step("web_search", item.get("query")))
        elif kind == "todo_list":
            items = item.get("items") or []
            out.steps.append(_step("todo_list", f"{len(items)} items", items=items))
        elif kind == "error":
            out.error = str(item.get("message") or "error")
            out.steps.append(_step("error", out.error))
        else:
            out.steps.append(_step(str(kind), "", item=item))

    def resume_argv(self, argv: list[str], resume_id: str | None, message: str,
                    model: str | None) -> list[str]:
        if not resume_id:
            raise ValueError("no codex thread id was recorded (thread.started); cannot resume")
        model_flags = ["-m", model] if model else []
        return [argv[0], "exec", "--json", *model_flags, "resume", resume_id, message]


class ClaudeAdapter(_EventStream):
    """`claude -p --output-format stream-json`: system/assistant/user/result messages."""

    name = "claude"

    def _parse(self, kind: Any, obj: dict[str, Any], out: Parsed) -> bool:
        if kind == "system":
            out.resume_id = obj.get("session_id")
        elif kind == "assistant":
            texts = []
            for block in _content(obj):
                if block.get("type") == "text" and block.get("text"):
                    texts.append(block["text"])
                elif block.get("type") == "tool_use":
                    out.steps.append(_step("tool_call", block.get("name"), id=block.get("id"),
                                           input=block.get("input")))
            text = "\n".join(texts)
            if text.strip():
                out.events.append(_message("assistant", text))
                out.response = True
                out.steps.insert(0, _step("message", text))
        elif kind == "user":
            for block in _content(obj):
                if block.get("type") != "tool_result":
                    continue
                result = _text_of(block.get("content"))
                if result.strip():
                    out.events.append(_message("tool", result,
                                               tool_call_id=block.get("tool_use_id") or "unknown"))
                out.steps.append(_step("tool_result", result, id=block.get("tool_use_id"),
                                       is_error=block.get("is_error")))
        elif kind == "result":
            usage = obj.get("usage") or {}
            tokens: dict[str, Any] = {"input_tokens": int(usage.get("input_tokens") or 0),
                                      "output_tokens": int(usage.get("output_tokens") or 0)}
            if isinstance(obj.get("total_cost_usd"), (int, float)):
                tokens["estimated_cost"] = float(obj["total_cost_usd"])
            out.events.append(("tokens.recorded", tokens))
            if obj.get("is_error"):
                out.error = str(obj.get("result") or obj.get("subtype") or "error")
            out.steps.append(_step("result", obj.get("result") or obj.get("subtype"),
                                   is_error=obj.get("is_error"),
                                   cost_usd=obj.get("total_cost_usd")))
        else:
            return False
        return True

    def resume_argv(self, argv: list[str], resume_id: str | None, message: str,
                    model: str | None) -> list[str]:
        if not resume_id:
            raise ValueError("no claude session id was recorded (system init); cannot resume")
        model_flags = ["--model", model] if model else []
        return [argv[0], "-p", message, "--output-format", "stream-json", "--verbose",
                *model_flags, "--resume", resume_id]


def _content(obj: dict[str, Any]) -> list[dict[str, Any]]:
    content = (obj.get("message") or {}).get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict))
    return "" if content is None else json.dumps(content)


Adapter = JsonlAdapter | CodexAdapter | ClaudeAdapter
ADAPTERS: dict[str, Adapter] = {
    a.name: a for a in (JsonlAdapter(), CodexAdapter(), ClaudeAdapter())}
