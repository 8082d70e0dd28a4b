"""The fold: each event type's effect on SessionState, and the seeds' derived fields."""

from __future__ import annotations

import msgspec
import pytest
from helpers import History

from sessiond_daemon.core.projection import FoldError, apply, fold, merge_patch


class TestSeedHiveSemantics:
    """Seed 000 (Hive's SessionState): computed fields and progress tracking."""

    def test_duration_is_zero_until_completed(self) -> None:
        """duration_ms is 0 while running and started→completed once finished."""
        h = History()
        assert fold(None, h.events).duration_ms == 0
        h.status("active", "completed", at="2026-01-01T00:00:02.500000Z")
        assert fold(None, h.events).duration_ms == 2500

    def test_duration_starts_when_a_pending_session_becomes_active(self) -> None:
        """A pending session's duration counts from when it became active."""
        h = History(status="pending")
        assert fold(None, h.events).timestamps.started_at is None
        h.status("pending", "active", at="2026-01-01T00:00:10.000000Z")
        h.status("active", "failed", at="2026-01-01T00:00:11.000000Z")
        assert fold(None, h.events).duration_ms == 1000

    def test_is_resumable_needs_paused_or_failed_and_a_node(self) -> None:
        """Resumable only when paused/failed and a resume point is known."""
        h = History()
        assert not fold(None, h.events).is_resumable
        h.status("active", "paused")
        assert not fold(None, h.events).is_resumable  # no node known yet
        h.status("paused", "active")
        h.add("progress.recorded", {"node_id": "plan"})
        h.status("active", "paused")
        state = fold(None, h.events)
        assert state.is_resumable and state.progress.paused_at == "plan"
        assert state.timestamps.paused_at_time is not None

    def test_failed_with_resume_from_is_resumable(self) -> None:
        """A failed session that names resume_from is resumable; completed is not."""
        h = History()
        h.status("active", "failed", resume_from="retry-node", error="boom")
        state = fold(None, h.events)
        assert state.is_resumable and state.progress.resume_from == "retry-node"
        assert state.error == "boom" and state.result.error == "boom"
        assert state.result.success is False
        h.status("failed", "active")
        h.status("active", "completed")
        assert not fold(None, h.events).is_resumable

    def test_resumable_from_checkpoint(self) -> None:
        """is_resumable_from_checkpoint needs checkpoints enabled and one saved, any status."""
        h = History()
        assert not fold(None, h.events).is_resumable_from_checkpoint
        h.add("checkpoint.saved", {"checkpoint_id": "c1", "size": 2})
        h.status("active", "completed")
        state = fold(None, h.events)
        assert state.is_resumable_from_checkpoint
        assert state.latest_checkpoint_id == "c1" and state.checkpoint_count == 1

    def test_path_visits_retries_and_quality(self) -> None:
        """node_visit_counts, retry_details, failures and execution_quality (the path is
        not in the view: progress.list pages it)."""
        h = History()
        h.add("progress.recorded",
              {"node_id": "a", "edge": "start->a", "latency_ms": 10, "tokens": 5})
        state = fold(None, h.events)
        assert state.progress.execution_quality == "clean"
        h.add("progress.recorded", {"node_id": "b", "edge": "a->b", "retries": 2, "latency_ms": 7})
        h.add("progress.recorded", {"node_id": "a", "edge": "b->a", "failed": True})
        p = fold(None, h.events).progress
        assert not hasattr(p, "path")
        assert p.node_visit_counts == {"a": 2, "b": 1}
        assert p.retry_details == {"b": 2} and p.total_retries == 2
        assert p.nodes_with_failures == ["a"] and p.had_partial_failures
        assert p.steps_executed == 3 and p.current_node == "a"
        assert p.total_latency_ms == 17 and p.total_tokens == 5
        assert p.execution_quality == "degraded"
        m = fold(None, h.events).metrics
        assert m.nodes_executed == ["a", "b"]
        assert not hasattr(m, "edges_traversed")  # progress.list gives the edges
        h.status("active", "failed")
        assert fold(None, h.events).progress.execution_quality == "failed"

    def test_problems_decisions_and_result(self) -> None:
        """Problems and decisions are kept whole and counted; result is recorded."""
        h = History()
        h.add("problem.recorded", {"severity": "high", "text": "x"})
        h.add("decision.recorded", {"choice": "b"})
        h.add("decision.recorded", {"choice": "c"})
        h.add("result.recorded", {"success": True, "output": {"answer": 42}})
        s = fold(None, h.events)
        assert s.problems == [{"severity": "high", "text": "x"}]
        assert s.metrics.problem_count == 1 and s.metrics.decision_count == 2
        assert s.result.success is True and s.result.output == {"answer": 42}

    def test_resume_dict(self) -> None:
        """to_session_state_dict gives the executor's resume shape."""
        h = History()
        h.add("memory.updated", {"patch": {"k": 1}})
        h.status("active", "paused", paused_at="n3")
        d = fold(None, h.events).to_session_state_dict()
        assert d == {"paused_at": "n3", "resume_from": None, "memory": {"k": 1}, "next_node": None}


