"""SessiondSessionService against ADK's own InMemorySessionService, and under a real ADK Runner."""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_extras import require_sdk

require_sdk("google.adk", "adk")
from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.errors.already_exists_error import AlreadyExistsError  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.events.event_actions import EventActions  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.sessions.base_session_service import GetSessionConfig  # noqa: E402
from google.genai import types  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.adk import SessiondSessionService  # noqa: E402

# The adapter's tests talk through the client: their PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
counter = itertools.count()
USERS = ["alice", "bob/with:odd chars"]


def make_event(kind: int, step: int) -> Event:
    """Events of the kinds agents write: text, a function call, its result, state only."""
    delta: dict[str, Any] = {f"k{step % 3}": step, "app:shared": step, f"user:u{step % 2}": step,
                             "temp:scratch": step, "nothing": None}
    author, part = [
        ("user", types.Part(text=f"hello {step}")),
        ("agent", types.Part(function_call=types.FunctionCall(id=f"c{step}", name="lookup",
                                                              args={"q": step}))),
        ("agent", types.Part(function_response=types.FunctionResponse(
            id=f"c{step}", name="lookup", response={"result": step}))),
        ("agent", None),
    ][kind]
    return Event(invocation_id=f"inv{step}", author=author, timestamp=1_700_000_000.0 + step,
                 content=types.Content(role="user" if author == "user" else "model",
                                       parts=[part]) if part else None,
                 actions=EventActions(state_delta=delta))


def comparable(session: Any) -> Any:
    if session is None:
        return None
    dumped = session.model_dump()
    if not session.events:
        dumped.pop("last_update_time")  # a fresh session's time is when each service made it
    return dumped


operations = st.lists(st.one_of(
    st.tuples(st.just("create"), st.sampled_from(USERS), st.integers(0, 2),
              # sessiond keeps numbers within int64 (docs/protocol.md): the SDK's own
              # stores differ past it (in memory: any int; SQL stores: their JSON type).
              st.dictionaries(st.sampled_from(["a", "app:x", "user:y", "temp:t"]),
                              st.integers(-2**63, 2**63 - 1), max_size=3)),
    st.tuples(st.just("append"), st.integers(0, 5), st.integers(0, 3)),
    st.tuples(st.just("get"), st.sampled_from(USERS), st.integers(0, 2),
              st.one_of(st.none(), st.integers(0, 4)), st.one_of(st.none(), st.integers(0, 6))),
    st.tuples(st.just("list"), st.one_of(st.none(), st.sampled_from(USERS))),
    st.tuples(st.just("delete"), st.sampled_from(USERS), st.integers(0, 2)),
    st.tuples(st.just("user_state"), st.sampled_from(USERS)),
), max_size=14)


