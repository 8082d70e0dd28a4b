"""SessiondSession against the OpenAI Agents SDK's own SQLiteSession, and under a real Runner."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_extras import require_sdk

agents = require_sdk("agents", "openai-agents")
from agents import Agent, Runner, SQLiteSession, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.memory.session_settings import SessionSettings  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from openai.types.responses import ResponseOutputMessage, ResponseOutputText  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.openai_agents import SessiondSession, session_id_for  # noqa: E402

# The adapter's tests talk through the client: their PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
set_tracing_disabled(True)  # no trace export: these tests never touch the network

ITEMS: list[Any] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_1", "name": "weather",
     "arguments": '{"city": "Paris"}', "id": "fc_1", "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "It is 18C and sunny.", "annotations": []}]},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"role": "developer", "content": "Answer briefly."},
    {"role": "user", "content": [{"type": "input_text", "text": "And tomorrow? ünïcødé"}]},
]
# Values plain JSON cannot hold: they must come back as SQLiteSession (json.dumps) gives them.
EDGE_ITEMS: list[Any] = [
    {"role": "user", "content": "inf and nan", "extra": [float("inf"), float("-inf")]},
    {"type": "function_call_output", "call_id": "c", "output": {"score": float("nan")}},
    {"role": "user", "content": "lone \ud800 surrogate"},
    {"role": "user", "content": [{"type": "input_text", "text": "pair 😀 and lone \udfff"}]},
    {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}", "\udc80": 1},
    {"role": "user", "content": "ok 😀", "n": 2**70},
]
POOL = ITEMS + EDGE_ITEMS
counter = itertools.count()


def both(tmp: Path, socket: str, **kwargs: Any) -> tuple[SQLiteSession, SessiondSession]:
    name = f"conv/{next(counter)} with spaces"  # not a sessiond id: mapped, original kept
    return (SQLiteSession(name, str(tmp / "sdk.db"), **kwargs),
            SessiondSession(name, socket=socket, **kwargs))


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(range(len(POOL))), max_size=4)),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-2, 8))),
    st.tuples(st.just("pop")),
    st.tuples(st.just("clear")),
), max_size=20)


class TestDifferential:
    @settings(max_examples=30, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(script=operations)
    async def test_same_answers_as_sqlite_session(self, daemon: Daemon, tmp_path: Path,
                                                  script: list[tuple[Any, ...]]) -> None:
        """Random add/get(limit)/pop/clear sequences: every answer equals SQLiteSession's."""
        reference, ours = both(tmp_path, daemon.socket)
        same = json.dumps  # NaN != NaN: compare what each gives back as its JSON text
        try:
            for op in script:
                if op[0] == "add":
                    items = [POOL[i] for i in op[1]]
                    await reference.add_items(items)
                    await ours.add_items(items)
                elif op[0] == "get":
                    assert same(await ours.get_items(op[1])) == same(
                        await reference.get_items(op[1])), op
                elif op[0] == "pop":
                    assert same(await ours.pop_item()) == same(await reference.pop_item())
                else:
                    await reference.clear_session()
                    await ours.clear_session()
            assert same(await ours.get_items()) == same(await reference.get_items())
        finally:
            reference.close()
            ours.close()

    async def test_session_settings_limit(self, daemon: Daemon, tmp_path: Path) -> None:
        """SessionSettings(limit) is the default limit, as in the SDK's own sessions."""
        reference, ours = both(tmp_path, daemon.socket, session_settings=SessionSettings(limit=2))
        await reference.add_items(ITEMS)
        await ours.add_items(ITEMS)
        assert await ours.get_items() == await reference.get_items() == ITEMS[-2:]
        assert await ours.get_items(5) == ITEMS[-5:]
        reference.close()
        ours.close()

    async def test_session_settings_dict_is_coerced_as_the_sdk_stores(
            self, daemon: Daemon, tmp_path: Path) -> None:
        """A dict is coerced to SessionSettings (so Runner.run reads its limit); an unknown
        key is the TypeError SQLiteSession raises."""
        reference, ours = both(tmp_path, daemon.socket, session_settings={"limit": 1})
        assert isinstance(ours.session_settings, SessionSettings)
        assert ours.session_settings == reference.session_settings
        await reference.add_items(ITEMS)
        await ours.add_items(ITEMS)
        assert await ours.get_items() == await reference.get_items() == ITEMS[-1:]
        result = await Runner.run(Agent(name="a", model=StubModel()), "hi", session=ours)
        assert result.final_output == "answer 1"
        reference.close()
        ours.close()
        with pytest.raises(TypeError) as theirs:
            SQLiteSession("x", str(tmp_path / "sdk.db"), session_settings={"limti": 1})
        with pytest.raises(TypeError) as mine:
            SessiondSession("x", socket=daemon.socket, session_settings={"limti": 1})
        assert str(mine.value) == str(theirs.value)


