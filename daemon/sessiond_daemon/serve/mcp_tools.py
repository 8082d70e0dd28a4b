"""The MCP server's tools (docs/mcp.md): what an agent may ask of the sessions sessiond keeps.

Each tool is one or a few calls of the contract's methods (session.search, session.list,
message.list, session.get, session.forks, session.fork), made through `Calls` as the
caller: the caller's grants decide, exactly as on the socket and the HTTP face. Each
tool's arguments are a msgspec Struct (its JSON Schema is the tool's input schema), and
each answer is one JSON text of at most ANSWER_BYTES bytes: long texts are cut (saying
so, with their full length), and a page ends early when the next item would not fit,
with a `cursor` that goes on from there. Nothing unbounded reaches a model.

This module knows nothing of MCP's wire: mcp.py serves these tools with the SDK.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

import msgspec

from sessiond_daemon.features.service import invalid_params
from sessiond_daemon.serve.web.calls import Caller, Calls
from sessiond_schemas.errors import InvalidParamsError

# Every answer's size: the UTF-8 bytes of its JSON text (about 4,000 tokens). An agent's
# context is the budget; Claude Code, for one, warns past 10,000 tokens of a tool's output.
ANSWER_BYTES: Final = 16_000
CONTENT_CHARS: Final = 2_000  # a message's content
INPUT_CHARS: Final = 500  # a tool call's input, as JSON
SNIPPET_CHARS: Final = 400  # a search hit's snippet
FIELD_CHARS: Final = 300  # a task, an error, a name
TOOL_CALLS: Final = 10  # a message's tool calls shown (the rest counted)
JSON_CHARS: Final = 1_500  # a state's memory, metadata, result, ..., as JSON
ANCESTORS: Final = 8  # the fork chain walked up from a session, at most
FORKS_PAGE: Final = 20  # a session's forks listed per answer

_json = msgspec.json.Encoder()

Status = Literal["pending", "active", "paused", "completed", "failed", "cancelled", "killed",
                 "expired"]


def _d(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


Cursor = Annotated[str | None, _d(
    "The `cursor` of the previous answer, to read the next page; leave it out for the"
    " first. A cursor goes on with the page size it was made with.")]
SessionId = Annotated[str, _d("A session's id, as search_sessions or list_sessions give it.")]


class SearchArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    query: Annotated[str, msgspec.Meta(min_length=1, max_length=1000, description=(
        "Full-text query over every session's messages, tool calls and results, tasks and"
        " errors: words (all must match), \"exact phrases\", prefix*, OR, NOT,"
        " NEAR(a b). Use the distinctive words of the problem: an error message, a"
        " function or file name."))]
    status: Annotated[list[Status] | None, _d("Only sessions in these statuses.")] = None
    namespace: Annotated[str | None, _d("Only sessions of this namespace.")] = None
    actor_name: Annotated[str | None, _d("Only sessions of this actor (agent name).")] = None
    since: Annotated[str | None, _d("Only matches recorded at or after this RFC 3339 time.")
                     ] = None
    until: Annotated[str | None, _d("Only matches recorded before this RFC 3339 time.")] = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=20, description="Sessions per page.")] = 5
    hits: Annotated[int, msgspec.Meta(ge=1, le=5, description=(
        "Matching snippets shown per session."))] = 3
    cursor: Cursor = None


class ListArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    namespace: Annotated[str | None, _d("Only sessions of this namespace.")] = None
    status: Annotated[list[Status] | None, _d("Only sessions in these statuses.")] = None
    actor_name: Annotated[str | None, _d("Only sessions of this actor (agent name).")] = None
    source: Annotated[str | None, _d(
        "Only sessions from this source (e.g. claude-code, codex for imported transcripts).")
                      ] = None
    created_after: Annotated[str | None, _d("Only sessions created after this RFC 3339 time.")
                             ] = None
    created_before: Annotated[str | None, _d(
        "Only sessions created before this RFC 3339 time.")] = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=50, description="Sessions per page.")] = 20
    cursor: Cursor = None


class ReadArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId
    from_sequence: Annotated[int, msgspec.Meta(ge=0, description=(
        "The first message to read, by its sequence (search hits give one: start a few"
        " before it to see what led there)."))] = 0
    limit: Annotated[int, msgspec.Meta(ge=1, le=50, description="Messages per page.")] = 20
    cursor: Cursor = None


class SessionArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId
    cursor: Annotated[str | None, _d(
        "The `forks_cursor` of the previous answer, for the next page of this session's"
        " forks.")] = None


class ForkArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId
    at_version: Annotated[Annotated[int, msgspec.Meta(ge=1)] | None, _d(
        "Fork the history up to this version (get_session gives the latest); by default"
        " all of it.")] = None
    idempotency_key: Annotated[Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
                               | None, _d("A key of your choosing: the same key forks once,"
                                          " however often it is sent.")] = None


class _Page(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """What a cursor holds: the daemon's cursor of a page, how many of its items were
    given already, and the page size it was asked with."""

    cursor: str | None
    skip: Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]  # or, of messages: a sequence
    size: Annotated[int, msgspec.Meta(ge=1, le=1000)]


def _cursor(page: _Page) -> str:
    return base64.urlsafe_b64encode(_json.encode(page)).decode().rstrip("=")


def _page(cursor: str) -> _Page:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        return msgspec.json.decode(raw, type=_Page)
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError("cursor: not one this tool gave (pass `cursor` back as it"
                                 " came)", {"detail": "invalid cursor", "path": "$.cursor"}
                                 ) from exc


def cut(text: str | None, limit: int) -> str | None:
    """`text`, or its first `limit` characters and a note of how long it was."""
    if text is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [cut: {len(text)} characters in all]"


def cut_json(value: Any, limit: int = JSON_CHARS) -> Any:
    """A JSON value as it is when short, else its JSON text cut to `limit` characters."""
    if value in (None, {}, []):
        return value
    text = _json.encode(value).decode()
    return value if len(text) <= limit else cut(text, limit)


def size(value: Any) -> int:
    return len(_json.encode(value))


def fit(answer: dict[str, Any], key: str, items: list[Any]) -> int:
    """Put as many of `items` in `answer[key]` as keep it within ANSWER_BYTES (at least
    one: each item is cut to fit alone); return how many."""
    answer[key] = []
    room = ANSWER_BYTES - size(answer) - 200  # what the cursor and the rest may take
    taken: list[Any] = []
    for item in items:
        room -= size(item) + 1
        if taken and room < 0:
            break
        taken.append(item)
    answer[key] = taken
    return len(taken)


async def _paged(call: Callable[[str | None, int], Awaitable[tuple[list[Any], str | None]]],
                 cursor: str | None, limit: int, answer: dict[str, Any], key: str) -> None:
    """One page of a daemon's paged method, cut to fit: `call(daemon cursor, size)` gives
    the page's items (projected) and the daemon's next cursor. A page cut short goes on
    from the first item left out (the same daemon page, read again, those given skipped)."""
    page = _page(cursor) if cursor is not None else _Page(None, 0, limit)
    items, following = await call(page.cursor, page.size)
    rest = items[page.skip:]
    taken = fit(answer, key, rest)
    if taken < len(rest):
        answer["cursor"] = _cursor(_Page(page.cursor, page.skip + taken, page.size))
    else:
        answer["cursor"] = _cursor(_Page(following, 0, page.size)) if following else None


def _hit(h: dict[str, Any]) -> dict[str, Any]:
    out = {"type": h["type"], "snippet": cut(h["snippet"], SNIPPET_CHARS),
           "recorded_at": h["recorded_at"]}
    if h.get("sequence") is not None:
        out["sequence"], out["role"] = h["sequence"], h.get("role")
    return out


def _found(s: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": s["session_id"], "status": s["status"],
            "namespace": cut(s["namespace"], FIELD_CHARS),
            "actor_name": cut(s["actor_name"], FIELD_CHARS),
            "task": cut(s["task"], FIELD_CHARS), "updated_at": s["updated_at"],
            "matches": s["matches"], "hits": [_hit(h) for h in s["hits"]]}


def _listed(s: dict[str, Any]) -> dict[str, Any]:
    return {"session_id": s["session_id"], "status": s["status"],
            "namespace": cut(s["namespace"], FIELD_CHARS),
            "actor_name": cut(s["actor_name"], FIELD_CHARS),
            "task": cut(s["task"], FIELD_CHARS), "created_at": s["created_at"],
            "updated_at": s["updated_at"], "message_count": s["message_count"],
            "token_usage": s["token_usage"]}


def _message(m: dict[str, Any]) -> dict[str, Any]:
    """A message as an agent reads it: its text, the tool calls it made (name, id, input),
    or the call it answers (tool_call_id)."""
    out: dict[str, Any] = {"sequence": m["sequence"], "role": cut(m["role"], FIELD_CHARS),
                           "timestamp": m["timestamp"],
                           "content": cut(m["content"], CONTENT_CHARS)}
    if m.get("tool_call_id"):
        out["tool_call_id"] = cut(m["tool_call_id"], FIELD_CHARS)
    calls = (m.get("metadata") or {}).get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {"id": cut_json(c.get("id"), FIELD_CHARS), "name": cut_json(c.get("name"),
                                                                       FIELD_CHARS),
             "input": cut_json(c.get("input"), INPUT_CHARS)} if isinstance(c, dict)
            else cut_json(c, INPUT_CHARS) for c in calls[:TOOL_CALLS]]
        if len(calls) > TOOL_CALLS:
            out["tool_calls_left_out"] = len(calls) - TOOL_CALLS
    return out


def _state(s: dict[str, Any]) -> dict[str, Any]:
    """A session's state with every field of unbounded size cut."""
    last = s.get("last_message")
    return {
        "session_id": s["session_id"], "status": s["status"], "version": s["version"],
        "namespace": cut(s["namespace"], FIELD_CHARS),
        "actor_name": cut(s["actor_name"], FIELD_CHARS),
        "agent_id": cut(s.get("agent_id"), FIELD_CHARS),
        "source": cut(s.get("source"), FIELD_CHARS), "model": cut(s.get("model"), FIELD_CHARS),
        "working_dir": cut(s.get("working_dir"), FIELD_CHARS),
        "task": cut(s.get("task"), FIELD_CHARS), "timestamps": s["timestamps"],
        "message_count": s["message_count"], "turn": s["turn"],
        "token_usage": s["token_usage"], "progress": cut_json(s.get("progress")),
        "result": cut_json(s.get("result")), "error": cut(s.get("error"), FIELD_CHARS),
        "memory": cut_json(s.get("memory")), "metadata": cut_json(s.get("metadata")),
        "problems": cut_json(s.get("problems"), FIELD_CHARS * 2),
        "decisions": cut_json(s.get("decisions"), FIELD_CHARS * 2),
        "last_message": None if last is None else {
            "sequence": last["sequence"], "role": cut(last["role"], FIELD_CHARS),
            "content": cut(last["content"], FIELD_CHARS)},
        "forked_from": s.get("forked_from"), "expires_at": s.get("expires_at"),
    }


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    title: str
    description: str
    args: type[msgspec.Struct]
    run: Callable[[Any, Caller], Awaitable[dict[str, Any]]]
    read_only: bool = True

    @property
    def input_schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = msgspec.json.schema(self.args)
        # msgspec puts a Struct's schema under $defs; a tool's must be the object itself.
        ref = schema.pop("$ref").rsplit("/", 1)[1]
        body: dict[str, Any] = schema["$defs"].pop(ref)
        body.pop("title", None)
        if schema["$defs"]:
            body["$defs"] = schema["$defs"]
        return body


