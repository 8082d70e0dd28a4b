"""The web view (docs/web.md) tells the truth for a session of any source (issue 44): in
Debian's chromium, at 1280×800 and 390 wide, a Claude Code import, a Codex import, a
LangGraph thread with an interrupt, an ADK session with a function call, an OpenAI Agents
SDK session with a tool call, an executor after its run and a fork each show their
messages, their tool calls with names and inputs, each result under its call, and no
error panel; and a session page follows its events live (status, exit code, trajectory,
the End button, the output) with no reload. No model is called: the SDKs' own types,
fixed messages. Screenshots go to $SESSIOND_SCREENSHOTS (docs/img holds some)."""

from __future__ import annotations

import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest
import test_web
from conftest import Daemon
from test_web import WAIT_MS, new_page, page_url

from sessiond import AsyncClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
# test_web's fixtures: Debian's chromium, the screenshots' folder, an HTTP listener
browser, shots, daemon_overrides = test_web.browser, test_web.shots, test_web.daemon_overrides

TRANSCRIPTS = Path(__file__).parent / "fixtures" / "transcripts"
CLAUDE_CODE = (TRANSCRIPTS / "claude-code" / "projects" / "-home-dev-shop"
               / "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d.jsonl")
CODEX = (TRANSCRIPTS / "codex" / "sessions" / "2026" / "01" / "19"
         / "rollout-2026-01-19T21-05-44-019bd7a1-2c3d-7e4f-8a9b-0c1d2e3f4a5b.jsonl")


@dataclass
class Source:
    """A session of one source, and what its page must show."""

    session_id: str
    message: str  # a message's text
    tool: str  # a call's tool name
    call_id: str
    given: str  # a piece of the call's input
    result: str  # a piece of its result
    panels: tuple[str, ...] = ()  # the panels it has beside the timeline and state


async def sessionctl(daemon: Daemon, *args: str) -> None:
    done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                    daemon.socket, *args], check=False)
    assert done.returncode == 0, done.stderr.decode()


async def claude_code(daemon: Daemon, client: AsyncClient) -> Source:
    await sessionctl(daemon, "import", "--format", "claude-code", str(CLAUDE_CODE))
    return Source("3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d", "quantize to cents", "Grep",
                  "toolu_01Qw3rTy5uIo7pAs9dFg1hJk", '"pattern": "def total"',
                  "shop/cart.py:41")


async def codex(daemon: Daemon, client: AsyncClient) -> Source:
    await sessionctl(daemon, "import", "--format", "codex", str(CODEX))
    return Source("019bd7a1-2c3d-7e4f-8a9b-0c1d2e3f4a5b", "now says 'receive'",
                  "apply_patch", "call_Zz9Yy8Xx7Ww6", "*** Begin Patch",
                  "Success. Updated the following files")


async def langgraph(daemon: Daemon, client: AsyncClient) -> Source:
    pytest.importorskip("langgraph", reason="pip install -e '.[langgraph]' to test it")
    from typing import Annotated, TypedDict

    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages
    from langgraph.types import interrupt

    from sessiond.integrations.langgraph import SessiondSaver

    # functional syntax: a class body's annotations would be read as strings (no locals)
    Chat = TypedDict("Chat", {"messages": Annotated[list[AnyMessage], add_messages]})  # noqa: UP013

    def agent(state: Any) -> Any:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage(content="It is sunny in Paris, 21C.", usage_metadata={
                "input_tokens": 50, "output_tokens": 8, "total_tokens": 58})]}
        return {"messages": [AIMessage(content="", tool_calls=[{
            "id": "call-w1", "name": "get_weather", "args": {"city": "Paris"}}])]}

    def tools(state: Any) -> Any:
        return {"messages": [ToolMessage(content="sunny, 21C", tool_call_id="call-w1")]}

    def review(state: Any) -> Any:
        answer = interrupt({"question": "send the answer?"})
        return {"messages": [HumanMessage(content=f"the reviewer says {answer}")]}

    builder = StateGraph(Chat)
    builder.add_node("agent", agent)
    builder.add_node("tools", tools)
    builder.add_node("review", review)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges(
        "agent", lambda s: "tools" if getattr(s["messages"][-1], "tool_calls", None)
        else "review")
    builder.add_edge("tools", "agent")
    builder.add_edge("review", END)
    saver = SessiondSaver(daemon.socket)
    graph = builder.compile(checkpointer=saver)
    thread: Any = {"configurable": {"thread_id": "weather-thread"}}
    await graph.ainvoke({"messages": [HumanMessage(content="weather in Paris?")]}, thread)
    assert (await graph.aget_state(thread)).interrupts  # stopped at the review
    await saver.aclose()
    saver.close()
    RESUME[:] = [lambda: builder.compile(checkpointer=SessiondSaver(daemon.socket))] * 2
    return Source("weather-thread", "It is sunny in Paris", "get_weather", "call-w1",
                  '"city": "Paris"', "sunny, 21C", ("Graph progress",))