class TestStored:
    async def test_items_are_messages_and_pop_clear_are_events(self, daemon: Daemon,
                                                              client: AsyncClient) -> None:
        """Items are readable messages (whole item in metadata); pop and clear stay in history."""
        session = SessiondSession("user-42", socket=daemon.socket)
        await session.add_items(ITEMS[:4])
        messages = (await client.list_messages("user-42")).messages
        assert [(m.role, m.content, m.tool_call_id) for m in messages] == [
            ("user", "What is the weather in Paris?", None),
            ("assistant", 'weather({"city": "Paris"})', None),
            ("tool", "18C and sunny", "call_1"),
            ("assistant", "It is 18C and sunny.", None)]
        # The item is kept whole but for the text its content already holds (stored once).
        assert messages[1].metadata["item"] == {**ITEMS[1], "arguments": ""}
        assert messages[1].metadata["spans"] == [[["arguments"], 8, 17]]
        assert messages[2].metadata["item"]["output"] == ""
        assert await session.pop_item() == ITEMS[3]
        await session.clear_session()
        assert await session.get_items() == []
        types = [e.type for e in (await client.read_events("user-42")).events]
        assert types == ["session.created"] + ["message.appended"] * 4 + ["messages.truncated"] * 2
        state = await client.get_session("user-42")
        assert (state.namespace, state.metadata) == ("openai-agents", {"sdk_session_id": "user-42"})
        assert session_id_for("a b") != session_id_for("a  b") and session_id_for("ok-1") == "ok-1"
        # Deleted behind the session's back (say, by retention): the next add starts it again.
        await client.delete_session("user-42")
        await session.add_items(ITEMS[:1])
        assert await session.get_items() == ITEMS[:1]
        session.close()


