"""The seeds' own stores imported: each view matches what its source said, field by field."""

from __future__ import annotations

import json
import os
import sys

import anyio
import pytest
from conftest import Daemon

from sessiond import AsyncClient
from sessiond.importers import FORMATS
from sessiond.importers._builder import rfc3339

pytestmark = pytest.mark.anyio
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


async def import_all(client: AsyncClient, fmt: str, path: str) -> dict[str, list[str]]:
    notes = {}
    for _, document, warnings in FORMATS[fmt](path):
        state = await client.import_session(document)
        notes[state.session_id] = warnings
    assert (await client.verify()).ok
    return notes


async def test_hive_states(daemon: Daemon, client: AsyncClient) -> None:
    """Hive 1.1 (paused, retries, failures) and 1.0 (legacy, completed) state.json files."""
    notes = await import_all(client, "hive", os.path.join(FIXTURES, "hive"))
    for sid in notes:
        with open(os.path.join(FIXTURES, "hive", "sessions", sid, "state.json")) as f:
            src = json.load(f)
        s = await client.get_session(sid)
        sp, p, ts = src["progress"], s.progress, src["timestamps"]
        for field in ("goal_id", "agent_id", "stream_id", "correlation_id", "entry_point",
                      "isolation_level", "input_data", "memory", "problems", "decisions",
                      "status"):
            assert getattr(s, field) == src[field], (sid, field)
        assert s.checkpoint_enabled == src.get("checkpoint_enabled", False)
        assert s.latest_checkpoint_id == src.get("latest_checkpoint_id")
        assert s.timestamps.started_at == s.timestamps.created_at == rfc3339(ts["started_at"])
        assert s.timestamps.updated_at == rfc3339(ts["updated_at"])
        assert s.token_usage.input_tokens == src["metrics"]["total_input_tokens"]
        assert s.token_usage.output_tokens == src["metrics"]["total_output_tokens"]
        assert s.metrics.decision_count == src["metrics"]["decision_count"]
        assert s.metrics.problem_count == src["metrics"]["problem_count"]
        assert s.metrics.nodes_executed == src["metrics"]["nodes_executed"]
        whole = await client.session_state_dict(sid)
        assert whole["metrics"]["edges_traversed"] == src["metrics"]["edges_traversed"]
        assert s.result.output == src["result"]["output"]
        if src["schema_version"] == "1.1":
            assert whole["progress"]["path"] == sp["path"]
            for field in ("node_visit_counts", "retry_details", "total_retries",
                          "nodes_with_failures", "had_partial_failures", "execution_quality",
                          "total_tokens", "total_latency_ms", "steps_executed", "current_node",
                          "paused_at", "resume_from"):
                assert getattr(p, field) == sp[field], field
            assert s.timestamps.paused_at_time == rfc3339(ts["paused_at_time"])
            assert s.is_resumable and s.is_resumable_from_checkpoint
        else:  # legacy: no path, the executed nodes stand for it
            assert whole["progress"]["path"] == src["metrics"]["nodes_executed"]
            assert s.result.success is True and p.execution_quality == "clean"
            assert s.timestamps.completed_at == rfc3339(ts["completed_at"])
            assert s.duration_ms == 150_000
            assert any("nodes_executed" in n for n in notes[sid])


async def test_cleveragents_document(daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """as_export_dict(): messages with their ULIDs and sequences, usage, plans, checksum."""
    path = os.path.join(FIXTURES, "cleveragents", "session.json")
    with open(path) as f:
        src = json.load(f)
    notes = await import_all(client, "cleveragents", path)
    assert notes[src["session_id"]] == []  # the checksum was recomputed and matched
    s = await client.get_session(src["session_id"])
    for field in ("namespace", "actor_name", "automation_level", "metadata", "linked_plan_ids"):
        assert getattr(s, field) == src[field], field
    assert (s.token_usage.input_tokens, s.token_usage.output_tokens,
            s.token_usage.estimated_cost) == tuple(src["token_usage"].values())
    assert s.timestamps.created_at == rfc3339(src["created_at"])
    assert s.timestamps.updated_at == rfc3339(src["updated_at"])
    msgs = (await client.list_messages(src["session_id"])).messages
    assert [(m.message_id, m.sequence, m.role, m.content, m.tool_call_id, m.metadata,
             m.timestamp) for m in msgs] == [
        (m["message_id"], m["sequence"], m["role"], m["content"], m["tool_call_id"],
         m["metadata"], rfc3339(m["timestamp"])) for m in src["messages"]]
    assert s.message_count == 3 and s.last_message is not None
    assert s.last_message.message_id == src["messages"][-1]["message_id"]
    # A checksum that cannot be recomputed is said plainly, and the import still goes in.
    src["checksum"] = "0" * 64
    src["session_id"] = "01JD3ZQ8Y5M6V4K2N7P9R1S3TZ"
    other = os.path.join(short_dir, "other.json")
    with open(other, "w") as f:
        json.dump(src, f)
    notes = await import_all(client, "cleveragents", other)
    assert "could not be verified" in notes[src["session_id"]][0]


async def test_zwarm_session_through_the_cli(daemon: Daemon, client: AsyncClient) -> None:
    """meta.json and turns/turn_N.jsonl via `sessionctl import --format zwarm`."""
    root = os.path.join(FIXTURES, "zwarm")
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "import",
         "--format", "zwarm", root, "--json"])
    summary = json.loads(result.stdout)
    [done] = summary["imported"]
    folder = os.path.dirname(done["file"])
    with open(done["file"]) as f:
        src = json.load(f)
    s = await client.get_session(src["id"])
    assert (s.task, s.working_dir, s.model, s.adapter, s.source) == (
        src["task"], src["working_dir"], src["model"], src["adapter"], src["source"])
    assert (s.status, s.turn, s.pid, s.exit_code, s.error) == (
        "completed", src["turn"], src["pid"], src["exit_code"], src["error"])
    assert (s.token_usage.input_tokens, s.token_usage.output_tokens) == (5400, 910)
    assert s.timestamps.created_at == rfc3339(src["created_at"])
    assert s.timestamps.updated_at == rfc3339(src["updated_at"])
    msgs = (await client.list_messages(src["id"])).messages
    assert [(m.role, m.content) for m in msgs] == [(m["role"], m["content"])
                                                   for m in src["messages"]]
    lines = []
    for turn in (1, 2):
        with open(os.path.join(folder, "turns", f"turn_{turn}.jsonl")) as f:
            lines += f.read().splitlines()
    out = (await client.read_events(src["id"], types=["process.output"])).events
    assert [e.data["line"] for e in out] == lines