RESUME: list[Callable[[], Any]] = []  # the last langgraph() graph, on a saver of its own


async def adk(daemon: Daemon, client: AsyncClient) -> Source:
    pytest.importorskip("google.adk", reason="pip install -e '.[adk]' to test it")
    from google.adk.events import Event
    from google.genai import types

    from sessiond.integrations.adk import SessiondSessionService, session_id_for

    service = SessiondSessionService(daemon.socket)
    session = await service.create_session(app_name="weather", user_id="ann", session_id="s1")

    def event(author: str, part: Any) -> Event:
        role = "user" if author == "user" else "model"
        return Event(invocation_id="inv-1", author=author,
                     content=types.Content(role=role, parts=[part]))

    for e in (event("user", types.Part(text="Is it warm in Oslo?")),
              event("weather_agent", types.Part(function_call=types.FunctionCall(
                  id="fc-1", name="get_temperature", args={"city": "Oslo"}))),
              event("weather_agent", types.Part(function_response=types.FunctionResponse(
                  id="fc-1", name="get_temperature", response={"celsius": 4}))),
              event("weather_agent", types.Part(text="No: 4°C in Oslo."))):
        await service.append_event(session, e)
    return Source(session_id_for("weather", "ann", "s1"), "4°C in Oslo", "get_temperature",
                  "fc-1", '"city": "Oslo"', '"celsius": 4')


async def openai_agents(daemon: Daemon, client: AsyncClient) -> Source:
    pytest.importorskip("agents", reason="pip install -e '.[openai-agents]' to test it")
    from sessiond.integrations.openai_agents import SessiondSession, session_id_for

    session = SessiondSession("trip-planner", socket=daemon.socket)
    await session.add_items([
        {"role": "user", "content": "What is the weather in Lyon?"},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Lyon"}', "id": "fc_1", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C and sunny"},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "It is 18C and sunny in Lyon.",
                      "annotations": []}]}])
    return Source(session_id_for("trip-planner"), "18C and sunny in Lyon", "weather", "call_1",
                  '"city": "Lyon"', "18C and sunny")


# A jsonl executor (docs/executors.md): a message with a tool call and its result, then
# it waits for `gate` to exist, says its last word and exits 0.
EXECUTOR = r"""
import json, os, sys, time
def say(t, d): print(json.dumps({"type": t, "data": d}), flush=True)
say("message.appended", {"role": "assistant", "content": "listing the files",
    "metadata": {"tool_calls": [{"id": "ls-1", "name": "shell", "input": {"cmd": "ls -l"}}]}})
say("message.appended", {"role": "tool", "content": "README.md setup.py", "tool_call_id": "ls-1"})
print("a line on stderr", file=sys.stderr, flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
say("message.appended", {"role": "assistant", "content": "all done, two files"})
"""


async def executor(daemon: Daemon, client: AsyncClient, gate: str | None = None) -> Source:
    """After its run (or, given a `gate` that does not exist yet, during it)."""
    done_gate = gate or os.path.join(os.path.dirname(daemon.socket), "gate-open")
    if gate is None:
        Path(done_gate).touch()
    state = await client.spawn([sys.executable, "-c", EXECUTOR, done_gate], adapter="jsonl",
                               task="list the files", session_id="exec-1")
    if gate is None:
        await wait_status(client, "exec-1", "completed")
    return Source(state.session_id, "listing the files", "shell", "ls-1", '"cmd": "ls -l"',
                  "README.md setup.py", ("Executor",))


async def fork(daemon: Daemon, client: AsyncClient) -> Source:
    await claude_code(daemon, client)
    forked = await client.fork("3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d", at_version=7,
                               new_session_id="cart-fork")
    await client.append_message(forked.session_id, "user", "and round half up, please")
    return Source("cart-fork", "and round half up", "Grep", "toolu_01Qw3rTy5uIo7pAs9dFg1hJk",
                  '"pattern": "def total"', "shop/cart.py:41", ("Forks",))


async def wait_status(client: AsyncClient, sid: str, status: str) -> None:
    with anyio.fail_after(WAIT_MS / 1000):
        while (await client.get_session(sid)).status != status:
            await anyio.sleep(0.02)


SOURCES: dict[str, Callable[[Daemon, AsyncClient], Awaitable[Source]]] = {
    "claude-code": claude_code, "codex": codex, "langgraph": langgraph, "adk": adk,
    "openai-agents": openai_agents, "executor": executor, "fork": fork}
PANELS = ("Graph progress", "Forks", "Executor")


