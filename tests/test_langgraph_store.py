"""SessiondStore against LangGraph's own stores (InMemoryStore, SqliteStore), its TTL, its
full-text search on both daemons, and a compiled graph that keeps memories in it."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import sqlite3
from collections.abc import AsyncIterator, Iterator
from typing import Any, TypedDict

import anyio
import pg
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_extras import require_sdk

require_sdk("langgraph", "langgraph")
require_sdk("langgraph.store.sqlite", "sdk-tests")
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.store.base import BaseStore, InvalidNamespaceError, Item  # noqa: E402
from langgraph.store.memory import InMemoryStore  # noqa: E402
from langgraph.store.sqlite import SqliteStore  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations import langgraph_store  # noqa: E402
from sessiond.integrations.langgraph_store import SessiondStore, item_session_id  # noqa: E402
from sessiond_schemas.errors import SessionNotFoundError  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
roots = itertools.count()


@pytest.fixture
async def store(daemon: Daemon) -> AsyncIterator[SessiondStore]:
    s = SessiondStore(daemon.socket)
    yield s
    await anyio.to_thread.run_sync(s.close)


def sqlite_store() -> SqliteStore:
    s = SqliteStore(sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None))
    s.setup()
    return s


def plain(item: Item | None) -> Any:
    return None if item is None else (item.namespace, item.key, item.value)


LABELS = st.sampled_from(["a", "b", "c d", "é/ü", "x:y"])
VALUES = st.fixed_dictionaries({"n": st.integers(-5, 5), "tag": st.sampled_from(["red", "blue"])},
                               optional={"nested": st.fixed_dictionaries({"k": st.booleans()}),
                                         "list": st.lists(st.integers(0, 2), max_size=2)})
FILTERS = st.one_of(
    st.none(),
    st.fixed_dictionaries({"tag": st.sampled_from(["red", "blue"])}),
    st.fixed_dictionaries({"n": st.fixed_dictionaries({}, optional={
        "$gt": st.integers(-5, 5), "$lte": st.integers(-5, 5), "$ne": st.integers(-5, 5)})}),
    st.fixed_dictionaries({"nested": st.fixed_dictionaries({"k": st.booleans()})}),
    st.fixed_dictionaries({"list": st.lists(st.integers(0, 2), max_size=2)}),
)
operations = st.lists(st.one_of(
    st.tuples(st.just("put"), st.lists(LABELS, min_size=1, max_size=3), st.integers(0, 3),
              VALUES),
    st.tuples(st.just("delete"), st.lists(LABELS, min_size=1, max_size=3), st.integers(0, 3)),
    st.tuples(st.just("get"), st.lists(LABELS, min_size=1, max_size=3), st.integers(0, 3)),
    st.tuples(st.just("search"), st.lists(LABELS, max_size=2), FILTERS),
    st.tuples(st.just("namespaces"), st.lists(LABELS, max_size=2),
              st.one_of(st.none(), st.lists(LABELS, min_size=1, max_size=1)),
              st.one_of(st.none(), st.integers(1, 3)), st.integers(0, 2)),
), max_size=16)


class TestAgainstLangGraphsStores:
    @settings(max_examples=50, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(script=operations)
    async def test_same_items_searches_and_namespaces(
            self, store: SessiondStore, script: list[tuple[Any, ...]]) -> None:
        """Random put/delete/get/search(filter)/list_namespaces sequences answer as
        InMemoryStore (items, filters) and SqliteStore (namespaces that hold items) do."""
        root = f"r{next(roots)}"
        memory, lite = InMemoryStore(), sqlite_store()
        for op in script:
            if op[0] in ("put", "delete", "get"):
                ns, key = (root, *op[1]), f"k{op[2]}"
                if op[0] == "put":
                    for s in (memory, lite):
                        s.put(ns, key, op[3])
                    await store.aput(ns, key, op[3])
                elif op[0] == "delete":
                    for s in (memory, lite):
                        s.delete(ns, key)
                    await store.adelete(ns, key)
                else:
                    ours = await store.aget(ns, key)
                    assert plain(ours) == plain(memory.get(ns, key)) == plain(lite.get(ns, key))
            elif op[0] == "search":
                prefix = (root, *op[1])
                ours = await store.asearch(prefix, filter=op[2], limit=1000)
                theirs = memory.search(prefix, filter=op[2], limit=1000)
                assert sorted(map(plain, ours)) == sorted(map(plain, theirs)), op
                assert all(i.score is None for i in ours)
            else:
                _, prefix, suffix, depth, offset = op
                args: dict[str, Any] = {"prefix": (root, *prefix), "max_depth": depth,
                                        "offset": offset, "limit": 3}
                if suffix:
                    args["suffix"] = tuple(suffix)
                assert await store.alist_namespaces(**args) == lite.list_namespaces(**args), op

    async def test_pages_of_a_search_and_the_sync_api(self, store: SessiondStore) -> None:
        """offset/limit pages cover every item once; the sync methods see the same store."""
        ns = ("pages", "p")
        for i in range(7):
            await anyio.to_thread.run_sync(lambda i=i: store.put(ns, f"k{i}", {"i": i}))
        pages = [await store.asearch(("pages",), limit=3, offset=o) for o in (0, 3, 6)]
        assert [len(p) for p in pages] == [3, 3, 1]
        assert sorted(i.value["i"] for p in pages for i in p) == list(range(7))
        assert await anyio.to_thread.run_sync(lambda: store.search(("pages",), limit=3)) == \
            pages[0]
        both = await anyio.to_thread.run_sync(lambda: store.get(ns, "k2"))
        assert both == await store.aget(ns, "k2")

    async def test_a_batch_reads_before_its_puts(self, store: SessiondStore) -> None:
        """As LangGraph's stores: a batch's reads see the store before its writes; the last
        put of one item wins."""
        from langgraph.store.base import GetOp, PutOp
        ns = ("batch",)
        await store.aput(ns, "a", {"v": 1})
        results = await store.abatch([PutOp(ns, "a", {"v": 2}), GetOp(ns, "a"),
                                      PutOp(ns, "a", {"v": 3}), PutOp(ns, "b", {"v": 4}),
                                      PutOp(ns, "b", None)])
        assert [plain(r) if isinstance(r, Item) else r for r in results] == [
            None, (ns, "a", {"v": 1}), None, None, None]
        assert (await store.aget(ns, "a")).value == {"v": 3}  # type: ignore[union-attr]
        assert await store.aget(ns, "b") is None

    async def test_values_json_has_no_type_for_read_back_as_sqlite_stores_do(
            self, store: SessiondStore) -> None:
        """Times, UUIDs and enums become what SqliteStore's orjson makes of them; a value
        that is not JSON at all (a set) is a TypeError and nothing is stored."""
        import datetime
        import enum
        import uuid

        class Colour(enum.Enum):
            TEAL = "teal"

        value = {"when": datetime.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=datetime.UTC),
                 "day": datetime.date(2026, 1, 2), "id": uuid.UUID(int=7),
                 "colour": Colour.TEAL, "naive": datetime.datetime(2026, 1, 2)}
        lite = sqlite_store()
        lite.put(("odd",), "k", value)
        await store.aput(("odd",), "k", value)
        assert plain(await store.aget(("odd",), "k")) == plain(lite.get(("odd",), "k"))
        from langgraph.store.base import PutOp
        with pytest.raises(TypeError):
            await store.abatch([PutOp(("odd",), "fine", {"v": 1}),
                                PutOp(("odd",), "s", {"tags": {"a", "b"}})])
        assert await store.aget(("odd",), "s") is None
        assert await store.aget(("odd",), "fine") is None  # nothing of the batch

    async def test_a_namespace_is_listed_while_it_holds_an_item(
            self, daemon: Daemon, store: SessiondStore) -> None:
        """The last item of a namespace deleted while another store puts a new one there,
        over and over: the namespace is listed exactly when it holds an item."""
        other = SessiondStore(daemon.socket)
        try:
            for i in range(30):
                ns = ("race", f"n{i % 3}")
                await store.aput(ns, "old", {"v": i})
                await asyncio.gather(store.adelete(ns, "old"), other.aput(ns, f"new{i}", {}))
                assert ns in await store.alist_namespaces(prefix=("race",))
                await other.adelete(ns, f"new{i}")
                assert ns not in await store.alist_namespaces(prefix=("race",))
        finally:
            await anyio.to_thread.run_sync(other.close)

    async def test_namespaces_and_dotted_filters(self, store: SessiondStore) -> None:
        """LangGraph's namespace rules (no periods, no empty labels, no "langgraph" root),
        wildcards in list_namespaces, and dotted paths in filters as the SQL stores."""
        with pytest.raises(InvalidNamespaceError):
            await store.aput(("a.b",), "k", {})
        with pytest.raises(InvalidNamespaceError):
            await store.aput(("langgraph",), "k", {})
        await store.aput(("docs", "u1", "v1"), "k", {"meta": {"lang": "en", "n": 2}})
        await store.aput(("docs", "u2", "v1"), "k", {"meta": {"lang": "fr", "n": 5}})
        await store.aput(("docs", "u2", "v2"), "k", {"meta": {"lang": "fr", "n": 9}})
        assert await store.alist_namespaces(prefix=("docs", "*", "v1")) == [
            ("docs", "u1", "v1"), ("docs", "u2", "v1")]
        assert await store.alist_namespaces(suffix=("v2",)) == [("docs", "u2", "v2")]
        found = await store.asearch(("docs",), filter={"meta.lang": "fr", "meta.n": {"$gt": 6}})
        assert [i.namespace for i in found] == [("docs", "u2", "v2")]


    async def test_langgraphs_namespace_listing_cases(self, store: SessiondStore) -> None:
        """The namespaces and listings of LangGraph's own test_list_namespaces_* (upstream
        tests/test_store.py), answered as SqliteStore answers them."""
        lite = sqlite_store()
        namespaces = [("a", "b", "c"), ("a", "b", "d", "e"), ("a", "b", "d", "i"),
                      ("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f"), ("users", "123"),
                      ("users", "456", "settings"), ("admin", "users", "789"),
                      *[("namespace", f"sub_{i:02d}") for i in range(20)]]
        for i, ns in enumerate(namespaces):
            lite.put(ns, f"id_{i}", {"data": i})
            await store.aput(ns, f"id_{i}", {"data": i})
        cases: list[dict[str, Any]] = [
            {"prefix": ("a", "b")}, {"suffix": ("f",)}, {"prefix": ("a",), "suffix": ("f",)},
            {"prefix": ("a", "b"), "max_depth": 3}, {"prefix": ("a", "b"), "limit": 2},
            {"prefix": ("a", "b"), "offset": 2}, {"prefix": ("a", "*", "f")},
            {"suffix": ("*", "f")}, {"prefix": ("nonexistent",)}, {"prefix": ("users", "123")},
            {"prefix": ("users", "*")}, {"prefix": ("*", "users"), "suffix": ("*", "settings")},
            {"prefix": ("namespace",), "limit": 5, "offset": 15}, {"max_depth": 2}, {}]
        for case in cases:
            assert await store.alist_namespaces(**case) == lite.list_namespaces(**case), case
        from langgraph.store.base import PutOp
        with pytest.raises(InvalidNamespaceError):  # past the public API too
            await store.abatch([PutOp(("the", "thing.about"), "k", {})])
        await store.abatch([PutOp(("langgraph", "foo"), "bar", {"v": 1})])  # as upstream
        assert (await store.aget(("langgraph", "foo"), "bar")) is not None


async def test_a_value_over_the_cap_is_a_value_error_naming_it(short_dir: str) -> None:
    """A value over max_event_bytes: a ValueError naming the setting, nothing stored for
    that item, the store goes on (sync and async)."""
    config = daemon_config(short_dir, max_event_bytes=10_000)
    async with running_daemon(config) as d:
        store = SessiondStore(d.socket)
        try:
            with pytest.raises(ValueError, match="max_event_bytes"):
                await store.aput(("cap",), "big", {"text": "x" * 20_000})
            assert await store.aget(("cap",), "big") is None
            assert await store.alist_namespaces() == []

            def sync() -> None:
                with pytest.raises(ValueError, match="max_event_bytes"):
                    store.put(("cap",), "big", {"text": "x" * 20_000})
                store.put(("cap",), "small", {"text": "ok"})

            await anyio.to_thread.run_sync(sync)
            assert (await store.aget(("cap",), "small")).value == {"text": "ok"}  # type: ignore[union-attr]
        finally:
            await anyio.to_thread.run_sync(store.close)


async def test_the_store_outlives_a_daemon_restart(short_dir: str) -> None:
    """Items stay across a restart, and the same store object (sync and async) goes on."""
    config = daemon_config(short_dir)
    store = SessiondStore(config.socket)
    try:
        async with running_daemon(config):
            await store.aput(("r",), "k", {"v": 1})
            await anyio.to_thread.run_sync(lambda: store.put(("r",), "s", {"v": 2}))
        async with running_daemon(config):
            assert (await store.aget(("r",), "s")).value == {"v": 2}  # type: ignore[union-attr]
            got = await anyio.to_thread.run_sync(lambda: store.get(("r",), "k"))
            assert got is not None and got.value == {"v": 1}
    finally:
        await anyio.to_thread.run_sync(store.close)


class TestTTL:
    async def test_expiry_refresh_on_read_and_the_sweep(
            self, store: SessiondStore, client: AsyncClient,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """An item's TTL (minutes) runs from its last access: a read moves it, a read with
        refresh_ttl=False does not; past it the item is gone from get and search, and the
        sweep deletes its session."""
        now = [1_000_000.0]
        monkeypatch.setattr(langgraph_store, "_now", lambda: now[0])
        ns = ("ttl",)
        await store.aput(ns, "short", {"v": 1}, ttl=1)
        await store.aput(ns, "kept", {"v": 2})
        now[0] += 50
        assert await store.aget(ns, "short") is not None  # refreshed: expires at +110
        now[0] += 50
        assert await store.aget(ns, "short", refresh_ttl=False) is not None
        now[0] += 50  # +150: 100 s after the last refreshing read
        assert await store.aget(ns, "short") is None
        assert [i.key for i in await store.asearch(ns)] == ["kept"]
        assert await store.asweep_ttl() == 1
        assert await store.alist_namespaces() == [ns]  # "kept" is still there
        with pytest.raises(SessionNotFoundError):
            await client.get_session(item_session_id(ns, "short"))
        assert (await store.aget(ns, "kept")).value == {"v": 2}  # type: ignore[union-attr]
        assert await store.asweep_ttl() == 0

    async def test_the_sweeper_deletes_expired_items_until_stopped(
            self, store: SessiondStore, client: AsyncClient,
            monkeypatch: pytest.MonkeyPatch) -> None:
        """start_ttl_sweeper sweeps on the store's thread every interval; stop ends it."""
        now = [3_000_000.0]
        monkeypatch.setattr(langgraph_store, "_now", lambda: now[0])
        await store.aput(("sw",), "k", {"v": 1}, ttl=1)
        sweeper = await anyio.to_thread.run_sync(
            lambda: store.start_ttl_sweeper(sweep_interval_minutes=0.001))
        assert store.start_ttl_sweeper() is sweeper  # one at a time
        now[0] += 120

        async def swept() -> bool:
            try:
                await client.get_session(item_session_id(("sw",), "k"))
            except SessionNotFoundError:
                return True
            return False

        await eventually(swept, "the sweeper to delete the expired item")

        async def unlisted() -> bool:  # the sweep's last step: the emptied namespace
            return await store.alist_namespaces() == []

        await eventually(unlisted, "the sweeper to take the emptied namespace out")
        assert store.stop_ttl_sweeper()
        assert sweeper.cancelled()

    async def test_ttl_config_default_and_refresh_on_read(
            self, daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
        """TTLConfig: default_ttl applies to puts without ttl; refresh_on_read=False makes
        reads leave the expiry alone; a search refreshes what it returns."""
        now = [2_000_000.0]
        monkeypatch.setattr(langgraph_store, "_now", lambda: now[0])
        lazy = SessiondStore(daemon.socket, ttl={"default_ttl": 1, "refresh_on_read": False})
        eager = SessiondStore(daemon.socket, ttl={"default_ttl": 1})
        try:
            await lazy.aput(("a",), "k", {"v": 1})
            await eager.aput(("b",), "k", {"v": 1})
            await eager.aput(("b",), "forever", {"v": 1}, ttl=None)
            now[0] += 40
            assert await lazy.aget(("a",), "k") is not None
            assert len(await eager.asearch(("b",))) == 2
            now[0] += 40  # +80
            assert await lazy.aget(("a",), "k") is None
            assert await eager.aget(("b",), "k") is not None
            now[0] += 1000
            assert await eager.asweep_ttl() == 2  # a sweep takes every store's items
            assert await eager.aget(("b",), "forever") is not None
        finally:
            await anyio.to_thread.run_sync(lazy.close)
            await anyio.to_thread.run_sync(eager.close)


class TestSearch:
    async def test_query_ranks_current_values_under_the_prefix(
            self, store: SessiondStore, store_kind: str) -> None:
        """search(query=...): session.search on both stores (a daemon without a search
        index gets the client-side match); either way only current values under the prefix
        match, the best first, and a filter still applies."""
        await store.aput(("mem", "u1"), "a", {"text": "likes pizza and pasta", "n": 1})
        await store.aput(("mem", "u1"), "b", {"text": "likes sushi", "n": 2})
        await store.aput(("mem", "u1"), "c", {"text": "pizza pizza, but only on fridays", "n": 3})
        await store.aput(("mem", "u1"), "old", {"text": "pizza once"})
        await store.aput(("mem", "u1"), "old", {"text": "now salad"})
        await store.aput(("mem", "u2"), "d", {"text": "pizza too"})
        await store.aput(("other",), "e", {"text": "pizza elsewhere"})
        found = await store.asearch(("mem", "u1"), query="Pizza and pasta?")
        assert [i.key for i in found][:1] == ["a"]
        assert {i.key for i in found} == {"a", "c"}
        assert all(isinstance(i.score, float) for i in found)
        assert {i.key for i in await store.asearch(("mem",), query="pizza")} == {"a", "c", "d"}
        assert [i.key for i in await store.asearch(("mem",), query="pizza",
                                                   filter={"n": {"$gte": 3}})] == ["c"]
        assert await store.asearch(("mem",), query="salad") != []
        assert await store.asearch(("mem",), query="once") == []
        assert len(await store.asearch(("mem",), query="pizza", limit=1, offset=1)) == 1

    async def test_items_are_events_exported_and_verified(
            self, store: SessiondStore, client: AsyncClient) -> None:
        """Each put is a message.appended of the item's session (its history), each delete
        removes the session; the store verifies and exports like any other."""
        await store.aput(("h",), "k", {"v": 1})
        await store.aput(("h",), "k", {"v": 2})
        sid = item_session_id(("h",), "k")
        events = (await client.read_events(sid)).events
        messages = [json.loads(e.data.content) for e in events
                    if e.type == "message.appended"]
        assert messages == [{"v": 1}, {"v": 2}]
        exported = await client.export_session(sid)
        assert [e["type"] for e in exported["events"]][:2] == [
            "session.created", "message.appended"]
        assert (await client.verify()).ok
        await store.adelete(("h",), "k")
        with pytest.raises(SessionNotFoundError):
            await client.get_session(sid)
        assert await store.alist_namespaces() == []


def letters(texts: list[str]) -> list[list[float]]:
    """An offline embedding: how often each letter occurs (and a constant, never zero)."""
    return [[0.5, *(t.lower().count(c) for c in "abcdefghijklmnopqrstuvwxyz")] for t in texts]


class TestVectorSearch:
    async def test_same_ranking_as_in_memory_store_with_the_same_index(
            self, daemon: Daemon) -> None:
        """With LangGraph's `index` config, search(query=...) ranks by the items' vectors
        (kept beside them, re-embedded on each put; per-put `index` fields or False), as
        InMemoryStore does: the same items, scores and pages, unscored items last."""
        index: Any = {"dims": 27, "embed": letters, "fields": ["text", "tags[*]"]}
        ours, theirs = SessiondStore(daemon.socket, index=index), InMemoryStore(index=index)
        puts: list[tuple[str, dict[str, Any], Any]] = [
            ("a", {"text": "apples and bananas", "kind": "fruit"}, None),
            ("b", {"text": "zebra crossing", "kind": "road"}, None),
            ("c", {"text": "banana bread", "kind": "food"}, None),
            ("d", {"text": "quiet quizzes", "other": "aaaa bbbb"}, ["other"]),
            ("e", {"text": "not embedded at all"}, False),
            ("f", {"title": "no text field"}, None),
            ("g", {"text": "many vectors", "tags": ["zebra", "qqq", "bread"]}, None),
            ("b", {"text": "bananas, again", "kind": "road"}, None),  # re-embedded
        ]
        try:
            for key, value, fields in puts:
                for s in (ours, theirs):
                    await s.aput(("v", "u1"), key, value, index=fields)
            await ours.aput(("w",), "x", {"text": "bananas elsewhere"})

            def ranked(found: list[Any]) -> tuple[list[Any], set[str]]:
                return ([(i.key, round(i.score, 9)) for i in found if i.score is not None],
                        {i.key for i in found if i.score is None})

            for query, kwargs in [("banana", {}), ("zebra", {"limit": 2}),
                                  ("a b", {"limit": 3, "offset": 2}),
                                  ("banana", {"filter": {"kind": "road"}}),
                                  ("bread", {"limit": 10, "offset": 4})]:
                got = await ours.asearch(("v",), query=query, **kwargs)
                want = await theirs.asearch(("v",), query=query, **kwargs)
                assert ranked(got) == ranked(want), (query, kwargs)
                assert "x" not in {i.key for i in got}
        finally:
            await anyio.to_thread.run_sync(ours.close)


class Chat(TypedDict):
    user: str
    said: str
    recalled: list[str]


async def test_a_compiled_graph_keeps_memories_across_threads(store: SessiondStore) -> None:
    """A graph given store=SessiondStore() writes a memory in one thread and finds it by
    search in another."""
    def remember(state: Chat, *, store: BaseStore) -> dict[str, Any]:
        ns = ("memories", state["user"])
        found = store.search(ns, query=state["said"])
        store.put(ns, f"m{len(found)}-{abs(hash(state['said']))}", {"text": state["said"]})
        return {"recalled": [i.value["text"] for i in found]}

    builder = StateGraph(Chat)
    builder.add_node("remember", remember)
    builder.add_edge(START, "remember")
    builder.add_edge("remember", END)
    graph = builder.compile(store=store)

    def run() -> list[Any]:
        first = graph.invoke({"user": "u1", "said": "my cat is called Tom", "recalled": []},
                             {"configurable": {"thread_id": "t1"}})
        second = graph.invoke({"user": "u1", "said": "what is my cat called", "recalled": []},
                              {"configurable": {"thread_id": "t2"}})
        other = graph.invoke({"user": "u2", "said": "cat", "recalled": []},
                             {"configurable": {"thread_id": "t3"}})
        return [first["recalled"], second["recalled"], other["recalled"]]

    assert await anyio.to_thread.run_sync(run) == [[], ["my cat is called Tom"], []]
    later = await graph.ainvoke({"user": "u1", "said": "Tom", "recalled": []},
                                {"configurable": {"thread_id": "t4"}})
    assert sorted(later["recalled"]) == ["my cat is called Tom"]


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_two_daemons_on_one_database_share_the_store(pg_url: str, short_dir: str) -> None:
    """Fleet mode: an item put through one host is read, found, listed and deleted
    through the other, and a subscriber on the first host sees the other's writes."""
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with running_daemon(configs[0]) as a, running_daemon(configs[1]) as b, \
            AsyncClient(a.socket) as on_a:
        on_host = [SessiondStore(a.socket), SessiondStore(b.socket)]
        try:
            await on_host[0].aput(("fleet", "u1"), "k", {"text": "written on a"})
            got = await on_host[1].aget(("fleet", "u1"), "k")
            assert got is not None and got.value == {"text": "written on a"}
            assert await on_host[1].alist_namespaces() == [("fleet", "u1")]
            assert [i.key for i in await on_host[1].asearch(("fleet",), query="written")] == ["k"]
            sid = item_session_id(("fleet", "u1"), "k")
            top = (await on_a.get_session(sid)).version
            async with on_a.subscribe(sid, from_version=top + 1) as events:
                await on_host[1].aput(("fleet", "u1"), "k", {"text": "rewritten on b"})
                async for event in events:
                    if event.type == "message.appended":
                        assert json.loads(event.data.content) == {"text": "rewritten on b"}
                        break
            await on_host[1].adelete(("fleet", "u1"), "k")
            assert await on_host[0].aget(("fleet", "u1"), "k") is None
            assert await on_host[0].alist_namespaces() == []
        finally:
            for store in on_host:
                await anyio.to_thread.run_sync(store.close)