class StubModel(Model):
    """An offline model: answers each turn with a fixed text and remembers what it was sent."""

    def __init__(self) -> None:
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions: Any, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any,
                           **kwargs: Any) -> ModelResponse:
        self.inputs.append(input)
        text = f"answer {len(self.inputs)}"
        message = ResponseOutputMessage(
            id=f"msg_{len(self.inputs)}", role="assistant", status="completed", type="message",
            content=[ResponseOutputText(text=text, type="output_text", annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


class TestRunner:
    async def test_runner_keeps_history_across_runs_and_a_restart(self, short_dir: str) -> None:
        """Runner.run twice, then again after the daemon restarts: the model sees all turns."""
        config = daemon_config(short_dir)
        model = StubModel()
        agent = Agent(name="assistant", instructions="Be brief.", model=model)
        async with running_daemon(config) as d:
            session = SessiondSession("chat-1", socket=d.socket)
            first = await Runner.run(agent, "Hello", session=session)
            second = await Runner.run(agent, "And again", session=session)
            assert (first.final_output, second.final_output) == ("answer 1", "answer 2")
            session.close()
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            session = SessiondSession("chat-1", socket=d.socket)
            third = await Runner.run(agent, "Still there?", session=session)
            assert third.final_output == "answer 3"
            texts = [m.content for m in (await c.list_messages("chat-1")).messages]
            assert texts == ["Hello", "answer 1", "And again", "answer 2", "Still there?",
                             "answer 3"]
            session.close()
        seen = [item.get("content") if isinstance(item.get("content"), str) else
                item["content"][0]["text"] for item in model.inputs[2]]
        assert seen == ["Hello", "answer 1", "And again", "answer 2", "Still there?"]




class TestParity:
    async def test_json_edge_values_as_sqlite_session(self, daemon: Daemon,
                                                      tmp_path: Path) -> None:
        """inf, NaN, lone surrogates and huge ints come back as SQLiteSession gives them back;
        bytes are refused with SQLiteSession's TypeError, and nothing of that add is stored."""
        import json

        reference, ours = both(tmp_path, daemon.socket)
        for item in EDGE_ITEMS:
            await reference.add_items([item])
            await ours.add_items([item])
        assert json.dumps(await ours.get_items()) == json.dumps(await reference.get_items())
        assert json.dumps(await ours.get_items(2)) == json.dumps(await reference.get_items(2))
        raised = []
        bytes_item: Any = {"role": "user", "content": b"bytes"}  # not JSON: refused by both
        for session in (reference, ours):
            with pytest.raises(TypeError) as error:
                await session.add_items([ITEMS[0], bytes_item])
            raised.append(str(error.value))
        assert raised[0] == raised[1]
        assert json.dumps(await ours.pop_item()) == json.dumps(await reference.pop_item())
        assert json.dumps(await ours.get_items()) == json.dumps(await reference.get_items())
        reference.close()
        ours.close()

    async def test_close_is_synchronous_as_sqlite_session(self, daemon: Daemon,
                                                          tmp_path: Path) -> None:
        """close() returns None at once (no coroutine to forget), closes the connection,
        and the session then refuses use with RuntimeError, as SQLiteSession does."""
        import warnings

        reference, ours = both(tmp_path, daemon.socket)
        await ours.add_items(ITEMS[:1])
        protocol = ours.client._conn
        assert protocol is not None and protocol.transport is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            closers: list[Callable[[], object]] = [ours.close, reference.close]
            assert [close() for close in closers] == [None, None]
        await eventually(protocol.transport.is_closing, "the client's transport closing")
        for session in (reference, ours):
            with pytest.raises(RuntimeError, match="closed"):
                await session.add_items([])
            with pytest.raises(RuntimeError, match="closed"):
                await session.get_items()

    @pytest.mark.parametrize("size", [1_100_000, 9_000_000])
    async def test_large_items_are_stored_once(self, daemon: Daemon, client: AsyncClient,
                                               size: int) -> None:
        """Items of 1.1 MB and 9 MB: stored (their text once, in the content), read back."""
        session = SessiondSession(f"big-{size}", socket=daemon.socket)
        item = {"type": "function_call_output", "call_id": "c", "output": "y" * size}
        await session.add_items([ITEMS[0], item])
        assert await session.get_items() == [ITEMS[0], item]
        # (a page ends at max_page_bytes: the big one may come on a page of its own)
        [message] = (await client.list_messages(f"big-{size}", after_sequence=0)).messages
        assert len(message.content) == size and message.metadata["item"]["output"] == ""
        # A structured output: its JSON text is the content, and it is not kept twice.
        rows = {"type": "function_call_output", "call_id": "d",
                "output": {"rows": [1.5] * (size // 10)}}
        await session.add_items([rows])
        assert (await session.get_items(1)) == [rows]
        [last] = (await client.list_messages(f"big-{size}", order="desc", limit=1)).messages
        assert last.content == json.dumps(rows["output"])
        assert last.metadata["item"]["output"] is None
        session.close()

    async def test_caps_raise_value_errors_naming_the_setting(self, short_dir: str) -> None:
        """Over max_message_bytes, and over max_request_bytes: a ValueError that names the
        setting, and the same connection goes on serving."""
        config = daemon_config(short_dir, max_message_bytes=10_000, max_request_bytes=50_000)
        async with running_daemon(config) as d:
            session = SessiondSession("caps", socket=d.socket)
            await session.add_items(ITEMS[:1])
            protocol = session.client._conn
            assert protocol is not None
            with pytest.raises(ValueError, match="max_message_bytes"):
                await session.add_items([{"role": "user", "content": "x" * 20_000}])
            with pytest.raises(ValueError, match="max_request_bytes"):
                await session.add_items([{"role": "user", "content": "x" * 9_000,
                                          "blob": "z" * 100_000}])
            assert await session.get_items() == ITEMS[:1]
            assert session.client._conn is protocol and not protocol.lost
            session.close()


async def test_four_processes_add_concurrently(daemon: Daemon) -> None:
    """Four real processes add to one session at once: every item once, each one's in order."""
    from sdk_extras import burst

    await burst("openai", daemon.socket, 40)
    session = SessiondSession("race", socket=daemon.socket)
    texts = [item["content"] for item in await session.get_items()]
    assert sorted(texts) == sorted(f"p{i} {n}" for i in range(4) for n in range(40))
    for i in range(4):
        assert [t for t in texts if t.startswith(f"p{i} ")] == [f"p{i} {n}" for n in range(40)]
    session.close()


class TestTtl:
    async def test_ttl_as_redis_session_ttl(self, short_dir: str) -> None:
        """RedisSession's ttl: the session's idle TTL. Once it passed the items are gone
        (get_items empty, pop None) and the next add_items starts the session again; the
        old items stay in its events. A ttl given to an existing session is set on it."""
        with pytest.raises(ValueError, match="ttl"):
            SessiondSession("x", ttl=0)
        config = daemon_config(short_dir, expire_every_s=0.01)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            session = SessiondSession("ttl-1", socket=d.socket, ttl=1)
            await session.add_items(ITEMS[:2])
            assert (await c.get_session("ttl-1")).ttl_s == 1

            async def expired() -> bool:
                return (await c.get_session("ttl-1")).status == "expired"

            await eventually(expired, "the session to expire")
            assert await session.get_items() == []
            assert await session.pop_item() is None
            await session.add_items(ITEMS[2:3])
            assert await session.get_items() == ITEMS[2:3]
            view = await c.get_session("ttl-1")
            assert view.status == "active"
            appended = (await c.read_events("ttl-1", types=["message.appended"])).events
            assert len(appended) == 3  # the history keeps what expired
            again = SessiondSession("ttl-1", socket=d.socket, ttl=600)
            await again.add_items(ITEMS[3:4])
            assert (await c.get_session("ttl-1")).ttl_s == 600
            session.close()
            again.close()


class MeteredModel(StubModel):
    """StubModel reporting token usage for each response; named as the SDK's models are
    (`OpenAIResponsesModel.model`)."""

    model = "metered"

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        response = await super().get_response(*args, **kwargs)
        return ModelResponse(output=response.output, response_id=None, usage=Usage(
            requests=1, input_tokens=50, output_tokens=7, total_tokens=57))


class TestUsage:
    async def test_store_run_usage_as_advanced_sqlite_session(
            self, daemon: Daemon, client: AsyncClient, tmp_path: Path) -> None:
        """store_run_usage after two Runner.run calls: get_session_usage answers as
        AdvancedSQLiteSession's; the view's token_usage (what sessionctl show, top and the
        metrics read) holds the tokens; cost 0 without prices, priced with them."""
        from agents.extensions.memory import AdvancedSQLiteSession

        theirs = AdvancedSQLiteSession(session_id="u1", db_path=str(tmp_path / "adv.db"),
                                       create_tables=True)
        ours = SessiondSession("usage-1", socket=daemon.socket)
        priced = SessiondSession("usage-2", socket=daemon.socket,
                                 prices={"metered": (2.0, 10.0)})
        assert await ours.get_session_usage() is None
        agent = Agent(name="a", model=MeteredModel())
        for session in (theirs, ours, priced):
            for text in ("one", "two"):
                await session.store_run_usage(await Runner.run(agent, text, session=session))
        assert await ours.get_session_usage() == await theirs.get_session_usage() == {
            "requests": 2, "input_tokens": 100, "output_tokens": 14, "total_tokens": 114,
            "total_turns": 2}
        usage = (await client.get_session("usage-1")).token_usage
        assert (usage.input_tokens, usage.output_tokens, usage.estimated_cost) == (100, 14, 0.0)
        cost = (await client.get_session("usage-2")).token_usage.estimated_cost
        assert cost == pytest.approx(2 * (50 * 2.0 + 7 * 10.0) / 1e6)
        with pytest.raises(ValueError, match="branch"):
            await ours.get_session_usage("main")
        theirs.close()
        ours.close()
        priced.close()


class IdModel(StubModel):
    """StubModel with a response id per turn (the Runner compacts only after a response)."""

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        response = await super().get_response(*args, **kwargs)
        response.response_id = f"resp_{len(self.inputs)}"
        return response


class CompactingClient:
    """The OpenAI client's `responses.compact`, offline: the input it is given becomes one
    summary message (what the model would send back, shaped as the API's output)."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.responses = self

    async def compact(self, **kwargs: Any) -> Any:
        from types import SimpleNamespace

        self.calls.append(kwargs)
        texts = [str(i.get("content")) for i in kwargs.get("input", [])]
        summary = {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "summary: " + " | ".join(texts)}]}
        return SimpleNamespace(output=[summary], usage=None)


class TestCompaction:
    async def test_automatic_compaction_replaces_the_suffix_as_sqlite_session(
            self, daemon: Daemon, client: AsyncClient, tmp_path: Path) -> None:
        """OpenAIResponsesCompactionSession over SessiondSession with a history limit, so the
        model sees only the latest items: automatic compaction replaces that suffix in one
        write (the SDK's snapshot protocol), as over SQLiteSession. Without the snapshot the
        SDK cannot match the whole history to the exchange, and skips compaction."""
        from agents.memory import OpenAIResponsesCompactionSession

        settings = SessionSettings(limit=2)
        theirs = SQLiteSession("c1", str(tmp_path / "c.db"), session_settings=settings)
        ours = SessiondSession("compact-1", socket=daemon.socket, session_settings=settings)
        apis = []
        for store in (theirs, ours):
            api, model = CompactingClient(), IdModel()
            session = OpenAIResponsesCompactionSession(
                "c1", store, client=api, compaction_mode="input",  # type: ignore[arg-type]
                should_trigger_compaction=lambda ctx: ctx["response_id"] == "resp_3")
            for text in ("one", "two", "three"):
                await Runner.run(Agent(name="a", model=model), text, session=session)
            apis.append(api)
        assert apis[0].calls == apis[1].calls and len(apis[1].calls) == 1
        assert [i.get("content") for i in apis[1].calls[0]["input"]][::2] == ["two", "three"]
        items = await ours.get_items(limit=100)
        assert items == await theirs.get_items(limit=100)
        assert [i.get("content") for i in items[:1]] == ["one"] and len(items) == 3
        assert items[2]["content"][0]["text"].startswith("summary: two | ")
        # The replacement was one write: a messages.truncated and the summary, together.
        events = (await client.read_events("compact-1")).events
        cuts = [e for e in events if e.type == "messages.truncated"]
        assert [(e.data.reason, e.data.from_sequence) for e in cuts] == [("replaced", 2)]
        after = [e for e in events if e.version == cuts[0].version + 1]
        assert [e.type for e in after] == ["message.appended"]
        assert (await client.get_session("compact-1")).message_count == 3
        theirs.close()
        ours.close()

    async def test_a_stale_snapshot_replaces_nothing(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        """replace_suffix after another write: False, and the history is as it was (the
        write is conditional on the version the snapshot read)."""
        ours = SessiondSession("compact-2", socket=daemon.socket)
        await ours.add_items(ITEMS[:4])
        snapshot = await ours._get_compaction_snapshot(3)
        assert snapshot is not None and not snapshot.complete
        assert snapshot.items == ITEMS[1:4]
        await ours.add_items(ITEMS[4:5])
        summary = {"role": "user", "content": "summary"}
        assert await snapshot.replace_suffix(1, [summary]) is False
        assert await ours.get_items() == ITEMS[:5]
        fresh = await ours._get_compaction_snapshot(10)
        assert fresh is not None and fresh.complete and fresh.items == ITEMS[:5]
        assert await fresh.replace_suffix(2, [summary]) is True
        assert await ours.get_items() == [*ITEMS[:2], summary]
        # A whole-context snapshot's replacement is a compaction (issue 48): the five
        # messages stay in the conversation, the context starts at the summary.
        state = await client.get_session("compact-2")
        assert state.message_count == 5
        assert state.context is not None and state.context.through_sequence == 4
        ours.close()


class TestEncrypted:
    async def test_pop_with_a_wrong_key_as_the_sdks_other_stores(
            self, daemon: Daemon, client: AsyncClient, tmp_path: Path) -> None:
        """EncryptedSession.pop_item with a wrong key: over SQLiteSession the SDK
        authenticates inside SQLite's transaction and raises InvalidToken, nothing removed
        (a path it offers SQLiteSession alone); over any other store, its own SQLAlchemy
        store included, it pops every unreadable item and returns None. SessiondSession
        behaves as those, and the popped ciphertexts stay in the session's events."""
        from agents.extensions.memory import EncryptedSession, SQLAlchemySession
        from cryptography.fernet import InvalidToken

        stores: dict[str, Any] = {
            "sqlite": SQLiteSession("e1", str(tmp_path / "e.db")),
            "sqlalchemy": SQLAlchemySession.from_url(
                "e1", url=f"sqlite+aiosqlite:///{tmp_path / 'a.db'}", create_tables=True),
            "sessiond": SessiondSession("enc-1", socket=daemon.socket)}
        outcome: dict[str, Any] = {}
        for name, store in stores.items():
            right = EncryptedSession("e1", store, encryption_key="right key " * 4)
            wrong = EncryptedSession("e1", store, encryption_key="wrong key " * 4)
            await right.add_items(ITEMS[:3])
            try:
                outcome[name] = await wrong.pop_item()
            except InvalidToken:
                outcome[name] = "InvalidToken"
            outcome[name] = (outcome[name], len(await right.get_items()))
        assert outcome == {"sqlite": ("InvalidToken", 3), "sqlalchemy": (None, 0),
                           "sessiond": (None, 0)}
        events = (await client.read_events("enc-1")).events
        assert [e.type for e in events].count("message.appended") == 3
        assert [e.data.reason for e in events if e.type == "messages.truncated"] == \
            ["popped"] * 3
        stores["sqlite"].close()
        await stores["sqlalchemy"].engine.dispose()
        stores["sessiond"].close()
