"""The Durable Streams protocol on sessions: PUT creates, POST appends (or closes), GET
reads and tails, HEAD describes, DELETE deletes (docs/http.md has the mapping).

Each operation is calls of the contract's methods (calls.py), so a stream write goes
through the writer with every check a socket write gets; the protocol's own rules
(closure, Stream-Seq, idempotent producers) are checked here under a per-stream lock,
and their state is read back from the session's events, never kept only in memory.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog

from sessiond_daemon.core.writer import Writer
from sessiond_daemon.features.forks import WALK_LIMIT
from sessiond_daemon.serve.web import codec, tails
from sessiond_daemon.serve.web.calls import DAEMON, Caller, Calls
from sessiond_daemon.serve.web.codec import HttpError
from sessiond_daemon.serve.web.context import context_reply
from sessiond_daemon.serve.web.expiry import Expiry, idle_ttl
from sessiond_schemas import streams
from sessiond_schemas.errors import InvalidTransitionError, SessiondError, SessionNotFoundError
from sessiond_schemas.events import TERMINAL_STATUSES

log = structlog.get_logger("sessiond.http")
MAX_READ_BYTES = 1 << 20  # a catch-up response's data, about (one larger chunk comes alone)
PAGE = 1000
MAX_SAFE = streams.MAX_SAFE  # producer epochs and sequence numbers
WRITER_STATES = 4096  # streams whose producer state is kept in memory (read back if evicted)
# A snapshot of a stream's producer state is written (metadata.stream.writers) once this
# many versions passed since the last: reading the state back reads at most about this
# many events, however long the history.
SNAPSHOT_EVERY = 1000


@dataclass(slots=True)
class Request:
    method: str
    name: str  # the stream's name: the session id
    query: list[tuple[str, str]]
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes
    caller: Caller
    mount: str  # the URL the request's path is under: scheme, host, "" or "/t/<token>"

    def param(self, name: str) -> str | None:
        values = [v for k, v in self.query if k == name]
        if len(values) > 1:
            raise HttpError(400, f"the query parameter {name} is given {len(values)} times")
        return values[0] if values else None

    def flag(self, name: str) -> bool:
        return self.headers.get(name, "").strip().lower() == "true"


@dataclass(slots=True)
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class StreamExpired(HttpError):
    """404: the stream is past its Stream-TTL or Stream-Expires-At (expiry.py), or the
    session's own TTL ended it. `generic`: a stream PUT made (a typed session is not)."""

    def __init__(self, message: str, *, generic: bool) -> None:
        super().__init__(404, message)
        self.generic = generic


@dataclass(slots=True)
class View:
    """What the protocol needs of a session's view."""

    session_id: str
    version: int
    content_type: str
    generic: bool  # a generic stream (stream.chunk events), not a typed session
    closed: bool
    ttl_s: int | None
    expires_at: str | None
    forked_from: tuple[str, int] | None
    fork: tuple[int, int] | None  # the (version, sub-offset) a PUT made it a fork at
    deleted: bool  # soft-deleted: DELETEd while it had forks
    writers: streams.Writers | None = None  # the last snapshot of its producer state

    @classmethod
    def of(cls, state: dict[str, Any]) -> View:
        meta = state.get("metadata") or {}
        try:  # checked where written (sessiond_schemas.streams); one stored before, not
            stream = streams.settings(meta.get(codec.META) or {})
        except msgspec.ValidationError:
            stream = streams.StreamSettings()  # a typed session's view: nothing to serve
        generic = state.get("source") == codec.SOURCE and stream.content_type is not None
        link = state.get("forked_from")
        return cls(
            session_id=state["session_id"], version=state["version"],
            content_type=stream.content_type if generic and stream.content_type
            else codec.JSON, generic=generic, closed=state["status"] in TERMINAL_STATUSES,
            ttl_s=stream.ttl_s if generic else None,
            expires_at=stream.expires_at if generic else None,
            forked_from=(link["session_id"], link["version"]) if link else None,
            fork=(stream.fork.offset, stream.fork.sub) if generic and stream.fork else None,
            deleted=stream.deleted is True, writers=stream.writers)

    def headers(self) -> dict[str, str]:
        h = {"content-type": self.content_type,
             "stream-next-offset": codec.offset(self.version)}
        if self.closed:
            h["stream-closed"] = "true"
        if self.ttl_s is not None:
            h["stream-ttl"] = str(self.ttl_s)
        if self.expires_at is not None:
            h["stream-expires-at"] = self.expires_at
        return h


