"""SessiondMemoryService against ADK's own InMemoryMemoryService, its scoping by app and
user, adding again, and a real Runner whose model is handed what it remembered."""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, ClassVar

import pg
import pytest
from conftest import Daemon, daemon_config, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_extras import require_sdk

require_sdk("google.adk", "adk")
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.memory import InMemoryMemoryService  # noqa: E402
from google.adk.memory.memory_entry import MemoryEntry  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions.session import Session  # noqa: E402
from google.adk.tools.preload_memory_tool import PreloadMemoryTool  # noqa: E402
from google.genai import types  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.adk import SessiondSessionService  # noqa: E402
from sessiond.integrations.adk_memory import (  # noqa: E402
    SessiondMemoryService,
    memory_session_id,
)

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
apps = itertools.count()
WORDS = ["teal", "colour", "pizza", "Berlin", "cat", "Tom", "café", "meeting", "tuesday"]


@pytest.fixture
async def memory(daemon: Daemon) -> AsyncIterator[SessiondMemoryService]:
    service = SessiondMemoryService(daemon.socket)
    yield service
    await service.close()


def event(i: int, text: str | None, author: str = "user", call: bool = False) -> Event:
    parts = [types.Part(text=text)] if text is not None else []
    if call:
        parts.append(types.Part(function_call=types.FunctionCall(name="lookup", args={"q": i})))
    return Event(id=f"e{i}", invocation_id=f"i{i}", author=author,
                 timestamp=1_700_000_000.0 + i,
                 content=types.Content(role="user" if author == "user" else "model",
                                       parts=parts) if parts else None)


def session(app: str, user: str, sid: str, events: list[Event]) -> Session:
    return Session(id=sid, app_name=app, user_id=user, events=events)


texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join)


class TestAgainstInMemoryMemoryService:
    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(sessions=st.lists(st.lists(st.tuples(texts, st.booleans()), max_size=5),
                             min_size=1, max_size=3),
           queries=st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
                            min_size=1, max_size=3),
           grown=st.lists(texts, max_size=3))
    async def test_same_memories_for_the_same_searches(
            self, memory: SessiondMemoryService, sessions: list[list[tuple[str, bool]]],
            queries: list[list[str]], grown: list[str]) -> None:
        """Sessions of text and tool-call events added to both services, the first grown
        and added again: every search returns the same memories (ids, contents, authors,
        times), in the same order."""
        app, n = f"app{next(apps)}", itertools.count()
        reference = InMemoryMemoryService()
        first: list[Event] = []
        for k, spec in enumerate(sessions):
            events = [event(next(n), text or None, "user" if i % 2 else "agent", call)
                      for i, (text, call) in enumerate(spec)]
            first = first or events
            for service in (reference, memory):
                await service.add_session_to_memory(session(app, "u1", f"s{k}", events))
        first += [event(next(n), text or None) for text in grown]
        for service in (reference, memory):
            await service.add_session_to_memory(session(app, "u1", "s0", first))
        for words in queries:
            query = " ".join(words) + "?"
            theirs = await reference.search_memory(app_name=app, user_id="u1", query=query)
            ours = await memory.search_memory(app_name=app, user_id="u1", query=query)
            assert [m.model_dump() for m in ours.memories] == [
                m.model_dump() for m in theirs.memories], query

    async def test_at_most_ten_the_most_matching_first(
            self, memory: SessiondMemoryService) -> None:
        """Twelve matching events: the ten holding most of the query's words, as the SDK."""
        app = f"app{next(apps)}"
        events = [event(i, "pizza" + (" Berlin" if i % 3 == 0 else "")) for i in range(12)]
        reference = InMemoryMemoryService()
        for service in (reference, memory):
            await service.add_session_to_memory(session(app, "u", "s", events))
        ours = await memory.search_memory(app_name=app, user_id="u", query="pizza in Berlin")
        theirs = await reference.search_memory(app_name=app, user_id="u", query="pizza in Berlin")
        assert [m.id for m in ours.memories] == [m.id for m in theirs.memories]
        assert len(ours.memories) == 10
        assert [m.id for m in ours.memories][:4] == ["e0", "e3", "e6", "e9"]


