"""Google ADK: `SessiondSessionService`, a `BaseSessionService` stored in sessiond.

    from google.adk.runners import Runner
    from sessiond.integrations.adk import SessiondSessionService

    runner = Runner(agent=agent, app_name="support", session_service=SessiondSessionService())

An ADK session is a sessiond session (namespace `adk:<app>:<user>`, both escaped). Each
ADK event is a message whose metadata keeps the event whole (`metadata.adk_event`), so
`sessionctl messages` shows the conversation; its state delta is written with it, in the
same write, as state.updated events per scope: session keys land in the session's
`memory`, `app:` and `user:` keys in the daemon's scoped state, shared by every session of
the app or user. `temp:` keys are never stored, as ADK requires.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, cast
from urllib.parse import quote

from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError as AdkSessionNotFound
from google.adk.events.event import Event
from google.adk.sessions import _session_util
from google.adk.sessions.base_session_service import (
    BaseSessionService,
    GetSessionConfig,
    ListSessionsResponse,
)
from google.adk.sessions.session import Session
from google.adk.sessions.state import State
from pydantic_core import to_jsonable_python

from sessiond_schemas import rpc
from sessiond_schemas.errors import SessionExistsError, SessionNotFoundError, VersionConflictError
from sessiond_schemas.state import MAX_TTL_S, SessionState

from . import adk_compaction as compaction
from ._loop import LoopClient, sized
from ._text import Piece, compose, lift, restore
from ._usage import Prices, tokens

_PAGE = 1000
# DatabaseSessionService's words for the same refusal.
STALE_SESSION_MESSAGE = ("The session has been modified in storage since it was loaded. "
                         "Please reload the session before appending more events.")


def namespace_for(app_name: str, user_id: str | None = None) -> str:
    """The namespace of an app's sessions (or of one user's): escaped, so no two collide."""
    app = "adk:" + quote(app_name, safe="") + ":"
    return app if user_id is None else app + quote(user_id, safe="")


def session_id_for(app_name: str, user_id: str, session_id: str) -> str:
    """ADK session ids are unique per app and user; sessiond's are global."""
    key = "\0".join((app_name, user_id, session_id)).encode()
    return "adk-" + hashlib.sha256(key).hexdigest()[:40]


def _render(event: Event, stored: dict[str, Any]) -> tuple[str, str, str | None,
                                                         list[list[Any]]]:
    """(role, content, tool_call_id, spans) of the message that carries an ADK event
    (`stored`: the event as JSON builtins); the spans say where its text parts and
    function arguments and responses lie in the content, so each is stored once."""
    pieces: list[Piece] = []
    tool_call_id = None
    parts = event.content.parts if event.content and event.content.parts else []
    kept = stored.get("content", {}).get("parts", [])
    for i, part in enumerate(parts):
        piece: Piece
        if part.text:
            piece = (part.text, ("content", "parts", i, "text"))
        elif part.function_call:
            call = kept[i]["function_call"]
            if "args" in call:
                args: Piece = (json.dumps(call["args"]),
                               ("content", "parts", i, "function_call", "args"), "json")
            else:
                args = ("null", None)
            pieces += [("\n", None)] if pieces else []
            pieces += [(f"{part.function_call.name}(", None), args, (")", None)]
            continue
        elif part.function_response:
            tool_call_id = part.function_response.id or part.function_response.name or "unknown"
            result = kept[i]["function_response"]
            piece = (json.dumps(result["response"]),
                     ("content", "parts", i, "function_response", "response"), "json") \
                if "response" in result else ("null", None)
        else:
            continue
        if pieces:
            pieces.append(("\n", None))
        pieces.append(piece)
    role = "user" if event.author == "user" else "tool" if tool_call_id else "assistant"
    content, spans = compose(pieces)
    if not content.strip():
        return role, f"[{event.author} event]", tool_call_id, []
    return role, content, tool_call_id, spans


def readable_calls(event: Event) -> list[dict[str, Any]]:
    """An event's function calls as every face of sessiond reads them
    (`metadata.function_calls`: the id a function_response names, and the function's
    name; the arguments are the content's, `name(args)`, stored once)."""
    parts = event.content.parts if event.content and event.content.parts else []
    return [{"id": p.function_call.id or p.function_call.name or "",
             "name": p.function_call.name or "function"}
            for p in parts if p.function_call]


