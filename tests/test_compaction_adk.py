"""Google ADK's event compaction over SessiondSessionService (issue 48): ADK's own
compaction (an App's EventsCompactionConfig, its LlmEventSummarizer over a fake model)
is stored as ADK's stores store it and marked as a sessiond compaction (by "adk"); and
get_session narrowed by GetSessionConfig reads from the end back, so what it costs
follows what it returns. Offline: the models are stubs."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator
from typing import Any, ClassVar

import pytest
from conftest import Daemon
from sdk_extras import require_sdk

adk = require_sdk("google.adk", "google-adk")

from google.adk.agents import LlmAgent  # noqa: E402
from google.adk.apps.app import App, EventsCompactionConfig  # noqa: E402
from google.adk.apps.llm_event_summarizer import LlmEventSummarizer  # noqa: E402
from google.adk.events.event import Event  # noqa: E402
from google.adk.models.base_llm import BaseLlm  # noqa: E402
from google.adk.models.llm_request import LlmRequest  # noqa: E402
from google.adk.models.llm_response import LlmResponse  # noqa: E402
from google.adk.runners import Runner  # noqa: E402
from google.adk.sessions import InMemorySessionService  # noqa: E402
from google.adk.sessions.base_session_service import GetSessionConfig  # noqa: E402
from google.genai import types  # noqa: E402
from test_adk import comparable  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations._loop import LoopClient  # noqa: E402
from sessiond.integrations.adk import SessiondSessionService, session_id_for  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql,
              pytest.mark.filterwarnings("ignore:.*EXPERIMENTAL.*:UserWarning")]
counter = itertools.count()


class AgentLlm(BaseLlm):
    """The agent's model: answers each turn, and remembers the texts it was sent."""

    seen: ClassVar[list[list[str]]] = []

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        texts = [p.text for c in llm_request.contents for p in (c.parts or []) if p.text]
        AgentLlm.seen.append(texts)
        yield LlmResponse(content=types.Content(
            role="model", parts=[types.Part(text=f"answer {len(AgentLlm.seen)}")]))


class SummaryLlm(BaseLlm):
    """The summarizer's model: a summary that says how many requests it has answered."""

    calls: ClassVar[int] = 0

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        SummaryLlm.calls += 1
        yield LlmResponse(content=types.Content(
            role="model", parts=[types.Part(text=f"summary {SummaryLlm.calls}")]))


async def three_turns(service: Any, session_id: str) -> list[list[str]]:
    AgentLlm.seen, SummaryLlm.calls = [], 0
    app = App(name="support", root_agent=LlmAgent(
        name="helper", model=AgentLlm(model="stub"), instruction="Be brief."),
        events_compaction_config=EventsCompactionConfig(
            compaction_interval=2, overlap_size=0,
            summarizer=LlmEventSummarizer(llm=SummaryLlm(model="stub"))))
    runner = Runner(app=app, session_service=service)
    await service.create_session(app_name="support", user_id="u", session_id=session_id)
    for text in ("first", "second", "third"):
        async for _ in runner.run_async(user_id="u", session_id=session_id,
                                        new_message=types.Content(
                                            role="user", parts=[types.Part(text=text)])):
            pass
    return AgentLlm.seen


class TestCompaction:
    async def test_adk_compaction_is_a_sessiond_compaction(self, daemon: Daemon,
                                                           client: AsyncClient) -> None:
        """Three turns with a compaction every two: the model is sent what it is sent
        over ADK's own store; the compaction event is among get_session's events, as
        there; and it is a session.compacted by adk whose summary is ADK's, standing for
        the compacted turns, so session.context starts at it."""
        theirs = await three_turns(InMemorySessionService(), "s")
        ours_service = SessiondSessionService(daemon.socket)
        ours = await three_turns(ours_service, "s")
        assert ours == theirs
        session = await ours_service.get_session(app_name="support", user_id="u",
                                                 session_id="s")
        assert session is not None
        compacted = [e for e in session.events if e.actions and e.actions.compaction]
        assert len(compacted) == 1
        sid = session_id_for("support", "u", "s")
        events = [e for e in (await client.read_events(sid)).events
                  if e.type == "session.compacted"]
        assert [e.data.by for e in events] == ["adk"]
        ctx = await client.context(sid)
        assert [m.content for m in ctx.summary] == ["summary 1"]
        # It stands for the two compacted turns (four messages), not for what followed.
        assert ctx.compaction is not None and ctx.compaction.through_sequence == 3
        # After it: ADK's compaction event itself (no content of its own), then the turn
        # that followed the compacted ones.
        assert [m.content for m in ctx.messages] == ["[user event]", "third", "answer 3"]
        # The next append through the session object is not refused as stale.
        await ours_service.append_event(session, Event(author="user", invocation_id="x"))
        await ours_service.close()


