"""Google ADK: `SessiondMemoryService`, a `BaseMemoryService` (long-term memory) in sessiond.

    from google.adk.runners import Runner
    from sessiond.integrations.adk_memory import SessiondMemoryService

    runner = Runner(agent=agent, app_name="support", session_service=...,
                    memory_service=SessiondMemoryService())

What an ADK session gives to memory is kept in a memory session of its own (one per app,
user and ADK session; namespace `adk-memory:<app>:<user>`, both escaped): each event with
text is a message, its text the content, the event's id, author, time and whole content
in the metadata. Adding a session again appends only the events not yet there.
`search_memory` is `session.search` within the user's namespace, so one user's search
never reaches another's memories; the best candidates are then ranked as ADK's
InMemoryMemoryService ranks (how many of the query's words each holds), at most ten.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import unicodedata
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from google.adk.events.event import Event
from google.adk.memory import _utils
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    SessionExistsError,
    SessionNotFoundError,
    StorageError,
    VersionConflictError,
)
from sessiond_schemas.state import Message

from . import _search_query
from ._loop import LoopClient, sized
from ._text import Piece, compose, lift, restore
from .adk import session_id_for

MAX_RESULTS = 10  # as InMemoryMemoryService
CANDIDATE_SESSIONS = 20  # session.search's best sessions whose best hits are ranked
CANDIDATE_HITS = 10
FALLBACK_SCAN = 10_000  # messages a search reads at most where there is no search index
_UNKNOWN_SESSION = "__unknown_session_id__"  # InMemoryMemoryService's, for events alone
_EXPLICIT = "__explicit_memories__"  # where add_memory's entries are kept
_PAGE = 1000
_Order = tuple[str, str, int]  # a memory's place in the order of adding: its memory
# session's creation (the session's first add), the session, the message
_CONCURRENT = 32


def memory_namespace(app_name: str, user_id: str) -> str:
    """The namespace of one user's memories: escaped, so no two users' collide."""
    return f"adk-memory:{quote(app_name, safe='')}:{quote(user_id, safe='')}"


def memory_session_id(app_name: str, user_id: str, session_id: str) -> str:
    key = "\0".join((app_name, user_id, session_id)).encode()
    return "adkm-" + hashlib.sha256(key).hexdigest()[:40]


def _forgotten_id(app_name: str, user_id: str) -> str:
    """The session that lists the memories one user of one app asked to forget."""
    key = "\0".join((app_name, user_id)).encode()
    return "adkmf-" + hashlib.sha256(key).hexdigest()[:40]


def _query_words(text: str) -> set[str]:
    """The query's words, as InMemoryMemoryService takes them."""
    return {w.lower() for w in re.findall(r"\w+", unicodedata.normalize("NFC", text))}


@dataclass(frozen=True)
class _Memory:
    """What one memory keeps: an event's (or an explicit entry's) id, content, author,
    time (an event's seconds, or an entry's own text) and custom metadata."""

    id: str | None
    content: types.Content | None
    author: str | None
    timestamp: float | str | None
    custom: Mapping[str, object]

    @classmethod
    def of(cls, event: Event, custom: Mapping[str, object] | None = None) -> _Memory:
        return cls(event.id, event.content, event.author, event.timestamp, custom or {})


def _text(memory: _Memory) -> tuple[str, list[list[Any]], dict[str, Any]] | None:
    """(content, spans, the content as JSON without its texts) of a memory worth keeping:
    one with text, the only kind a search can find."""
    if not memory.content or not memory.content.parts:
        return None
    pieces: list[Piece] = []
    for i, part in enumerate(memory.content.parts):
        if part.text:
            if pieces:
                pieces.append((" ", None))
            pieces.append((part.text, ("parts", i, "text")))
    content, spans = compose(pieces)
    if not re.search(r"\w", content):
        return None
    stored = memory.content.model_dump(mode="json", exclude_none=True)
    return content, spans, lift(stored, spans)


def _message(memory: _Memory) -> dict[str, Any] | None:
    kept = _text(memory)
    if kept is None:
        return None
    content, spans, stored = kept
    about: dict[str, Any] = {"id": memory.id, "author": memory.author,
                             "timestamp": memory.timestamp, "content": stored}
    if memory.custom:
        about["custom_metadata"] = dict(memory.custom)
    return {"role": "user" if memory.author == "user" else "assistant", "content": content,
            "metadata": {"adk_memory": about, "spans": spans}}


def _entry(message: Message) -> MemoryEntry:
    kept = message.metadata["adk_memory"]
    content = restore(kept["content"], message.content, message.metadata.get("spans") or [])
    when = kept["timestamp"]
    return MemoryEntry(id=kept["id"], content=types.Content.model_validate(content),
                       author=kept["author"], custom_metadata=kept.get("custom_metadata") or {},
                       timestamp=_utils.format_timestamp(when)
                       if isinstance(when, (int, float)) else when)


