"""What LangGraph's readable records cost: a chat graph's steps with and without them.

    python -m bench.lg_readable            # 200 turns a run
    python -m bench.lg_readable --turns 50

Each turn is a real compiled StateGraph run (LangGraph's own loop, no model: fixed
messages): a user message, an agent step that calls a tool, the tool's step, the agent's
answer; four checkpoints. SessiondSaver runs it with `readable=False` (the checkpoints
only) and with the readable records (the new messages through message.append_many, the
nodes that ran as progress.recorded through events.append), each against a daemon of its
own, their turns interleaved (so the machine's drift hits both alike).
Printed: the median milliseconds of a turn and of a step (a checkpoint), the events and
database bytes a step adds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from typing import Annotated, Any, TypedDict

from .daemon import DaemonProcess
from .sdks import db_bytes

STEPS_A_TURN = 4  # input, agent, tools, agent


async def run(turns: int) -> dict[bool, dict[str, float]]:
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
    out: dict[bool, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="sdl-") as directory:
        daemons = {on: DaemonProcess(os.path.join(directory, "on" if on else "off"))
                   for on in (False, True)}
        for d in daemons.values():
            os.mkdir(os.path.dirname(d.socket))
            await d.start()
        try:
            savers = {on: SessiondSaver(d.socket, readable=on) for on, d in daemons.items()}
            graphs = {on: builder.compile(checkpointer=s) for on, s in savers.items()}
            thread: Any = {"configurable": {"thread_id": "bench-1"}}
            before: dict[bool, tuple[int, int]] = {}
            for on, graph in graphs.items():
                await graph.ainvoke({"messages": [HumanMessage(content="warm up")]}, thread)
                async with AsyncClient(daemons[on].socket) as c:
                    v0 = (await c.get_session("bench-1")).version
                before[on] = (v0, db_bytes(daemons[on].db))
            times: dict[bool, list[float]] = {False: [], True: []}
            for i in range(turns):  # the two interleaved: the machine's drift hits both
                for on in ((False, True) if i % 2 else (True, False)):
                    t0 = time.perf_counter()
                    await graphs[on].ainvoke(
                        {"messages": [HumanMessage(content=f"weather in Paris? ({i})")]},
                        thread)
                    times[on].append(time.perf_counter() - t0)
            steps = turns * STEPS_A_TURN
            for on in (False, True):
                async with AsyncClient(daemons[on].socket) as c:
                    v1 = (await c.get_session("bench-1")).version
                turn_ms = statistics.median(times[on]) * 1000
                out[on] = {"turn_ms": turn_ms, "step_ms": turn_ms / STEPS_A_TURN,
                           "events_per_step": (v1 - before[on][0]) / steps,
                           "bytes_per_step": (db_bytes(daemons[on].db) - before[on][1]) / steps}
                await savers[on].aclose()
                savers[on].close()
        finally:
            for d in daemons.values():
                d.stop()
    return out


async def main(turns: int) -> None:
    both = await run(turns)
    off, on = both[False], both[True]
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
