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

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Callable
from typing import Any

import msgspec
from agents.memory.session import SessionABC, _await_mutation, _CompactionSnapshot
from agents.memory.session_settings import (
    SessionSettings,
    coerce_session_settings,
    resolve_session_limit,
)

from sessiond_schemas.bounds import json_out_of_bounds
from sessiond_schemas.errors import (
    SessiondError,
    SessionExistsError,
    SessionNotFoundError,
    VersionConflictError,
)
from sessiond_schemas.events import MAX_SUMMARY_MESSAGES
from sessiond_schemas.state import MAX_TTL_S

from ._loop import LoopClient, sized
from ._text import Piece, compose, lift, restore
from ._usage import Prices, tokens

log = logging.getLogger("sessiond.integrations.openai_agents")

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_PAGE = 1000  # message.list's largest page
_BATCH_BYTES = 48 << 20  # well under the daemon's default max_request_bytes (128 MiB)


def session_id_for(name: str) -> str:
    """The sessiond session id of an SDK session id: itself when it is a valid id, else a
    stable hash of it (the original is kept in the session's metadata)."""
    if _ID.match(name):
        return name
    return "oa-" + hashlib.sha256(name.encode()).hexdigest()[:40]


def _parts(content: Any, key: str | int) -> list[Piece]:
    """The pieces of a content list (or string) field, joined by newlines."""
    if isinstance(content, str):
        return [(content, (key,))]
    pieces: list[Piece] = []
    if isinstance(content, list):
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                continue
            if pieces:
                pieces.append(("\n", None))
            for field in ("text", "refusal"):
                if isinstance(part.get(field), str) and part[field]:
                    pieces.append((part[field], (key, i, field)))
                    break
            else:
                pieces.append((str(part.get("text") or part.get("refusal") or
                                   f"[{part.get('type', 'part')}]"), None))
    return pieces


def _json_text(item: Any) -> str:
    """The item as SQLiteSession stores it (`json.dumps`): bytes and other objects JSON
    cannot hold raise TypeError as they do there; inf, NaN and lone surrogates pass."""
    return json.dumps(item)


# A \ud800-\udfff escape that is not half of a pair: UTF-8 (and so the daemon) cannot hold it.
_LONG_DIGITS = re.compile(r"\d{19}")  # an int that may be past int64
_LONE_SURROGATE = re.compile(
    r"\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}")


def as_message(item: Any) -> dict[str, Any]:
    """The sessiond message that carries one SDK item: its readable content, and the item
    whole in metadata, minus the strings the content already holds (`_text.lift`)."""
    item = dict(item)
    kind = item.get("type")
    role, tool_call_id = "assistant", None
    pieces: list[Piece] = []
    if item.get("role") in ("user", "assistant", "system", "developer"):
        role = "system" if item["role"] == "developer" else item["role"]
        pieces = _parts(item.get("content"), "content")
    elif kind == "function_call":
        arguments = item.get("arguments", "")
        pieces = [(f"{item.get('name')}(", None),
                  (arguments, ("arguments",)) if isinstance(arguments, str) else
                  (str(arguments), None), (")", None)]
    elif kind in ("function_call_output", "computer_call_output", "custom_tool_call_output"):
        role, tool_call_id = "tool", str(item.get("call_id") or "unknown")
        output = item.get("output")
        pieces = [(output, ("output",)) if isinstance(output, str) else
                  (_json_text(output), ("output",), "json")]
    elif kind == "reasoning":
        pieces = _parts(item.get("summary"), "summary")
    content, spans = compose(pieces)
    if not content.strip():
        content, spans = f"[{kind or role}]", []
    try:
        content.encode()
    except UnicodeEncodeError:  # a lone surrogate: the item keeps its text, escaped
        content, spans = content.encode("utf-8", "replace").decode(), []
    text = _json_text(lift(item, spans))
    metadata: dict[str, Any] = {}
    if ("Infinity" in text or "NaN" in text or ("\\ud" in text and _LONE_SURROGATE.search(text))
            or (_LONG_DIGITS.search(text) and json_out_of_bounds(json.loads(text)))):
        # What sessiond's JSON does not carry (non-finite floats, lone surrogates, ints past
        # int64), kept as text, as SQLiteSession keeps every item.
        metadata["item_json"] = text
    else:
        metadata["item"] = msgspec.Raw(text)
    if spans:
        metadata["spans"] = spans
    if kind == "function_call":
        metadata["tool_calls"] = readable_calls(item)
    message: dict[str, Any] = {"role": role, "content": content, "metadata": metadata}
    if tool_call_id:
        message["tool_call_id"] = tool_call_id
    return message


