"""SessiondSaver: LangGraph's conformance suite, and a real graph with an interrupt across a
restart."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, TypedDict

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from sdk_extras import require_sdk

require_sdk("langgraph", "langgraph")
require_sdk("langgraph.checkpoint.conformance", "sdk-tests")
from langchain_core.messages import AnyMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.channels import DeltaChannel  # noqa: E402
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

from sessiond.integrations.langgraph import SessiondSaver  # noqa: E402

# The adapter's tests talk through the client: their PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]


async def test_conformance_suite_passes_every_capability(daemon: Daemon) -> None:
    """langgraph-checkpoint-conformance: base and extended capabilities, all detected, all pass."""
    @checkpointer_test(name="SessiondSaver")
    async def saver() -> Any:
        s = SessiondSaver(daemon.socket)
        yield s
        await s.aclose()
        s.close()

    report = await validate(saver)
    failures = {cap: r.failures for cap, r in report.results.items() if not r.passed}
    assert failures == {}
    assert set(report.results) == {"put", "put_writes", "get_tuple", "list", "delete_thread",
                                   "delete_for_runs", "copy_thread", "prune"}
    assert all(r.detected and r.tests_passed > 0 for r in report.results.values())
    assert sum(r.tests_passed for r in report.results.values()) == 81


class Draft(TypedDict, total=False):
    topic: str
    context: str  # large and never changed after the first step
    draft: str
    approved: bool


def build() -> StateGraph[Draft]:
    def write(state: Draft) -> Draft:
        return {"draft": f"a draft about {state['topic']}"}

    def review(state: Draft) -> Draft:
        answer = interrupt({"draft": state["draft"]})
        return {"approved": answer == "yes"}

    builder = StateGraph(Draft)
    builder.add_node("write", write)
    builder.add_node("review", review)
    builder.add_edge(START, "write")
    builder.add_edge("write", "review")
    builder.add_edge("review", END)
    return builder


async def test_interrupted_graph_resumes_after_a_restart(short_dir: str) -> None:
    """A compiled StateGraph stops at interrupt(); after a daemon restart it resumes from the
    checkpoint, and get_state_history (async and sync) walks every step."""
    config = daemon_config(short_dir)
    thread: RunnableConfig = {"configurable": {"thread_id": "review-1"}}
    context = "background " * 400
    async with running_daemon(config) as d:
        saver = SessiondSaver(d.socket)
        graph = build().compile(checkpointer=saver)
        first = await graph.ainvoke({"topic": "sessiond", "context": context}, thread)
        assert first["__interrupt__"][0].value == {"draft": "a draft about sessiond"}
        assert (await graph.aget_state(thread)).next == ("review",)
        await saver.aclose()
        saver.close()
        # Only changed channels are stored per step: the context is in one event only.
        rows = d.sql("SELECT data FROM events WHERE session_id = 'review-1'"
                     " AND type = 'graph.checkpoint' ORDER BY version")
        holding = [json.loads(r[0])["blobs"].keys() for r in rows]
        assert sum("context" in blobs for blobs in holding) == 1, holding
    async with running_daemon(config) as d:
        saver = SessiondSaver(d.socket)
        graph = build().compile(checkpointer=saver)
        done = await graph.ainvoke(Command(resume="yes"), thread)
        assert (done["approved"], done["context"], done["draft"]) == (
            True, context, "a draft about sessiond")
        history = [s async for s in graph.aget_state_history(thread)]
        assert history[0].values["approved"] is True and history[0].next == ()
        assert history[-1].next == ("__start__",)
        assert [s.config["configurable"]["checkpoint_id"] for s in history] == sorted(
            (s.config["configurable"]["checkpoint_id"] for s in history), reverse=True)
        sync_history = await anyio.to_thread.run_sync(
            lambda: list(graph.get_state_history(thread)))
        assert [s.values for s in sync_history] == [s.values for s in history]
        await saver.aclose()
        saver.close()


def connected(saver: SessiondSaver) -> tuple[bool, bool]:
    """Whether the saver's async and blocking connections are open."""
    return saver.aclient._conn is not None, saver.client._sock is not None