class TestDifferential:
    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(script=operations)
    async def test_same_sessions_events_and_state_as_in_memory(
            self, daemon: Daemon, script: list[tuple[Any, ...]]) -> None:
        """Random create/append/get(config)/list/delete sequences: equal answers from both."""
        app = f"app {next(counter)}"
        reference, ours = InMemorySessionService(), SessiondSessionService(daemon.socket)
        live: list[tuple[Any, Any]] = []  # (reference session, our session) pairs
        step = itertools.count()
        try:
            for op in script:
                if op[0] == "create":
                    _, user, n, state = op
                    results: list[Any] = []  # a Session, or "exists"
                    for service in (reference, ours):
                        try:
                            results.append(await service.create_session(
                                app_name=app, user_id=user, state=dict(state), session_id=f"s{n}"))
                        except AlreadyExistsError:
                            results.append("exists")
                    assert [comparable(r) if r != "exists" else r for r in results] == [
                        comparable(results[0]) if results[0] != "exists" else "exists"] * 2
                    if results[0] != "exists":
                        live.append((results[0], results[1]))
                elif op[0] == "append" and live:
                    theirs, mine = live[op[1] % len(live)]
                    event = make_event(op[2], next(step))
                    await reference.append_event(theirs, copy.deepcopy(event))
                    await ours.append_event(mine, copy.deepcopy(event))
                    assert comparable(mine) == comparable(theirs)
                elif op[0] == "get":
                    _, user, n, recent, after = op
                    config = GetSessionConfig(
                        num_recent_events=recent,
                        after_timestamp=None if after is None else 1_700_000_000.0 + after)
                    got = [await s.get_session(app_name=app, user_id=user, session_id=f"s{n}",
                                               config=config) for s in (reference, ours)]
                    assert comparable(got[1]) == comparable(got[0]), op
                elif op[0] == "list":
                    listed = [await s.list_sessions(app_name=app, user_id=op[1])
                              for s in (reference, ours)]
                    assert [comparable(s) for s in listed[1].sessions] == [
                        comparable(s) for s in listed[0].sessions]
                elif op[0] == "delete":
                    for s in (reference, ours):
                        await s.delete_session(app_name=app, user_id=op[1], session_id=f"s{op[2]}")
                    live = [pair for pair in live if not (
                        pair[0].user_id == op[1] and pair[0].id == f"s{op[2]}")]
                elif op[0] == "user_state":
                    assert await ours.get_user_state(app_name=app, user_id=op[1]) == \
                        await reference.get_user_state(app_name=app, user_id=op[1])
        finally:
            await ours.close()

    @pytest.mark.parametrize(("recent", "after"), [
        (None, None), (3, None), (0, None), (10, None), (None, 2), (None, 0), (None, 9),
        (2, 1), (4, 3)])
    async def test_get_session_config(self, daemon: Daemon, recent: int | None,
                                      after: int | None) -> None:
        """num_recent_events and after_timestamp narrow the events exactly as in memory."""
        reference, ours = InMemorySessionService(), SessiondSessionService(daemon.socket)
        app = f"cfg {next(counter)}"
        sessions = [await s.create_session(app_name=app, user_id="u", session_id="s")
                    for s in (reference, ours)]
        for step in range(6):
            event = make_event(step % 4, step)
            for service, session in zip((reference, ours), sessions, strict=True):
                await service.append_event(session, copy.deepcopy(event))
        config = GetSessionConfig(num_recent_events=recent, after_timestamp=None if after is None
                                  else 1_700_000_000.0 + after)
        got = [await s.get_session(app_name=app, user_id="u", session_id="s", config=config)
               for s in (reference, ours)]
        assert comparable(got[1]) == comparable(got[0])
        theirs, mine = got
        assert theirs is not None and mine is not None
        assert len(mine.events) == len(theirs.events)
        await ours.close()

    async def test_scoped_state_is_shared_and_temp_is_not_stored(self, daemon: Daemon,
                                                                 client: AsyncClient) -> None:
        """app: keys reach every session of the app, user: keys every session of the user."""
        ours = SessiondSessionService(daemon.socket)
        a = await ours.create_session(app_name="shop", user_id="ann", session_id="one")
        for user, sid in (("ann", "two"), ("ben", "one")):  # the same ADK id, another user
            await ours.create_session(app_name="shop", user_id=user, session_id=sid)
        await ours.append_event(a, Event(author="agent", actions=EventActions(state_delta={
            "app:theme": "dark", "user:lang": "fr", "cart": 2, "temp:draft": "x"})))
        assert a.state["temp:draft"] == "x"  # the caller's object has it for this invocation
        got: dict[str, Any] = {
            n: await ours.get_session(app_name="shop", user_id=u, session_id=i)
            for n, (u, i) in {"a": ("ann", "one"), "b": ("ann", "two"),
                              "c": ("ben", "one")}.items()}
        assert got["a"].state == {"app:theme": "dark", "user:lang": "fr", "cart": 2}
        assert got["b"].state == {"app:theme": "dark", "user:lang": "fr"}
        assert got["c"].state == {"app:theme": "dark"}
        stored = (await client.read_events(types=["state.updated"])).events
        assert all("temp:draft" not in e.data.delta for e in stored)
        await ours.close()


