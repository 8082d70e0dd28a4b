"""Compaction (issue 48): session.compact writes a session.compacted event that the view
folds (where the context starts); session.context reads the last summary and the messages
after it, paged; nothing before it is cut, and forks made after it inherit it."""

from __future__ import annotations

import json

import pytest
from conftest import Daemon

from sessiond import AsyncClient
from sessiond_daemon.core.projection import fold
from sessiond_schemas.errors import InvalidParamsError, SessionNotFoundError

pytestmark = pytest.mark.anyio

SUMMARY = [{"role": "system", "content": "so far: the user asked for a plan"}]


async def _conversation(c: AsyncClient, sid: str, n: int) -> None:
    await c.create_session(sid)
    await c.append_messages(sid, [{"role": "user" if i % 2 == 0 else "assistant",
                                   "content": f"m{i}"} for i in range(n)])


class TestCompact:
    async def test_compaction_is_an_event_folded_into_the_view(self,
                                                                client: AsyncClient) -> None:
        """The event carries the summary, what it stands for and who made it; the view
        says where the context starts; the stored view is a fresh fold of the events."""
        await _conversation(client, "c1", 6)
        state = await client.compact("c1", SUMMARY, through_sequence=3, by="cli",
                                     reason="too long")
        assert state.context is not None
        assert (state.context.session_id, state.context.version,
                state.context.through_sequence) == ("c1", state.version, 3)
        assert state.message_count == 6  # nothing cut
        events = (await client.read_events("c1")).events
        last = events[-1]
        assert last.type == "session.compacted"
        assert last.fields() == {"summary": SUMMARY, "through_sequence": 3,
                                 "through_version": state.version - 1, "by": "cli",
                                 "reason": "too long"}
        assert fold(None, events) == state
        assert len((await client.list_messages("c1")).messages) == 6  # history readable
        assert (await client.verify()).ok

    async def test_through_sequence_defaults_to_every_message_and_is_checked(
            self, client: AsyncClient) -> None:
        await _conversation(client, "c2", 3)
        state = await client.compact("c2", SUMMARY)
        assert state.context is not None and state.context.through_sequence == 2
        with pytest.raises(InvalidParamsError, match="through_sequence 3 is past"):
            await client.compact("c2", SUMMARY, through_sequence=3)
        with pytest.raises(InvalidParamsError):
            await client.compact("c2", [], through_sequence=0)
        with pytest.raises(InvalidParamsError):
            await client.compact("c2", [{"role": "user", "content": "  "}])
        with pytest.raises(InvalidParamsError):
            await client.compact("c2", SUMMARY, by="Not A Name")
        with pytest.raises(SessionNotFoundError):
            await client.compact("nope", SUMMARY)
        assert (await client.get_session("c2")).version == state.version  # nothing written

    async def test_a_cut_behind_the_summary_ends_it_a_cut_after_it_does_not(
            self, client: AsyncClient) -> None:
        """Old messages.truncated cuts keep their meaning: a pop after the summary leaves
        the compaction; a clear (behind it) ends it, the context is every message again."""
        await _conversation(client, "c3", 5)
        await client.compact("c3", SUMMARY, through_sequence=1)
        await client.pop_message("c3")
        assert (await client.get_session("c3")).context is not None
        ctx = await client.context("c3")
        assert [m.content for m in ctx.messages] == ["m2", "m3"]
        await client.clear_messages("c3")
        assert (await client.get_session("c3")).context is None
        await client.append_message("c3", "user", "again")
        ctx = await client.context("c3")
        assert ctx.compaction is None and ctx.summary == []
        assert [m.content for m in ctx.messages] == ["again"]


