"""The tool calls a stored message makes, whoever wrote them, in one shape.

A message's `metadata.tool_calls` holds its calls as its writer wrote them: the
importers' `{id, name, input}` (Claude Code's `tool_use`, Codex's function calls),
OpenAI's `{id, function: {name, arguments}}`, LangChain's `{id, name, args}`, the Agents
SDK's `{call_id, name, arguments}`; ADK's `metadata.function_calls` are `{id, name, args}`.
Every face (sessionctl, the trajectory, the web view's app.js) reads them through this.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict


class ToolCall(TypedDict):
    id: str | None
    name: str
    input: Any


def tool_calls(metadata: dict[str, Any] | None) -> list[ToolCall]:
    """`metadata.tool_calls` and `metadata.function_calls` as `{id, name, input}`."""
    found: list[dict[str, Any]] = []
    for key in ("tool_calls", "function_calls"):
        calls = (metadata or {}).get(key)
        if isinstance(calls, list):
            found += [c for c in calls if isinstance(c, dict)]
    out: list[ToolCall] = []
    for c in found:
        f = c["function"] if isinstance(c.get("function"), dict) else {}
        given = [c.get(k) for k in ("input", "args", "arguments")] + [f.get("arguments")]
        ident = c.get("id") or c.get("call_id")
        out.append({"id": str(ident) if ident is not None else None,
                    "name": str(c.get("name") or f.get("name") or c.get("type") or "tool"),
                    "input": next((x for x in given if x is not None), None)})
    return out


def message_calls(metadata: dict[str, Any] | None, content: str) -> list[ToolCall]:
    """A message's calls (`tool_calls`), each call's input taken from the content when the
    call holds none (the Agents SDK and ADK store the arguments once, in the content,
    as `name(arguments)`, a line a call)."""
    calls = tool_calls(metadata)
    lines = content.strip().split("\n") if len(calls) > 1 else [content.strip()]
    if len(lines) == len(calls):
        for c, line in zip(calls, lines, strict=True):
            if c["input"] is None and line.startswith(f"{c['name']}(") and line.endswith(")"):
                c["input"] = line[len(c["name"]) + 1:-1]
    return calls


def input_text(value: Any) -> str:
    """A call's input on one line: a JSON string parsed first, then compact JSON."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return str(value)
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def is_call_text(content: str, calls: list[ToolCall]) -> bool:
    """Whether a message's text only names its calls (`Grep({...})`: what the importers
    write for a message that holds nothing but tool calls), so the calls say it all."""
    text = content.strip()
    return bool(calls) and text.startswith(f"{calls[0]['name']}(") and text.endswith(")")