class StubLlm(BaseLlm):
    """An offline model: answers with a fixed text, and remembers what it was sent."""

    seen: ClassVar[list[list[str]]] = []

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        texts = [p.text for c in llm_request.contents for p in (c.parts or []) if p.text]
        StubLlm.seen.append(texts)
        yield LlmResponse(content=types.Content(
            role="model", parts=[types.Part(text=f"answer {len(StubLlm.seen)}")]))


async def test_runner_runs_two_turns_across_a_restart(short_dir: str) -> None:
    """A real ADK Runner: two turns, the daemon restarted between them; the model sees both."""
    config = daemon_config(short_dir)
    agent = LlmAgent(name="helper", model=StubLlm(model="stub"), instruction="Be brief.")
    StubLlm.seen = []

    async def turn(socket: str, text: str) -> list[str]:
        service = SessiondSessionService(socket)
        runner = Runner(agent=agent, app_name="support", session_service=service)
        replies = [p.text async for event in runner.run_async(
                       user_id="u1", session_id="s1",
                       new_message=types.Content(role="user", parts=[types.Part(text=text)]))
                   for p in (event.content.parts or [] if event.content else []) if p.text]
        await service.close()
        return replies

    async with running_daemon(config) as d:
        service = SessiondSessionService(d.socket)
        await service.create_session(app_name="support", user_id="u1", session_id="s1")
        await service.close()
        assert await turn(d.socket, "first question") == ["answer 1"]
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        assert await turn(d.socket, "second question") == ["answer 2"]
        service = SessiondSessionService(d.socket)
        session = await service.get_session(app_name="support", user_id="u1", session_id="s1")
        assert session is not None
        assert [e.author for e in session.events] == ["user", "helper", "user", "helper"]
        await service.close()
        texts = [m.content for m in (await c.list_messages(
            "adk-" + __import__("hashlib").sha256(b"support\0u1\0s1").hexdigest()[:40])).messages]
        assert texts == ["first question", "answer 1", "second question", "answer 2"]
    assert StubLlm.seen[1] == ["first question", "answer 1", "second question"]


