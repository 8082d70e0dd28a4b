"""Google ADK: `SessiondMemoryService`, a `BaseMemoryService` (long-term memory) in sessiond.

    from google.adk.runners import Runner
    from sessiond.integrations.adk import SessiondSessionService
    from sessiond.integrations.adk_memory import SessiondMemoryService

    runner = Runner(agent=agent, app_name="support", session_service=SessiondSessionService(),
                    memory_service=SessiondMemoryService())

Each (app, user) has one memory session (namespace `adk-memory:<app>:<user>`, both
escaped), and each memory is one of its messages: the text of the event (or entry) as
the content, the rest of it in `metadata.adk_memory`. So memories are sessiond events:
exported, verified, replicated in fleet mode and watchable, and one user's memories are
never in another's session. `search_memory` ranks them with `session.search` (the
daemon's full-text index) within that one session; on a store without the index
(PostgreSQL) it ranks by words shared with the query, as InMemoryMemoryService does.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import anyio
from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from sessiond_schemas.errors import SessionExistsError, SessionNotFoundError, StorageError

from ._loop import LoopClient, sized
from ._text import Piece, compose, lift, restore

_PAGE = 1000
_WORD = re.compile(r"\w+", re.UNICODE)


def memory_namespace(app_name: str, user_id: str) -> str:
    return "adk-memory:" + quote(app_name, safe="") + ":" + quote(user_id, safe="")


def memory_session_id(app_name: str, user_id: str) -> str:
    """The session that holds one user's memories of one app."""
    return "adkmem-" + hashlib.sha256("\0".join((app_name, user_id)).encode()).hexdigest()[:40]


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(unicodedata.normalize("NFC", text))}


