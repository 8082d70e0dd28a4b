"""Claude Agent SDK: `SessiondSessionStore`, a `SessionStore` whose transcripts live in sessiond.

The SDK mirrors each Claude Code transcript line (an "entry") to its session store. Here
each transcript (a session's, or one of its sub-agents') is a sessiond session, and each
entry one `events.append` whose idempotency key is the line's own id, as
`sessionctl import --format claude-code` writes them (importers/_lines.py): the entry's
messages, tool calls and results and token usage become the session's messages and
usage (so search, the web view and export see them), and the entry itself is kept whole
in its first event, which is what `load` gives back. A session both this store and the
importer see is one session: the same id, the same namespace, and no line twice.

    from claude_agent_sdk import ClaudeAgentOptions, query
    from sessiond.integrations.claude_agent_sdk import SessiondSessionStore

    options = ClaudeAgentOptions(session_store=SessiondSessionStore())

Where things are (docs/integrations/claude-agent-sdk.md):
- a main transcript: namespace `claude-code:<project_key>` (with `namespace=N`,
  `claude-code+N:<project_key>`), session id the SDK's session id when it is a valid
  sessiond id not taken by another project or namespace, else `cas-<hash>`;
- a sub-agent's (`subpath` "subagents/agent-<id>"): namespace
  `<main namespace>:<session_id>`, id `<session_id>.agent-<id>` (or `cas-<hash>`);
- the SDK's summary (`fold_session_summary`) in the main session's metadata.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from claude_agent_sdk import SessionStore, fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)

from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    SessionExistsError,
    SessionNotFoundError,
    VersionConflictError,
)
from sessiond_schemas.events import parse_time
from sessiond_schemas.state import SessionState

from ..importers._builder import Problem
from ..importers._lines import (
    LINE_CUT_FIELD,
    LINE_FIELD,
    LINE_KEY_FIELD,
    ClaudeCode,
    Line,
    line_keys,
    namespace_for,
)
from ._loop import LoopClient, sized

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_AGENT = re.compile(r"^subagents/agent-([A-Za-z0-9_-]{1,64})$")
_PAGE = 1000
_BATCH_BYTES = 32 << 20  # well under the daemon's default max_request_bytes (128 MiB)
SOURCE = "claude-agent-sdk"


def _candidates(namespace: str | None, key: SessionKey) -> list[str]:
    """The sessiond ids a key may have, in the order they are taken: the SDK's own id (as
    the importer names the transcript), then one of this key alone."""
    sid, sub = key["session_id"], key.get("subpath")
    found: list[str] = []
    if sub is None:
        found.append(sid)
    elif (m := _AGENT.match(sub)) is not None:
        found.append(f"{sid}.agent-{m.group(1)}")
    found = [c for c in found if _ID.match(c)]
    whole = "\0".join((namespace or "", key["project_key"], sid, sub or "")).encode()
    return [*found, "cas-" + hashlib.sha256(whole).hexdigest()[:40]]


def _batches(lines: list[Line]) -> list[list[Line]]:
    """Lines in writes of at most 10,000 events and about _BATCH_BYTES of kept text."""
    batches: list[list[Line]] = [[]]
    events = size = 0
    for line in lines:
        cost = 2 * len(line.events[0]["data"][LINE_FIELD])  # the line, and its messages
        if batches[-1] and (events + len(line.events) > 10_000 or size + cost > _BATCH_BYTES):
            batches.append([])
            events = size = 0
        batches[-1].append(line)
        events += len(line.events)
        size += cost
    return batches


def _ms(time: str) -> int:
    return int(parse_time(time).timestamp() * 1000)


def _text(entry: Any) -> str:
    """The entry as the CLI writes a line (compact JSON, UTF-8)."""
    text = json.dumps(entry, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, as JSON can say it
        text = json.dumps(entry, separators=(",", ":"))
    return text


class SessiondSessionStore(SessionStore):
    """A Claude Agent SDK session store in sessiond: every method of the protocol.

    `namespace` separates stores sharing one daemon (None: where `sessionctl import
    --format claude-code` puts the CLI's own transcripts, so both see the same
    sessions); `socket`, the daemon's (default: the usual one). Pass `client` to share
    one connection among stores.
    """

    def __init__(self, namespace: str | None = None, socket: str | None = None, *,
                 client: LoopClient | None = None) -> None:
        self.namespace = namespace
        self.client = client or LoopClient(socket)
        self._sids: dict[tuple[str, str, str | None], str] = {}
        self._known: dict[str, set[str]] = {}  # sessiond id -> line keys it holds
        self._at: dict[str, int] = {}  # sessiond id -> the version _known is exact at
        self._parsers: dict[tuple[str, str, str | None], ClaudeCode] = {}

    # --- where a key lives -------------------------------------------------------------

    def _namespace(self, key: SessionKey) -> str:
        sub = key.get("subpath") is not None
        return namespace_for(self.namespace, key["project_key"],
                             key["session_id"] if sub else None)

    def _owns(self, view: SessionState, key: SessionKey) -> bool:
        return (view.namespace == self._namespace(key)
                and view.metadata.get("subpath") == key.get("subpath"))

    async def _resolve(self, key: SessionKey,
                       create: Callable[[str], Any] | None = None) -> str | None:
        """The sessiond id of `key` (None if it has none); with `create`, one is made if
        needed (create(sid) makes it) at the first id free."""
        ck = (key["project_key"], key["session_id"], key.get("subpath"))
        if ck in self._sids:
            return self._sids[ck]
        free: list[str] = []
        for sid in _candidates(self.namespace, key):
            try:
                view = await self.client.get_session(sid)
            except SessionNotFoundError:
                free.append(sid)
                continue
            if self._owns(view, key):
                self._sids[ck] = sid
                return sid
        if create is None:
            return None
        for sid in free:
            try:
                await create(sid)
            except SessionExistsError:  # made meanwhile: by another writer of this key?
                view = await self.client.get_session(sid)
                if not self._owns(view, key):
                    continue
            self._sids[ck] = sid
            return sid
        raise RuntimeError(f"no session id free for {key!r}")  # every candidate taken

    def _forget(self, key: SessionKey) -> None:
        ck = (key["project_key"], key["session_id"], key.get("subpath"))
        self._parsers.pop(ck, None)
        sid = self._sids.pop(ck, None)
        if sid is not None:
            self._known.pop(sid, None)
            self._at.pop(sid, None)

    async def _keys(self, sid: str, version: int | None = None) -> set[str]:
        """The line keys session `sid` holds, as of its latest version (read once, then
        only the events written since: `version`, when known, says whether any were)."""
        keys = self._known.setdefault(sid, set())
        at = self._at[sid] if sid in self._at else await self._start(sid) - 1
        if version is not None and version == at:
            return keys
        start: int | None = at + 1
        while start is not None:
            page = await self.client.read_events(sid, from_version=start, limit=10_000)
            keys.update(line_keys(page.events))
            if page.events:
                at = page.events[-1].version
            start = page.next
        self._at[sid] = at
        return keys

    async def _start(self, sid: str) -> int:
        """The first version session `sid` holds: 1, or where retention's trim left it."""
        try:
            view = await self.client.get_session(sid)
        except SessionNotFoundError:
            return 1
        return view.history.version if view.history else 1

    # --- writing ------------------------------------------------------------------------

    def _lines(self, key: SessionKey, entries: list[SessionStoreEntry]
               ) -> tuple[ClaudeCode, list[tuple[SessionStoreEntry, Line]]]:
        """Each entry as the importer reads its line; one it cannot read (the store takes
        any JSON) is kept all the same, as a line that says nothing for the session. One
        parser per key: a response's usage, on each of its lines, is counted once."""
        sub = key.get("subpath")
        ck = (key["project_key"], key["session_id"], sub)
        parser = self._parsers.get(ck)
        if parser is None:
            path = f"{key['project_key']}/{key['session_id']}" + (
                f"/{sub}.jsonl" if sub else ".jsonl")
            parser = self._parsers[ck] = ClaudeCode(path)
        lines = []
        for entry in entries:
            text = _text(entry)
            try:
                line = parser.parse(text, 0)
            except Problem:
                line = None
            if line is None:
                uuid = entry.get("uuid") if isinstance(entry, dict) else None
                line = Line(f"cc:{uuid}" if isinstance(uuid, str) and uuid
                            else parser.content_key("cc", text), 0, None)
                line.keep(text)
            lines.append((entry, line))
        return parser, lines

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        if not entries:
            return
        parser, lines = self._lines(key, entries)
        f = parser.facts
        sub = key.get("subpath")

        async def create(sid: str) -> None:
            metadata: dict[str, Any] = {
                "project": key["project_key"], "sdk_session_id": key["session_id"],
                "cli_version": f.cli_version, "git_branch": f.first_git_branch}
            parent = None
            if sub is not None:
                metadata["subpath"] = sub
                parent = (_candidates(self.namespace, {
                    "project_key": key["project_key"], "session_id": key["session_id"]})[0])
                metadata["parent_session_id"] = parent
            await self.client.create_session(
                sid, namespace=self._namespace(key), source=SOURCE, adapter="claude-code",
                task=f.task, working_dir=f.working_dir, model=f.first_model or f.model,
                correlation_id=parent,
                metadata={k: v for k, v in metadata.items() if v is not None})

        summarize = key if sub is None else None  # sub-agents' lines are not summarized
        try:
            sid = await self._resolve(key, create)
            assert sid is not None
            await self._write(sid, lines, summarize)
        except SessionNotFoundError:  # deleted behind this store's back: made again
            self._forget(key)
            sid = await self._resolve(key, create)
            assert sid is not None
            await self._write(sid, lines, summarize)

    async def _write(self, sid: str, lines: list[tuple[SessionStoreEntry, Line]],
                     summarize: SessionKey | None) -> None:
        """Append the lines the session does not hold, in one write (or a few, for huge
        batches), with the summary folded over them when `summarize`; an entry without a
        uuid is never taken for another (a repeat of its text gets the next number).
        The write is at the version the session's line keys (and summary) were read at:
        if anything was written between (the importer, another store), the new lines and
        the summary are worked out again, so no line is stored twice."""
        conflicts = 0
        pending = list(lines)  # not stored by this call yet
        stored: list[SessionStoreEntry] = []  # stored by this call, not summarized yet
        while True:
            view = await self.client.get_session(sid) if summarize is not None else None
            if conflicts > 1 or (view is not None and view.version < self._at.get(sid, 0)):
                # Not just written meanwhile: deleted and made again. Read it afresh.
                self._known.pop(sid, None)
                self._at.pop(sid, None)
            new = await self._new(sid, pending, view.version if view is not None else None)
            if not new:
                break
            batches = _batches([line for _, line in new])
            summary = None
            if view is not None and summarize is not None and len(batches) == 1:
                folded = fold_session_summary(self._summary(view), summarize,
                                              stored + [entry for entry, _ in new])
                events = sum(len(line.events) for _, line in new)
                summary = {"type": "metadata.updated", "data": {"patch": {"sdk_summary": {
                    "data": json.dumps(folded["data"]),
                    "version": view.version + events + 1}}}}
            try:
                for batch in batches:
                    summarized = await self._append(sid, batch, summary)
                    ids = {id(line) for line in batch}
                    stored += [entry for entry, line in pending if id(line) in ids]
                    pending = [(entry, line) for entry, line in pending if id(line) not in ids]
                    if summary is not None and summarized:
                        stored = []
            except VersionConflictError:
                conflicts += 1
                continue  # written meanwhile: what it holds now, and again
            break
        if summarize is not None and stored:
            await self._summarize(sid, summarize, stored)

    async def _new(self, sid: str, lines: list[tuple[SessionStoreEntry, Line]],
                   version: int | None) -> list[tuple[SessionStoreEntry, Line]]:
        """The lines the session does not hold yet (at `version`, if known), each with
        its key."""
        known = await self._keys(sid, version)
        new: list[tuple[SessionStoreEntry, Line]] = []
        taken: set[str] = set()
        for entry, line in lines:
            if not (isinstance(entry, dict) and entry.get("uuid")):
                base, n = line.key.split("#")[0], 1
                line.key = base
                while line.key in known or line.key in taken:
                    n += 1
                    line.key = f"{base}#{n}"
            elif line.key in known or line.key in taken:
                continue  # stored already (the SDK retries batches), or twice in this one
            taken.add(line.key)
            new.append((entry, line))
        return new

    async def _append(self, sid: str, lines: list[Line],
                      summary: dict[str, Any] | None = None) -> bool:
        """One events.append of these lines (and the summary after them), at the version
        the line keys are exact at; each line's key in its first event
        (`LINE_KEY_FIELD`), the write's key made of theirs: a retry of the same batch
        writes nothing again. If the daemon refuses what some entry's messages would
        hold (a number past int64, say), the lines go one by one, that entry kept all the
        same, as its text only, and the summary is not written (False: the caller
        writes it)."""
        events = []
        for line in lines:
            first = {**line.events[0], "data": {**line.events[0]["data"],
                                                LINE_KEY_FIELD: line.key}}
            events += [first, *line.events[1:]]
        whole = "\n".join(line.key for line in lines).encode()
        known = self._known.setdefault(sid, set())
        try:
            with sized():
                write = await self.client.append_events(
                    sid, events + ([summary] if summary else []),
                    expected_version=self._at.get(sid, 0),
                    idempotency_key="ccb:" + hashlib.sha256(whole).hexdigest()[:40])
        except InvalidParamsError:
            if len(lines) > 1:
                for line in lines:
                    await self._append(sid, [line])
                return summary is None
            bare = Line(lines[0].key, 0, None)
            bare.keep(lines[0].events[0]["data"][LINE_FIELD])
            with sized():
                write = await self.client.append_events(
                    sid, bare.events, expected_version=self._at.get(sid, 0),
                    idempotency_key=lines[0].key)
            known.add(lines[0].key)
            self._at[sid] = max(self._at.get(sid, 0), write.version)  # a repeat: its first
            return summary is None
        known.update(line.key for line in lines)
        self._at[sid] = max(self._at.get(sid, 0), write.version)
        return True

    async def _summarize(self, sid: str, key: SessionKey,
                         entries: list[SessionStoreEntry]) -> None:
        """Fold the entries into the session's summary and store it, only over the
        version it was read at (a concurrent append folds again)."""
        while True:
            view = await self.client.get_session(sid)
            prev = self._summary(view)
            folded = fold_session_summary(prev, key, entries)
            stored = {"data": json.dumps(folded["data"]), "version": view.version + 1}
            try:
                await self.client.append_events(
                    sid, [{"type": "metadata.updated", "data": {"patch": {
                        "sdk_summary": stored}}}], expected_version=view.version)
                return
            except VersionConflictError:
                continue

    @staticmethod
    def _summary(view: SessionState) -> SessionSummaryEntry | None:
        """The stored summary; its mtime the session's last write if the summary is that
        write, else just before it (so the SDK sees it is stale and reads the session)."""
        stored = view.metadata.get("sdk_summary")
        if not isinstance(stored, dict) or not isinstance(stored.get("data"), str):
            return None
        mtime = _ms(view.timestamps.updated_at)
        if stored.get("version") != view.version:
            mtime -= 1
        session_id = view.metadata.get("sdk_session_id", view.session_id)
        return {"session_id": session_id, "mtime": mtime, "data": json.loads(stored["data"])}

    # --- reading ------------------------------------------------------------------------

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        sid = await self._resolve(key)
        if sid is None:
            return None
        entries: list[SessionStoreEntry] = []
        try:
            version: int | None = await self._start(sid)
            while version is not None:
                page = await self.client.read_events(sid, from_version=version, limit=10_000)
                for event in page.events:
                    data = event.fields()
                    text = data.get(LINE_FIELD)
                    if isinstance(text, str) and LINE_CUT_FIELD not in data:
                        entries.append(json.loads(text))
                version = page.next
        except SessionNotFoundError:
            self._forget(key)
            return None
        return entries or None

    async def _states(self, namespace: str) -> list[SessionState]:
        views: list[SessionState] = []
        cursor = None
        while True:
            page = await self.client.call("session.states", rpc.SessionStatesResult,
                                          namespace=namespace, limit=_PAGE, cursor=cursor)
            views += page.states
            if page.next is None:
                return views
            cursor = page.next

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        return [{"session_id": v.metadata.get("sdk_session_id", v.session_id),
                 "mtime": _ms(v.timestamps.updated_at)}
                for v in await self._states(namespace_for(self.namespace, project_key))]

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        found = []
        for view in await self._states(namespace_for(self.namespace, project_key)):
            summary = self._summary(view)
            if summary is not None:
                found.append(summary)
        return found

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        views = await self._states(namespace_for(self.namespace, key["project_key"],
                                                 key["session_id"]))
        return sorted(v.metadata["subpath"] for v in views
                      if isinstance(v.metadata.get("subpath"), str))

    async def delete(self, key: SessionKey) -> None:
        keys = [key]
        if key.get("subpath") is None:
            keys += [{**key, "subpath": sub} for sub in await self.list_subkeys(
                {"project_key": key["project_key"], "session_id": key["session_id"]})]
        for k in keys[::-1]:  # the sub-agents first: a main never outlives them
            sid = await self._resolve(k)
            self._forget(k)
            if sid is not None:
                with contextlib.suppress(SessionNotFoundError):
                    await self.client.delete_session(sid)

    def close(self) -> None:
        """Close the connection (from any thread; the next call opens another)."""
        self.client.close()