class TestStaleAndRetries:
    @pytest.mark.fleet
    async def test_four_processes_refused_where_database_session_service_refuses(
            self, daemon: Daemon, tmp_path: Any) -> None:
        """Four real processes, each with its own copy of one session, append and reload in
        a fixed order: sessiond refuses (StaleSessionError) exactly the appends that
        DatabaseSessionService on SQLite refuses, and both then hold the same events and
        state. Then the four append freely at once, reloading when refused: every event
        is stored exactly once."""
        from google.adk.sessions.database_session_service import DatabaseSessionService
        from sdk_extras import Workers

        db_url = f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}"
        stores: dict[str, SessiondSessionService | DatabaseSessionService] = {
            "sessiond": SessiondSessionService(daemon.socket),
            "database": DatabaseSessionService(db_url)}
        for store in stores.values():
            await store.create_session(app_name="race", user_id="u", session_id="s")
        rng = __import__("random").Random(17)
        script = [(rng.randrange(4), "load" if rng.random() < 0.3 else "append")
                  for _ in range(40)]

        def drive() -> tuple[dict[str, list[object]], list[object]]:
            workers = Workers("adk", 4, daemon.socket, db_url)
            try:
                outcomes: dict[str, list[object]] = {}
                for store in ("database", "sessiond"):
                    for i in range(4):
                        workers.ask(i, f"load {store}")
                    outcomes[store] = [
                        workers.ask(p, f"load {store}" if op == "load" else f"append {store} {n}")
                        for n, (p, op) in enumerate(script)]
                return outcomes, workers.all("burst 25")
            finally:
                workers.close()

        outcomes, _ = await anyio.to_thread.run_sync(drive)  # the bursts: checked below
        assert outcomes["sessiond"] == outcomes["database"]
        assert {"ok", "stale"} <= set(outcomes["database"])
        ours = await stores["sessiond"].get_session(app_name="race", user_id="u", session_id="s")
        theirs = await stores["database"].get_session(app_name="race", user_id="u",
                                                      session_id="s")
        assert ours is not None and theirs is not None
        scripted = [e.id for e in ours.events if int(e.id.split("-")[1]) < 10_000]
        assert scripted == [e.id for e in theirs.events]
        burst = sorted(e.id for e in ours.events if int(e.id.split("-")[1]) >= 10_000)
        assert burst == sorted(f"p{i}-{10_000 + n}" for i in range(4) for n in range(25))
        assert len({e.id for e in ours.events}) == len(ours.events)  # nothing doubled
        for store in stores.values():
            await store.close()

    async def test_an_outdated_object_is_refused_and_a_retry_is_stored_once(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """The same refusals for objects this service did not load (ADK's fallback by time
        and last event); a retried append leaves one copy in session.events and the store;
        a refused append leaves the object as DatabaseSessionService leaves it."""
        from google.adk.errors import StaleSessionError
        from google.adk.sessions.session import Session

        service = SessiondSessionService(daemon.socket)
        a = await service.create_session(app_name="retry", user_id="u", session_id="s")
        b = copy.deepcopy(a)
        first = make_event(0, 1)
        await service.append_event(a, first)
        await service.append_event(a, first)  # retried: one copy
        assert [e.id for e in a.events] == [first.id]
        with pytest.raises(StaleSessionError) as refused:
            await service.append_event(b, Event(author="agent", actions=EventActions(
                state_delta={"temp:t": 1, "k": 2})))
        assert isinstance(refused.value, ValueError) and "reload" in str(refused.value)
        assert b.events == [] and b.state == {"temp:t": 1}  # temp applied first, as ADK's
        # The answer of an append was lost: the same event through the older copy is the
        # stored one, not a conflict, and not a second copy.
        await service.append_event(b, copy.deepcopy(first))
        assert [e.id for e in b.events] == [first.id]
        # A Session made by hand (no revision): refused only when the store moved past it.
        loose = Session(id="s", app_name="retry", user_id="u", last_update_time=0.0)
        with pytest.raises(StaleSessionError):
            await service.append_event(loose, make_event(1, 2))
        loose = Session(id="s", app_name="retry", user_id="u", events=[first],
                        last_update_time=0.0)
        await service.append_event(loose, make_event(1, 2))
        got = await service.get_session(app_name="retry", user_id="u", session_id="s")
        assert got is not None and [e.id for e in got.events] == [first.id, loose.events[-1].id]
        await service.close()

    async def test_a_600_kb_event_is_stored_once(self, daemon: Daemon, client: AsyncClient,
                                                 short_dir: str) -> None:
        """A 600 KB text part: stored (once, in the message's content), read back whole."""
        service = SessiondSessionService(daemon.socket)
        session = await service.create_session(app_name="big", user_id="u", session_id="s")
        text = "é" * 300_000  # 600 KB of UTF-8
        event = Event(author="user", timestamp=1_699_999_999.0,  # before make_event's
                      content=types.Content(role="user", parts=[
                          types.Part(text="short"), types.Part(text=text)]))
        await service.append_event(session, event)
        got = await service.get_session(app_name="big", user_id="u", session_id="s")
        assert got is not None and got.events[0].content == event.content
        [message] = (await client.list_messages(
            __import__("sessiond.integrations.adk", fromlist=["x"]).session_id_for(
                "big", "u", "s"))).messages
        assert message.content == "short\n" + text
        assert [p["text"] for p in message.metadata["adk_event"]["content"]["parts"]] == ["", ""]
        # A function call's arguments and a response: shown in the content as JSON, not
        # kept again in the event.
        rows = {"rows": ["r" * 1000] * 300}
        call, answer = make_event(1, 2), make_event(2, 3)
        assert call.content and answer.content
        call.content.parts[0].function_call.args = rows  # type: ignore[index,union-attr]
        answer.content.parts[0].function_response.response = rows  # type: ignore[index,union-attr]
        for e in (call, answer):
            await service.append_event(session, e)
        got = await service.get_session(app_name="big", user_id="u", session_id="s")
        assert got is not None and [e.content for e in got.events[1:]] == [
            call.content, answer.content]
        stored = (await client.list_messages(
            __import__("sessiond.integrations.adk", fromlist=["x"]).session_id_for(
                "big", "u", "s"))).messages[1:]
        assert stored[0].content == f"lookup({json.dumps(rows)})"
        assert stored[0].metadata["adk_event"]["content"]["parts"][0]["function_call"][
            "args"] is None
        assert stored[1].metadata["adk_event"]["content"]["parts"][0]["function_response"][
            "response"] is None
        await service.close()

    async def test_a_cap_hit_is_a_value_error_naming_the_setting(self, short_dir: str) -> None:
        """Over max_event_bytes: a ValueError naming the setting; the service goes on."""
        async with running_daemon(daemon_config(short_dir, max_event_bytes=1000)) as d:
            service = SessiondSessionService(d.socket)
            session = await service.create_session(app_name="cap", user_id="u", session_id="s")
            with pytest.raises(ValueError, match="max_event_bytes"):
                await service.append_event(session, Event(author="user", content=types.Content(
                    role="user", parts=[types.Part(text="x" * 2000)])))
            await service.append_event(session, make_event(0, 1))
            assert len(session.events) == 1
            await service.close()

    async def test_parallel_appends_through_one_object_all_pass(self, daemon: Daemon) -> None:
        """Branches of a ParallelAgent append through one session object at once: each waits
        for the one before (as DatabaseSessionService's lock), none is refused as stale."""
        service = SessiondSessionService(daemon.socket)
        session = await service.create_session(app_name="par", user_id="u", session_id="s")
        events = [make_event(0, n) for n in range(8)]
        async with anyio.create_task_group() as tg:
            for event in events:
                tg.start_soon(service.append_event, session, event)
        got = await service.get_session(app_name="par", user_id="u", session_id="s")
        assert got is not None
        assert sorted(e.id for e in got.events) == sorted(e.id for e in events)
        assert [e.id for e in session.events] == [e.id for e in got.events]
        assert service._locks == {}
        await service.close()


class TestAsDatabaseSessionService:
    """Where ADK's own SQL store and its in-memory one differ, sessiond does as the SQL one."""

    @pytest.fixture
    async def stores(self, daemon: Daemon, tmp_path: Any) -> AsyncGenerator[
            dict[str, Any], None]:
        from google.adk.sessions.database_session_service import DatabaseSessionService

        found = {"sessiond": SessiondSessionService(daemon.socket),
                 "database": DatabaseSessionService(
                     f"sqlite+aiosqlite:///{tmp_path / 'adk.db'}")}
        yield found
        for store in found.values():
            await store.close()

    async def test_state_values_that_are_not_json_are_stored_as_the_sdk_stores_them(
            self, stores: dict[str, Any]) -> None:
        """A datetime, a set, a pydantic model and an object in a state delta: the event is
        stored, and the state and event read back are DatabaseSessionService's."""
        import datetime

        from google.adk.sessions.session import Session as AdkSession

        class Opaque:
            def __repr__(self) -> str:
                return "<opaque>"

        when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
        got = {}
        for name, store in stores.items():
            session = await store.create_session(
                app_name="json", user_id="u", session_id="s", state={"at": when, "ids": {3}})
            event = Event(id="e1", author="agent", invocation_id="i", timestamp=1_700_000_000.0,
                          actions=EventActions(state_delta={
                              "at": when, "tags": {"a"}, "app:model": AdkSession(
                                  id="m", app_name="a", user_id="u", last_update_time=1.0),
                              "user:thing": Opaque()}))
            await store.append_event(session, event)
            got[name] = await store.get_session(app_name="json", user_id="u", session_id="s")
        assert got["sessiond"] is not None and got["database"] is not None
        assert got["sessiond"].state == got["database"].state
        assert got["sessiond"].state["at"] == "2026-01-02T03:04:05Z"
        assert got["sessiond"].state["user:thing"] == "<opaque>"
        assert [e.model_dump() for e in got["sessiond"].events] == [
            e.model_dump() for e in got["database"].events]

    async def test_append_after_delete_is_not_found(self, stores: dict[str, Any]) -> None:
        """Deleted under a loaded session object: SessionNotFoundError, not StaleSessionError."""
        from google.adk.errors.session_not_found_error import SessionNotFoundError as NotFound

        for store in stores.values():
            session = await store.create_session(app_name="gone", user_id="u", session_id="s")
            await store.append_event(session, make_event(0, 1))
            await store.delete_session(app_name="gone", user_id="u", session_id="s")
            with pytest.raises(NotFound):
                await store.append_event(session, make_event(0, 2))

    async def test_two_events_with_one_id_are_refused(self, stores: dict[str, Any]) -> None:
        """A second, different event under a stored id raises (the SQL store's primary key
        does); nothing of it is stored. The same event again is a retry: stored once."""
        ours = stores["sessiond"]
        session = await ours.create_session(app_name="dup", user_id="u", session_id="s")
        first = make_event(0, 1)
        await ours.append_event(session, first)
        other = make_event(1, 2)
        other.id = first.id
        with pytest.raises(AlreadyExistsError, match=first.id):
            await ours.append_event(session, copy.deepcopy(other))  # this object has it
        fresh = await ours.get_session(app_name="dup", user_id="u", session_id="s")
        assert fresh is not None
        stale = copy.deepcopy(fresh)
        await ours.append_event(fresh, make_event(0, 3))
        with pytest.raises(AlreadyExistsError):  # through a copy that never saw it: the store
            await ours.append_event(stale, copy.deepcopy(other))
        await ours.append_event(stale, copy.deepcopy(first))  # a retry: no error, no copy
        got = await ours.get_session(app_name="dup", user_id="u", session_id="s")
        assert got is not None and [e.id for e in got.events] == [
            first.id, fresh.events[-1].id]
        assert got.events[0].model_dump() == first.model_dump()
        theirs = stores["database"]
        session = await theirs.create_session(app_name="dup", user_id="u", session_id="s")
        await theirs.append_event(session, copy.deepcopy(first))
        from sqlalchemy.exc import IntegrityError

        with pytest.raises(IntegrityError):
            await theirs.append_event(session, copy.deepcopy(other))

    async def test_equal_timestamps_read_back_in_id_order(self, stores: dict[str, Any]) -> None:
        """Events appended out of time order, some at one timestamp: read back, and cut by
        num_recent_events, in DatabaseSessionService's order (timestamp, then id)."""
        got = {}
        for name, store in stores.items():
            session = await store.create_session(app_name="order", user_id="u",
                                                 session_id="s")
            for eid, ts in (("e-c", 5.0), ("e-a", 5.0), ("e-b", 5.0), ("e-z", 4.0),
                            ("e-y", 6.0)):
                await store.append_event(session, Event(
                    id=eid, author="user", invocation_id="i", timestamp=1_700_000_000.0 + ts))
            got[name] = [[e.id for e in (await store.get_session(
                app_name="order", user_id="u", session_id="s", config=config)).events]
                for config in (None, GetSessionConfig(num_recent_events=3),
                               GetSessionConfig(after_timestamp=1_700_000_005.0))]
        assert got["sessiond"] == got["database"]
        assert got["sessiond"][0] == ["e-z", "e-a", "e-b", "e-c", "e-y"]



class TestTtl:
    async def test_ttl_as_vertex_ai_session_service(self, short_dir: str) -> None:
        """create_session(ttl="7200s" or seconds), as VertexAiSessionService, or the
        service's own ttl: the session's idle TTL. Once it passed the session is gone:
        get_session answers None, list_sessions leaves it out, its id can be created
        again, and retention removes it."""
        from sessiond.integrations.adk import session_id_for, ttl_seconds

        assert [ttl_seconds(t) for t in ("7200s", 30, "1.5s", None)] == [7200, 30, 2, None]
        for bad in ("soon", 0, "0s"):
            with pytest.raises(ValueError):
                ttl_seconds(bad)
        config = daemon_config(short_dir, expire_every_s=0.01)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            service = SessiondSessionService(d.socket, ttl="3600s")
            with pytest.raises(ValueError, match="expire_time"):
                await service.create_session(app_name="t", user_id="u",
                                             expire_time="2030-01-01T00:00:00Z")
            kept = await service.create_session(app_name="t", user_id="u", session_id="k")
            short = await service.create_session(app_name="t", user_id="u", session_id="s",
                                                 ttl="1s")
            await service.append_event(short, make_event(0, 1))
            sid = session_id_for("t", "u", "s")
            assert (await c.get_session(sid)).ttl_s == 1
            assert (await c.get_session(session_id_for("t", "u", "k"))).ttl_s == 3600

            async def expired() -> bool:
                return (await c.get_session(sid)).status == "expired"

            await eventually(expired, "the session to expire")
            assert await service.get_session(app_name="t", user_id="u", session_id="s") is None
            listed = await service.list_sessions(app_name="t", user_id="u")
            assert [s.id for s in listed.sessions] == [kept.id]
            from google.adk.errors import StaleSessionError
            with pytest.raises(StaleSessionError):  # an object loaded before: it moved on
                await service.append_event(short, make_event(0, 2))
            assert (await c.cleanup(older_than_days=0)).session_ids == [sid]
            again = await service.create_session(app_name="t", user_id="u", session_id="s")
            assert again.events == []
            await service.close()

    async def test_an_expired_id_is_free_before_retention(self, short_dir: str) -> None:
        config = daemon_config(short_dir, expire_every_s=0.01)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            from sessiond.integrations.adk import session_id_for

            service = SessiondSessionService(d.socket)
            await service.create_session(app_name="t", user_id="u", session_id="s", ttl=1)
            sid = session_id_for("t", "u", "s")

            async def expired() -> bool:
                return (await c.get_session(sid)).status == "expired"

            await eventually(expired, "the session to expire")
            fresh = await service.create_session(app_name="t", user_id="u", session_id="s",
                                                 state={"k": 1})
            assert fresh.state == {"k": 1} and fresh.events == []
            assert (await c.get_session(sid)).status == "active"
            with pytest.raises(AlreadyExistsError):
                await service.create_session(app_name="t", user_id="u", session_id="s")
            await service.close()


class MeteredLlm(BaseLlm):
    """An offline model that reports token usage as Gemini does (usage_metadata)."""

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        yield LlmResponse(
            content=types.Content(role="model", parts=[types.Part(text="metered")]),
            model_version="stub-1",
            usage_metadata=types.GenerateContentResponseUsageMetadata(
                prompt_token_count=100, candidates_token_count=20, thoughts_token_count=5,
                total_token_count=125))


async def test_runner_usage_is_recorded_with_its_event(daemon: Daemon,
                                                       client: AsyncClient) -> None:
    """Two Runner turns of a model that reports usage_metadata: the session's token_usage
    holds both (prompt in; candidates and thinking out), each recorded in its event's own
    write; the cost is 0 without prices and priced with them."""
    from sessiond.integrations.adk import session_id_for

    agent = LlmAgent(name="helper", model=MeteredLlm(model="stub"), instruction="Be brief.")
    for app, prices in (("free", None), ("priced", {"stub-1": (1.0, 4.0)})):
        service = SessiondSessionService(daemon.socket, prices=prices)
        runner = Runner(agent=agent, app_name=app, session_service=service)
        await service.create_session(app_name=app, user_id="u", session_id="s")
        for text in ("one", "two"):
            async for _ in runner.run_async(user_id="u", session_id="s", new_message=types.Content(
                    role="user", parts=[types.Part(text=text)])):
                pass
        await service.close()
        sid = session_id_for(app, "u", "s")
        usage = (await client.get_session(sid)).token_usage
        assert (usage.input_tokens, usage.output_tokens) == (200, 50)
        assert usage.estimated_cost == (0.0 if prices is None else
                                        pytest.approx(2 * (100 * 1.0 + 25 * 4.0) / 1e6))
        recorded = (await client.read_events(sid, types=["tokens.recorded"])).events
        assert [e.data.model for e in recorded] == ["stub-1", "stub-1"]
        messages = (await client.read_events(sid, types=["message.appended"])).events
        # Each in the same write as the model's message: the version right after it.
        assert {e.version for e in recorded} <= {m.version + 1 for m in messages}