async def test_from_socket_with_and_async_with(short_dir: str) -> None:
    """SessiondSaver.from_socket (alias from_conn_string, as SqliteSaver's) in `with` and
    `async with`: the saver works inside and its connections are closed at the end; a
    9 MB state value goes through a real graph and back."""
    config = daemon_config(short_dir)
    thread: RunnableConfig = {"configurable": {"thread_id": "big-1"}}
    context = "c" * 9_000_000
    async with running_daemon(config) as d:
        async with SessiondSaver.from_socket(d.socket) as saver:
            graph = build().compile(checkpointer=saver)
            first = await graph.ainvoke({"topic": "big", "context": context}, thread)
            assert first["context"] == context
            assert connected(saver)[0]
        assert connected(saver) == (False, False)

        def sync() -> Any:
            with SessiondSaver.from_conn_string(d.socket) as saver:
                state = build().compile(checkpointer=saver).get_state(thread)
                assert connected(saver)[1]
            assert connected(saver) == (False, False)
            with SessiondSaver(d.socket) as plain:  # the saver itself is a context manager too
                assert plain.get_tuple(thread) is not None
            return state

        state = await anyio.to_thread.run_sync(sync)
        assert state.values["context"] == context and state.next == ("review",)


async def test_a_cap_hit_is_a_value_error_naming_the_setting(short_dir: str) -> None:
    """Over max_checkpoint_bytes, or a line over max_request_bytes: a ValueError naming the
    setting, and the same saver goes on."""
    config = daemon_config(short_dir, max_checkpoint_bytes=100_000, max_request_bytes=400_000)
    thread: RunnableConfig = {"configurable": {"thread_id": "cap-1"}}
    async with running_daemon(config) as d, SessiondSaver.from_socket(d.socket) as saver:
        graph = build().compile(checkpointer=saver)
        with pytest.raises(ValueError, match="max_checkpoint_bytes"):
            await graph.ainvoke({"topic": "t", "context": "x" * 200_000}, thread)
        with pytest.raises(ValueError, match="max_request_bytes"):
            await graph.ainvoke({"topic": "t", "context": "x" * 500_000}, thread)
        small = await graph.ainvoke({"topic": "t", "context": "fine"},
                                    {"configurable": {"thread_id": "cap-2"}})
        assert small["context"] == "fine"

        def sync() -> None:
            with pytest.raises(ValueError, match="max_request_bytes"):
                graph.invoke({"topic": "t", "context": "x" * 500_000},
                             {"configurable": {"thread_id": "cap-3"}})
            assert graph.invoke({"topic": "t", "context": "ok"},
                                {"configurable": {"thread_id": "cap-4"}})["context"] == "ok"

        await anyio.to_thread.run_sync(sync)


async def test_four_processes_put_concurrently(daemon: Daemon) -> None:
    """Four real processes put checkpoints and writes to one thread at once: every
    checkpoint and every write is there once."""
    from sdk_extras import burst

    await burst("langgraph", daemon.socket, 30)
    async with SessiondSaver.from_socket(daemon.socket) as saver:
        tuples = [t async for t in saver.alist({"configurable": {"thread_id": "race"}})]
        ids = [t.config["configurable"]["checkpoint_id"] for t in tuples]
        assert sorted(ids) == sorted(f"p{i}-{n:04}" for i in range(4) for n in range(30))
        for t in tuples:
            name, n = t.config["configurable"]["checkpoint_id"].split("-")
            assert t.checkpoint["channel_values"] == {"by": f"{name} {int(n)}"}
            assert t.pending_writes is not None
            assert [w[1:] for w in t.pending_writes] == [("by", f"{name} write {int(n)}")]