def readable_calls(item: dict[str, Any]) -> list[dict[str, Any]]:
    """A function_call item's call as every face of sessiond reads one
    (`metadata.tool_calls`: its id, which the output's tool_call_id names, and the
    tool's name; its arguments are the content's, `name(arguments)`, stored once)."""
    return [{"id": str(item.get("call_id") or item.get("id") or ""),
             "name": str(item.get("name") or "tool")}]


def item_of(message: Any) -> Any:
    """The SDK item a stored message carries (None if it carries none)."""
    metadata = message.metadata
    if "item" in metadata:
        item = metadata["item"]
    elif "item_json" in metadata:
        item = json.loads(metadata["item_json"])
    else:
        return None
    spans = metadata.get("spans")
    return restore(item, message.content, spans) if spans else item


def _batches(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """append_many calls for these messages: one (so the items are stored atomically, as
    SQLiteSession stores them) unless it would pass append_many's 10,000 messages or
    about _BATCH_BYTES; huge lists of huge items are then stored a batch at a time."""
    batches: list[list[dict[str, Any]]] = [[]]
    size = 0
    for m in messages:
        metadata = m["metadata"]
        item = metadata.get("item")
        cost = len(m["content"]) + (len(item) if isinstance(item, msgspec.Raw)
                                    else len(metadata.get("item_json", "")))
        if batches[-1] and (len(batches[-1]) >= 10_000 or size + cost > _BATCH_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(m)
        size += cost
    return batches


class SessiondSession(SessionABC):
    """An Agents SDK session stored in sessiond (one sessiond session per SDK session).

    Pass `client` to share one connection among many sessions; without it each session
    connects (on first use) to the daemon at `socket`, by default the usual socket.
    """

    def __init__(self, session_id: str, *, client: LoopClient | None = None,
                 socket: str | None = None, namespace: str = "openai-agents",
                 session_settings: SessionSettings | dict[str, Any] | None = None,
                 ttl: int | None = None, prices: Prices | None = None) -> None:
        self.session_id = session_id
        # As every store of the SDK: a dict becomes SessionSettings, an unknown key is a
        # TypeError here rather than an AttributeError inside Runner.run.
        self.session_settings = (coerce_session_settings(session_settings)
                                 if session_settings is not None else SessionSettings())
        self.namespace = namespace
        # RedisSession's `ttl` (seconds): here the session's idle TTL, after which the
        # daemon ends it and retention removes it; each write starts it again, as there.
        if ttl is not None and not 1 <= ttl <= MAX_TTL_S:
            raise ValueError(f"ttl must be 1 … {MAX_TTL_S} seconds, not {ttl}")
        self.ttl = ttl
        self.prices = prices  # model -> (USD per 1M input, per 1M output tokens); else cost 0
        self.client = client or LoopClient(socket)
        self._sid = session_id_for(session_id)
        self._exists = False
        self._closed = False

    async def _ensure(self) -> None:
        if self._exists:
            return
        try:
            await self.client.create_session(
                self._sid, namespace=self.namespace, source="openai-agents",
                metadata={"sdk_session_id": self.session_id}, ttl_s=self.ttl)
        except SessionExistsError:
            view = await self._revive_if_expired()
            if self.ttl is not None and view.ttl_s != self.ttl:
                await self.client.set_ttl(self._sid, self.ttl)
        self._exists = True

    async def _revive_if_expired(self) -> Any:
        """A session whose TTL passed has no items, as a Redis key that expired: the next
        write clears its conversation and makes it active again (its history stays in the
        events until retention removes the session)."""
        view = await self.client.get_session(self._sid)
        if view.status == "expired":
            await self.client.clear_messages(self._sid)
            view = await self.client.transition(self._sid, "active", reason="used after expiry")
        return view

    async def _is_expired(self) -> bool:
        """Only sessions given a ttl pay the look-up (one session.get per call)."""
        if self.ttl is None:
            return False
        try:
            return (await self.client.get_session(self._sid)).status == "expired"
        except SessionNotFoundError:
            return False

    async def get_items(self, limit: int | None = None) -> list[Any]:
        """The session's items as the model sees them: a compaction's summary items, then
        the items after it (session.context), read in time proportional to them, not to
        the history before the compaction (which stays in the session)."""
        self._check_not_closed()
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit < 0:
            limit = None  # as SQLiteSession's SQL LIMIT: a negative limit is no limit
        if await self._is_expired():
            return []
        try:
            messages = await (self._context() if limit is None else self._latest_context(limit))
        except SessionNotFoundError:
            return []
        return [item for item in map(item_of, messages) if item is not None]

    async def _latest_context(self, n: int) -> list[Any]:
        """The latest `n` of the context: from the message index alone while they are all
        after the compaction, else the whole context (fewer than `n` messages, then the
        summary's last items)."""
        view = await self.client.get_session(self._sid)
        tail = view.message_count - (view.context.through_sequence + 1 if view.context else 0)
        if n <= tail:
            return await self._latest(n)
        found = await self._context()
        return found[max(0, len(found) - n):]

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

    async def _context(self) -> list[Any]:
        """The whole context: the last compaction's summary, then every message after it."""
        page = await self.client.context(self._sid, limit=_PAGE)
        found: list[Any] = [*page.summary, *page.messages]
        while page.next is not None:
            page = await self.client.context(self._sid, limit=_PAGE, after_sequence=page.next)
            found += page.messages
        return found

    async def add_items(self, items: list[Any]) -> None:
        self._check_not_closed()  # before the empty-list fast path, as SQLiteSession
        if not items:
            return
        await self._ensure()
        if await self._is_expired():
            await self._revive_if_expired()
        messages = [as_message(item) for item in items]
        for batch in _batches(messages):
            try:
                with sized():
                    await self.client.append_messages(self._sid, batch)
            except SessionNotFoundError:  # deleted behind our back: start it again
                self._exists = False
                await self._ensure()
                with sized():
                    await self.client.append_messages(self._sid, batch)

    async def pop_item(self) -> Any | None:
        self._check_not_closed()
        if await self._is_expired():
            return None
        try:
            view = await self.client.get_session(self._sid)
            if view.context is not None and view.message_count <= \
                    view.context.through_sequence + 1:
                return await self._pop_summary(view.version)
            popped = await self.client.pop_message(self._sid)
        except SessionNotFoundError:
            return None
        if popped.message is None:
            return None
        return item_of(popped.message)

    async def _pop_summary(self, version: int) -> Any | None:
        """pop_item when the context is a compaction's summary alone: its last item leaves
        it (a compaction of the others, or, for the only one, message.clear)."""
        items = [item_of(m) for m in (await self.client.context(self._sid, limit=1)).summary]
        if not items or (len(items) > 1 and not await self._compact(items[:-1], version)):
            return None
        if len(items) == 1:
            await self.client.clear_messages(self._sid, expected_version=version)
        return items[-1]

    async def _get_compaction_snapshot(
            self, limit: int, *,
            prune_prefix: Callable[[Any], bool] | None = None) -> _CompactionSnapshot | None:
        """The SDK's compaction snapshot (what OpenAIResponsesCompactionSession's automatic
        compaction asks its store for, as SQLiteSession answers it): the latest `limit`
        items of the context, whether they are all of it, and `replace_suffix(start,
        output)`, written only if the session is still at the version read here (False, and
        nothing written, if anything was written since).

        When the snapshot is the whole context, the replacement is a compaction
        (session.compact, by "openai-agents"): its summary is the items kept before
        `start` and `output`, and it stands for every message so far, which stay in the
        session. When a history limit hides the context's start, the items before the
        snapshot must stay where they are: the suffix is replaced in the conversation
        (message.append_many with `replace_from`; the replaced items stay in the events).

        `prune_prefix` (EncryptedSession's expired items) is taken and not used: the
        conversation can only be cut at its end, so the expired prefix stays, unread by
        EncryptedSession as before (as every item, it stays in the events anyway)."""
        del prune_prefix
        if type(self) is not SessiondSession:  # as the SDK's: a subclass owns its own
            return None
        self._check_not_closed()
        try:
            view = await self.client.get_session(self._sid)
        except SessionNotFoundError:
            return None
        if view.status == "expired":
            return None
        version, count = view.version, view.message_count
        start_seq = view.context.through_sequence + 1 if view.context else 0
        if limit < count - start_seq:
            return await self._suffix_snapshot(limit, version, count)
        messages = await self._context()
        if await self._moved(version):
            return None
        items = [item_of(m) for m in messages]
        if any(item is None for item in items):
            return None  # a message that carries no item: not an SDK history

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            if not 0 <= start < len(items):
                return False
            return await self._compact([*items[:start], *output], version)

        return _CompactionSnapshot(items, True, replace_suffix)

    async def _moved(self, version: int) -> bool:
        return (await self.client.get_session(self._sid)).version != version

    async def _compact(self, items: list[Any], version: int | None) -> bool:
        """One session.compacted whose summary is `items`, standing for every message so
        far (at `version`, if given); False, nothing written, if it cannot be one write."""
        batch = [as_message(item) for item in items]
        if not batch or len(_batches(batch)) > 1 or len(batch) > MAX_SUMMARY_MESSAGES:
            return False
        try:
            with sized():
                await _await_mutation(self.client.compact(
                    self._sid, batch, by="openai-agents", expected_version=version))
        except (VersionConflictError, SessionNotFoundError):
            return False
        return True

    async def _atomic_replace_items(self, items: list[Any]) -> bool:
        """The SDK's whole-history replacement (manual `run_compaction`, and automatic
        compaction without a snapshot): a compaction whose summary is `items`, in one write;
        False (the SDK then clears and adds) when there is nothing to put there."""
        self._check_not_closed()
        await self._ensure()
        return await self._compact(items, None)

    async def _suffix_snapshot(self, limit: int, version: int,
                               count: int) -> _CompactionSnapshot | None:
        """A snapshot of the latest `limit` messages, all after the context's start."""
        messages = await self._latest(limit)
        if [m.sequence for m in messages] != list(range(count - len(messages), count)):
            return None  # written since the version above: no snapshot, no compaction
        items = [item_of(m) for m in messages]
        if any(item is None for item in items):
            return None  # a message that carries no item: not an SDK history
        first = count - len(messages)

        async def replace_suffix(start: int, output: list[Any]) -> bool:
            if not 0 <= start < len(messages):
                return False
            batch = [as_message(item) for item in output]
            if not batch or len(_batches(batch)) > 1:
                return False  # nothing to put there, or past one write: history kept
            try:
                with sized():
                    await _await_mutation(self.client.append_messages(
                        self._sid, batch, replace_from=first + start,
                        expected_version=version))
            except (VersionConflictError, SessionNotFoundError):
                return False
            return True

        return _CompactionSnapshot(items, False, replace_suffix)

    async def clear_session(self) -> None:
        self._check_not_closed()
        with contextlib.suppress(SessionNotFoundError):
            await self.client.clear_messages(self._sid)

    # --- usage, as AdvancedSQLiteSession's -------------------------------------------

    async def store_run_usage(self, result: Any) -> None:
        """Record a run's token usage (`result.context_wrapper.usage`, after Runner.run) in
        the session's token_usage, as one tokens.recorded event. As the SDK's, a failure is
        logged, never raised into the caller's run."""
        usage = getattr(getattr(result, "context_wrapper", None), "usage", None)
        if usage is None:
            return
        model = getattr(getattr(result, "last_agent", None), "model", None)
        name = model if isinstance(model, str) else getattr(model, "model", None)
        data = tokens(usage.input_tokens, usage.output_tokens,
                      name if isinstance(name, str) else None, self.prices)
        if data is None and not usage.requests:
            return
        data = {**(data or {"input_tokens": 0, "output_tokens": 0}),
                "requests": usage.requests, "total_tokens": usage.total_tokens}
        try:
            await self._ensure()
            await self.client.append_events(self._sid, [{"type": "tokens.recorded",
                                                         "data": data}])
        except (SessiondError, ValueError):
            log.exception("Failed to store session usage", extra={"session_id": self.session_id})

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """The session's usage over every stored run, as AdvancedSQLiteSession's:
        {requests, input_tokens, output_tokens, total_tokens, total_turns}, or None if no
        run was stored. Branches are sessiond forks (see the docs): `branch_id` names no
        branch here, so only None is taken."""
        if branch_id is not None:
            raise ValueError("SessiondSession has no branches: a branch is a fork, its own"
                             " SessiondSession (docs/integrations/openai-agents.md)")
        totals = {"requests": 0, "input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
                  "total_turns": 0}
        try:
            view = await self.client.get_session(self._sid)
            # From where the history starts (retention may have trimmed it: issue 48).
            version: int | None = view.history.version if view.history else 1
            while version is not None:
                page = await self.client.read_events(self._sid, from_version=version,
                                                     types=["tokens.recorded"])
                for e in page.events:
                    d = e.fields()  # as stored: `requests` and `total_tokens` are extras
                    if "requests" not in d:  # recorded otherwise, not by a run
                        continue
                    totals["total_turns"] += 1
                    for key in ("requests", "input_tokens", "output_tokens", "total_tokens"):
                        totals[key] += int(d.get(key, 0))
                version = page.next
        except SessionNotFoundError:
            return None
        return totals if totals["total_turns"] else None

    def close(self) -> None:
        """Close the connection (shared with every session given the same client); as
        SQLiteSession's, synchronous, and the session refuses further use."""
        self._closed = True
        self.client.close()

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError("SessiondSession is closed")