class TestEverySource:
    @pytest.mark.parametrize("name", list(SOURCES))
    async def test_its_page_shows_the_conversation(
            self, daemon: Daemon, client: AsyncClient, browser: Any, shots: Path,
            store_kind: str, name: str) -> None:
        source = await SOURCES[name](daemon, client)
        for width, height in ((1280, 800), (390, 844)):
            page, _ = await new_page(browser, width, height)
            await page.goto(page_url(daemon) + f"#/s/{source.session_id}")
            timeline = page.locator("#timeline")
            await timeline.locator(f"text={source.message}").first.wait_for(timeout=WAIT_MS)
            call = timeline.locator(f".call[data-call='{source.call_id}']")
            assert await call.count() == 1
            assert await call.locator(".tool").inner_text() == source.tool
            assert source.given in await call.locator("pre.input").inner_text()
            result = call.locator(f"[data-result-of='{source.call_id}']")
            assert source.result in await result.inner_text()  # under its call
            await page.locator("#forks, #graph, #executor").first.wait_for(
                state="attached", timeout=WAIT_MS)
            await anyio.sleep(0.3)  # the panels' own reads
            shown = {p for p in PANELS
                     if await page.locator(f"[data-panel='{p}']").is_visible()}
            assert shown == set(source.panels), shown
            assert await page.locator(".error").count() == 0
            assert "-32602" not in await page.locator("#main").inner_text()
            if width == 390:
                assert await page.evaluate("document.documentElement.scrollWidth") <= 390
            assert page.errors == []
            suffix = "" if width == 1280 else "-phone"
            if store_kind == "sqlite":
                await page.screenshot(path=str(shots / f"source-{name}{suffix}.png"),
                                      full_page=True)
            await page.context.close()

    async def test_a_langgraph_thread_reads_as_steps_and_an_interrupt(
            self, daemon: Daemon, client: AsyncClient, browser: Any) -> None:
        source = await langgraph(daemon, client)
        page, _ = await new_page(browser)
        await page.goto(page_url(daemon) + f"#/s/{source.session_id}")
        await page.locator("#path .node").first.wait_for(timeout=WAIT_MS)
        assert [await n.inner_text() for n in await page.locator("#path .node").all()] == [
            "agent", "tools", "agent"]
        assert await page.locator("#timeline >> text=interrupt in review").count() == 1
        text = await page.locator("#timeline").inner_text()
        assert "hqF" not in text and "msgpack" not in text  # no LangGraph bytes as text

    async def test_a_langgraph_thread_is_searched_and_shown_as_steps(
            self, daemon: Daemon, client: AsyncClient, store_kind: str) -> None:
        """What the saver records besides its checkpoints: the messages (searchable, with
        the call and its result), the steps as progress, the usage as tokens."""
        source = await langgraph(daemon, client)
        state = await client.get_session(source.session_id)
        assert state.progress.steps_executed == 3 and state.progress.current_node == "agent"
        assert (state.token_usage.input_tokens, state.token_usage.output_tokens) == (50, 8)
        messages = (await client.list_messages(source.session_id)).messages
        assert [(m.role, m.content) for m in messages] == [
            ("user", "weather in Paris?"), ("assistant", 'get_weather({"city":"Paris"})'),
            ("tool", "sunny, 21C"), ("assistant", "It is sunny in Paris, 21C.")]
        assert messages[1].metadata["tool_calls"] == [
            {"id": "call-w1", "name": "get_weather", "args": {"city": "Paris"}}]
        assert messages[2].tool_call_id == "call-w1"
        if store_kind == "sqlite":  # full-text search is SQLite's (docs/protocol.md)
            found = await client.search("sunny")
            assert [s.session_id for s in found.sessions] == [source.session_id]
        done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                        daemon.socket, "show", source.session_id])
        assert "node agent  steps 3" in done.stdout.decode()

        # Resumed by another saver (another process): it records what the resume adds,
        # never the thread's messages again.
        from langgraph.types import Command

        graph = RESUME.pop()()
        await graph.ainvoke(Command(resume="yes"), {"configurable": {
            "thread_id": "weather-thread"}})
        messages = (await client.list_messages(source.session_id)).messages
        assert [m.content for m in messages[3:]] == [
            "It is sunny in Paris, 21C.", "the reviewer says yes"]

        # A message not of the saver's last: a new saver records what later puts add.
        from langchain_core.messages import HumanMessage

        await client.append_message(source.session_id, "user", "a note by hand")
        await RESUME.pop()().ainvoke({"messages": [HumanMessage(content="and Rome?")]},
                                     {"configurable": {"thread_id": "weather-thread"}})
        messages = (await client.list_messages(source.session_id)).messages
        assert [m.content for m in messages[5:]] == [
            "a note by hand", 'get_weather({"city":"Paris"})', "sunny, 21C",
            "It is sunny in Paris, 21C."]

    async def test_a_fork_marks_what_it_inherited(self, daemon: Daemon, client: AsyncClient,
                                                  browser: Any) -> None:
        await fork(daemon, client)
        page, _ = await new_page(browser)
        await page.goto(page_url(daemon) + "#/s/cart-fork")
        await page.locator("#timeline li[data-type='session.forked']").wait_for(
            timeout=WAIT_MS)
        inherited = page.locator("#timeline li.inherited")
        assert await inherited.count() == 6  # versions 1-7, a tool result under its call
        assert [await li.get_attribute("data-version") for li in
                await page.locator("#timeline > li").all()] == [
            "1", "2", "3", "4", "5", "6", "8", "9"]
        link = inherited.first.locator(".from a")
        assert await link.inner_text() == "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"
        await page.locator("#forked-from a").click()
        await page.locator("h1 >> text=3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d").wait_for(
            timeout=WAIT_MS)
        assert await page.locator("#timeline li.inherited").count() == 0