def _score(words: set[str], message: Message) -> int:
    """How many of the query's words the memory holds, as InMemoryMemoryService counts
    (a non-Latin word also matches inside a longer run of text)."""
    held = {w.lower() for w in re.findall(r"\w+", unicodedata.normalize("NFC", message.content))}
    lower = unicodedata.normalize("NFC", message.content).lower()
    return sum(1 for w in words if w in held or (not w.isascii() and w in lower))


class SessiondMemoryService(BaseMemoryService):
    """ADK memory in sessiond (`socket`: the daemon's, by default); a search returns at most
    `max_results` memories (InMemoryMemoryService's 10 by default)."""

    def __init__(self, socket: str | None = None, *, client: LoopClient | None = None,
                 max_results: int = MAX_RESULTS) -> None:
        self.client = client or LoopClient(socket)
        self.max_results = max_results

    # --- adding -----------------------------------------------------------------------

    async def add_session_to_memory(self, session: Session) -> None:
        """Keep the session's events with text; again later, only those added since."""
        await self._add(session.app_name, session.user_id, session.id,
                        [_Memory.of(e) for e in session.events], whole=True)

    async def add_events_to_memory(self, *, app_name: str, user_id: str,
                                   events: Sequence[Event], session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        """Keep these events (a delta: those already kept are skipped), with the custom
        metadata in each entry a search returns."""
        await self._add(app_name, user_id, session_id or _UNKNOWN_SESSION,
                        [_Memory.of(e, custom_metadata) for e in events], whole=False)

    async def add_memory(self, *, app_name: str, user_id: str, memories: Sequence[MemoryEntry],
                         custom_metadata: Mapping[str, object] | None = None) -> None:
        """Explicit memories (one without an id gets one); their own time text is kept."""
        await self._add(app_name, user_id, _EXPLICIT, [
            _Memory(m.id or str(uuid.uuid4()), m.content, m.author, m.timestamp,
                    {**m.custom_metadata, **(custom_metadata or {})}) for m in memories],
            whole=False)

    async def _add(self, app_name: str, user_id: str, session_id: str,
                   events: Sequence[_Memory], *, whole: bool) -> None:
        sid = memory_session_id(app_name, user_id, session_id)
        forgotten = await self._forgotten(app_name, user_id)
        for _ in range(5):  # another writer added to the same memory meanwhile: again
            try:
                view = await self.client.get_session(sid)
            except SessionNotFoundError:
                fresh = self._messages(events, forgotten)
                try:
                    with sized():
                        await self.client.create_session(
                            sid, namespace=memory_namespace(app_name, user_id),
                            source="adk-memory", metadata={"adk_memory": {
                                "app_name": app_name, "user_id": user_id,
                                "session_id": session_id, "deltas": not whole,
                                "from_session": session_id_for(app_name, user_id, session_id)}},
                            events=[{"type": "message.appended", "data": m} for m in fresh])
                    return
                except SessionExistsError:
                    continue
            kept = [e for e in events if _text(e) is not None]
            last = view.last_message.metadata["adk_memory"]["id"] if view.last_message else None
            n = view.message_count
            # Only whole-session adds wrote here: what is kept is a prefix of the session's
            # events, and when its last one is where it should be, what follows is new.
            deltas = bool(view.metadata.get("adk_memory", {}).get("deltas"))
            if whole and not deltas and 0 < n <= len(kept) and kept[n - 1].id == last:
                fresh = self._messages(kept[n:], forgotten)  # the usual case: one read
            else:
                fresh = self._messages(kept, await self._stored_ids(sid) | forgotten)
            if not fresh:
                return
            appended = [{"type": "message.appended", "data": m} for m in fresh]
            if not whole and not deltas:
                appended.insert(0, {"type": "metadata.updated", "data": {
                    "patch": {"adk_memory": {"deltas": True}}}})
            version = view.version
            try:
                with sized():
                    for start in range(0, len(appended), 10_000):
                        written = await self.client.append_events(
                            sid, appended[start:start + 10_000], expected_version=version)
                        version = written.version
                return
            except VersionConflictError:
                continue
        raise RuntimeError(f"memory of session {session_id!r} kept changing while adding to it")

    @staticmethod
    def _messages(events: Sequence[_Memory], stored: set[str | None]) -> list[dict[str, Any]]:
        messages, seen = [], set(stored)
        for event in events:
            message = _message(event)
            if message is not None and event.id not in seen:
                seen.add(event.id)
                messages.append(message)
        return messages

    async def _stored_ids(self, sid: str) -> set[str | None]:
        ids: set[str | None] = set()
        after = None
        while True:
            page = await self.client.list_messages(sid, limit=_PAGE, after_sequence=after)
            ids.update(m.metadata["adk_memory"]["id"] for m in page.messages)
            if not page.messages or (len(page.messages) < _PAGE
                                     and not page.truncated_by_bytes):
                return ids
            after = page.messages[-1].sequence

    # --- searching --------------------------------------------------------------------

    async def search_memory(self, *, app_name: str, user_id: str,
                            query: str) -> SearchMemoryResponse:
        """At most ten memories of this user, those holding the most of the query's words
        first; ties in the order they were added (the session first added to memory first,
        then its events in order), as InMemoryMemoryService."""
        words = _query_words(query)
        if not words:
            return SearchMemoryResponse(memories=[])
        namespace = memory_namespace(app_name, user_id)
        forgotten = await self._forgotten(app_name, user_id)
        try:
            candidates = await self._candidates(namespace, words)
        except StorageError as exc:
            if exc.data.get("detail") != "no search index":
                raise
            candidates = await self._scan(namespace)
        scored = [(s, order, m) for order, m in candidates
                  if m.metadata["adk_memory"]["id"] not in forgotten
                  and (s := _score(words, m))]
        scored.sort(key=lambda som: (-som[0], som[1]))
        return SearchMemoryResponse(
            memories=[_entry(m) for _, _, m in scored[:self.max_results]])

    async def _candidates(self, namespace: str, words: set[str]) -> list[tuple[_Order, Message]]:
        """The best hits of the best sessions session.search finds in the namespace, each
        with its place in the order of adding."""
        async def search(query: str) -> rpc.SearchResult:
            return await self.client.search(query, namespace=namespace,
                                            limit=CANDIDATE_SESSIONS, hits=CANDIDATE_HITS)

        # "any of the words" (\w+, no quotes), in as many queries as its length needs
        found = await _search_query.each(search, sorted(words))
        gate = asyncio.Semaphore(_CONCURRENT)

        async def message(session_id: str, sequence: int) -> Message | None:
            async with gate:
                page = await self.client.list_messages(session_id, limit=1,
                                                       after_sequence=sequence - 1)
            return page.messages[0] if page.messages else None

        async def created(session_id: str) -> str:
            async with gate:
                return (await self.client.get_session(session_id)).timestamps.created_at

        hits = list(dict.fromkeys(
            (s.session_id, h.sequence) for result in found for s in result.sessions
            for h in s.hits if h.type == "message.appended" and h.sequence is not None))
        fetched = await asyncio.gather(*(message(sid, seq) for sid, seq in hits))
        sessions = list(dict.fromkeys(sid for sid, _ in hits))
        when = dict(zip(sessions, await asyncio.gather(*(created(sid) for sid in sessions)),
                        strict=True))
        return [((when[m_sid], m_sid, m.sequence), m)
                for (m_sid, _), m in zip(hits, fetched, strict=True)
                if m is not None and "adk_memory" in m.metadata]

    async def _scan(self, namespace: str) -> list[tuple[_Order, Message]]:
        """No search index (an older daemon on PostgreSQL): the user's memories themselves, at most
        FALLBACK_SCAN of them."""
        messages: list[tuple[_Order, Message]] = []
        cursor = None
        while len(messages) < FALLBACK_SCAN:
            page: rpc.SessionStatesResult = await self.client.call(
                "session.states", rpc.SessionStatesResult, namespace=namespace, limit=_PAGE,
                cursor=cursor)
            for view in page.states:
                after = None
                while len(messages) < FALLBACK_SCAN:
                    got = await self.client.list_messages(
                        view.session_id, after_sequence=after,
                        limit=min(_PAGE, FALLBACK_SCAN - len(messages)))
                    messages += [((view.timestamps.created_at, view.session_id, m.sequence), m)
                                 for m in got.messages]
                    if not got.messages or (len(got.messages) < _PAGE
                                            and not got.truncated_by_bytes):
                        break
                    after = got.messages[-1].sequence
            if page.next is None:
                break
            cursor = page.next
        return messages

    # --- forgetting -------------------------------------------------------------------

    async def delete_memory(self, *, app_name: str, user_id: str,
                            memory_id: str | None = None) -> None:
        """Forget a memory (the id search_memory gave): searches no longer return it and
        adding its event again does not bring it back, as InMemoryMemoryService. Its
        message stays in its memory session's history (`sessionctl delete` erases)."""
        if not memory_id:
            return
        fid = _forgotten_id(app_name, user_id)
        forget = [{"type": "metadata.updated",
                   "data": {"patch": {"forgotten": {memory_id: True}}}}]
        for _ in range(3):
            try:
                await self.client.append_events(fid, forget)
                return
            except SessionNotFoundError:
                pass
            try:
                await self.client.create_session(
                    fid, namespace=memory_namespace(app_name, user_id), source="adk-memory",
                    metadata={"adk_memory": {"app_name": app_name, "user_id": user_id},
                              "forgotten": {memory_id: True}})
                return
            except SessionExistsError:
                continue
        raise RuntimeError(f"the forgotten memories of {user_id!r} kept changing")

    async def _forgotten(self, app_name: str, user_id: str) -> set[str | None]:
        try:
            view = await self.client.get_session(_forgotten_id(app_name, user_id))
        except SessionNotFoundError:
            return set()
        return set(view.metadata.get("forgotten") or {})

    async def close(self) -> None:
        await self.client.aclose()