class TestSeedCleverAgentsSemantics:
    """Seed 002 (cleveragents' Session): messages, token usage, plans."""

    def test_messages_count_and_last(self) -> None:
        """message_count counts; last_message is the newest with its sequence."""
        h = History()
        assert fold(None, h.events).last_message is None
        h.message("user", "hi")
        h.message("tool", "result", tool_call_id="call-1")
        s = fold(None, h.events)
        assert s.message_count == 2
        assert s.last_message is not None
        last = s.last_message
        assert (last.sequence, last.role, last.content) == (1, "tool", "result")
        assert s.last_message.tool_call_id == "call-1"
        assert s.last_message.timestamp == h.events[-1].recorded_at

    def test_token_usage_accumulates_with_cost(self) -> None:
        """Token counts and estimated cost add up; total_tokens follows."""
        h = History()
        h.add("tokens.recorded", {"input_tokens": 100, "output_tokens": 20, "estimated_cost": 0.25})
        h.add("tokens.recorded", {"input_tokens": 1, "estimated_cost": 0.5})
        s = fold(None, h.events)
        assert (s.token_usage.input_tokens, s.token_usage.output_tokens) == (101, 20)
        assert s.token_usage.estimated_cost == pytest.approx(0.75)
        assert s.progress.total_tokens == 121

    def test_linked_plans_are_deduplicated(self) -> None:
        """Linking the same plan twice keeps one entry, in first-linked order."""
        h = History()
        for plan in ("p1", "p2", "p1"):
            h.add("plan.linked", {"plan_id": plan})
        assert fold(None, h.events).linked_plan_ids == ["p1", "p2"]

    def test_created_fields_and_metadata_patch(self) -> None:
        """Creation fields land in the view; metadata takes merge patches."""
        h = History(namespace="team", actor_name="team/bot", automation_level="high",
                    metadata={"a": 1, "b": {"c": 2}})
        h.add("metadata.updated", {"patch": {"b": {"c": None, "d": 3}, "e": 4}})
        s = fold(None, h.events)
        assert (s.namespace, s.actor_name, s.automation_level) == ("team", "team/bot", "high")
        assert s.metadata == {"a": 1, "b": {"d": 3}, "e": 4}


class TestFoldRules:
    """Purity, ordering and the merge patch."""

    def test_apply_does_not_change_its_input(self) -> None:
        """apply returns a new state and leaves the given one as it was."""
        h = History()
        h.add("progress.recorded", {"node_id": "a"})
        before = fold(None, h.events)
        snapshot = msgspec.to_builtins(before)
        ev = h.add("progress.recorded", {"node_id": "b", "retries": 1, "failed": True})
        after = apply(before, ev)
        assert msgspec.to_builtins(before) == snapshot
        assert after.progress.node_visit_counts == {"a": 1, "b": 1}
        assert after.progress.nodes_with_failures == ["b"]
        assert before.progress.nodes_with_failures == []
        assert after.version == before.version + 1

    def test_incremental_equals_whole_fold(self) -> None:
        """Folding one event at a time equals folding all at once."""
        h = History()
        h.message("user", "x")
        h.add("memory.updated", {"patch": {"a": {"b": 1}}})
        h.add("process.started", {"pid": 10, "argv": ["x"], "turn": 1})
        h.add("process.output", {"turn": 1, "line": "out"})
        h.add("process.exited", {"pid": 10, "turn": 1, "exit_code": 3})
        state = None
        for event in h.events:
            state = apply(state, event)
        whole = fold(None, h.events)
        assert msgspec.to_builtins(state) == msgspec.to_builtins(whole)
        assert (whole.pid, whole.turn, whole.exit_code) == (10, 1, 3)

    def test_gaps_and_second_creation_are_refused(self) -> None:
        """A history with a gap, or two creations, is not a valid history."""
        h = History()
        h.message("user", "x")
        with pytest.raises(FoldError):
            fold(None, [h.events[1]])
        with pytest.raises(FoldError):
            fold(None, [h.events[0], h.events[0]])
        with pytest.raises(FoldError):
            fold(fold(None, h.events[:1]), h.events[2:] + h.events[1:2][:0] + [h.events[0]])

    def test_old_event_shapes_are_upcast(self) -> None:
        """A version-0 tokens.recorded (Hive's field names) folds as today's shape."""
        from msgspec.structs import replace

        h = History()
        old = h.add("tokens.recorded", {"total_input_tokens": 5, "total_output_tokens": 2})
        h.events[-1] = replace(old, schema_version=0)
        s = fold(None, h.events)
        assert (s.token_usage.input_tokens, s.token_usage.output_tokens) == (5, 2)

    def test_merge_patch_rfc7396(self) -> None:
        """RFC 7396 examples: null removes, objects merge, others replace."""
        target = {"a": "b", "c": {"d": "e", "f": "g"}}
        assert merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
        assert target == {"a": "b", "c": {"d": "e", "f": "g"}}
        assert merge_patch({"a": [1]}, {"a": [2]}) == {"a": [2]}
        assert merge_patch({"a": 1}, {"b": {"c": None}}) == {"a": 1, "b": {}}