class TestTtl:
    async def test_ttl_config_is_each_new_threads_idle_ttl(self, short_dir: str) -> None:
        """TTLConfig(default_ttl=minutes): every thread the saver creates gets that idle TTL
        (the namespace default otherwise); it expires, and retention removes it."""
        from sessiond import AsyncClient
        from sessiond.integrations.langgraph import session_id_for, ttl_seconds

        assert ttl_seconds({"default_ttl": 0.5, "refresh_on_read": False}) == 30
        assert ttl_seconds({"default_ttl": 0.001}) == 1
        assert ttl_seconds(None) is None
        with pytest.raises(ValueError, match="refresh_on_read"):
            ttl_seconds({"default_ttl": 1, "refresh_on_read": True})
        config = daemon_config(short_dir, expire_every_s=0.01,
                               default_ttl_s={"langgraph": 3600})
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            short = SessiondSaver(d.socket, ttl={"default_ttl": 1 / 60})
            plain = SessiondSaver(d.socket)
            for saver, thread_id in ((short, "short-1"), (plain, "plain-1")):
                graph = build().compile(checkpointer=saver)
                await graph.ainvoke({"topic": "t"}, {"configurable": {"thread_id": thread_id}})
            assert (await c.get_session(session_id_for("plain-1"))).ttl_s == 3600
            sid = session_id_for("short-1")
            assert (await c.get_session(sid)).ttl_s == 1

            async def expired() -> bool:
                return (await c.get_session(sid)).status == "expired"

            await eventually(expired, "the thread to expire")
            assert (await c.get_session(session_id_for("plain-1"))).status == "active"
            assert (await c.cleanup(older_than_days=0)).session_ids == [sid]
            for saver in (short, plain):
                await saver.aclose()
                saver.close()


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


async def test_messages_usage_metadata_is_recorded_once(daemon: Daemon) -> None:
    """A graph whose node answers with an AIMessage carrying usage_metadata (as every
    LangChain chat model does): the thread's token_usage holds each call once, though the
    message is in the task's writes and in every later checkpoint; cost with prices."""
    from langchain_core.messages import AIMessage, HumanMessage

    from sessiond import AsyncClient
    from sessiond.integrations.langgraph import session_id_for

    def model(state: Chat) -> Chat:
        return {"messages": [AIMessage(
            content="hi", response_metadata={"model_name": "stub-chat"},
            usage_metadata={"input_tokens": 30, "output_tokens": 4, "total_tokens": 34})]}

    builder = StateGraph(Chat)
    builder.add_node("model", model)
    builder.add_edge(START, "model")
    builder.add_edge("model", END)
    saver = SessiondSaver(daemon.socket, prices={"stub-chat": (3.0, 15.0)})
    graph = builder.compile(checkpointer=saver)
    thread: RunnableConfig = {"configurable": {"thread_id": "usage-1"}}
    for text in ("one", "two"):
        await graph.ainvoke({"messages": [HumanMessage(content=text)]}, thread)
    sync = SessiondSaver(daemon.socket)  # the blocking path too
    await anyio.to_thread.run_sync(lambda: builder.compile(checkpointer=sync).invoke(
        {"messages": [HumanMessage(content="three")]}, thread))
    async with AsyncClient(daemon.socket) as c:
        usage = (await c.get_session(session_id_for("usage-1"))).token_usage
    assert (usage.input_tokens, usage.output_tokens) == (90, 12)
    assert usage.estimated_cost == pytest.approx(2 * (30 * 3.0 + 4 * 15.0) / 1e6)
    for s in (saver, sync):
        await s.aclose()
        s.close()


def _concat(state: list[str], writes: Sequence[list[str]]) -> list[str]:
    return [*state, *(x for w in writes for x in w)]


class Deltas(TypedDict, total=False):
    items: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]
    n: int


def delta_graph() -> StateGraph[Deltas]:
    """A loop that appends to a DeltaChannel, with two parallel writers each round."""
    def left(state: Deltas) -> Deltas:
        return {"items": [f"l{state.get('n', 0)}"]}

    def right(state: Deltas) -> Deltas:
        return {"items": [f"r{state.get('n', 0)}"]}

    def count(state: Deltas) -> Deltas:
        return {"n": state.get("n", 0) + 1}

    builder = StateGraph(Deltas)
    for name, node in (("left", left), ("right", right), ("count", count)):
        builder.add_node(name, node)
    builder.add_edge(START, "left")
    builder.add_edge(START, "right")
    builder.add_edge("left", "count")
    builder.add_edge("right", "count")
    builder.add_conditional_edges("count", lambda s: END if s["n"] >= 4 else ["left", "right"])
    return builder


