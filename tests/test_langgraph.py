"""SessiondSaver: LangGraph's conformance suite, and a real graph with an interrupt across a restart."""

from __future__ import annotations

import json
from typing import Any, TypedDict

import anyio
import pytest

from conftest import Daemon, daemon_config, running_daemon
from sdk_extras import require_sdk

require_sdk("langgraph", "langgraph")
require_sdk("langgraph.checkpoint.conformance", "sdk-tests")
from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402
from sessiond.integrations.langgraph import SessiondSaver  # noqa: E402

pytestmark = pytest.mark.anyio


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


class Draft(TypedDict, total=False):
    topic: str
    context: str  # large and never changed after the first step
    draft: str
    approved: bool


def build() -> StateGraph:
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
    thread = {"configurable": {"thread_id": "review-1"}}
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