class Tools:
    """The tools, each run as its caller (the caller's grants decide, in `Calls`)."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.all: dict[str, Tool] = {t.name: t for t in (
            Tool("search_sessions", "Search every session", SEARCH, SearchArgs, self.search),
            Tool("list_sessions", "List sessions", LIST, ListArgs, self.list),
            Tool("read_messages", "Read a session's messages", READ, ReadArgs, self.read),
            Tool("get_session", "A session's state and fork tree", GET, SessionArgs,
                 self.get),
            Tool("fork_session", "Fork a session", FORK, ForkArgs, self.fork,
                 read_only=False),
        )}

    async def call(self, name: str, arguments: dict[str, Any], caller: Caller
                   ) -> dict[str, Any]:
        """Run a tool; its answer, within ANSWER_BYTES. Raises the contract's errors
        (KeyError: no such tool)."""
        tool = self.all[name]
        try:
            args = msgspec.convert(arguments, tool.args)
        except msgspec.ValidationError as exc:
            raise invalid_params(exc, context=f"invalid arguments for {name}") from exc
        answer = await tool.run(args, caller)
        if size(answer) > ANSWER_BYTES:  # the cuts above make it impossible: a bug
            raise RuntimeError(f"{name}'s answer is {size(answer)} bytes, over ANSWER_BYTES")
        return answer

    async def search(self, a: SearchArgs, caller: Caller) -> dict[str, Any]:
        filters = {k: v for k, v in (("status", a.status), ("namespace", a.namespace),
                                     ("actor_name", a.actor_name), ("since", a.since),
                                     ("until", a.until)) if v is not None}
        answer: dict[str, Any] = {"query": cut(a.query, FIELD_CHARS)}

        async def page(cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
            r = await self.calls.call("session.search", {
                "query": a.query, **filters, "limit": limit, "hits": a.hits,
                **({"cursor": cursor} if cursor else {})}, caller)
            answer["complete"] = r["complete"]
            return [_found(s) for s in r["sessions"]], r["next_cursor"]

        await _paged(page, a.cursor, a.limit, answer, "sessions")
        return answer

    async def list(self, a: ListArgs, caller: Caller) -> dict[str, Any]:
        filters = {k: v for k, v in msgspec.structs.asdict(a).items()
                   if v is not None and k not in ("limit", "cursor")}
        answer: dict[str, Any] = {}

        async def page(cursor: str | None, limit: int) -> tuple[list[Any], str | None]:
            r = await self.calls.call("session.list", {
                **filters, "limit": limit, **({"cursor": cursor} if cursor else {})}, caller)
            return [_listed(s) for s in r["sessions"]], r["next_cursor"]

        await _paged(page, a.cursor, a.limit, answer, "sessions")
        return answer

    async def read(self, a: ReadArgs, caller: Caller) -> dict[str, Any]:
        start, limit = a.from_sequence, a.limit
        if a.cursor is not None:
            page = _page(a.cursor)
            start, limit = page.skip, page.size
        r = await self.calls.call("message.list", {
            "session_id": a.session_id, "after_sequence": start - 1, "limit": limit}, caller)
        answer: dict[str, Any] = {"session_id": a.session_id, "total_messages": r["total"]}
        messages = [_message(m) for m in r["messages"]]
        taken = fit(answer, "messages", messages)
        # A page cut short, or a full one (more may follow: the next page says), goes on
        # after the last message given.
        more = taken < len(messages) or len(messages) == limit
        answer["cursor"] = _cursor(_Page(None, messages[taken - 1]["sequence"] + 1, limit)
                                   ) if more and taken else None
        return answer

    async def get(self, a: SessionArgs, caller: Caller) -> dict[str, Any]:
        state = await self.calls.call("session.get", {"session_id": a.session_id}, caller)
        answer: dict[str, Any] = {"session": _state(state), "ancestors": []}
        # The chain it was forked from, nearest first: walked a bounded number of steps,
        # never round a cycle (a stored link is not trusted to end).
        link, seen = state.get("forked_from"), {a.session_id}
        while link is not None and len(answer["ancestors"]) < ANCESTORS \
                and link["session_id"] not in seen:
            seen.add(link["session_id"])
            answer["ancestors"].append(link)
            up = await self.calls.call("session.forks", {"session_id": link["session_id"],
                                                         "limit": 1}, caller)
            link = up["forked_from"]
        if link is not None and len(answer["ancestors"]) >= ANCESTORS:
            answer["ancestors_left_out"] = True
        forks = await self.calls.call("session.forks", {
            "session_id": a.session_id, "limit": FORKS_PAGE,
            **({"cursor": a.cursor} if a.cursor else {})}, caller)
        answer["fork_count"] = forks["count"]
        fit(answer, "forks", forks["forks"])
        answer["forks_cursor"] = forks["next_cursor"]
        return answer

    async def fork(self, a: ForkArgs, caller: Caller) -> dict[str, Any]:
        params = {k: v for k, v in msgspec.structs.asdict(a).items() if v is not None}
        state = await self.calls.call("session.fork", params, caller)
        return {"session": _state(state)}


SEARCH = (
    "Full-text search over every session sessiond keeps: the messages, tool calls and tool"
    " results of all agents' past sessions (Claude Code and Codex transcripts imported"
    " into sessiond too), their tasks and errors. Call it first when the user asks about"
    " earlier work, or when you meet a problem that an earlier session may have solved"
    " already: search the error message, the function or file name. Answers the"
    " best-matching sessions, each with its matching snippets (the match between « and"
    " ») and the message `sequence` of each hit; read the conversation around a hit with"
    " read_messages(session_id, from_sequence). Filters: status, namespace, actor_name,"
    " since/until. Pass `cursor` back for more.")
LIST = (
    "List the sessions sessiond keeps, newest activity first, with their status, task,"
    " message count and tokens. Call it to browse recent sessions or to find one by"
    " namespace, actor, source (claude-code, codex, ...) or creation time when you have"
    " no words to search for (then use search_sessions). Pass `cursor` back for more.")
READ = (
    "Read a session's messages in order, with the tool calls each made (name, id, input)"
    " and the tool results (role tool, with the tool_call_id they answer). Call it after"
    " search_sessions or list_sessions to see what a session actually did: start at a"
    " hit's sequence (minus a few) to read how a problem was found and fixed. Long"
    " contents are cut, saying how long they were. Pass `cursor` back for the next page.")
GET = (
    "A session's state: status, task, model, working directory, timestamps, tokens,"
    " result or error, memory and metadata (long values cut), its last message, and its"
    " fork tree: the sessions it was forked from (nearest first) and the forks taken"
    " of it. Call it to judge a session found by search before reading it, or before"
    " forking it.")
FORK = (
    "Fork a session: a new session whose history is this one's, up to `at_version` (by"
    " default all of it), which can then go on separately while the original stays as it"
    " is. A write: call it only when the user wants to branch from an earlier session."
    " Answers the new session's state (its id in session.session_id).")