def comparable(history: Mapping[str, Any]) -> dict[str, Any]:
    """A delta history without task ids (they hash each run's own checkpoint ids)."""
    return {ch: {"writes": [(c, v) for _, c, v in h["writes"]],
                 **({"seed": h["seed"]} if "seed" in h else {})} for ch, h in history.items()}


async def test_delta_channel_history_from_the_index(daemon: Daemon) -> None:
    """get_delta_channel_history (sync and async) answers what LangGraph's default walk
    over get_tuple answers, at every checkpoint of a thread with parallel writers and a
    fork; a DeltaChannel graph on it reads back the state InMemorySaver's run holds."""
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.memory import InMemorySaver

    assert "aget_delta_channel_history" in SessiondSaver.__dict__  # the capability's test
    states = {}
    for name, saver in (("sessiond", SessiondSaver(daemon.socket)),
                        ("memory", InMemorySaver())):
        graph = delta_graph().compile(checkpointer=saver)
        thread: RunnableConfig = {"configurable": {"thread_id": f"delta-{name}"}}
        await graph.ainvoke({"items": ["start"], "n": 0}, thread)
        history = [s async for s in graph.aget_state_history(thread)]
        fork = await graph.aupdate_state(history[3].config, {"items": ["forked"]},
                                         as_node="count")
        await graph.ainvoke(None, fork)
        states[name] = (await graph.aget_state(thread)).values
        if isinstance(saver, SessiondSaver):
            ours = saver
            configs = [s.config async for s in graph.aget_state_history(thread)]
    assert states["sessiond"] == states["memory"]
    assert "forked" in states["sessiond"]["items"]
    for config in configs:
        for channels in (["items"], ["items", "n", "nothing"]):
            expected = await BaseCheckpointSaver.aget_delta_channel_history(
                ours, config=config, channels=channels)
            got = await ours.aget_delta_channel_history(config=config, channels=channels)
            assert comparable(got) == comparable(expected), config
            blocking = await anyio.to_thread.run_sync(
                lambda config=config, channels=channels: ours.get_delta_channel_history(
                    config=config, channels=channels))
            assert comparable(blocking) == comparable(expected)
    assert await ours.aget_delta_channel_history(config=configs[0], channels=[]) == {}
    await ours.aclose()
    ours.close()


async def test_list_filters_by_dotted_metadata_paths_as_sqlite_saver(daemon: Daemon) -> None:
    """list(filter={"user.id": ...}): a path into nested metadata, as SqliteSaver reads it
    (json_extract); a plain key, a missing one and a path through a non-object too."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    def run() -> None:  # the blocking saver, off the loop that serves the daemon
        ours = SessiondSaver(daemon.socket)
        with SqliteSaver.from_conn_string(":memory:") as theirs:
            for saver in (ours, theirs):
                for i, meta in enumerate([{"source": "input", "user": {"id": "u1", "tier": 2}},
                                          {"source": "loop", "user": {"id": "u2"}},
                                          {"source": "loop", "user": "flat"}]):
                    saver.put({"configurable": {"thread_id": "dotted", "checkpoint_ns": ""}},
                              empty_checkpoint(), {**meta, "step": i},  # type: ignore[typeddict-item]
                              {})
            for flt in ({"user.id": "u1"}, {"user.id": "u2"}, {"user.tier": 2},
                        {"source": "loop"}, {"user.id": "nobody"}, {"user.id.deeper": "x"}):
                got = [[t.metadata["step"]  # type: ignore[typeddict-item]
                        for t in s.list(None, filter=flt)] for s in (ours, theirs)]
                assert got[0] == got[1], flt
        ours.close()

    await anyio.to_thread.run_sync(run)