class TestScopeAndAddingAgain:
    async def test_one_user_never_sees_anothers_memories(
            self, memory: SessiondMemoryService) -> None:
        """Apps and users whose names would run together if joined stay apart."""
        pairs = [("x", "a:b"), ("x:a", "b"), ("x", "a"), ("y", "a:b")]
        for k, (app, user) in enumerate(pairs):
            await memory.add_session_to_memory(
                session(app, user, "s", [event(k, f"secret{k} shared word")]))
        for k, (app, user) in enumerate(pairs):
            found = await memory.search_memory(app_name=app, user_id=user,
                                               query="shared secret0 secret1 secret2 secret3")
            assert [m.content.parts[0].text for m in found.memories] == [  # type: ignore[index]
                f"secret{k} shared word"]
        assert (await memory.search_memory(app_name="x", user_id="nobody",
                                           query="shared")).memories == []

    async def test_adding_again_adds_only_what_is_new(
            self, memory: SessiondMemoryService, client: AsyncClient) -> None:
        """A session added, grown, added again: only the new events are appended; added
        once more unchanged, nothing is written. add_events_to_memory skips kept ids."""
        app = f"app{next(apps)}"
        events = [event(0, "first teal"), event(1, None, call=True), event(2, "second teal")]
        await memory.add_session_to_memory(session(app, "u", "s", events))
        sid = memory_session_id(app, "u", "s")
        assert (await client.get_session(sid)).message_count == 2
        events += [event(3, "third teal"), event(4, "fourth teal")]
        await memory.add_session_to_memory(session(app, "u", "s", events))
        view = await client.get_session(sid)
        assert view.message_count == 4
        appended = [e for e in (await client.read_events(sid)).events
                    if e.type == "message.appended"]
        assert [e.data.content for e in appended] == [
            "first teal", "second teal", "third teal", "fourth teal"]
        await memory.add_session_to_memory(session(app, "u", "s", events))
        assert (await client.get_session(sid)).version == view.version
        await memory.add_events_to_memory(app_name=app, user_id="u", session_id="s",
                                          events=[event(2, "second teal"), event(5, "fifth teal")])
        assert (await client.get_session(sid)).message_count == 5
        found = await memory.search_memory(app_name=app, user_id="u", query="teal")
        assert [m.id for m in found.memories] == ["e0", "e2", "e3", "e4", "e5"]
        # Once deltas were added, a whole add looks at the kept ids: here the memory ends
        # with e6 as the session does, yet the session's e8 before it is new.
        await memory.add_events_to_memory(app_name=app, user_id="u", session_id="s",
                                          events=[event(6, "sixth teal")])
        grown = [events[0], *events[2:5], event(8, "eighth teal"), event(6, "sixth teal")]
        await memory.add_session_to_memory(session(app, "u", "s", grown))
        appended = [e.data.content for e in (await client.read_events(sid)).events
                    if e.type == "message.appended"]
        assert appended[-2:] == ["sixth teal", "eighth teal"]
        assert (await client.verify()).ok


class TestExplicitMemoriesAndForgetting:
    async def test_a_deleted_memory_stays_forgotten_as_in_memory_service(
            self, memory: SessiondMemoryService) -> None:
        """delete_memory: the memory is gone from searches and adding its session (or the
        event) again does not bring it back, in both services; no id does nothing."""
        app = f"app{next(apps)}"
        reference = InMemoryMemoryService()
        events = [event(0, "the blue door"), event(1, "the blue window")]
        for service in (reference, memory):
            await service.add_session_to_memory(session(app, "u", "s", events))
            await service.delete_memory(app_name=app, user_id="u", memory_id="e0")
            await service.delete_memory(app_name=app, user_id="u")
            await service.add_session_to_memory(session(app, "u", "s", [*events,
                                                                       event(2, "blue sky")]))
            await service.add_events_to_memory(app_name=app, user_id="u", session_id="t",
                                               events=[event(0, "the blue door")])
        got = [[m.model_dump() for m in (await service.search_memory(
            app_name=app, user_id="u", query="blue")).memories] for service in (reference, memory)]
        assert got[1] == got[0]
        assert [m["id"] for m in got[1]] == ["e1", "e2"]
        assert (await memory.search_memory(app_name=app, user_id="other",
                                           query="blue")).memories == []

    async def test_explicit_memories_custom_metadata_and_max_results(self, daemon: Daemon) -> None:
        """add_memory keeps entries as given (an id made for one without), custom metadata
        of the call joins each entry's; max_results bounds a search."""
        app = f"app{next(apps)}"
        service = SessiondMemoryService(daemon.socket, max_results=2)
        try:
            await service.add_memory(app_name=app, user_id="u", custom_metadata={"by": "hr"},
                                     memories=[
                MemoryEntry(id="fact-1", author="system", timestamp="2026-01-01",
                            content=types.Content(parts=[types.Part(text="office in Lyon")]),
                            custom_metadata={"source": "wiki"}),
                MemoryEntry(content=types.Content(parts=[types.Part(text="Lyon has rivers")]))])
            await service.add_events_to_memory(app_name=app, user_id="u",
                                               events=[event(0, "I visited Lyon office")],
                                               custom_metadata={"ttl": "30d"})
            found = (await service.search_memory(app_name=app, user_id="u",
                                                 query="Lyon office")).memories
            assert [m.id for m in found] == ["fact-1", "e0"]
            assert found[0].custom_metadata == {"source": "wiki", "by": "hr"}
            assert (found[0].author, found[0].timestamp) == ("system", "2026-01-01")
            assert found[1].custom_metadata == {"ttl": "30d"}
            unbounded = SessiondMemoryService(daemon.socket)
            every = (await unbounded.search_memory(app_name=app, user_id="u",
                                                   query="Lyon")).memories
            await unbounded.close()
            # ties in the order of adding: the two explicit ones, then the event
            assert [every[0].id, every[2].id] == ["fact-1", "e0"]
            assert every[1].id and len(every[1].id) == 36  # made for it (a UUID)
        finally:
            await service.close()


