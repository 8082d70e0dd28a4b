"""LangGraph's summarization as a compaction (issue 48): a node that replaces the whole
`messages` channel (RemoveMessage of every message, then the summary and what it keeps,
as langmem's SummarizationNode writes it) through SessiondSaver is a session.compacted
by "langgraph" in the thread's session; removing some messages is not. Offline."""

from __future__ import annotations

from typing import Annotated, TypedDict

import anyio
import pytest
from conftest import Daemon
from sdk_extras import require_sdk

require_sdk("langgraph", "langgraph")

from langchain_core.messages import (  # noqa: E402
    AIMessage,
    AnyMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
)
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.langgraph import SessiondSaver, session_id_for  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def answer(state: Chat) -> Chat:
    return {"messages": [AIMessage(content=f"answer {len(state['messages'])}")]}


def summarize(state: Chat) -> Chat:
    """After "drop", the oldest message alone is removed (not a compaction); else, from
    four messages on, the history is replaced by a summary and the last message."""
    messages = state["messages"]
    if messages[-2].content == "drop":
        return {"messages": [RemoveMessage(id=str(messages[0].id))]}
    if len(messages) >= 4:
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES),
                             SystemMessage(content=f"summary of {len(messages) - 1} messages"),
                             messages[-1]]}
    return {"messages": []}


def build() -> StateGraph[Chat]:
    builder = StateGraph(Chat)
    builder.add_node("answer", answer)
    builder.add_node("summarize", summarize)
    builder.add_edge(START, "answer")
    builder.add_edge("answer", "summarize")
    builder.add_edge("summarize", END)
    return builder


async def test_a_summary_that_replaces_the_messages_is_a_compaction(daemon: Daemon) -> None:
    saver = SessiondSaver(daemon.socket)
    graph = build().compile(checkpointer=saver)
    thread: RunnableConfig = {"configurable": {"thread_id": "lg-compact"}}
    await graph.ainvoke({"messages": [HumanMessage(content="one")]}, thread)  # 2: nothing
    await graph.ainvoke({"messages": [HumanMessage(content="drop")]}, thread)  # 4 -> 3
    state = await graph.ainvoke({"messages": [HumanMessage(content="three")]}, thread)
    assert [m.content for m in state["messages"]] == ["summary of 4 messages", "answer 4"]
    sync = SessiondSaver(daemon.socket)  # the blocking path too
    await anyio.to_thread.run_sync(lambda: build().compile(checkpointer=sync).invoke(
        {"messages": [HumanMessage(content="four")]}, thread))
    sid = session_id_for("lg-compact")
    async with AsyncClient(daemon.socket) as c:
        events = [e for e in (await c.read_events(sid, limit=10_000)).events
                  if e.type == "session.compacted"]
        ctx = await c.context(sid)
    assert [(e.data.by, [m.content for m in e.data.summary]) for e in events] == [
        ("langgraph", ["summary of 4 messages", "answer 4"]),
        ("langgraph", ["summary of 3 messages", "answer 3"])]
    assert [(m.role, m.content) for m in ctx.summary] == [
        ("system", "summary of 3 messages"), ("assistant", "answer 3")]
    for s in (saver, sync):
        await s.aclose()
        s.close()