@dataclass(slots=True)
class Page:
    items: list[bytes]  # chunks' bytes, or one JSON text per message
    next: int  # the version read up to
    at_tail: bool


@dataclass(slots=True)
class Producer:
    epoch: int
    seq: int
    closed_it: bool = False  # its (epoch, seq) is the append that closed the stream


@dataclass(slots=True)
class WriterState:
    """A stream's Stream-Seq and producers (by the hash of their id, the most recent
    last), read from its last snapshot and its events after it, up to `version`."""

    version: int = 0
    last_seq: str | None = None
    producers: dict[str, Producer] = field(default_factory=dict)
    snapshot_at: int = 0  # the version of the last snapshot written or read

    @classmethod
    def of(cls, snapshot: streams.Writers | None) -> WriterState:
        if snapshot is None:
            return cls()
        return cls(version=snapshot.version, last_seq=snapshot.last_seq, producers={
            h: Producer(epoch, seq, closed) for h, epoch, seq, closed in snapshot.producers},
            snapshot_at=snapshot.version)

    def snapshot(self) -> dict[str, Any]:
        """As metadata.stream.writers (the most recent MAX_PRODUCERS producers)."""
        kept = list(self.producers.items())[-streams.MAX_PRODUCERS:]
        return {"version": self.version, "last_seq": self.last_seq,
                "producers": [[h, p.epoch, p.seq, p.closed_it] for h, p in kept]}

    def saw(self, producer_hash: str, producer: Producer) -> None:
        self.producers.pop(producer_hash, None)  # to the end: the most recent
        self.producers[producer_hash] = producer


Sender = Callable[[bytes], Awaitable[None]]


