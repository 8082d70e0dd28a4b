"""SessiondMemoryService: ADK long-term memory as sessiond events, scoped by app and user."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from conftest import Daemon
from sdk_extras import require_sdk

require_sdk("google.adk", "adk")
from google.adk.events.event import Event  # noqa: E402
from google.adk.memory import InMemoryMemoryService  # noqa: E402
from google.adk.memory.memory_entry import MemoryEntry  # noqa: E402
from google.adk.sessions.session import Session  # noqa: E402
from google.genai import types  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.adk_memory import (  # noqa: E402
    SessiondMemoryService,
    memory_session_id,
)

pytestmark = pytest.mark.anyio
counter = itertools.count()


def said(author: str, text: str, ts: float) -> Event:
    return Event(author=author, timestamp=ts, invocation_id="i", content=types.Content(
        role="user" if author == "user" else "model", parts=[types.Part(text=text)]))


def session_of(app: str, user: str, sid: str, *texts: tuple[str, str]) -> Session:
    events = [said(author, text, 1_700_000_000.0 + i) for i, (author, text) in enumerate(texts)]
    return Session(id=sid, app_name=app, user_id=user, events=events,
                   last_update_time=1_700_000_000.0)


def texts(memories: list[MemoryEntry]) -> list[str]:
    return [" ".join(p.text or "" for p in m.content.parts or []) for m in memories]


class TestMemory:
    async def test_search_finds_the_users_own_memories_best_first(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Two users of one app, and another app: each search sees only its own app and
        user's memories; the best match comes first; entries keep id, author, time."""
        app = f"mem-{next(counter)}"
        service = SessiondMemoryService(daemon.socket)
        alice = session_of(app, "alice", "s1", ("user", "my cat is called Tom"),
                           ("assistant", "Tom is a fine name for a cat"),
                           ("user", "I also like green tea"))
        bob = session_of(app, "bob", "s1", ("user", "my cat is called Felix"))
        other = session_of(app + "-other", "alice", "s1", ("user", "the cat Garfield"))
        for s in (alice, bob, other):
            await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="alice", query="cat name Tom")
        assert texts(found.memories)[0] == "Tom is a fine name for a cat"
        assert set(texts(found.memories)) == {"Tom is a fine name for a cat",
                                              "my cat is called Tom"}
        first = found.memories[0]
        assert first.id == alice.events[1].id and first.author == "assistant"
        assert first.timestamp is not None and first.timestamp.startswith("2023-11-14")
        assert texts((await service.search_memory(app_name=app, user_id="bob",
                                                  query="cat")).memories) == [
            "my cat is called Felix"]
        assert (await service.search_memory(app_name=app, user_id="carol",
                                            query="cat")).memories == []
        assert (await service.search_memory(app_name=app, user_id="alice",
                                            query="   ")).memories == []
        # Stored as events of the user's own memory session.
        sid = memory_session_id(app, "alice")
        stored = (await client.read_events(sid, types=["message.appended"])).events
        assert [e.data["content"] for e in stored] == [
            "my cat is called Tom", "Tom is a fine name for a cat", "I also like green tea"]
        await service.close()

    async def test_adding_again_adds_only_new_events_and_deleted_stay_deleted(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """ADK adds a session many times in its life: each event is a memory once; a
        deleted memory is not found, and adding its session again does not bring it back."""
        app = f"mem-{next(counter)}"
        service = SessiondMemoryService(daemon.socket)
        s = session_of(app, "u", "s", ("user", "remember the blue door"))
        await service.add_session_to_memory(s)
        s.events.append(said("assistant", "the blue door is noted", 1_700_000_100.0))
        await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="u", query="blue door")
        assert sorted(texts(found.memories)) == ["remember the blue door",
                                                 "the blue door is noted"]
        sid = memory_session_id(app, "u")
        assert (await client.get_session(sid)).message_count == 2
        await service.delete_memory(app_name=app, user_id="u", memory_id=s.events[0].id)
        await service.add_session_to_memory(s)
        found = await service.search_memory(app_name=app, user_id="u", query="blue door")
        assert texts(found.memories) == ["the blue door is noted"]
        assert (await client.get_session(sid)).message_count == 2
        with pytest.raises(ValueError):
            await service.delete_memory(app_name=app, user_id="u")
        await service.close()

    async def test_explicit_memories_and_deltas(self, daemon: Daemon) -> None:
        """add_memory (entries, with or without id) and add_events_to_memory (a delta)."""
        app = f"mem-{next(counter)}"
        service = SessiondMemoryService(daemon.socket, max_results=2)
        await service.add_memory(app_name=app, user_id="u", memories=[
            MemoryEntry(id="fact-1", author="system", content=types.Content(
                parts=[types.Part(text="the office moves to Lyon")]),
                custom_metadata={"source": "hr"}),
            MemoryEntry(content=types.Content(parts=[types.Part(text="Lyon has a river")]))])
        await service.add_events_to_memory(app_name=app, user_id="u", events=[
            said("user", "I visited Lyon once", 1_700_000_000.0),
            Event(author="agent", invocation_id="i")])  # no content: not a memory
        found = await service.search_memory(app_name=app, user_id="u", query="Lyon office")
        assert len(found.memories) == 2  # max_results
        assert found.memories[0].id == "fact-1"
        assert found.memories[0].custom_metadata == {"source": "hr"}
        await service.close()

    async def test_same_memories_found_as_in_memory_service(self, daemon: Daemon) -> None:
        """The memories InMemoryMemoryService finds for a query are found here too."""
        app = f"mem-{next(counter)}"
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