class CountingClient(LoopClient):
    """The service's client, counting the messages its message.list calls return."""

    def __init__(self, socket: str) -> None:
        super().__init__(socket)
        self.read = 0

    async def list_messages(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        page = await super().list_messages(*args, **kwargs)
        self.read += len(page.messages)
        return page


class TestNarrowedReads:
    async def test_num_recent_events_reads_what_it_returns(self, daemon: Daemon) -> None:
        """get_session with num_recent_events (and after_timestamp) on 600 events: the
        same events as ADK's in-memory store, read from a few of the newest messages,
        not from all 600."""
        counting = CountingClient(daemon.socket)
        ours, reference = SessiondSessionService(client=counting), InMemorySessionService()
        app = f"narrow {next(counter)}"
        sessions = [await s.create_session(app_name=app, user_id="u", session_id="s")
                    for s in (reference, ours)]
        for step in range(600):
            event = Event(author="user", invocation_id=f"i{step}",
                          timestamp=1_700_000_000.0 + step,
                          content=types.Content(role="user", parts=[types.Part(text=f"t{step}")]))
            for service, session in zip((reference, ours), sessions, strict=True):
                await service.append_event(session, event.model_copy(deep=True))
        for config in (GetSessionConfig(num_recent_events=5),
                       GetSessionConfig(after_timestamp=1_700_000_590.0),
                       GetSessionConfig(num_recent_events=3, after_timestamp=1_700_000_100.0)):
            counting.read = 0
            got = [await s.get_session(app_name=app, user_id="u", session_id="s",
                                       config=config) for s in (reference, ours)]
            assert comparable(got[1]) == comparable(got[0]), config
            assert counting.read <= 40, (config, counting.read)
        counting.read = 0
        whole = await ours.get_session(app_name=app, user_id="u", session_id="s")
        assert whole is not None and len(whole.events) == 600 and counting.read == 600
        await ours.close()


class TestTrimmed:
    async def test_get_session_after_retention_trimmed_it(self, daemon: Daemon,
                                                          client: AsyncClient) -> None:
        """A session trimmed behind a compaction (session.trim): get_session reads what
        is kept, whole or narrowed, and appends go on."""
        service = SessiondSessionService(daemon.socket)
        session = await service.create_session(app_name="t", user_id="u", session_id="s")
        for step in range(40):
            await service.append_event(session, Event(
                author="user", invocation_id=f"i{step}", timestamp=1_700_000_000.0 + step,
                content=types.Content(role="user", parts=[types.Part(text=f"t{step}")])))
        sid = session_id_for("t", "u", "s")
        await client.compact(sid, [{"role": "system", "content": "summary"}],
                             through_sequence=29)
        done = await client.trim(sid, older_than_days=0)
        assert done.starts_at is not None
        gone = (await client.get_session(sid)).history
        assert gone is not None
        whole = await service.get_session(app_name="t", user_id="u", session_id="s")
        assert whole is not None
        assert [e.content.parts[0].text for e in whole.events if e.content and e.content.parts
                ] == [f"t{i}" for i in range(gone.through_sequence + 1, 40)]
        recent = await service.get_session(app_name="t", user_id="u", session_id="s",
                                           config=GetSessionConfig(num_recent_events=3))
        assert recent is not None and [e.invocation_id for e in recent.events] == [
            "i37", "i38", "i39"]
        await service.append_event(whole, Event(author="user", invocation_id="after"))
        await service.close()