class TestContext:
    async def test_context_is_the_summary_and_the_tail_paged(self,
                                                             client: AsyncClient) -> None:
        await _conversation(client, "t1", 10)
        before = await client.context("t1", limit=4)
        assert before.compaction is None and before.total == 10
        assert [m.sequence for m in before.messages] == [0, 1, 2, 3] and before.next == 3
        await client.compact("t1", SUMMARY, through_sequence=5)
        await client.append_message("t1", "user", "m10")
        first = await client.context("t1", limit=2)
        assert first.compaction is not None
        assert (first.compaction.through_sequence, first.compaction.by) == (5, "api")
        assert [(m.role, m.content) for m in first.summary] == [
            ("system", SUMMARY[0]["content"])]
        assert [m.content for m in first.messages] == ["m6", "m7"]
        assert first.total == 5 and first.next == 7
        second = await client.context("t1", limit=10, after_sequence=first.next)
        assert second.summary == [] and second.compaction is not None
        assert [m.content for m in second.messages] == ["m8", "m9", "m10"]
        assert second.next is None
        # A cursor from before the summary still starts after it.
        assert [m.sequence for m in (await client.context(
            "t1", limit=1, after_sequence=0)).messages] == [6]

    async def test_a_later_compaction_replaces_the_start(self, client: AsyncClient) -> None:
        await _conversation(client, "t2", 4)
        await client.compact("t2", SUMMARY, through_sequence=1)
        await client.compact("t2", [{"role": "user", "content": "newer"},
                                    {"role": "assistant", "content": "ok"}])
        ctx = await client.context("t2")
        assert [m.content for m in ctx.summary] == ["newer", "ok"]
        assert ctx.messages == [] and ctx.total == 0 and ctx.next is None

    async def test_forks_after_a_compaction_inherit_it_before_do_not(
            self, client: AsyncClient) -> None:
        await _conversation(client, "f1", 6)
        before = (await client.get_session("f1")).version
        await client.compact("f1", SUMMARY, through_sequence=3)
        await client.append_message("f1", "user", "m6")
        after = await client.fork("f1", new_session_id="f1-after")
        early = await client.fork("f1", at_version=before, new_session_id="f1-before")
        assert after.context is not None and after.context.session_id == "f1"
        assert early.context is None
        ctx = await client.context("f1-after")
        assert [m.content for m in ctx.summary] == [SUMMARY[0]["content"]]
        assert [m.content for m in ctx.messages] == ["m4", "m5", "m6"]
        await client.append_message("f1-after", "user", "fork's own")
        assert [m.content for m in (await client.context("f1-after")).messages][-1] \
            == "fork's own"
        assert len((await client.context("f1-before")).messages) == 6
        assert (await client.verify()).ok

    async def test_the_history_before_stays_searchable(self, client: AsyncClient) -> None:
        await client.create_session("s1")
        await client.append_message("s1", "user", "the quokka question")
        await client.compact("s1", SUMMARY)
        hits = await client.search("quokka")
        assert [s.session_id for s in hits.sessions] == ["s1"]


@pytest.mark.slow_on_postgresql  # each sessionctl call is a new process
class TestSessionctl:
    async def test_compact_context_and_the_timeline(self, daemon: Daemon,
                                                    client: AsyncClient) -> None:
        """`sessionctl compact` records one (by cli), `sessionctl context` shows the boundary,
        the summary, the tail and how to read what came before; `events` shows the
        boundary in the timeline."""
        from test_cli import ctl, ctl_json

        await _conversation(client, "cli1", 5)
        state = await ctl_json(daemon, "compact", "cli1", "--through", "2",
                               stdin=json.dumps(SUMMARY))
        assert state["context"]["through_sequence"] == 2
        ctx = await ctl_json(daemon, "context", "cli1", "--limit", "1")
        assert ctx["compaction"]["by"] == "cli" and ctx["next"] == 3
        assert [m["content"] for m in ctx["messages"]] == ["m3"]
        shown = (await ctl(daemon, "context", "cli1")).stdout
        assert "compacted at v" in shown and "[summary] system: so far" in shown
        assert "m4" in shown and "sessionctl messages cli1 --limit 3" in shown
        timeline = (await ctl(daemon, "events", "cli1")).stdout
        assert "═ #0–#2 summarized (cli)" in timeline
        dry = await ctl_json(daemon, "trim", "cli1", "--older-than-days", "0", "--dry-run")
        assert dry["session_id"] == "cli1" and "starts_at" in dry


class TestAppended:
    async def test_events_append_takes_a_compaction_the_daemon_completes(
            self, client: AsyncClient) -> None:
        """events.append of session.compacted (an importer's, in the same write as the
        messages): through_sequence defaults to every message before it in the session and
        the batch, through_version is the version before it; one past them is refused and
        nothing of the batch is written."""
        await _conversation(client, "a1", 2)
        written = await client.append_events("a1", [
            {"type": "message.appended", "data": {"role": "user", "content": "m2"}},
            {"type": "session.compacted", "data": {"summary": SUMMARY, "by": "codex"}},
            {"type": "message.appended", "data": {"role": "user", "content": "m3"}}])
        compacted = [e for e in (await client.read_events("a1")).events
                     if e.type == "session.compacted"]
        assert [(e.version, e.data.through_sequence, e.data.through_version, e.data.by)
                for e in compacted] == [(written.version - 1, 2, written.version - 2, "codex")]
        ctx = await client.context("a1")
        assert [m.content for m in ctx.messages] == ["m3"]
        with pytest.raises(InvalidParamsError, match="through_sequence 5 is past") as refused:
            await client.append_events("a1", [
                {"type": "message.appended", "data": {"role": "user", "content": "m4"}},
                {"type": "session.compacted", "data": {"summary": SUMMARY,
                                                       "through_sequence": 5}}])
        assert refused.value.data["path"] == "$.events[1].data.through_sequence"
        assert (await client.get_session("a1")).version == written.version
        created = await client.create_session("a2", events=[
            {"type": "message.appended", "data": {"role": "user", "content": "x"}},
            {"type": "session.compacted", "data": {"summary": SUMMARY}}])
        assert created.context is not None and created.context.through_sequence == 0
        assert (await client.read_events("a2")).events[-1].data.through_version == 2