_RETRY_WINDOW = 32  # how far back in session.events a retried append is looked for


def _marker(version: int, newest: float | None = None) -> str:
    """The session object's storage revision (ADK's `_storage_update_marker`): the
    sessiond session's version it was read at or last appended to, and (when known) the
    newest event timestamp stored up to it (`_NEWEST`; -inf: no event)."""
    return f"sessiond:{version}" + (f":{newest!r}" if newest is not None else "")


def _version(marker: str | None) -> int | None:
    parts = marker.split(":") if marker else []
    if len(parts) in (2, 3) and parts[0] == "sessiond" and parts[1].isdigit():
        return int(parts[1])
    return None  # none, or another store's: ADK's fallback by time and last event


def _newest(marker: str | None) -> float | None:
    """The newest timestamp a marker of ours carries (None: not known)."""
    parts = marker.split(":") if marker else []
    if len(parts) == 3 and _version(marker) is not None:
        with contextlib.suppress(ValueError):
            return float(parts[2])
    return None


# Each stored event's message keeps, in metadata[_NEWEST], the newest timestamp of it and of
# every event stored before it: a read of the newest events (num_recent_events,
# after_timestamp) walks back from the end only until no older event can be newer than
# what it has, so it costs what it returns, not the session's history (bench B15).
_NEWEST = "adk_newest"