def _message(memory_id: str, content: types.Content, author: str | None,
             timestamp: str | None, session_id: str | None,
             custom_metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """The message that carries one memory: its text parts as the content (each kept once:
    `metadata.spans` says where), the rest of it in metadata.adk_memory."""
    stored: dict[str, Any] = {
        "id": memory_id, "author": author, "timestamp": timestamp, "session_id": session_id,
        "content": content.model_dump(mode="json", exclude_none=True),
        "custom_metadata": dict(custom_metadata or {})}
    pieces: list[Piece] = []
    for i, part in enumerate(content.parts or []):
        if part.text:
            if pieces:
                pieces.append(("\n", None))
            pieces.append((part.text, ("content", "parts", i, "text")))
    text, spans = compose(pieces)
    if not text.strip():
        text, spans = f"[{author or 'memory'}]", []
    metadata: dict[str, Any] = {"adk_memory": lift(stored, spans)}
    if spans:
        metadata["spans"] = spans
    return {"role": "user" if author == "user" else "assistant", "content": text,
            "metadata": metadata}


def _entry(message: Any) -> MemoryEntry | None:
    stored = message.metadata.get("adk_memory")
    if stored is None:
        return None
    stored = restore(stored, message.content, message.metadata.get("spans") or [])
    return MemoryEntry(id=stored["id"], author=stored.get("author"),
                       timestamp=stored.get("timestamp"),
                       content=types.Content.model_validate(stored["content"]),
                       custom_metadata=stored.get("custom_metadata") or {})


class SessiondMemoryService(BaseMemoryService):
    """ADK memory in sessiond (`socket`: the default); a search returns at most
    `max_results` memories, best first."""

    def __init__(self, socket: str | None = None, *, client: LoopClient | None = None,
                 max_results: int = 10) -> None:
        self.client = client or LoopClient(socket)
        self.max_results = max_results

    # --- adding -----------------------------------------------------------------------

    async def add_session_to_memory(self, session: Session) -> None:
        """Every event of the session with content becomes a memory, once: adding the
        session again (ADK allows it) adds only the events not added before."""
        await self.add_events_to_memory(app_name=session.app_name, user_id=session.user_id,
                                        events=session.events, session_id=session.id)

    async def add_events_to_memory(self, *, app_name: str, user_id: str,
                                   events: Sequence[Event], session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        memories = [(event.id, _message(
            event.id, event.content, event.author,
            datetime.fromtimestamp(event.timestamp, UTC).isoformat(), session_id,
            custom_metadata)) for event in events if event.content and event.content.parts]
        await self._add(app_name, user_id, memories)

    async def add_memory(self, *, app_name: str, user_id: str, memories: Sequence[MemoryEntry],
                         custom_metadata: Mapping[str, object] | None = None) -> None:
        """Explicit memories; one without an id gets one (its `id` then names it)."""
        items = []
        for entry in memories:
            memory_id = entry.id or str(uuid.uuid4())
            items.append((memory_id, _message(
                memory_id, entry.content, entry.author, entry.timestamp, None,
                {**entry.custom_metadata, **(custom_metadata or {})})))
        await self._add(app_name, user_id, items)

    async def _add(self, app_name: str, user_id: str,
                   memories: list[tuple[str, dict[str, Any]]]) -> None:
        if not memories:
            return
        sid = memory_session_id(app_name, user_id)
        with contextlib.suppress(SessionExistsError):
            await self.client.create_session(
                sid, namespace=memory_namespace(app_name, user_id), source="adk",
                metadata={"adk_memory": {"app_name": app_name, "user_id": user_id}})

        async def add(memory_id: str, message: dict[str, Any]) -> None:
            # Keyed by the memory's id: added twice (or after delete_memory), stored once.
            with sized():
                await self.client.append_events(
                    sid, [{"type": "message.appended", "data": message}],
                    idempotency_key=("adk-memory:" + memory_id)[:256])

        async with anyio.create_task_group() as tg:  # sent together: one group commit
            for memory_id, message in memories:
                tg.start_soon(add, memory_id, message)

    # --- searching --------------------------------------------------------------------

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        sid = memory_session_id(app_name, user_id)
        words = _words(query)
        if not words:
            return SearchMemoryResponse(memories=[])
        try:
            deleted = set((await self.client.get_session(sid)).metadata.get("deleted_memories",
                                                                            {}))
        except SessionNotFoundError:
            return SearchMemoryResponse(memories=[])
        try:
            messages = await self._ranked(sid, app_name, user_id, words)
        except StorageError as exc:
            if exc.data.get("detail") != "no search index":
                raise
            messages = await self._by_shared_words(sid, words)
        found = [e for e in map(_entry, messages) if e is not None and e.id not in deleted]
        return SearchMemoryResponse(memories=found[:self.max_results])

    async def _ranked(self, sid: str, app_name: str, user_id: str,
                      words: set[str]) -> list[Any]:
        """The best matches by the daemon's full-text ranking (bm25), within the one
        memory session of this app and user."""
        fts = " OR ".join('"' + w.replace('"', '""') + '"' for w in sorted(words))
        result = await self.client.search(fts, namespace=memory_namespace(app_name, user_id),
                                          limit=1, hits=min(20, self.max_results + 10))
        hits = [h.sequence for s in result.sessions if s.session_id == sid
                for h in s.hits if h.sequence is not None and h.current]
        messages: dict[int, Any] = {}

        async def fetch(sequence: int) -> None:
            page = await self.client.list_messages(sid, offset=sequence, limit=1)
            if page.messages:
                messages[sequence] = page.messages[0]

        async with anyio.create_task_group() as tg:
            for sequence in hits:
                tg.start_soon(fetch, sequence)
        return [messages[s] for s in hits if s in messages]

    async def _by_shared_words(self, sid: str, words: set[str]) -> list[Any]:
        """InMemoryMemoryService's ranking: the memories sharing most words with the query
        (ties: newest first), for a store without the full-text index."""
        scored: list[tuple[int, int, Any]] = []
        after = None
        while True:
            page = await self.client.list_messages(sid, limit=_PAGE, after_sequence=after)
            for m in page.messages:
                shared = len(words & _words(m.content))
                if shared:
                    scored.append((-shared, -m.sequence, m))
            if len(page.messages) < _PAGE and not page.truncated_by_bytes:
                break
            after = page.messages[-1].sequence
        scored.sort(key=lambda t: (t[0], t[1]))
        return [m for *_, m in scored]

    # --- deleting ---------------------------------------------------------------------

    async def delete_memory(self, *, app_name: str, user_id: str,
                            memory_id: str | None = None) -> None:
        """Forget one memory: searches no longer return it, and adding its event again does
        not bring it back. Its message stays in the memory session's history."""
        if memory_id is None:
            raise ValueError("delete_memory needs the memory_id search_memory returned")
        with contextlib.suppress(SessionNotFoundError):
            await self.client.append_events(
                memory_session_id(app_name, user_id),
                [{"type": "metadata.updated",
                  "data": {"patch": {"deleted_memories": {memory_id: True}}}}])

    async def close(self) -> None:
        await self.client.aclose()