class Streams:
    def __init__(self, calls: Calls, writer: Writer, *, long_poll_s: float,
                 sse_close_s: float, on_tail: Callable[[int], None] = lambda n: None) -> None:
        self.calls, self.writer = calls, writer
        self.on_tail = on_tail  # live tails count as subscriptions (daemon.stats, metrics)
        self._tails: set[anyio.CancelScope] = set()
        self.long_poll_s, self.sse_close_s = long_poll_s, sse_close_s
        self._locks: dict[str, tuple[anyio.Lock, int]] = {}
        self._writers: OrderedDict[str, WriterState] = OrderedDict()
        self.expiry = Expiry(calls)
        self.on_idle: Callable[[], None] = lambda: None  # an SSE tail's keep-alive

    # --- reading views and events -------------------------------------------------------

    async def view(self, sid: str, caller: Caller, *, gone_ok: bool = False,
                   touch: bool = False) -> View:
        """The stream's view; 404 if there is none or it has expired, 410 if it is
        soft-deleted (unless `gone_ok`: a fork reading the history it shares). `touch`: a
        read or a write, which restarts a Stream-TTL's countdown (a HEAD does not)."""
        try:
            state = await self.calls.call("session.get", {"session_id": sid}, caller)
        except SessionNotFoundError as exc:
            raise HttpError(404, f"no stream {sid}") from exc
        view = View.of(state)
        if view.deleted and not gone_ok:
            raise HttpError(410, f"stream {sid} was deleted; its forks still share its"
                            " history")
        if not gone_ok and self.expiry.expired(state, view):
            raise StreamExpired(f"no stream {sid}: it expired", generic=view.generic)
        if touch and await self.expiry.touch(state, view):
            view = View.of(await self.calls.call("session.get", {"session_id": sid}, caller))
        return view

    async def _after_mark(self, r: Request, given: str | None) -> View:
        """The view a live tail reads up to, taken after its tail's mark: a batch rings only
        once it has landed, after the mark if this view lacks it, so a tail that reads up
        to this view and then waits misses nothing. (A view may hold a batch not rung yet:
        the tail then wakes for what it has read already, and reads nothing more.) 400 if
        the offset is past its end (the stream was deleted and made again meanwhile)."""
        view = await self.view(r.name, r.caller)
        offset_within(given, view)
        return view

    async def _events(self, view: View, after: int, caller: Caller,
                      chain: list[View] | None = None) -> tuple[list[dict[str, Any]], bool]:
        """Events after version `after`, from the session of the fork chain that holds
        them; and whether more follow. `chain` is the view and its sources as far as they
        were looked up (a read's pages share it, so each source is looked up once a read,
        whatever the depth; at most forks.WALK_LIMIT of them: a chain written behind the
        daemon's back that goes round ends there)."""
        chain = chain if chain is not None else [view]
        while True:
            i, cut = 0, None
            while (link := chain[i].forked_from) is not None and after < link[1]:
                cut = link[1] if cut is None else min(cut, link[1])  # the nearest above
                if i + 1 == len(chain):
                    if len(chain) > WALK_LIMIT:
                        raise HttpError(500, f"the fork chain of {view.session_id} goes"
                                        " round (damaged: sessionctl verify names it)")
                    chain.append(await self.view(link[0], caller, gone_ok=True))
                i += 1
            page = await self.calls.call("events.read", {
                "session_id": chain[i].session_id, "from_version": after + 1,
                "limit": PAGE}, caller)
            events = page["events"]
            if cut is None:  # the session's own part
                return events, page["next"] is not None
            events = [e for e in events if e["version"] <= cut]
            if events:
                return events, True  # the fork's own part follows, at least
            after = cut  # nothing of the source's up to the fork point: on past it

    async def read(self, view: View, after: int, caller: Caller) -> Page:
        """The data after version `after`, up to about MAX_READ_BYTES, and never past
        `view.version`: the offsets a read gives are the view's, so the next request, whose
        view is at least as new, never finds its offset past the stream's end. (A commit
        that lands between the view's read and this one is left to the next read.)"""
        items: list[bytes] = []
        size, at, chain = 0, after, [view]
        while size < MAX_READ_BYTES and at < view.version:
            events, more = await self._events(view, at, caller, chain)
            for e in events:
                if e["version"] > view.version:
                    return Page(items, at, True)
                if view.generic:
                    item = (codec.chunk_bytes(e["data"]) if e["type"] == "stream.chunk"
                            else None)
                else:
                    item = codec.encode(e)
                if item is not None:
                    if items and size + len(item) > MAX_READ_BYTES:
                        return Page(items, at, False)
                    items.append(item)
                    size += len(item)
                at = e["version"]
            if not more:
                return Page(items, at, True)
        return Page(items, at, at >= view.version)

    def body(self, view: View, page: Page) -> bytes:
        if codec.is_json(view.content_type):
            return b"[" + b",".join(page.items) + b"]"
        return b"".join(page.items)

    @contextmanager
    def _tail(self) -> Iterator[None]:
        """A live wait: counted, and ended (not failed) by `stop` when the daemon stops."""
        scope = anyio.CancelScope()
        self._tails.add(scope)
        self.on_tail(1)
        try:
            with scope:
                yield
        finally:
            self._tails.discard(scope)
            self.on_tail(-1)

    def stop(self) -> None:
        """End every live tail now: a long poll answers 204, an SSE response ends (the
        client reconnects from its last offset, to another daemon or this one again)."""
        for scope in list(self._tails):
            scope.cancel()

    # --- the per-stream lock and writer state -----------------------------------------

    @asynccontextmanager
    async def _locked(self, sid: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(sid) or (anyio.Lock(), 0)
        self._locks[sid] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[sid]
            if users == 1:
                del self._locks[sid]
            else:
                self._locks[sid] = (lock, users - 1)

    async def _writer_state(self, view: View, caller: Caller) -> WriterState:
        """The stream's Stream-Seq and producers: what is cached, plus its events since
        (another host's writes included)."""
        ws = self._writers.pop(view.session_id, None)
        if ws is None or ws.version > view.version:  # not cached, or deleted and made again
            ws = WriterState.of(view.writers)
            if ws.version > view.version:
                ws = WriterState()
        while ws.version < view.version:
            params = {"session_id": view.session_id, "from_version": ws.version + 1,
                      "limit": PAGE}
            page = await self.calls.call("events.read", params, caller)
            for e in page["events"]:
                _note(ws, e, closing=e["type"] == "session.status_changed")
            if not page["events"]:
                break  # a fork: its versions start past the source's
            ws.version = page["events"][-1]["version"]
        ws.version = max(ws.version, view.version)
        self._writers[view.session_id] = ws
        while len(self._writers) > WRITER_STATES:
            self._writers.popitem(last=False)
        return ws

    # --- operations -------------------------------------------------------------------

    async def head(self, r: Request) -> Reply:
        view = await self.view(r.name, r.caller)
        return Reply(200, {**view.headers(), "cache-control": "no-store"})

    async def get(self, r: Request) -> Reply:
        if r.param("context") is not None:  # sessiond's extension: the context read
            return Reply(200, *await context_reply(self, r))
        live = r.param("live")
        if live not in (None, "long-poll", "sse"):
            raise HttpError(400, f"live must be long-poll or sse, not {live[:20]!r}")
        given = r.param("offset")
        if live is not None and given is None:
            raise HttpError(400, f"live={live} needs an offset (-1 for the start, now)")
        view = await self.view(r.name, r.caller, touch=True)
        after = offset_within(given, view)
        async with AsyncExitStack() as watching:
            tail: tails.Tail | None = None
            if live == "long-poll":  # a follower of the stream's bells from here on
                tail = await watching.enter_async_context(
                    tails.following(self.writer, r.name))
                view = await self._after_mark(r, given)
            page = await self.read(view, after, r.caller)
            if tail is not None and not page.items and not view.closed:
                woken = False
                with self._tail():
                    woken = await tail.wait(self.long_poll_s)
                if woken:
                    view = await self._after_mark(r, given)
                    page = await self.read(view, after, r.caller)
                if not page.items:
                    view = await self.view(r.name, r.caller)
        headers = {"content-type": view.content_type,
                   "stream-next-offset": codec.offset(page.next), "cache-control": "no-store"}
        # Of the view in hand (after a wait, newer than the one read up to).
        at_end = page.at_tail and page.next >= view.version
        closed = view.closed and at_end
        if at_end:
            headers["stream-up-to-date"] = "true"
        if closed:
            headers["stream-closed"] = "true"
        if live is not None and not closed:
            headers["stream-cursor"] = codec.cursor(r.param("cursor"))
        if live == "long-poll" and not page.items:
            return Reply(204, headers)
        etag = f'"{r.name}:{codec.offset(after)}:{codec.offset(page.next)}' + (
            ':c"' if closed else '"')
        headers["etag"] = etag
        if r.headers.get("if-none-match") == etag:
            return Reply(304, headers)
        return Reply(200, headers, self.body(view, page))

    async def put(self, r: Request) -> Reply:
        ttl_s, expires_at = codec.check_ttl(r.headers.get("stream-ttl"),
                                            r.headers.get("stream-expires-at"))
        source_path = r.headers.get("stream-forked-from")
        if source_path is None and ("stream-fork-offset" in r.headers
                                    or "stream-fork-sub-offset" in r.headers):
            raise HttpError(400, "Stream-Fork-Offset and Stream-Fork-Sub-Offset need"
                            " Stream-Forked-From")
        sub_text = r.headers.get("stream-fork-sub-offset", "0").strip()
        if not sub_text.isdigit() or len(sub_text) > 18:
            raise HttpError(400, f"Stream-Fork-Sub-Offset must be a whole number: {sub_text!r}")
        sub = int(sub_text)
        close = r.flag("stream-closed")
        given_type = r.headers.get("content-type")
        async with self._locked(r.name):
            try:
                existing = await self.view(r.name, r.caller)
            except HttpError as exc:
                if exc.status == 410:
                    raise HttpError(409, f"stream {r.name} was deleted (its forks share its"
                                    " history): the name is not free yet") from exc
                existing = None
                if isinstance(exc, StreamExpired):
                    if not exc.generic:  # a session's history is retention's to remove
                        raise HttpError(409, f"session {r.name} exists (ended by its TTL;"
                                        " its history is kept until retention removes it):"
                                        " the name is not free") from exc
                    # A stream past its Stream-TTL or Expires-At: its name is free again.
                    await self.calls.call("session.delete", {"session_id": r.name},
                                          r.caller)
                    self.expiry.forget(r.name)
            if existing is not None:
                wanted_source = (source_path.rstrip("/").rsplit("/", 1)[-1]
                                 if source_path is not None else None)
                same = (existing.generic
                        and (existing.forked_from or (None,))[0] == wanted_source
                        and codec.media_type(given_type or existing.content_type)
                        == codec.media_type(existing.content_type)
                        and existing.ttl_s == ttl_s and existing.expires_at == expires_at
                        and existing.closed == close
                        and (source_path is None or _same_fork(existing, r, sub)))
                if not same:
                    raise HttpError(409, f"stream {r.name} exists with another configuration"
                                    " (content type, TTL, expiry or closure)")
                return Reply(200, existing.headers())
            if source_path is not None:
                view = await self._fork(r, source_path, given_type, ttl_s, expires_at, sub)
            else:
                content_type = codec.check_content_type(given_type or codec.OCTETS)
                events = codec.chunk_events(content_type, r.body, seq=None, creating=True)
                if close:
                    events.append(_closing())
                stream = {"content_type": content_type, "ttl_s": ttl_s,
                          "expires_at": expires_at}
                ttl = idle_ttl(ttl_s, expires_at)
                state = await self.calls.call("session.create", {
                    "session_id": r.name, "source": codec.SOURCE, "events": events,
                    "ttl_s": ttl, "metadata": {codec.META: {k: v for k, v in stream.items()
                                                            if v is not None}}}, r.caller)
                if ttl is None and state.get("ttl_s") is not None:
                    # A namespace's default_ttl_s would end a stream that has no TTL of
                    # its own, and that reads would never renew: a stream has none.
                    state = await self.calls.call("session.set_ttl", {
                        "session_id": r.name, "ttl_s": None}, DAEMON)
                view = View.of(state)
        return Reply(201, {**view.headers(), "location": f"{r.mount}/v1/stream/{r.name}"})

    async def _fork(self, r: Request, source_path: str, given_type: str | None,
                    ttl_s: int | None, expires_at: str | None, sub: int) -> View:
        """session.fork at the offset; a sub-offset's part of the next append is copied
        into the fork as its first chunk (the rest of the history is shared, not copied)."""
        source_name = source_path.rstrip("/").rsplit("/", 1)[-1]
        try:
            source = await self.view(codec.session_id(source_name), r.caller)
        except HttpError as exc:
            if exc.status == 410:
                raise HttpError(409, f"the source {source_name} was deleted") from exc
            raise HttpError(404, f"no source stream {source_path[:200]}") from exc
        if given_type and codec.media_type(given_type) != codec.media_type(source.content_type):
            raise HttpError(409, f"a fork has its source's content type {source.content_type}")
        at = codec.parse_offset(r.headers.get("stream-fork-offset"), source.version)
        if at > source.version:
            raise HttpError(400, "Stream-Fork-Offset is past the source's end")
        at = max(1, at) if "stream-fork-offset" in r.headers else source.version
        prefix = await self._sub_offset(source, at, sub, r.caller) if sub else []
        state = await self.calls.call("session.fork", {
            "session_id": source.session_id, "at_version": at, "new_session_id": r.name},
            r.caller)
        view = View.of(state)
        events = prefix + codec.chunk_events(view.content_type, r.body, seq=None,
                                             creating=True)
        # The fork's own expiry (section 4.2), and where it branched (a PUT compares it):
        # the face's bookkeeping, written as the daemon (calls.DAEMON).
        stream: dict[str, Any] = {"fork": {"offset": at, "sub": sub}}
        if ttl_s is not None or expires_at is not None:
            stream |= {"ttl_s": ttl_s, "expires_at": expires_at}
        await self.calls.call("events.append", {"session_id": r.name, "events": [
            {"type": "metadata.updated", "data": {"patch": {codec.META: stream}}}]}, DAEMON)
        if view.closed or r.flag("stream-closed"):
            # A fork starts open (section 4.2): an ended source's status is reopened.
            events = ([{"type": "session.status_changed", "data": {"to": "active"}}]
                      if view.closed else []) + events
            if r.flag("stream-closed"):
                events.append(_closing())
        if events:
            await self.calls.call("events.append", {"session_id": r.name, "events": events},
                                  r.caller)
            view = await self.view(r.name, r.caller)
        ttl = idle_ttl(ttl_s, expires_at)
        if ttl is not None:  # the fork's own, in place of the one its view inherited
            await self.calls.call("session.set_ttl", {"session_id": r.name, "ttl_s": ttl},
                                  DAEMON)
            view = await self.view(r.name, r.caller)
        return view

    async def _sub_offset(self, source: View, at: int, sub: int,
                          caller: Caller) -> list[dict[str, Any]]:
        """The chunks a fork at (`at`, `sub`) inherits past `at`: the first `sub` bytes of
        the next chunk, or the first `sub` messages of a JSON stream's next append."""
        events, _ = await self._events(source, at, caller)
        chunks = [e for e in events if e["type"] == "stream.chunk"]
        if not chunks:
            raise HttpError(400, "Stream-Fork-Sub-Offset is past the source's end")
        if codec.is_json(source.content_type):
            batch = [c for c in chunks if c["recorded_at"] == chunks[0]["recorded_at"]]
            if sub > len(batch):
                raise HttpError(400, f"Stream-Fork-Sub-Offset {sub} is past the next append"
                                f" ({len(batch)} messages)")
            return [{"type": "stream.chunk", "data": {"text": c["data"]["text"]}}
                    for c in batch[:sub]]
        data = codec.chunk_bytes(chunks[0]["data"])
        if sub > len(data):
            raise HttpError(400, f"Stream-Fork-Sub-Offset {sub} is past the next append"
                            f" ({len(data)} bytes)")
        return codec.chunk_events(source.content_type, data[:sub], seq=None, creating=True)

    async def post(self, r: Request) -> Reply:
        producer = _producer_headers(r.headers)
        close = r.flag("stream-closed")
        if not r.body and not close:
            raise HttpError(400, "an append needs a body (or Stream-Closed: true to close)")
        async with self._locked(r.name):
            view = await self.view(r.name, r.caller, touch=True)
            ws = await self._writer_state(view, r.caller)
            closed_headers = {"stream-closed": "true",
                              "stream-next-offset": codec.offset(view.version)}
            if view.closed:
                if producer is not None:
                    known = ws.producers.get(_hash(producer[0]))
                    if known and known.closed_it and (known.epoch, known.seq) == producer[1:]:
                        return Reply(204, {**closed_headers, **_echo(producer)})
                if close and not r.body:
                    return Reply(204, closed_headers)
                raise HttpError(409, f"stream {r.name} is closed", closed_headers)
            if r.body:
                if "content-type" not in r.headers:
                    raise HttpError(400, "an append with a body needs a Content-Type")
                if codec.media_type(r.headers["content-type"]) != codec.media_type(
                        view.content_type):
                    raise HttpError(409, f"stream {r.name} holds {view.content_type}, not"
                                    f" {r.headers['content-type'][:80]}")
            if producer is not None:
                highest = _check_producer(ws, producer)
                if highest is not None:  # a duplicate: written before, nothing to do
                    return Reply(204, {"stream-next-offset": codec.offset(view.version),
                                       "producer-epoch": str(producer[1]),
                                       "producer-seq": str(highest)})
            seq = r.headers.get("stream-seq")
            if seq is not None:
                if not view.generic:
                    raise HttpError(400, "Stream-Seq is for generic streams; a typed session"
                                    " orders its writes by version")
                if ws.last_seq is not None and seq <= ws.last_seq:
                    raise HttpError(409, f"Stream-Seq {seq[:80]!r} does not sort after the"
                                    f" last one, {ws.last_seq[:80]!r}")
            if not r.body:
                events = []
            elif view.generic:
                events = codec.chunk_events(view.content_type, r.body, seq=seq,
                                            creating=False)
            else:
                events = codec.typed_events(r.body)
            if close:
                events.append(_closing())
            params: dict[str, Any] = {"session_id": r.name, "events": events,
                                      "expected_version": view.version}
            if producer is not None:
                params["idempotency_key"] = _key(producer)
            result = await self.calls.call("events.append", params, r.caller)
            ws.version = result["version"]
            if seq is not None:
                ws.last_seq = seq
            headers = {"stream-next-offset": codec.offset(result["version"])}
            if close:
                headers["stream-closed"] = "true"
            if producer is not None:
                pid, epoch, pseq = producer
                ws.saw(_hash(pid), Producer(epoch, pseq, closed_it=close))
            if ws.version - ws.snapshot_at >= SNAPSHOT_EVERY:
                await self._snapshot(r.name, ws)
            if producer is not None:
                return Reply(200 if r.body else 204, {**headers, **_echo(producer)})
            return Reply(204, headers)

    async def _snapshot(self, sid: str, ws: WriterState) -> None:
        """Write the producer state as of `ws.version` into the stream's settings (as the
        daemon: the face's bookkeeping). The append it follows is written: a failure here
        is logged, and the next append tries again."""
        try:
            await self.calls.call("events.append", {"session_id": sid, "events": [
                {"type": "metadata.updated",
                 "data": {"patch": {codec.META: {"writers": ws.snapshot()}}}}]}, DAEMON)
        except SessiondError as exc:
            log.warning("http.producer_snapshot_failed", session_id=sid, code=exc.code)
            return
        ws.snapshot_at = ws.version

    async def delete(self, r: Request) -> Reply:
        """session.delete; a stream with forks is soft-deleted instead (section 5.4: 410
        from then on, its history kept for the forks) and deleted with its last fork."""
        async with self._locked(r.name):
            view = await self.view(r.name, r.caller)
            try:
                await self.calls.call("session.delete", {"session_id": r.name}, r.caller)
            except InvalidTransitionError:  # -32003: it has forks
                await self.calls.call("events.append", {"session_id": r.name, "events": [
                    {"type": "metadata.updated",
                     "data": {"patch": {codec.META: {"deleted": True}}}}]}, DAEMON)
                return Reply(204)
            self._writers.pop(r.name, None)
        while view.forked_from is not None:  # collect soft-deleted sources left forkless
            try:
                view = await self.view(view.forked_from[0], r.caller, gone_ok=True)
                if not view.deleted:
                    break
                await self.calls.call("session.delete", {"session_id": view.session_id},
                                      r.caller)
            except (HttpError, InvalidTransitionError):  # gone already, or other forks left
                break
        return Reply(204)

    # --- SSE ------------------------------------------------------------------------

    async def sse(self, r: Request, send: Sender) -> None:
        """Send the stream as Server-Sent Events from the offset, then follow it until it
        closes or sse_close_s passes (the client reconnects from the last control event)."""
        given = r.param("offset")
        view = await self.view(r.name, r.caller, touch=True)
        after = offset_within(given, view)
        binary = codec.sse_base64(view.content_type)
        async with tails.following(self.writer, r.name) as tail:
            view = await self._after_mark(r, given)
            with self._tail(), anyio.move_on_after(self.sse_close_s):
                while True:
                    after, at_tail, closed = await self._sse_send(r, send, view, after,
                                                                  binary)
                    if closed:
                        return
                    if at_tail:
                        # Waiting holds the offset and nothing of what was sent or rung.
                        while not await tail.wait(15.0):
                            await send(b": keep-alive\n\n")  # finds a client gone away
                            self.on_idle()  # a rotated token ends this tail (face.py)
                    tail.mark()
                    view = await self._after_mark(r, codec.offset(after))

    async def _sse_send(self, r: Request, send: Sender, view: View, after: int,
                        binary: bool) -> tuple[int, bool, bool]:
        """Send the data after `after` (a page), with its control event; return the offset
        sent up to, whether that is the stream's end, and whether the stream is closed
        there."""
        page = await self.read(view, after, r.caller)
        # The data and its control event in one write: a reader never sees one without
        # the other.
        data = _sse("data", self._sse_data(view, page, binary)) if page.items else b""
        closed = view.closed and page.at_tail
        control: dict[str, Any] = {"streamNextOffset": codec.offset(page.next)}
        if closed:
            control |= {"streamClosed": True, "upToDate": True}
        else:
            control["streamCursor"] = codec.cursor(r.param("cursor"))
            if page.at_tail:
                control["upToDate"] = True
        await send(data + _sse("control", codec.encode(control).decode()))
        return page.next, page.at_tail, closed

    def _sse_data(self, view: View, page: Page, binary: bool) -> str:
        if binary:
            import base64

            return base64.b64encode(b"".join(page.items)).decode()
        return self.body(view, page).decode("utf-8", errors="replace")


def offset_within(given: str | None, view: View) -> int:
    """The version an offset names; 400 if it is past the end of `view`."""
    after = codec.parse_offset(given, view.version)
    if after > view.version:
        raise HttpError(400, f"offset {given} is past the stream's end"
                        f" {codec.offset(view.version)}")
    return after


def _same_fork(existing: View, r: Request, sub: int) -> bool:
    """A PUT of a fork that exists: the same offset and sub-offset as it was made with."""
    if existing.fork is None:
        return False
    given = r.headers.get("stream-fork-offset")
    offset_ok = given is None or max(1, codec.parse_offset(given, 0)) == existing.fork[0]
    return offset_ok and sub == existing.fork[1]


def _sse(event: str, data: str) -> bytes:
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return (f"event: {event}\n" + "".join(f"data:{line}\n" for line in lines) + "\n").encode()


def _closing() -> dict[str, Any]:
    return {"type": "session.status_changed",
            "data": {"to": "completed", "reason": "stream closed"}}


# --- idempotent producers (section 5.2.1) -------------------------------------------------
# A producer's append is written with idempotency_key "ds:<epoch>:<seq>:<hash of its id>",
# so a retry after a crash finds the stored result, and the state below is read back from
# the events' keys after a restart or on another host.


def _hash(producer_id: str) -> str:
    return hashlib.sha256(producer_id.encode()).hexdigest()[:32]


def _key(producer: tuple[str, int, int]) -> str:
    pid, epoch, seq = producer
    return f"ds:{epoch}:{seq}:{_hash(pid)}"


def _note(ws: WriterState, event: dict[str, Any], *, closing: bool) -> None:
    if event["type"] == "stream.chunk" and event["data"].get("seq") is not None:
        ws.last_seq = event["data"]["seq"]
    key = (event.get("meta") or {}).get("idempotency_key") or ""
    parts = key.split(":")
    if len(parts) == 4 and parts[0] == "ds" and parts[1].isdigit() and parts[2].isdigit():
        epoch, seq = int(parts[1]), int(parts[2])
        known = ws.producers.get(parts[3])
        if known is None or (epoch, seq) >= (known.epoch, known.seq):
            ws.saw(parts[3], Producer(epoch, seq, closed_it=closing))


def _producer_headers(headers: dict[str, str]) -> tuple[str, int, int] | None:
    given = [h in headers for h in ("producer-id", "producer-epoch", "producer-seq")]
    if not any(given):
        return None
    if not all(given):
        raise HttpError(400, "Producer-Id, Producer-Epoch and Producer-Seq go together")
    pid = headers["producer-id"]
    if not pid.strip():
        raise HttpError(400, "Producer-Id must not be empty")
    numbers = []
    for name in ("producer-epoch", "producer-seq"):
        text = headers[name].strip()
        if not text.isdigit() or int(text) > MAX_SAFE:
            raise HttpError(400, f"{name} must be an integer from 0 to 2^53-1: {text[:30]!r}")
        numbers.append(int(text))
    return pid, numbers[0], numbers[1]


def _check_producer(ws: WriterState, producer: tuple[str, int, int]) -> int | None:
    """Refuse a stale epoch (403) or a gap (409); for a duplicate (already written), the
    highest sequence number accepted in its epoch; None for a new append."""
    pid, epoch, seq = producer
    known = ws.producers.get(_hash(pid))
    if known is None or epoch > known.epoch:
        if seq != 0:
            raise HttpError(400, f"a new producer epoch starts at Producer-Seq 0, not {seq}")
        return None
    if epoch < known.epoch:
        raise HttpError(403, f"producer epoch {epoch} is stale; the current one is"
                        f" {known.epoch}", {"producer-epoch": str(known.epoch)})
    if seq <= known.seq:
        return known.seq
    if seq > known.seq + 1:
        raise HttpError(409, f"Producer-Seq {seq} leaves a gap: expected {known.seq + 1}",
                        {"producer-expected-seq": str(known.seq + 1),
                         "producer-received-seq": str(seq)})
    return None


def _echo(producer: tuple[str, int, int]) -> dict[str, str]:
    return {"producer-epoch": str(producer[1]), "producer-seq": str(producer[2])}


def as_http(exc: SessiondError) -> HttpError:
    return codec.from_rpc(exc)