def _json_safe_deltas(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state's deltas per scope, made JSON-safe as DatabaseSessionService makes them
    (pydantic's JSON form: a datetime is its ISO text, a set a list; what pydantic cannot
    serialize, its repr), so a state value never costs the event."""
    safe = getattr(_session_util, "extract_json_safe_state_delta", None)
    if safe is not None:
        return cast(dict[str, dict[str, Any]], safe(state))
    deltas = _session_util.extract_state_delta(state)  # ADK before it had the helper
    return cast(dict[str, dict[str, Any]], to_jsonable_python(deltas, serialize_unknown=True))


def ttl_seconds(ttl: str | float | None) -> int | None:
    """An idle TTL in whole seconds from VertexAiSessionService's `ttl` ("7200s", a
    protobuf Duration string) or a number of seconds; at least 1, at most ten years."""
    if ttl is None:
        return None
    text = ttl[:-1] if isinstance(ttl, str) and ttl.endswith("s") else ttl
    try:
        seconds = math.ceil(float(text))
    except (TypeError, ValueError):
        raise ValueError(f"ttl must be seconds, or a duration like '7200s': {ttl!r}") from None
    if not 1 <= seconds <= MAX_TTL_S:
        raise ValueError(f"ttl must be 1 … {MAX_TTL_S} seconds, not {ttl!r}")
    return seconds


def _state_events(state: dict[str, Any], app_name: str, user_id: str) -> list[dict[str, Any]]:
    deltas = _json_safe_deltas(state)
    events = []
    for scope in ("session", "app", "user"):
        if deltas[scope]:
            data: dict[str, Any] = {"scope": scope, "delta": deltas[scope]}
            if scope != "session":
                data["app_name"] = app_name
            if scope == "user":
                data["user_id"] = user_id
            events.append({"type": "state.updated", "data": data})
    return events


def _duplicate(session: Session, event: Event) -> AlreadyExistsError:
    return AlreadyExistsError(
        f"Event {event.id} already exists in session {session.id} with other content;"
        " nothing was stored (an event id is unique within its session).")


def _event_of(m: Any) -> Event:
    return Event.model_validate(restore(m.metadata["adk_event"], m.content,
                                        m.metadata.get("spans") or []))


def _settled(found: list[Event], limit: int | None, after: float | None,
             bound: float) -> bool:
    """Whether events older than those read (none newer than `bound`) can no longer be in
    the answer: all before `after`, or older than the `limit`-th newest read."""
    if after is not None and bound < after:
        return True
    if limit is None:
        return False
    kept = sorted(e.timestamp for e in found if after is None or e.timestamp >= after)
    return limit == 0 or (len(kept) >= limit and bound < kept[-limit])


class SessiondSessionService(BaseSessionService):
    """ADK sessions, events and app/user/session state in sessiond (`socket`: the default)."""

    def __init__(self, socket: str | None = None, *, client: LoopClient | None = None,
                 ttl: str | float | None = None, prices: Prices | None = None) -> None:
        self.client = client or LoopClient(socket)
        self.prices = prices  # model -> (USD per 1M input, per 1M output tokens); else cost 0
        self._locks: dict[tuple[Any, ...], list[Any]] = {}
        self.ttl_s = ttl_seconds(ttl)  # every new session's, unless create_session says

    # --- sessions ---------------------------------------------------------------------

    async def create_session(self, *, app_name: str, user_id: str,
                             state: dict[str, Any] | None = None,
                             session_id: str | None = None,
                             ttl: str | float | None = None,
                             expire_time: str | None = None) -> Session:
        """As ADK's stores; `ttl` as VertexAiSessionService's (`"7200s"`, or seconds):
        the session's idle TTL, after which it is gone (get_session answers None)."""
        if expire_time is not None:
            raise ValueError("expire_time is not supported: sessiond's TTL is idle time,"
                             " counted from the session's last event; pass ttl")
        session_id = (session_id.strip() if session_id else None) or str(uuid.uuid4())
        sid = session_id_for(app_name, user_id, session_id)
        ttl_s = ttl_seconds(ttl) if ttl is not None else self.ttl_s
        for attempt in (1, 2):
            created = time.time()
            try:
                await self.client.create_session(
                    sid, namespace=namespace_for(app_name, user_id), source="adk",
                    metadata={"adk": {"app_name": app_name, "user_id": user_id,
                                      "id": session_id, "created_time": created}},
                    events=_state_events(state or {}, app_name, user_id), ttl_s=ttl_s)
                break
            except SessionExistsError:
                # An expired session is gone, as in ADK's stores with a TTL: its id is free.
                if attempt == 2 or not await self._expired(sid):
                    raise AlreadyExistsError(
                        f"Session with id {session_id} already exists.") from None
                with contextlib.suppress(SessionNotFoundError):
                    await self.client.delete_session(sid)
        found = await self.get_session(app_name=app_name, user_id=user_id, session_id=session_id)
        assert found is not None
        return found

    async def get_session(self, *, app_name: str, user_id: str, session_id: str,
                          config: GetSessionConfig | None = None) -> Session | None:
        sid = session_id_for(app_name, user_id, session_id.strip())
        try:
            view = await self.client.get_session(sid)
        except SessionNotFoundError:
            return None
        if view.status == "expired":  # its TTL passed: gone for ADK until retention takes it
            return None
        # Retention (issue 48) may have trimmed the messages up to history.through_sequence.
        start = view.history.through_sequence if view.history else None
        events, newest = await self._events(sid, view.message_count, config, start)
        scoped = await self._scoped(app_name, [user_id])
        session = self._session(view, events, scoped)
        session._storage_update_marker = _marker(view.version, newest)
        return session

    async def list_sessions(self, *, app_name: str,
                            user_id: str | None = None) -> ListSessionsResponse:
        views: list[SessionState] = []
        cursor = None
        while True:
            page = await self.client.call(
                "session.states", rpc.SessionStatesResult, limit=_PAGE, cursor=cursor,
                namespace=namespace_for(app_name, user_id), prefix=user_id is None)
            views += [v for v in page.states if v.status != "expired"]
            if page.next is None:
                break
            cursor = page.next
        users = sorted({v.metadata["adk"]["user_id"] for v in views})
        scoped = await self._scoped(app_name, users)
        sessions = [self._session(v, [], scoped) for v in views]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def _expired(self, sid: str) -> bool:
        try:
            return (await self.client.get_session(sid)).status == "expired"
        except SessionNotFoundError:
            return False

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        with contextlib.suppress(SessionNotFoundError):
            await self.client.delete_session(session_id_for(app_name, user_id, session_id.strip()))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        return (await self._scoped(app_name, [user_id])).users.get(user_id, {})

    # --- events -----------------------------------------------------------------------

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store the event, as DatabaseSessionService does: through a session object older
        than the stored session it raises StaleSessionError (a ValueError) and stores
        nothing; once stored, the object takes the event and the new revision."""
        if event.partial:
            return event
        # As the SDK's stores: temp: keys reach the object's state, never the store.
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        async with self._session_lock(session):
            return await self._append(session, event)

    @contextlib.asynccontextmanager
    async def _session_lock(self, session: Session) -> AsyncIterator[None]:
        """One append at a time per session in this process, as DatabaseSessionService:
        the branches of a ParallelAgent share one session object, and each must see the
        revision the one before it left there."""
        key = (id(asyncio.get_running_loop()), session.app_name, session.user_id, session.id)
        entry = self._locks.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                yield
        finally:
            entry[1] -= 1
            if not entry[1]:
                self._locks.pop(key, None)

    async def _append(self, session: Session, event: Event) -> Event:
        # A retry of an append this object already took: stored once, kept once. Retries
        # come right after their first try, so the newest few events are enough to look
        # at; scanning them all made every append cost O(history).
        stored = event.model_dump(mode="json", exclude_none=True)
        for e in session.events[-_RETRY_WINDOW:]:
            if event.id and e.id == event.id:
                if e.model_dump(mode="json", exclude_none=True) != stored:
                    raise _duplicate(session, event)
                return event
        sid = session_id_for(session.app_name, session.user_id, session.id)
        version = _version(session._storage_update_marker)
        newest = _newest(session._storage_update_marker)
        if version is None:
            version, newest = await self._check_unmarked(sid, session)
        newest = max(newest, event.timestamp) if newest is not None else None
        role, content, tool_call_id, spans = _render(event, stored)
        message: dict[str, Any] = {"role": role, "content": content,
                                   "metadata": {"adk_event": lift(stored, spans)}}
        if newest is not None and math.isfinite(newest):
            message["metadata"][_NEWEST] = newest
        if spans:
            message["metadata"]["spans"] = spans
        if tool_call_id:
            message["tool_call_id"] = tool_call_id
        calls = readable_calls(event)
        if calls:
            message["metadata"]["function_calls"] = calls
        delta = event.actions.state_delta if event.actions and event.actions.state_delta else {}
        events = [{"type": "message.appended", "data": message},
                  *_state_events(delta, session.app_name, session.user_id),
                  *self._usage_events(event)]
        if event.actions and event.actions.compaction:
            events += await compaction.compacted(self.client, sid, event)
        # The same event delivered again (a retry whose answer was lost) is stored once;
        # its key is its id (or, without one, its content).
        key = "adk-event:" + (event.id or hashlib.sha256(
            json.dumps(stored, sort_keys=True).encode()).hexdigest())
        try:
            with sized():
                written = await self.client.append_events(
                    sid, events, idempotency_key=key[:256], expected_version=version)
        except SessionNotFoundError:
            raise AdkSessionNotFound(f"Session {session.id} not found.") from None
        except VersionConflictError:
            raise StaleSessionError(STALE_SESSION_MESSAGE) from None
        if written.version <= version:  # the key was taken before: a retry, or another event
            await self._check_repeat(sid, written.version - len(events) + 1, stored, session,
                                     event)
        session.last_update_time = event.timestamp
        session._storage_update_marker = _marker(written.version, newest)
        return self._commit_event_to_session(session, event)

    def _usage_events(self, event: Event) -> list[dict[str, Any]]:
        """The model's token usage the event carries (`usage_metadata`), recorded with it in
        the same write: prompt tokens in, candidate and thinking tokens out."""
        u = event.usage_metadata
        if u is None:
            return []
        data = tokens(u.prompt_token_count or 0,
                      (u.candidates_token_count or 0) + (u.thoughts_token_count or 0),
                      event.model_version, self.prices)
        return [{"type": "tokens.recorded", "data": data}] if data else []

    async def _check_repeat(self, sid: str, at: int, stored: dict[str, Any], session: Session,
                            event: Event) -> None:
        """A repeated key is a retry only if the stored event is this one; a different
        event under a taken id is refused, as DatabaseSessionService's primary key does."""
        read = await self.client.read_events(sid, from_version=at, limit=1)
        first = read.events[0].fields() if read.events else {}
        metadata = first.get("metadata", {}) if isinstance(first, dict) else {}
        if "adk_event" not in metadata or restore(
                metadata["adk_event"], first["content"], metadata.get("spans") or []) != stored:
            raise _duplicate(session, event)

    async def _check_unmarked(self, sid: str, session: Session) -> tuple[int, float | None]:
        """For a session object this service did not load (no marker), ADK's fallback:
        stale only if the store moved past the object's last_update_time and its latest
        event is not the object's latest. The version to append at, and the newest
        timestamp stored (None: not known)."""
        try:
            view = await self.client.get_session(sid)
        except SessionNotFoundError:
            raise AdkSessionNotFound(f"Session {session.id} not found.") from None
        last = view.last_message.metadata.get("adk_event") if view.last_message else None
        stored_time = last["timestamp"] if last else view.metadata["adk"]["created_time"]
        if stored_time > session.last_update_time:
            latest = last.get("id") if last else None
            if latest != (session.events[-1].id if session.events else None):
                raise StaleSessionError(STALE_SESSION_MESSAGE)
            session.last_update_time = stored_time
        newest = view.last_message.metadata.get(_NEWEST) if view.last_message else -math.inf
        return view.version, newest if isinstance(newest, (int, float)) else None

    # --- reading back -----------------------------------------------------------------

    async def _events(self, sid: str, count: int, config: GetSessionConfig | None,
                      start: int | None = None) -> tuple[list[Event], float | None]:
        """The session's events in DatabaseSessionService's order (by timestamp, ties by
        event id; the log keeps append order), as GetSessionConfig narrows them; and the
        newest timestamp stored (None: not known). That order is not append order when
        timestamps go back: a narrowed read walks back from the end until no older event
        can be newer than the ones it has (each message's `_NEWEST`), which is the newest
        few when timestamps go forward, as ADK's runner writes them."""
        limit = config.num_recent_events if config else None
        after = config.after_timestamp if config else None
        if limit is not None and limit <= 0:
            limit = 0
        if limit is None and after is None:
            found = await self._all_events(sid, count, start)
            return found, max((e.timestamp for e in found), default=-math.inf)
        found, newest = await self._newest_events(sid, count, limit, after, start)
        found.sort(key=lambda e: (e.timestamp, e.id))
        if after is not None:
            found = [e for e in found if e.timestamp >= after]
        return (found if limit is None else found[-limit:] if limit else []), newest

    async def _all_events(self, sid: str, count: int, start: int | None) -> list[Event]:
        found: list[Event] = []
        cursor: int | None = start
        while len(found) < count:
            page = await self.client.list_messages(sid, limit=_PAGE, after_sequence=cursor)
            if not page.messages:
                break
            found += [_event_of(m) for m in page.messages if "adk_event" in m.metadata]
            cursor = page.messages[-1].sequence
        found.sort(key=lambda e: (e.timestamp, e.id))
        return found

    async def _newest_events(self, sid: str, count: int, limit: int | None,
                             after: float | None, start: int | None
                             ) -> tuple[list[Event], float | None]:
        """Events read from the end back, until the ones not read cannot change the
        answer (the oldest read message's `_NEWEST` is older than what is kept)."""
        found: list[Event] = []
        newest: float | None = -math.inf if count == 0 else None
        want, read = min(_PAGE, (limit or 0) + 2 if limit is not None else 16), 0
        while read < count - (start + 1 if start is not None else 0):
            page = await self.client.list_messages(sid, order="desc", limit=want, offset=read)
            if not page.messages:
                break
            if read == 0:
                top = page.messages[0].metadata.get(_NEWEST)
                newest = top if isinstance(top, (int, float)) else None
            read += len(page.messages)
            found += [_event_of(m) for m in page.messages if "adk_event" in m.metadata]
            bound = page.messages[-1].metadata.get(_NEWEST)
            if isinstance(bound, (int, float)) and _settled(found, limit, after, bound):
                break
            want = min(_PAGE, want * 2)
        return found, newest

    async def _scoped(self, app_name: str, user_ids: list[str]) -> rpc.StateGetResult:
        result: rpc.StateGetResult = await self.client.call(
            "state.get", rpc.StateGetResult, app_name=app_name, user_ids=user_ids)
        return result

    @staticmethod
    def _session(view: SessionState, events: list[Event], scoped: rpc.StateGetResult) -> Session:
        adk = view.metadata["adk"]
        state = dict(view.memory)
        state.update({State.APP_PREFIX + k: v for k, v in scoped.app.items()})
        state.update({State.USER_PREFIX + k: v
                      for k, v in scoped.users.get(adk["user_id"], {}).items()})
        last = view.last_message.metadata.get("adk_event") if view.last_message else None
        session = Session(id=adk["id"], app_name=adk["app_name"], user_id=adk["user_id"],
                          state=state, events=events,
                          last_update_time=last["timestamp"] if last else adk["created_time"])
        session._storage_update_marker = _marker(view.version)
        return session

    async def close(self) -> None:
        await self.client.aclose()
