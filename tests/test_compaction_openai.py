"""The OpenAI Agents SDK's compaction over SessiondSession (issue 48): every mode of
OpenAIResponsesCompactionSession keeps the history as a compaction (session.compacted,
by "openai-agents"), while get_items answers what the SDK's own SQLiteSession answers.
Offline: the compaction API is a test double, the model a stub."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import Daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sdk_extras import require_sdk

agents = require_sdk("agents", "openai-agents")

from agents import Agent, Runner, SQLiteSession  # noqa: E402
from agents.memory import OpenAIResponsesCompactionSession  # noqa: E402
from test_openai_agents import ITEMS, CompactingClient, IdModel  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.openai_agents import SessiondSession  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
counter = itertools.count()


def compacting(store: Any, api: CompactingClient, mode: str = "input",
               **kwargs: Any) -> OpenAIResponsesCompactionSession:
    return OpenAIResponsesCompactionSession(f"s{next(counter)}", store, client=api,  # type: ignore[arg-type]
                                            compaction_mode=mode, **kwargs)  # type: ignore[arg-type]


async def compactions(client: AsyncClient, sid: str) -> list[Any]:
    return [e for e in (await client.read_events(sid)).events if e.type == "session.compacted"]


class TestModes:
    @pytest.mark.parametrize("mode", ["input", "previous_response_id", "auto"])
    async def test_manual_compaction_is_a_compaction_and_reads_as_sqlite_session(
            self, daemon: Daemon, client: AsyncClient, tmp_path: Path, mode: str) -> None:
        """run_compaction (forced) in each mode: SQLiteSession is cleared and refilled; here
        the history stays (message.list still has every item) and one session.compacted
        holds the output; get_items, with and without a limit, as SQLiteSession's."""
        theirs = SQLiteSession("m", str(tmp_path / "m.db"))
        ours = SessiondSession(f"manual-{mode}", socket=daemon.socket)
        apis = []
        for store in (theirs, ours):
            api = CompactingClient()
            session = compacting(store, api, mode)
            await session.add_items(ITEMS[:4])
            await session.run_compaction({"force": True, "response_id": "resp_1"})
            await session.add_items(ITEMS[4:6])
            apis.append(api)
        assert apis[0].calls == apis[1].calls
        assert ("previous_response_id" in apis[1].calls[0]) == (mode != "input")
        for limit in (None, 1, 2, 3, 10):
            assert await ours.get_items(limit) == await theirs.get_items(limit), limit
        [event] = await compactions(client, f"manual-{mode}")
        assert event.data.by == "openai-agents" and event.data.through_sequence == 3
        assert len((await client.list_messages(f"manual-{mode}")).messages) == 6
        ctx = await client.context(f"manual-{mode}")
        assert len(ctx.summary) == 1 and len(ctx.messages) == 2
        theirs.close()
        ours.close()

    async def test_automatic_compaction_of_the_whole_history(
            self, daemon: Daemon, client: AsyncClient, tmp_path: Path) -> None:
        """Under a real Runner, automatic compaction of a history the model saw whole: one
        session.compacted (the snapshot is the whole context), the same items as over
        SQLiteSession, and the next turn sends the model the summary and what follows."""
        theirs = SQLiteSession("a", str(tmp_path / "a.db"))
        ours = SessiondSession("auto-1", socket=daemon.socket)
        models = []
        for store in (theirs, ours):
            api, model = CompactingClient(), IdModel()
            session = compacting(store, api, "auto",
                                 should_trigger_compaction=lambda c: c["response_id"] == "resp_2")
            for text in ("one", "two", "three"):
                await Runner.run(Agent(name="a", model=model), text, session=session)
            models.append(model)
        assert models[0].inputs == models[1].inputs
        assert await ours.get_items() == await theirs.get_items()
        [event] = await compactions(client, "auto-1")
        assert event.data.by == "openai-agents"
        assert (await client.get_session("auto-1")).message_count == 6  # history stays
        theirs.close()
        ours.close()


operations = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.sampled_from(range(len(ITEMS))), max_size=3)),
    st.tuples(st.just("get"), st.one_of(st.none(), st.integers(-1, 6))),
    st.tuples(st.just("pop")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("compact")),
), max_size=14)


class TestDifferential:
    @settings(max_examples=25, deadline=None,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(script=operations)
    async def test_same_answers_as_sqlite_session_across_compactions(
            self, daemon: Daemon, tmp_path: Path, script: list[tuple[Any, ...]]) -> None:
        """Random add/get(limit)/pop/clear/compact sequences through the SDK's compaction
        session: every answer equals SQLiteSession's under the same wrapper."""
        n = next(counter)
        theirs = SQLiteSession(f"d{n}", str(tmp_path / "d.db"))
        ours = SessiondSession(f"diff-{n}", socket=daemon.socket)
        wrapped = [compacting(s, CompactingClient()) for s in (theirs, ours)]
        try:
            for op in script:
                answers = []
                for session in wrapped:
                    if op[0] == "add":
                        await session.add_items([ITEMS[i] for i in op[1]])
                    elif op[0] == "get":
                        answers.append(await session.get_items(op[1]))
                    elif op[0] == "pop":
                        answers.append(await session.pop_item())
                    elif op[0] == "clear":
                        await session.clear_session()
                    elif await session.get_items():  # the SDK compacts a non-empty history
                        await session.run_compaction({"force": True})
                if answers:
                    assert json.dumps(answers[0]) == json.dumps(answers[1]), op
            assert await ours.get_items() == await theirs.get_items()
        finally:
            theirs.close()
            ours.close()