class TestLive:
    async def test_an_executors_page_follows_it_to_its_end(
            self, daemon: Daemon, client: AsyncClient, browser: Any, shots: Path,
            store_kind: str) -> None:
        """The page opened during the run; the run ends from outside: the status badge,
        the exit code, the trajectory, the End button and the output change, no reload."""
        gate = os.path.join(os.path.dirname(daemon.socket), "gate")
        await executor(daemon, client, gate)
        page, _ = await new_page(browser)
        loads: list[str] = []
        page.on("load", lambda p: loads.append(p.url))
        await page.goto(page_url(daemon) + "#/s/exec-1")
        await page.locator("#trajectory li >> text=listing the files").wait_for(
            timeout=WAIT_MS)
        assert await page.locator("#status").inner_text() == "active"
        assert await page.locator("#exit-code").inner_text() == "-"
        assert await page.locator("#end").is_visible()
        output = await page.locator("#output").inner_text()
        assert "undefined" not in output and '"listing the files"' in output
        if store_kind == "sqlite":
            await page.screenshot(path=str(shots / "executor-running.png"), full_page=True)

        Path(gate).touch()  # the run goes on to its end, from outside the page
        await page.locator("#status >> text=completed").wait_for(timeout=WAIT_MS)
        await page.locator("#exit-code >> text=0").wait_for(timeout=WAIT_MS)
        await page.locator("#trajectory li >> text=all done, two files").wait_for(
            timeout=WAIT_MS)
        await page.locator("#output >> text=all done").wait_for(timeout=WAIT_MS)
        assert not await page.locator("#end").is_visible()
        assert await page.locator("#timeline >> text=active → completed").count() == 1
        assert len(loads) == 1  # no reload
        if store_kind == "sqlite":
            await page.screenshot(path=str(shots / "executor-done.png"), full_page=True)

    async def test_status_and_end_button_follow_a_transition(
            self, daemon: Daemon, client: AsyncClient, browser: Any) -> None:
        await client.create_session("plain-1", task="a plain session")
        page, _ = await new_page(browser)
        await page.goto(page_url(daemon) + "#/s/plain-1")
        await page.locator("#end").wait_for(timeout=WAIT_MS)
        await client.transition("plain-1", "paused")
        await page.locator("#status >> text=paused").wait_for(timeout=WAIT_MS)
        assert await page.locator("#end").is_visible()
        assert not await page.locator("[data-panel='Graph progress']").is_visible()
        await client.record_progress("plain-1", "plan")  # the graph panel appears with it
        await page.locator("[data-panel='Graph progress'] #path .node >> text=plan").wait_for(
            timeout=WAIT_MS)
        await client.transition("plain-1", "failed", error="gave up")
        await page.locator("#status >> text=failed").wait_for(timeout=WAIT_MS)
        await page.locator("#end").wait_for(state="hidden", timeout=WAIT_MS)


class TestHostOnAPhone:
    async def test_its_tables_become_cards(self, daemon: Daemon, client: AsyncClient,
                                           browser: Any, shots: Path, store_kind: str) -> None:
        await client.create_session("h-1", actor_name="team/a-rather-long-actor-name")
        await client.record_tokens("h-1", input_tokens=1200, output_tokens=300,
                                   estimated_cost=0.01)
        await claude_code(daemon, client)  # usage of 2025, arriving after this minute's
        page, _ = await new_page(browser, 390, 844)
        await page.goto(page_url(daemon) + "#/host")
        row = page.locator("[data-actor='team/a-rather-long-actor-name']")
        await row.wait_for(timeout=WAIT_MS)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        # Windows by the events' own time: the import's tokens are no one's spend now.
        assert await page.locator("#actors tbody tr").count() == 1
        assert "1500" in await row.inner_text()
        if store_kind == "sqlite":
            await page.screenshot(path=str(shots / "host-phone.png"), full_page=True)
