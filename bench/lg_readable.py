"""What LangGraph's readable records cost: a chat graph's steps with and without them.

    python -m bench.lg_readable            # 200 turns a run
    python -m bench.lg_readable --turns 50

Each turn is a real compiled StateGraph run (LangGraph's own loop, no model: fixed
messages): a user message, an agent step that calls a tool, the tool's step, the agent's
answer; four checkpoints. SessiondSaver runs it with `readable=False` (the checkpoints
only) and with the readable records (the new messages through message.append_many, the
nodes that ran as progress.recorded through events.append), each against a fresh daemon.
Printed: the median milliseconds of a turn and of a step (a checkpoint), the events and
database bytes a step adds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from typing import Annotated, Any, TypedDict

from .daemon import DaemonProcess
from .sdks import db_bytes

STEPS_A_TURN = 4  # input, agent, tools, agent


async def run(readable: bool, turns: int) -> dict[str, float]:
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
    from langgraph.graph import START, StateGraph
    from langgraph.graph.message import add_messages

    from sessiond import AsyncClient
    from sessiond.integrations.langgraph import SessiondSaver

    # functional syntax: a class body's annotations would be read as strings (no locals)
    Chat = TypedDict("Chat", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    def agent(state: Any) -> Any:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            return {"messages": [AIMessage(content="It is sunny in Paris, 21C. " + "x" * 200,
                                           usage_metadata={"input_tokens": 50,
                                                           "output_tokens": 12,
                                                           "total_tokens": 62})]}
        return {"messages": [AIMessage(content="", tool_calls=[{
            "id": f"call-{len(state['messages'])}", "name": "get_weather",
            "args": {"city": "Paris"}}])]}

    def tools(state: Any) -> Any:
        call = state["messages"][-1].tool_calls[0]  # type: ignore[union-attr]
        return {"messages": [ToolMessage(content="sunny, 21C", tool_call_id=call["id"])]}

    builder = StateGraph(Chat)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "tools" if getattr(s["messages"][-1], "tool_calls", None)
        else "__end__")
    builder.add_edge("tools", "agent")
    with tempfile.TemporaryDirectory(prefix="sdl-") as directory:
        daemon = DaemonProcess(directory)
        await daemon.start()
        try:
            saver = SessiondSaver(daemon.socket, readable=readable)
            graph = builder.compile(checkpointer=saver)
            thread: Any = {"configurable": {"thread_id": "bench-1"}}
            await graph.ainvoke({"messages": [HumanMessage(content="warm up")]}, thread)
            async with AsyncClient(daemon.socket) as c:
                v0 = (await c.get_session("bench-1")).version
            before = db_bytes(daemon.db)
            times = []
            for i in range(turns):
                t0 = time.perf_counter()
                await graph.ainvoke(
                    {"messages": [HumanMessage(content=f"weather in Paris? ({i})")]}, thread)
                times.append(time.perf_counter() - t0)
            async with AsyncClient(daemon.socket) as c:
                v1 = (await c.get_session("bench-1")).version
            grown = db_bytes(daemon.db) - before
            await saver.aclose()
            saver.close()
        finally:
            daemon.stop()
    turn_ms = statistics.median(times) * 1000
    steps = turns * STEPS_A_TURN
    return {"turn_ms": turn_ms, "step_ms": turn_ms / STEPS_A_TURN,
            "events_per_step": (v1 - v0) / steps, "bytes_per_step": grown / steps}


async def main(turns: int) -> None:
    off = await run(False, turns)
    on = await run(True, turns)
    print("| LangGraph chat turn (4 steps) | checkpoints only | with readable records | ratio |")
    print("| --- | --- | --- | --- |")
    for key, label in (("turn_ms", "ms a turn (median)"), ("step_ms", "ms a step"),
                       ("events_per_step", "events a step"),
                       ("bytes_per_step", "database bytes a step")):
        print(f"| {label} | {off[key]:,.2f} | {on[key]:,.2f} | {on[key] / off[key]:.2f}× |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.lg_readable")
    parser.add_argument("--turns", type=int, default=200)
    asyncio.run(main(parser.parse_args().turns))