def said_at(author: str, text: str, ts: float) -> Event:
    return Event(author=author, timestamp=ts, invocation_id="i", content=types.Content(
        role="user" if author == "user" else "model", parts=[types.Part(text=text)]))


def session_of(app: str, user: str, sid: str, *texts: tuple[str, str]) -> Session:
    events = [said_at(author, text, 1_700_000_000.0 + i)
              for i, (author, text) in enumerate(texts)]
    return Session(id=sid, app_name=app, user_id=user, events=events,
                   last_update_time=1_700_000_000.0)


def texts_of(memories: list[MemoryEntry]) -> list[str]:
    return [" ".join(p.text or "" for p in m.content.parts or []) for m in memories]


class TestFirstImplementationsCases:
    """b28a's SessiondMemoryService tests (one memory session per user there), with the
    memory session named per ADK session here and delete_memory without an id a no-op
    as in InMemoryMemoryService."""

    async def test_search_finds_the_users_own_memories_best_first(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Two users of one app, and another app: each search sees only its own app and
        user's memories; the best match comes first; entries keep id, author, time."""
        app = f"mem-{next(apps)}"
        service = SessiondMemoryService(daemon.socket)
        alice = session_of(app, "alice", "s1", ("user", "my cat is called Tom"),
                           ("assistant", "Tom is a fine name for a cat"),
                           ("user", "I also like green tea"))
        bob = session_of(app, "bob", "s1", ("user", "my cat is called Felix"))
        other = session_of(app + "-other", "alice", "s1", ("user", "the cat Garfield"))
        for s in (alice, bob, other):
            await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="alice", query="cat name Tom")
        assert texts_of(found.memories)[0] == "Tom is a fine name for a cat"
        assert set(texts_of(found.memories)) == {"Tom is a fine name for a cat",
                                              "my cat is called Tom"}
        first = found.memories[0]
        assert first.id == alice.events[1].id and first.author == "assistant"
        assert first.timestamp is not None and first.timestamp.startswith("2023-11-14")
        assert texts_of((await service.search_memory(app_name=app, user_id="bob",
                                                  query="cat")).memories) == [
            "my cat is called Felix"]
        assert (await service.search_memory(app_name=app, user_id="carol",
                                            query="cat")).memories == []
        assert (await service.search_memory(app_name=app, user_id="alice",
                                            query="   ")).memories == []
        # Stored as events of the user's own memory session.
        sid = memory_session_id(app, "alice", "s1")
        stored = (await client.read_events(sid, types=["message.appended"])).events
        assert [e.data.content for e in stored] == [
            "my cat is called Tom", "Tom is a fine name for a cat", "I also like green tea"]
        await service.close()

    async def test_adding_again_adds_only_new_events_and_deleted_stay_deleted(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """ADK adds a session many times in its life: each event is a memory once; a
        deleted memory is not found, and adding its session again does not bring it back."""
        app = f"mem-{next(apps)}"
        service = SessiondMemoryService(daemon.socket)
        s = session_of(app, "u", "s", ("user", "remember the blue door"))
        await service.add_session_to_memory(s)
        s.events.append(said_at("assistant", "the blue door is noted", 1_700_000_100.0))
        await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="u", query="blue door")
        assert sorted(texts_of(found.memories)) == ["remember the blue door",
                                                 "the blue door is noted"]
        sid = memory_session_id(app, "u", "s")
        assert (await client.get_session(sid)).message_count == 2
        await service.delete_memory(app_name=app, user_id="u", memory_id=s.events[0].id)
        await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="u", query="blue door")
        assert texts_of(found.memories) == ["the blue door is noted"]
        assert (await client.get_session(sid)).message_count == 2
        await service.delete_memory(app_name=app, user_id="u")  # no id: nothing, as the SDK
        await service.close()

    async def test_explicit_memories_and_deltas(self, daemon: Daemon) -> None:
        """add_memory (entries, with or without id) and add_events_to_memory (a delta)."""
        app = f"mem-{next(apps)}"
        service = SessiondMemoryService(daemon.socket, max_results=2)
        await service.add_memory(app_name=app, user_id="u", memories=[
            MemoryEntry(id="fact-1", author="system", content=types.Content(
                parts=[types.Part(text="the office moves to Lyon")]),
                custom_metadata={"source": "hr"}),
            MemoryEntry(content=types.Content(parts=[types.Part(text="Lyon has a river")]))])
        await service.add_events_to_memory(app_name=app, user_id="u", events=[
            said_at("user", "I visited Lyon once", 1_700_000_000.0),
            Event(author="agent", invocation_id="i")])  # no content: not a memory
        found = await service.search_memory(app_name=app, user_id="u", query="Lyon office")
        assert len(found.memories) == 2  # max_results
        assert found.memories[0].id == "fact-1"
        assert found.memories[0].custom_metadata == {"source": "hr"}
        await service.close()

    async def test_same_memories_found_as_in_memory_service(self, daemon: Daemon) -> None:
        """The memories InMemoryMemoryService finds for a query are found here too."""
        app = f"mem-{next(apps)}"
        ours, theirs = SessiondMemoryService(daemon.socket), InMemoryMemoryService()
        s = session_of(app, "u", "s", ("user", "pasta with basil"), ("assistant", "noted"),
                       ("user", "and pizza with basil"), ("user", "nothing here"))
        for service in (ours, theirs):
            await service.add_session_to_memory(s)
        for query in ("basil", "pizza", "pasta pizza", "noted", "absent"):
            got: list[Any] = [sorted(m.id or "" for m in (await service.search_memory(
                app_name=app, user_id="u", query=query)).memories)
                for service in (ours, theirs)]
            assert got[0] == got[1], query
        await ours.close()


