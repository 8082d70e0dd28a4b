"""LangGraph: `SessiondStore`, a `BaseStore` (long-term memory) whose items are sessiond sessions.

    from sessiond.integrations.langgraph_store import SessiondStore

    graph = builder.compile(checkpointer=SessiondSaver(), store=SessiondStore())

One item is one session (its id a hash of the namespace and key; its sessiond namespace
`lgstore:` and the item's namespace labels, escaped, each ended by `/`): each `put` appends
the value as a message (its JSON text, so full-text search finds it), so an item's
versions are its history, exported, verified and watchable like any session; `delete`
deletes the session. `get` is one `session.get`: the value is the last message. Each
namespace also has a small directory session (`lgstore-ns:`), so `list_namespaces` reads
one session per namespace, never every item. `search(query=...)` is `session.search`;
on a daemon without a search index (an older one on PostgreSQL) it falls back to
matching the words of the query in the client, over at most `FALLBACK_SCAN` items of
the namespace. With
LangGraph's `index` config, a put also keeps the item's vectors (its session's memory)
and `search(query=...)` ranks by them, as InMemoryStore.

TTL (LangGraph's TTLConfig, in minutes) is kept with the item (`expires_at` in the
session's metadata), honoured on every read, refreshed by reads when `refresh_on_read`,
and enforced by `sweep_ttl()` / `start_ttl_sweeper()`, which delete expired items.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import hashlib
import json
import threading
import time
from array import array
from collections.abc import AsyncIterator, Coroutine, Iterable
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import quote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
)

from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    SessiondError,
    SessionExistsError,
    SessionNotFoundError,
    StorageError,
    VersionConflictError,
)
from sessiond_schemas.state import SessionState

from . import _search_query
from ._loop import LoopClient, sized
from ._store_rules import (
    check_labels,
    cosine,
    json_default,
    matches,
    namespace_matches,
    query_words,
)

T = TypeVar("T")

ITEMS = "lgstore:"  # the sessiond namespace of items starts with it
DIRECTORY = "lgstore-ns:"  # ... and of the sessions that list the namespaces
FALLBACK_SCAN = 10_000  # items a query reads at most where there is no search index
_PAGE = 1000
_SEARCH_PAGE = 100  # session.search's largest page
_CONCURRENT = 32  # requests in flight at once for one operation
_REFRESH_SLACK = 0.01  # a read moves expires_at only when it would move by 1% of the TTL
_now = time.time  # the clock of expiry (a test moves it)


def namespace_text(labels: Iterable[str]) -> str:
    """Labels as sessiond namespace text: each escaped and ended by "/", so a prefix of the
    text is a prefix of the labels and no two namespaces collide."""
    return "".join(quote(label, safe="") + "/" for label in labels)


def item_session_id(namespace: tuple[str, ...], key: str) -> str:
    digest = hashlib.sha256(json.dumps([list(namespace), key]).encode()).hexdigest()
    return "lgs-" + digest[:40]


def _directory_id(namespace: tuple[str, ...]) -> str:
    return "lgn-" + hashlib.sha256(json.dumps(list(namespace)).encode()).hexdigest()[:40]


def _prefix_tag(labels: tuple[str, ...]) -> str:
    """A search token for "in this namespace or below": one word, letters and digits."""
    return "lgp" + hashlib.sha256(json.dumps(list(labels)).encode()).hexdigest()[:24]


# --- items as sessions ----------------------------------------------------------------


def _item_meta(view: SessionState) -> dict[str, Any]:
    meta: dict[str, Any] = view.metadata.get("lgstore") or {}
    return meta


def _expired(view: SessionState, now: float) -> bool:
    expires_at = _item_meta(view).get("expires_at")
    return expires_at is not None and expires_at <= now


def _fields(view: SessionState) -> dict[str, Any]:
    meta, last = _item_meta(view), view.last_message
    assert last is not None
    return {"namespace": tuple(meta["namespace"]), "key": meta["key"],
            "value": json.loads(last.content),
            "created_at": datetime.fromisoformat(view.timestamps.created_at),
            "updated_at": datetime.fromisoformat(last.timestamp)}


def _item(view: SessionState) -> Item:
    return Item(**_fields(view))


def _search_item(view: SessionState, score: float | None) -> SearchItem:
    return SearchItem(**_fields(view), score=score)


class SessiondStore(BaseStore):
    """A LangGraph store in sessiond (`socket`: the daemon's, by default); `ttl`: LangGraph's
    TTLConfig (minutes); `index`: LangGraph's IndexConfig, for vector search (without it,
    `search(query=...)` is full-text search)."""

    supports_ttl = True

    def __init__(self, socket: str | None = None, *, ttl: TTLConfig | None = None,
                 index: IndexConfig | None = None) -> None:
        self.ttl_config = ttl
        self.index_config = index
        self.embeddings = ensure_embeddings(index.get("embed")) if index else None
        self._fields = [(f, f if f == "$" else tokenize_path(f))
                        for f in (index or {}).get("fields") or ["$"]]
        self.socket = socket
        self.aclient = LoopClient(socket)  # the caller's event loop
        self._client = LoopClient(socket)  # the sync methods' loop, on a thread of its own
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start = threading.Lock()
        self._sweeper: concurrent.futures.Future[None] | None = None

    # --- the sync side: the same coroutines on a private loop --------------------------

    def _run(self, make: Coroutine[Any, Any, T]) -> T:
        with self._start:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, daemon=True,
                                          name="sessiond-store")
                thread.start()
                self._loop, self._thread = loop, thread
        return asyncio.run_coroutine_threadsafe(make, self._loop).result()

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return self._run(self._batch(self._client, list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await self._batch(self.aclient, list(ops))

    def close(self) -> None:
        """Stop the sweeper and close the connections (the next call opens new ones)."""
        self.stop_ttl_sweeper()
        self.aclient.close()
        with self._start:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            async def closed() -> None:
                self._client.close()
                await asyncio.sleep(0)  # the transport closes on the next turn of the loop

            asyncio.run_coroutine_threadsafe(closed(), loop).result()
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    async def aclose(self) -> None:
        self.close()

    def __enter__(self) -> SessiondStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> SessiondStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    # --- one batch ---------------------------------------------------------------------

    async def _batch(self, client: LoopClient, ops: list[Op]) -> list[Result]:
        """As LangGraph's stores: reads see the store as it was before the batch; its puts
        apply after them, the last one per item winning."""
        for op in ops:
            check_labels(op)
        gate = asyncio.Semaphore(_CONCURRENT)
        results: list[Result] = [None] * len(ops)
        puts: dict[tuple[tuple[str, ...], str], PutOp] = {}

        async def read(i: int, op: Op) -> None:
            if isinstance(op, GetOp):
                async with gate:
                    results[i] = await self._get(client, op)
            elif isinstance(op, SearchOp):  # these take the gate per request they make
                results[i] = await self._search(client, op, gate)
            elif isinstance(op, ListNamespacesOp):
                results[i] = await self._list_namespaces(client, op)

        reads = []
        for i, op in enumerate(ops):
            if isinstance(op, PutOp):
                puts[(tuple(op.namespace), op.key)] = op
            elif isinstance(op, (GetOp, SearchOp, ListNamespacesOp)):
                reads.append(read(i, op))
            else:
                raise ValueError(f"Unknown operation type: {type(op)}")
        await asyncio.gather(*reads)

        # Every value encoded before any is written: one that is not JSON fails the batch
        # with nothing stored.
        contents = {item: json.dumps(dict(op.value), ensure_ascii=False,
                                     default=json_default)
                    for item, op in puts.items() if op.value is not None}
        vectors = await self._embed(list(puts.values()))

        async def write(item: tuple[tuple[str, ...], str], op: PutOp) -> None:
            async with gate:
                await self._put(client, op, contents.get(item), vectors.get(item))

        await asyncio.gather(*(write(item, op) for item, op in puts.items()))
        return results

    # --- vectors (with an `index` config) ----------------------------------------------

    async def _embed(self, puts: list[PutOp]) -> dict[tuple[tuple[str, ...], str],
                                                     dict[str, str]]:
        """Each put item's vectors ({field path: base64 of float64s}), embedded in one call
        as InMemoryStore does: the index's fields, or the put's own `index` list."""
        if self.embeddings is None:
            return {}
        wanted: list[tuple[tuple[tuple[str, ...], str], str, str]] = []
        found: dict[tuple[tuple[str, ...], str], dict[str, str]] = {}
        for op in puts:
            if op.value is None:
                continue
            item = (tuple(op.namespace), op.key)
            found[item] = {}
            if op.index is False:
                continue
            paths = self._fields if op.index is None else [
                (f, tokenize_path(f)) for f in op.index]
            for path, tokens in paths:
                texts = get_text_at_path(op.value, tokens)
                for i, text in enumerate(texts):
                    wanted.append((item, f"{path}.{i}" if len(texts) > 1 else path, text))
        if wanted:
            embedded = await self.embeddings.aembed_documents([t for _, _, t in wanted])
            for (item, path, _), vector in zip(wanted, embedded, strict=True):
                found[item][path] = base64.b64encode(array("d", vector).tobytes()).decode()
        return found

    # --- get ---------------------------------------------------------------------------

    async def _view(self, client: LoopClient, namespace: tuple[str, ...],
                    key: str) -> SessionState | None:
        try:
            view = await client.get_session(item_session_id(namespace, key))
        except SessionNotFoundError:
            return None
        return view if view.last_message is not None else None

    async def _get(self, client: LoopClient, op: GetOp) -> Item | None:
        view = await self._view(client, tuple(op.namespace), op.key)
        if view is None or _expired(view, _now()):
            return None
        if op.refresh_ttl:
            await self._refresh(client, view)
        return _item(view)

    async def _refresh(self, client: LoopClient, view: SessionState) -> None:
        """Move the item's expiry to now + its TTL (a metadata.updated event), unless that
        moves it by less than 1% of the TTL: a hot item costs at most 100 events per TTL."""
        meta = _item_meta(view)
        ttl = meta.get("ttl")
        if ttl is None:
            return
        expires_at = _now() + ttl * 60
        if expires_at - (meta.get("expires_at") or 0) < ttl * 60 * _REFRESH_SLACK:
            return
        with contextlib.suppress(SessionNotFoundError):  # deleted meanwhile: nothing to keep
            await client.append_events(view.session_id, [{"type": "metadata.updated", "data": {
                "patch": {"lgstore": {"expires_at": expires_at}}}}])

    # --- put and delete ----------------------------------------------------------------

    async def _put(self, client: LoopClient, op: PutOp, content: str | None,
                   vectors: dict[str, str] | None) -> None:
        namespace = tuple(op.namespace)
        sid = item_session_id(namespace, op.key)
        if content is None:
            with contextlib.suppress(SessionNotFoundError):
                await client.delete_session(sid)
                await self._collect(client, namespace)
            return
        tags = [_prefix_tag(namespace[:n]) for n in range(len(namespace) + 1)]
        message = {"role": "system", "content": content, "metadata": {"lgstore": tags}}
        expiry = {"ttl": op.ttl,
                  "expires_at": None if op.ttl is None else _now() + op.ttl * 60}
        events = [{"type": "message.appended", "data": message},
                  {"type": "metadata.updated", "data": {"patch": {"lgstore": expiry}}}]
        if vectors is not None:  # beside the item, in its memory (not in the search index)
            events += [{"type": "memory.updated", "data": {"patch": {"vectors": None}}},
                       {"type": "memory.updated", "data": {"patch": {"vectors": vectors}}}]
        with sized():
            for _ in range(3):  # an item made or deleted by another writer meanwhile
                try:
                    await client.append_events(sid, events)
                    return
                except SessionNotFoundError:
                    pass
                try:
                    await client.create_session(
                        sid, namespace=ITEMS + namespace_text(namespace),
                        source="langgraph-store", events=[events[0], *events[2:]],
                        metadata={"lgstore": {"namespace": list(namespace), "key": op.key,
                                              **expiry}})
                except SessionExistsError:
                    continue
                await self._touch(client, namespace)
                return
        raise RuntimeError(f"the item {namespace}/{op.key} kept changing under the put")

    # The directory: a session per namespace that holds items. A new item touches its
    # namespace's directory session (after the item exists); a delete that leaves the
    # namespace empty deletes it at the version read before looking, so a touch in between
    # (a new item) keeps it.

    async def _touch(self, client: LoopClient, namespace: tuple[str, ...]) -> None:
        did = _directory_id(namespace)
        touch = [{"type": "metadata.updated", "data": {"patch": {"lgstore": {
            "touched": _now()}}}}]
        for _ in range(3):
            try:
                await client.append_events(did, touch)
                return
            except SessionNotFoundError:
                pass
            try:
                await client.create_session(
                    did, namespace=DIRECTORY + namespace_text(namespace),
                    source="langgraph-store",
                    metadata={"lgstore": {"namespace": list(namespace)}})
                return
            except SessionExistsError:
                continue
        raise RuntimeError(f"the directory of {namespace} kept changing under a put")

    async def _collect(self, client: LoopClient, namespace: tuple[str, ...]) -> None:
        """Delete the namespace's directory session if the namespace holds no item."""
        did = _directory_id(namespace)
        try:
            directory = await client.get_session(did)
        except SessionNotFoundError:
            return
        if (await self._pages(client, ITEMS + namespace_text(namespace), False, None,
                              1)).states:
            return
        with contextlib.suppress(SessionNotFoundError, VersionConflictError):
            await client.delete_session(did, expected_version=directory.version)

    # --- search ------------------------------------------------------------------------

    async def _pages(self, client: LoopClient, namespace: str, prefix: bool,
                     cursor: str | None, limit: int = _PAGE) -> rpc.SessionStatesResult:
        page: rpc.SessionStatesResult = await client.call(
            "session.states", rpc.SessionStatesResult, namespace=namespace, prefix=prefix,
            limit=limit, cursor=cursor)
        return page

    async def _search(self, client: LoopClient, op: SearchOp,
                      gate: asyncio.Semaphore) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        wanted = max(op.offset, 0) + max(op.limit, 0)
        words = query_words(op.query) if op.query else []
        if not wanted:
            return []
        found: list[tuple[SessionState, float | None]]
        if op.query and self.embeddings is not None:
            found = await self._nearest(client, prefix, op)  # the page itself
        else:
            if words:
                try:
                    found = await self._full_text(client, prefix, words, op.filter, wanted,
                                                  gate)
                except StorageError as exc:
                    if exc.data.get("detail") != "no search index":
                        raise
                    found = await self._scan_for_words(client, prefix, words, op.filter,
                                                       wanted)
            else:
                found = await self._scan(client, prefix, op.filter, wanted)
            found = found[op.offset:op.offset + op.limit]
        if op.refresh_ttl:
            async def refresh(view: SessionState) -> None:
                async with gate:
                    await self._refresh(client, view)
            await asyncio.gather(*(refresh(view) for view, _ in found))
        return [_search_item(view, score) for view, score in found]

    async def _scan(self, client: LoopClient, prefix: tuple[str, ...],
                    filter: dict[str, Any] | None,
                    wanted: int) -> list[tuple[SessionState, float | None]]:
        """Items under the prefix that pass the filter, a page at a time, in a stable order
        (by session id), until `wanted` are found."""
        found: list[tuple[SessionState, float | None]] = []
        cursor, now, size = None, _now(), min(_PAGE, wanted)
        while True:
            page = await self._pages(client, ITEMS + namespace_text(prefix), True, cursor,
                                     size)
            size = min(_PAGE, size * 2)  # a page as large as the answer, then larger
            for view in page.states:
                if (view.last_message is not None and not _expired(view, now)
                        and matches(json.loads(view.last_message.content), filter)):
                    found.append((view, None))
                    if len(found) == wanted:
                        return found
            if page.next is None:
                return found
            cursor = page.next

    async def _full_text(self, client: LoopClient, prefix: tuple[str, ...], words: list[str],
                         filter: dict[str, Any] | None, wanted: int,
                         gate: asyncio.Semaphore) -> list[tuple[SessionState, float | None]]:
        """Items ranked by session.search (bm25; score is minus it, higher is better): any
        of the query's words, in the item's current value, under the prefix. A query too
        long for one session.search is several (_search_query.py), their items merged,
        each at its best score."""
        tag = _prefix_tag(prefix)
        lists = await _search_query.each(
            lambda query: self._full_text_of(client, query, filter, wanted, gate), words,
            lambda any_of: f"({any_of}) AND tags: {tag}")
        if len(lists) == 1:
            return lists[0]
        best: dict[str, tuple[SessionState, float | None]] = {}
        for view, score in (pair for found in lists for pair in found):
            held = best.get(view.session_id)
            if held is None or (score or 0.0) > (held[1] or 0.0):
                best[view.session_id] = (view, score)
        return sorted(best.values(), key=lambda pair: -(pair[1] or 0.0))[:wanted]

    async def _full_text_of(self, client: LoopClient, query: str,
                            filter: dict[str, Any] | None, wanted: int,
                            gate: asyncio.Semaphore) -> list[tuple[SessionState, float | None]]:
        """The first `wanted` items one session.search query finds, best first."""
        found: list[tuple[SessionState, float | None]] = []
        cursor, now = None, _now()

        async def current(hit: rpc.SearchSession) -> SessionState | None:
            async with gate:
                try:
                    view = await client.get_session(hit.session_id)
                except SessionNotFoundError:
                    return None
            last = view.last_message
            # a match in an older value of the item is not a match of the item
            if last is None or _expired(view, now) or not any(
                    h.type == "message.appended" and h.sequence == last.sequence
                    for h in hit.hits):
                return None
            return view if matches(json.loads(last.content), filter) else None

        while True:
            result = await client.search(query, limit=min(_SEARCH_PAGE, wanted), hits=20,
                                         cursor=cursor)
            views = await asyncio.gather(*(current(s) for s in result.sessions))
            for hit, view in zip(result.sessions, views, strict=True):
                if view is not None:
                    found.append((view, -hit.score))
                    if len(found) == wanted:
                        return found
            if result.next_cursor is None:
                return found
            cursor = result.next_cursor

    async def _scanned(self, client: LoopClient, prefix: tuple[str, ...]
                       ) -> AsyncIterator[tuple[SessionState, Any]]:
        """The live items under the prefix, and their values: at most FALLBACK_SCAN
        items read, a page at a time (what a scan without the search index reads)."""
        cursor, now, seen = None, _now(), 0
        while seen < FALLBACK_SCAN:
            page = await self._pages(client, ITEMS + namespace_text(prefix), True, cursor,
                                     min(_PAGE, FALLBACK_SCAN - seen))
            seen += len(page.states)
            for view in page.states:
                if view.last_message is not None and not _expired(view, now):
                    yield view, json.loads(view.last_message.content)
            if page.next is None:
                return
            cursor = page.next

    async def _scan_for_words(self, client: LoopClient, prefix: tuple[str, ...],
                              words: list[str], filter: dict[str, Any] | None,
                              wanted: int) -> list[tuple[SessionState, float | None]]:
        """No search index (an older daemon on PostgreSQL): the first FALLBACK_SCAN items under the
        prefix that pass the filter, ranked by how many of the query's words each holds."""
        scored: list[tuple[SessionState, float | None]] = []
        async for view, value in self._scanned(client, prefix):
            assert view.last_message is not None
            held = set(query_words(view.last_message.content))
            score = sum(1 for w in words if w in held)
            if score and matches(value, filter):
                scored.append((view, float(score)))
        scored.sort(key=lambda pair: -(pair[1] or 0))
        return scored[:wanted]

    async def _nearest(self, client: LoopClient, prefix: tuple[str, ...],
                       op: SearchOp) -> list[tuple[SessionState, float | None]]:
        """Vector search, as InMemoryStore: the items under the prefix (at most
        FALLBACK_SCAN) that pass the filter, by their best vector's cosine similarity to
        the query's; items without vectors fill the page after them, unscored."""
        assert self.embeddings is not None and op.query
        query = await self.embeddings.aembed_query(op.query)
        scored: list[tuple[SessionState, float | None]] = []
        scoreless: list[tuple[SessionState, float | None]] = []
        async for view, value in self._scanned(client, prefix):
            if not matches(value, op.filter):
                continue
            vectors = [array("d", base64.b64decode(v))
                       for v in (view.memory.get("vectors") or {}).values()]
            if vectors:
                scored.append((view, max(cosine(query, v) for v in vectors)))
            else:
                scoreless.append((view, None))
        scored.sort(key=lambda pair: -(pair[1] or 0.0))
        kept = scored[op.offset:op.offset + op.limit]
        if scoreless and len(kept) < op.limit:
            kept += scoreless[:op.limit - len(kept)]
        return kept

    # --- namespaces --------------------------------------------------------------------

    async def _list_namespaces(self, client: LoopClient,
                               op: ListNamespacesOp) -> list[tuple[str, ...]]:
        """The namespaces that hold items: the directory, a page (1,000 namespaces) at a
        time under the conditions' literal prefix, never the items."""
        conditions = op.match_conditions or ()
        literal: list[str] = []
        for condition in conditions:
            if condition.match_type == "prefix":
                for label in condition.path:
                    if label == "*":
                        break
                    literal.append(label)
                break
        kept: list[tuple[str, ...]] = []
        cursor = None
        while True:
            page = await self._pages(client, DIRECTORY + namespace_text(literal), True, cursor)
            for view in page.states:
                namespace = tuple(_item_meta(view)["namespace"])
                if all(namespace_matches(c, namespace) for c in conditions):
                    kept.append(namespace)
            if page.next is None:
                break
            cursor = page.next
        if op.max_depth is not None:
            kept = list({ns[:op.max_depth] for ns in kept})
        kept.sort()
        return kept[op.offset:op.offset + op.limit]

    # --- TTL -----------------------------------------------------------------------------

    async def asweep_ttl(self) -> int:
        """Delete the expired items (a page of items at a time); how many were deleted."""
        return await self._sweep(self.aclient)

    def sweep_ttl(self) -> int:
        """Delete the expired items (a page of items at a time); how many were deleted."""
        return self._run(self._sweep(self._client))

    async def _sweep(self, client: LoopClient) -> int:
        deleted, cursor, now = 0, None, _now()
        emptied: set[tuple[str, ...]] = set()
        while True:
            page = await self._pages(client, ITEMS, True, cursor)
            for view in page.states:
                if _expired(view, now):
                    # expected_version: an item refreshed or rewritten since is kept
                    with contextlib.suppress(SessionNotFoundError, VersionConflictError):
                        await client.delete_session(view.session_id,
                                                    expected_version=view.version)
                        deleted += 1
                        emptied.add(tuple(_item_meta(view)["namespace"]))
            if page.next is None:
                break
            cursor = page.next
        for namespace in emptied:
            await self._collect(client, namespace)
        return deleted

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None
                          ) -> concurrent.futures.Future[None]:
        """Sweep every `sweep_interval_minutes` (default: the TTLConfig's, else 5) on the
        store's own thread until stop_ttl_sweeper() or close(); as SqliteStore's."""
        if self._sweeper is not None and not self._sweeper.done():
            return self._sweeper
        interval = float(sweep_interval_minutes
                         or (self.ttl_config or {}).get("sweep_interval_minutes") or 5)

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval * 60)
                with contextlib.suppress(SessiondError, OSError):  # the next round retries
                    await self._sweep(self._client)

        self._run(asyncio.sleep(0))  # start the store's loop
        assert self._loop is not None
        self._sweeper = asyncio.run_coroutine_threadsafe(loop(), self._loop)
        return self._sweeper

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
        return True
