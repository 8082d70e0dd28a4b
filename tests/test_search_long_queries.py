"""The LangGraph store's and ADK memory's searches answer a query of any length, as the
SDKs' in-memory stores do (issue 45 §8): session.search takes at most 1,000 characters
and 64 words, so a longer query is split into several (client/sessiond/integrations/
_search_query.py) and what they find merged."""

from __future__ import annotations

import itertools
import random
import string
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, running_daemon
from sdk_extras import require_sdk

from sessiond.integrations import _search_query
from sessiond.integrations._search_query import MAX_QUERY_CHARS, MAX_TERMS, any_of

pytestmark = pytest.mark.anyio
apps = itertools.count()
rng = random.Random(45)
# 120 distinct words, about 1,300 characters as a query: past both of the daemon's limits.
FILLER = list(dict.fromkeys("".join(rng.choices(string.ascii_lowercase, k=rng.randint(6, 12)))
                            for _ in range(120)))
LONG = " ".join([*FILLER[:60], "pizza", *FILLER[60:], "Berlin?"])


def test_the_queries_fit_the_daemon_and_keep_every_word_they_can() -> None:
    """Each query is within 1,000 characters and 64 terms (with what `wrap` adds); all
    the words are in one of them while they fit in MAX_QUERIES; past that the longest
    are kept; a short list stays one query, in its order."""
    wrap = lambda q: f"({q}) AND tags: ns_abc"  # noqa: E731
    words = [w.lower() for w in LONG.replace("?", "").split()]
    queries = any_of(words, wrap)
    assert 1 < len(queries) <= _search_query.MAX_QUERIES
    for query in queries:
        assert len(query) <= MAX_QUERY_CHARS and _search_query._terms(query) <= MAX_TERMS
        assert query.endswith(") AND tags: ns_abc")
    assert {w for q in queries for w in q.split('"')[1::2]} == set(words)
    assert any_of(["b", "a"], wrap) == ['("b" OR "a") AND tags: ns_abc']
    many = [f"w{i:04}" + "x" * (i % 7) for i in range(2_000)]
    kept = [w for q in any_of(many) for w in q.split('"')[1::2]]
    assert 0 < len(kept) < len(many) and min(map(len, kept)) >= max(
        len(w) for w in many if w not in kept)
    assert any_of(["y" * 2_000]) == []  # a word the query cannot hold
    assert len(any_of(words, max_terms=10)) == _search_query.MAX_QUERIES


class TestAdkMemory:
    @pytest.fixture
    async def memory(self, daemon: Daemon) -> AsyncIterator[Any]:
        require_sdk("google.adk", "adk")
        from sessiond.integrations.adk_memory import SessiondMemoryService
        service = SessiondMemoryService(daemon.socket)
        yield service
        await service.close()

    async def test_a_long_query_finds_what_the_in_memory_service_finds(
            self, memory: Any) -> None:
        from google.adk.events.event import Event
        from google.adk.memory import InMemoryMemoryService
        from google.adk.sessions.session import Session
        from google.genai import types
        app = f"long{next(apps)}"
        texts = ["pizza in Berlin", "only pizza", "Berlin alone", "nothing", FILLER[-1],
                 "tea"]
        events = [Event(id=f"e{i}", invocation_id=f"i{i}", author="user",
                        timestamp=1_700_000_000.0 + i,
                        content=types.Content(role="user", parts=[types.Part(text=t)]))
                  for i, t in enumerate(texts)]
        reference = InMemoryMemoryService()
        for service in (reference, memory):
            await service.add_session_to_memory(
                Session(id="s", app_name=app, user_id="u", events=events))
        for query in (LONG, LONG + " tea", "pizza Berlin"):
            theirs = await reference.search_memory(app_name=app, user_id="u", query=query)
            ours = await memory.search_memory(app_name=app, user_id="u", query=query)
            assert [m.model_dump() for m in ours.memories] == [
                m.model_dump() for m in theirs.memories]
            assert ours.memories  # the query finds something on both


@asynccontextmanager
async def langgraph_store(socket: str) -> AsyncIterator[Any]:
    require_sdk("langgraph", "langgraph")
    from sessiond.integrations.langgraph_store import SessiondStore
    store = SessiondStore(socket)
    try:
        yield store
    finally:
        await anyio.to_thread.run_sync(store.close)


class TestLangGraphStore:
    async def test_a_long_query_answers_as_the_in_memory_store(self, daemon: Daemon) -> None:
        """InMemoryStore (no index) answers any query with the items under the prefix;
        ours answers a long one with the items holding any of its words, best first: here
        every item holds one, so the same items."""
        async with langgraph_store(daemon.socket) as store:
            await self.check(store)

    async def check(self, store: Any) -> None:
        from langgraph.store.memory import InMemoryStore
        theirs = InMemoryStore()
        values = {"a": {"text": "likes pizza"}, "b": {"text": f"{FILLER[0]} and {FILLER[-1]}"},
                  "c": {"text": "berlin"}}
        for key, value in values.items():
            for s in (store, theirs):
                await s.aput(("mem",), key, value)
        await store.aput(("other",), "d", {"text": "pizza"})
        ours = await store.asearch(("mem",), query=LONG, limit=10)
        want = await theirs.asearch(("mem",), query=LONG, limit=10)
        assert {i.key for i in ours} == {i.key for i in want} == set(values)
        assert all(isinstance(i.score, float) for i in ours)
        assert [i.key for i in await store.asearch(("mem",), query=LONG, limit=1)] != []
        assert await store.asearch(("mem",), query=" ".join(FILLER[1:-1])) == []


@pytest.mark.sqlite_only("the client's narrowing is the same on both stores")
async def test_a_daemon_with_fewer_terms_gets_narrower_queries(
        store_kind: str, short_dir: str) -> None:
    """A daemon whose search_max_terms is below the default refuses the first queries;
    the client splits again at the daemon's own limit."""
    config = daemon_config(short_dir, search_max_terms=8)
    async with running_daemon(config) as d, langgraph_store(d.socket) as store:
        await store.aput(("mem",), "a", {"text": f"about {FILLER[5]}"})
        found = await store.asearch(("mem",), query=" ".join(FILLER[:20]))
        assert [i.key for i in found] == ["a"]