class RememberingLlm(BaseLlm):
    """An offline model that keeps the texts of each request it was sent."""

    seen: ClassVar[list[str]] = []

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        RememberingLlm.seen.append(" ".join(
            p.text for c in llm_request.contents for p in (c.parts or []) if p.text))
        yield LlmResponse(content=types.Content(role="model", parts=[types.Part(text="ok")]))


async def test_a_runner_preloads_what_an_earlier_session_said(daemon: Daemon) -> None:
    """A Runner on SessiondSessionService and SessiondMemoryService: a session added to
    memory is what PreloadMemoryTool hands the model in the next session."""
    sessions, memory = SessiondSessionService(daemon.socket), SessiondMemoryService(daemon.socket)
    agent = LlmAgent(name="helper", model=RememberingLlm(model="stub"), instruction="Be brief.",
                     tools=[PreloadMemoryTool()])
    runner = Runner(agent=agent, app_name="support", session_service=sessions,
                    memory_service=memory)
    RememberingLlm.seen = []

    async def say(sid: str, text: str) -> None:
        if await sessions.get_session(app_name="support", user_id="u1", session_id=sid) is None:
            await sessions.create_session(app_name="support", user_id="u1", session_id=sid)
        message = types.Content(role="user", parts=[types.Part(text=text)])
        _: list[Any] = [e async for e in runner.run_async(user_id="u1", session_id=sid,
                                                          new_message=message)]

    try:
        await say("s1", "my favourite colour is teal")
        done = await sessions.get_session(app_name="support", user_id="u1", session_id="s1")
        assert done is not None
        await memory.add_session_to_memory(done)
        await say("s2", "which colour do I like?")
        first, second = RememberingLlm.seen
        assert "PAST_CONVERSATIONS" not in first  # nothing in memory yet
        assert "<PAST_CONVERSATIONS>" in second
        assert "user: my favourite colour is teal" in second.split("<PAST_CONVERSATIONS>")[1]
    finally:
        await sessions.close()
        await memory.close()


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_two_daemons_on_one_database_share_memories(pg_url: str, short_dir: str) -> None:
    """Fleet mode: a session added to memory through one host is found through the other,
    and added again there, only its new events are appended."""
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with running_daemon(configs[0]) as a, running_daemon(configs[1]) as b, \
            AsyncClient(b.socket) as on_b:
        on_a, on_b_memory = SessiondMemoryService(a.socket), SessiondMemoryService(b.socket)
        try:
            events = [event(0, "the meeting is on tuesday")]
            await on_a.add_session_to_memory(session("app", "u", "s", events))
            found = await on_b_memory.search_memory(app_name="app", user_id="u",
                                                    query="when is the meeting")
            assert [m.id for m in found.memories] == ["e0"]
            events.append(event(1, "moved to the cafe"))
            await on_b_memory.add_session_to_memory(session("app", "u", "s", events))
            assert (await on_b.get_session(memory_session_id("app", "u", "s"))
                    ).message_count == 2
        finally:
            await on_a.close()
            await on_b_memory.close()
