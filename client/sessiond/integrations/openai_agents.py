"""OpenAI Agents SDK: `SessiondSession`, a `Session` whose history lives in sessiond.

Each item becomes a message of a sessiond session: the item is kept whole in the
message's metadata (`metadata["item"]`), and the message's role and content are a
readable rendering of it, so `sessionctl messages` and `sessionctl watch` show the
conversation. `pop_item` and `clear_session` are events too (message.pop,
message.clear): the conversation changes, the history stays auditable.

    from agents import Agent, Runner
    from sessiond.integrations.openai_agents import SessiondSession

    result = await Runner.run(agent, "Hi", session=SessiondSession("user-42"))
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings, resolve_session_limit

from sessiond_schemas.errors import SessionExistsError, SessionNotFoundError

from ._loop import LoopClient

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_PAGE = 1000  # message.list's largest page


def session_id_for(name: str) -> str:
    """The sessiond session id of an SDK session id: itself when it is a valid id, else a
    stable hash of it (the original is kept in the session's metadata)."""
    if _ID.match(name):
        return name
    return "oa-" + hashlib.sha256(name.encode()).hexdigest()[:40]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, dict):
                parts.append(str(part.get("text") or part.get("refusal") or
                                 f"[{part.get('type', 'part')}]"))
        return "\n".join(parts)
    return ""


def as_message(item: Any) -> dict[str, Any]:
    """The sessiond message that carries one SDK item (kept whole in metadata)."""
    item = dict(item)
    kind = item.get("type")
    role, content, tool_call_id = "assistant", "", None
    if item.get("role") in ("user", "assistant", "system", "developer"):
        role = "system" if item["role"] == "developer" else item["role"]
        content = _text(item.get("content"))
    elif kind == "function_call":
        content = f"{item.get('name')}({item.get('arguments', '')})"
    elif kind in ("function_call_output", "computer_call_output", "custom_tool_call_output"):
        role, tool_call_id = "tool", str(item.get("call_id") or "unknown")
        output = item.get("output")
        content = output if isinstance(output, str) else json.dumps(output)
    elif kind == "reasoning":
        content = _text(item.get("summary"))
    if not content.strip():
        content = f"[{kind or role}]"
    message: dict[str, Any] = {"role": role, "content": content, "metadata": {"item": item}}
    if tool_call_id:
        message["tool_call_id"] = tool_call_id
    return message


class SessiondSession(SessionABC):
    """An Agents SDK session stored in sessiond (one sessiond session per SDK session).

    Pass `client` to share one connection among many sessions; without it each session
    connects (on first use) to the daemon at `socket`, by default the usual socket.
    """

    def __init__(self, session_id: str, *, client: LoopClient | None = None,
                 socket: str | None = None, namespace: str = "openai-agents",
                 session_settings: SessionSettings | None = None) -> None:
        self.session_id = session_id
        self.session_settings = session_settings or SessionSettings()
        self.namespace = namespace
        self.client = client or LoopClient(socket)
        self._sid = session_id_for(session_id)
        self._exists = False

    async def _ensure(self) -> None:
        if self._exists:
            return
        try:
            await self.client.create_session(
                self._sid, namespace=self.namespace, source="openai-agents",
                metadata={"sdk_session_id": self.session_id})
        except SessionExistsError:
            pass
        self._exists = True

    async def get_items(self, limit: int | None = None) -> list[Any]:
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit < 0:
            limit = None  # as SQLiteSession's SQL LIMIT: a negative limit is no limit
        try:
            messages = await (self._all() if limit is None else self._latest(limit))
        except SessionNotFoundError:
            return []
        return [m.metadata["item"] for m in messages if "item" in m.metadata]

    async def _latest(self, n: int) -> list[Any]:
        found: list[Any] = []
        while len(found) < n:
            want = min(n - len(found), _PAGE)
            page = await self.client.list_messages(self._sid, order="desc", limit=want,
                                                   offset=len(found))
            found += page.messages
            if len(page.messages) < want and not page.truncated_by_bytes:
                break
        return found[::-1]

    async def _all(self) -> list[Any]:
        found: list[Any] = []
        after = None
        while True:
            page = await self.client.list_messages(self._sid, limit=_PAGE, after_sequence=after)
            found += page.messages
            if len(page.messages) < _PAGE and not page.truncated_by_bytes:
                return found
            after = page.messages[-1].sequence

    async def add_items(self, items: list[Any]) -> None:
        if not items:
            return
        await self._ensure()
        messages = [as_message(item) for item in items]
        for start in range(0, len(messages), 10_000):  # append_many's largest batch
            batch = messages[start:start + 10_000]
            try:
                await self.client.append_messages(self._sid, batch)
            except SessionNotFoundError:  # deleted behind our back: start it again
                self._exists = False
                await self._ensure()
                await self.client.append_messages(self._sid, batch)

    async def pop_item(self) -> Any | None:
        try:
            popped = await self.client.pop_message(self._sid)
        except SessionNotFoundError:
            return None
        if popped.message is None:
            return None
        return popped.message.metadata.get("item")

    async def clear_session(self) -> None:
        try:
            await self.client.clear_messages(self._sid)
        except SessionNotFoundError:
            pass

    async def close(self) -> None:
        """Close the connection (shared with every session given the same client)."""
        await self.client.aclose()
