"""The seeds' own stores imported: each view matches what its source said, field by field."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessiond import AsyncClient
from sessiond.importers import FORMATS, Problem
from sessiond.importers._builder import rfc3339
from sessiond_schemas.errors import SessiondError, SessionNotFoundError

pytestmark = pytest.mark.anyio
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")


async def import_all(client: AsyncClient, fmt: str, path: str) -> dict[str, list[str]]:
    notes = {}
    for found in FORMATS[fmt](path, False):
        assert found.problem is None and found.document is not None, found
        state = await client.import_session(found.document)
        notes[state.session_id] = found.warnings
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
    assert [e.data.line for e in out] == lines


# --- every importer goes on past a bad file, and says which file, where and why ------

SOURCES = os.path.join(FIXTURES, "transcripts")
HIVE_GOOD = "session_20261101_093000_ab12cd34"


async def sessionctl(daemon: Daemon, *args: str,
                     env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run `sessionctl ARGS` against the daemon; (exit code, stdout, stderr)."""
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, *args], check=False,
        env=None if env is None else {**os.environ, **env})
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def import_json(daemon: Daemon, *args: str,
                      env: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    code, out, err = await sessionctl(daemon, "import", *args, "--json", env=env)
    assert "Traceback" not in err, err
    return code, json.loads(out)


def assert_failures_named(failed: list[dict[str, Any]]) -> None:
    """Each failure names its file once, a JSON path and a reason that is a sentence."""
    for item in failed:
        assert item["file"] and item["reason"] and item["path"].startswith("$"), item
        assert item["file"] not in item["error"], item  # the path is said once
        assert not re.fullmatch(r"'[^']*'", item["reason"]), item  # never a bare KeyError


async def exists(client: AsyncClient, sid: str) -> bool:
    try:
        await client.get_session(sid)
    except SessionNotFoundError:
        return False
    return True


def write(path: str, content: str | bytes) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
    return path


async def test_hive_good_malformed_and_mixed_roots(daemon: Daemon, client: AsyncClient,
                                                   short_dir: str) -> None:
    root = os.path.join(short_dir, "hive")
    shutil.copytree(os.path.join(FIXTURES, "hive"), root)
    with open(os.path.join(root, "sessions", HIVE_GOOD, "state.json")) as f:
        good = f.read()
    state = json.loads(good)
    bad = os.path.join(root, "sessions")
    write(f"{bad}/truncated/state.json", good[: len(good) // 2])
    write(f"{bad}/a_list/state.json", "[1, 2]")
    no_start = dict(state, session_id="no-start", timestamps={"updated_at": "2026-11-01"})
    write(f"{bad}/no_start/state.json", json.dumps(no_start))
    wrong_type = dict(state, session_id="wrong-type", progress=[1])
    write(f"{bad}/wrong_type/state.json", json.dumps(wrong_type))
    write(f"{bad}/garbage/state.json", b"\x00\xff\xfe garbage \x80")
    os.makedirs(f"{bad}/a_dir/state.json")
    code, out = await import_json(daemon, "--format", "hive", root)
    assert code == 1
    assert sorted(i["session_id"] for i in out["imported"]) == sorted(
        os.listdir(os.path.join(FIXTURES, "hive", "sessions")))
    failed = {os.path.basename(os.path.dirname(i["file"])): i for i in out["failed"]}
    assert set(failed) == {"truncated", "a_list", "no_start", "wrong_type", "garbage", "a_dir"}
    assert_failures_named(out["failed"])
    assert "invalid JSON" in failed["truncated"]["reason"]
    assert "found a list" in failed["a_list"]["reason"]
    assert (failed["no_start"]["path"], failed["no_start"]["reason"]) == (
        "$.timestamps.started_at", "missing")
    assert failed["wrong_type"]["path"] == "$.progress"
    assert "UTF-8" in failed["garbage"]["reason"]
    assert "directory" in failed["a_dir"]["reason"].lower()
    for sid in ("no-start", "wrong-type"):
        assert not await exists(client, sid)
    # A root that is not there: said once, exit 1, no traceback.
    code, _, err = await sessionctl(daemon, "import", "--format", "hive",
                                    os.path.join(short_dir, "nope"))
    assert code == 1 and "Traceback" not in err
    assert err.count(os.path.join(short_dir, "nope")) == 1, err


@pytest.mark.slow_on_postgresql
async def test_cleveragents_malformed_mixed_and_strict(daemon: Daemon, client: AsyncClient,
                                                       short_dir: str) -> None:
    with open(os.path.join(FIXTURES, "cleveragents", "session.json")) as f:
        src = json.load(f)
    folder = os.path.join(short_dir, "ca")
    write(f"{folder}/good.json", json.dumps(src))
    write(f"{folder}/list.json", json.dumps([src]))
    no_created = {k: v for k, v in src.items() if k != "created_at"}
    no_created["session_id"] = "01JD3ZQ8Y5M6V4K2N7P9R1S3AA"
    write(f"{folder}/no_created.json", json.dumps(no_created))
    write(f"{folder}/truncated.json", json.dumps(src)[:300])
    bad_message = dict(src, session_id="01JD3ZQ8Y5M6V4K2N7P9R1S3AB",
                       messages=[{"sequence": 0, "role": "user"}])
    write(f"{folder}/bad_message.json", json.dumps(bad_message))
    code, out = await import_json(daemon, "--format", "cleveragents", folder)
    assert code == 1
    assert [i["session_id"] for i in out["imported"]] == [src["session_id"]]
    failed = {os.path.basename(i["file"]): i for i in out["failed"]}
    assert set(failed) == {"list.json", "no_created.json", "truncated.json", "bad_message.json"}
    assert_failures_named(out["failed"])
    assert "found a list" in failed["list.json"]["reason"]
    assert (failed["no_created.json"]["path"], failed["no_created.json"]["reason"]) == (
        "$.created_at", "missing")
    assert failed["bad_message.json"]["path"] == "$.messages[0].message_id"
    for sid in (no_created["session_id"], bad_message["session_id"]):
        assert not await exists(client, sid)
    # A checksum that does not verify: a note without --strict, a failure with it.
    unverified = dict(src, session_id="01JD3ZQ8Y5M6V4K2N7P9R1S3AC", checksum="0" * 64)
    path = write(f"{short_dir}/unverified.json", json.dumps(unverified))
    code, out = await import_json(daemon, "--format", "cleveragents", "--strict", path)
    assert code == 1 and out["imported"] == []
    [item] = out["failed"]
    assert item["path"] == "$.checksum" and "could not be verified" in item["reason"]
    assert not await exists(client, unverified["session_id"])
    code, out = await import_json(daemon, "--format", "cleveragents", path)
    assert code == 0 and "could not be verified" in out["imported"][0]["warnings"][0]
    assert "seed" not in out["imported"][0]["warnings"][0]  # words of ours reach no user
    # --strict takes a document whose checksum verifies.
    code, out = await import_json(daemon, "--format", "cleveragents", "--strict",
                                  "--on-conflict", "skip",
                                  os.path.join(FIXTURES, "cleveragents", "session.json"))
    assert code == 0 and out["failed"] == []


async def test_zwarm_mixed_root_and_history_order(daemon: Daemon, client: AsyncClient,
                                                  short_dir: str) -> None:
    """The zwarm case of the issue: one session without created_at beside a good one."""
    root = os.path.join(short_dir, "proj")
    shutil.copytree(os.path.join(FIXTURES, "zwarm"), root)
    sessions = os.path.join(root, ".zwarm", "sessions")
    [good_id] = os.listdir(sessions)
    with open(os.path.join(sessions, good_id, "meta.json")) as f:
        meta = json.load(f)
    broken = {k: v for k, v in meta.items() if k != "created_at"}
    broken["id"] = "z2"
    write(os.path.join(sessions, "z2", "meta.json"), json.dumps(broken))
    write(os.path.join(sessions, "z3", "meta.json"), b"\x7fELF\x02\x01\x01")
    os.makedirs(os.path.join(sessions, "z4"))  # a folder with no meta.json
    code, out = await import_json(daemon, "--format", "zwarm", root)
    assert code == 1
    assert [i["session_id"] for i in out["imported"]] == [good_id]
    failed = {os.path.basename(os.path.dirname(i["file"])): i for i in out["failed"]}
    assert set(failed) == {"z2", "z3", "z4"}
    assert_failures_named(out["failed"])
    assert (failed["z2"]["path"], failed["z2"]["reason"]) == ("$.created_at", "missing")
    assert failed["z2"]["file"].endswith(os.path.join("z2", "meta.json"))
    assert not await exists(client, "z2")
    # The history in the order zwarm lived it: the task is the first step, of turn 1.
    steps = await client.trajectory(good_id)
    users = [s for s in steps if s.type == "user"]
    assert steps[0].type == "user" and steps[0].summary == meta["task"]
    assert [(s.summary, s.turn) for s in users] == [
        (meta["messages"][0]["content"], 1), (meta["messages"][2]["content"], 2)]
    events = (await client.read_events(good_id)).events
    times = [e.recorded_at for e in events if e.type != "process.detached"]
    assert times == sorted(times)  # never a message earlier than the work before it


# --- the agent CLIs' transcripts ----------------------------------------------------

CC = os.path.join(SOURCES, "claude-code", "projects")
CODEX = os.path.join(SOURCES, "codex", "sessions")


def jsonl(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


async def keys_of(client: AsyncClient, sid: str) -> list[str]:
    """The line keys a session holds, in order, once each."""
    events = (await client.read_events(sid, limit=10_000)).events
    keys: list[str] = []
    for e in events:
        key = e.meta.idempotency_key
        if key and (not keys or keys[-1] != key):
            keys.append(key)
    return keys


@pytest.mark.slow_on_postgresql
async def test_claude_code_transcripts(daemon: Daemon, client: AsyncClient,
                                       short_dir: str) -> None:
    """Three CLI versions (1.0, 2.0 with agent files beside, 2.1 with subagents/)."""
    root = os.path.join(short_dir, "projects")
    shutil.copytree(CC, root)
    code, out = await import_json(daemon, "--format", "claude-code", root)
    assert code == 0 and out["failed"] == [] and len(out["imported"]) == 5
    sid = "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"
    path = os.path.join(root, "-home-dev-shop", f"{sid}.jsonl")
    lines = jsonl(path)
    s = await client.get_session(sid)
    assert (s.working_dir, s.model, s.adapter, s.task) == (
        "/home/dev/shop", "claude-sonnet-4-20250514", "claude-code", lines[1]["message"]["content"])
    assert s.metadata["cli_version"] == "1.0.58"
    assert s.metadata["git_branch"] == "fix/rounding"  # the branch changed on line 6
    assert s.metadata["summary"] == "Fix cart total rounding"
    # Usage per API response, once, although Claude Code repeats it on each block's line.
    usage = [line["message"]["usage"] for line in lines[2:] if line["type"] == "assistant"]
    first, last = usage[0], usage[2]
    assert s.token_usage.input_tokens == sum(
        u["input_tokens"] + u["cache_creation_input_tokens"] + u["cache_read_input_tokens"]
        for u in (first, last))
    assert s.token_usage.output_tokens == first["output_tokens"] + last["output_tokens"]
    msgs = (await client.list_messages(sid)).messages
    assert [(m.role, m.tool_call_id) for m in msgs] == [
        ("user", None), ("assistant", None), ("assistant", None),
        ("tool", "toolu_01Qw3rTy5uIo7pAs9dFg1hJk"), ("assistant", None), ("user", None)]
    assert msgs[2].metadata["tool_calls"][0]["name"] == "Grep"
    assert msgs[3].content == "shop/cart.py:41:    def total(self) -> float:"
    timed = [x for x in lines if x["type"] in ("user", "assistant")]
    assert [m.timestamp for m in msgs] == [rfc3339(x["timestamp"]) for x in timed]
    assert s.timestamps.created_at == rfc3339(lines[1]["timestamp"])
    assert [m.metadata["claude_code"]["uuid"] for m in msgs] == [x["uuid"] for x in timed]
    # Sub-agents are sessions of their own, linked to the session that started them.
    for parent, agent in (("7d1c2b9e-5a44-4f0b-9e61-3c8a2d4f6b10", "a3f9c21"),
                          ("e4d3c2b1-7a6f-4e5d-8c9b-0a1b2c3d4e5f", "5be1a07")):
        sub = await client.get_session(f"{parent}.agent-{agent}")
        assert sub.metadata["parent_session_id"] == sub.correlation_id == parent
        assert await exists(client, parent)
    sub_msgs = (await client.list_messages(
        "7d1c2b9e-5a44-4f0b-9e61-3c8a2d4f6b10.agent-a3f9c21")).messages
    assert [m.role for m in sub_msgs] == ["user", "assistant", "tool", "assistant"]
    # Re-running imports nothing; a line the CLI added later is all that goes in.
    before = {i["session_id"]: i["version"] for i in out["imported"]}
    home = os.path.join(short_dir, "home")  # without a PATH: ~/.claude/projects
    os.makedirs(os.path.join(home, ".claude"))
    os.rename(root, os.path.join(home, ".claude", "projects"))
    root = os.path.join(home, ".claude", "projects")
    path = os.path.join(root, "-home-dev-shop", f"{sid}.jsonl")
    code, again = await import_json(daemon, "--format", "claude-code", env={"HOME": home})
    assert code == 0 and again["imported"] == [] and len(again["skipped"]) == 5
    assert {i["reason"] for i in again["skipped"]} == {"nothing new"}
    extra = dict(lines[-1], uuid="b2c4d6e8-0000-4000-8000-000000000007",
                 parentUuid=lines[-1]["uuid"], timestamp="2025-07-21T09:17:00.000Z")
    extra["message"] = {"role": "user", "content": "One more: add a test."}
    with open(path, "a") as f:
        f.write(json.dumps(extra) + "\n")
    code, again = await import_json(daemon, "--format", "claude-code", root)
    assert code == 0
    assert [(i["session_id"], i["lines"]) for i in again["imported"]] == [(sid, 1)]
    assert (await client.get_session(sid)).version == before[sid] + 1
    keys = await keys_of(client, sid)  # the summary line has no uuid: its content's hash
    assert keys[0].startswith("cc:") and keys[1:] == [f"cc:{x['uuid']}" for x in [*lines, extra]
                                                      if x.get("uuid")]
    assert (await client.verify()).ok


async def test_codex_rollouts(daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """Three CLI versions: before the envelope (2025-05), 0.46 and 0.80."""
    root = os.path.join(short_dir, "sessions")
    shutil.copytree(CODEX, root)
    code, out = await import_json(daemon, "--format", "codex", root)
    assert code == 0 and out["failed"] == [] and len(out["imported"]) == 3
    sid = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
    s = await client.get_session(sid)
    assert (s.working_dir, s.model, s.adapter) == ("/home/dev/billing", "gpt-5-codex", "codex")
    assert s.task == "Why does test_invoice_due_date fail on the 31st?"
    assert (s.metadata["git_branch"], s.metadata["cli_version"]) == ("main", "0.46.0")
    # token_count: the last turn's figures, each counted once (repeats are not turns).
    assert (s.token_usage.input_tokens, s.token_usage.output_tokens) == (8120 + 8480, 210 + 52)
    assert s.timestamps.created_at == rfc3339("2025-10-14T08:30:00.512Z")
    assert s.timestamps.updated_at == rfc3339("2025-10-14T08:30:12.900Z")
    msgs = (await client.list_messages(sid)).messages
    assert [(m.role, m.tool_call_id) for m in msgs] == [
        ("system", None), ("user", None), ("assistant", None),
        ("tool", "call_Q1w2E3r4T5y6U7i8"), ("assistant", None)]
    assert msgs[2].metadata["tool_calls"][0]["id"] == "call_Q1w2E3r4T5y6U7i8"
    assert msgs[4].timestamp == rfc3339("2025-10-14T08:30:12.870Z")
    new = await client.get_session("019bd7a1-2c3d-7e4f-8a9b-0c1d2e3f4a5b")
    assert (new.model, new.metadata["git_branch"]) == ("gpt-5.2-codex", "docs/typos")
    new_msgs = (await client.list_messages(new.session_id)).messages
    assert [m.role for m in new_msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert new_msgs[2].metadata["tool_calls"][0]["name"] == "apply_patch"
    old = (await client.list_messages("0b9c8d7e-6f5a-4b3c-9d2e-1f0a9b8c7d6e")).messages
    assert [(m.role, m.tool_call_id) for m in old] == [
        ("user", None), ("assistant", None), ("tool", "call_Ab12Cd34Ef56"), ("assistant", None)]
    # Without a PATH: where Codex keeps them ($CODEX_HOME/sessions), as the unit runs it.
    home = os.path.join(short_dir, "codex-home")
    os.makedirs(home)
    os.rename(root, os.path.join(home, "sessions"))
    code, again = await import_json(daemon, "--format", "codex", env={"CODEX_HOME": home})
    assert code == 0 and again["imported"] == [] and len(again["skipped"]) == 3
    assert all(i["file"].startswith(home) for i in again["skipped"])
    assert (await client.verify()).ok


@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
async def test_transcripts_malformed_and_mixed(daemon: Daemon, client: AsyncClient,
                                               short_dir: str, fmt: str) -> None:
    """Bad lines fail alone (file, line, JSON path, reason); the good lines around them
    go in; a file with no good line leaves no session; good files beside import whole."""
    root = os.path.join(short_dir, "mixed")
    shutil.copytree(os.path.join(SOURCES, "malformed", fmt), os.path.join(root, "bad"))
    shutil.copytree(CC if fmt == "claude-code" else CODEX, os.path.join(root, "good"))
    code, out = await import_json(daemon, "--format", fmt, root)
    assert code == 1
    assert_failures_named(out["failed"])
    assert all(i["file"].startswith(os.path.join(root, "bad")) for i in out["failed"])
    assert len([i for i in out["imported"] if "/good/" in i["file"]]) == (
        5 if fmt == "claude-code" else 3)
    by_line = {i["line"]: i for i in out["failed"] if "dead" not in i["file"]}
    if fmt == "claude-code":
        sid = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
        assert sorted(by_line) == [2, 3, 4, 5, 6, 8]
        assert "invalid JSON" in by_line[2]["reason"]
        assert "found a list" in by_line[3]["reason"]
        assert by_line[4]["path"] == "$.message.content"
        assert by_line[5]["path"] == "$.timestamp"
        assert "UTF-8" in by_line[6]["reason"]
        # A number past the contract's bounds: the daemon refuses that line alone.
        assert "input.timeout_ms" in by_line[8]["reason"], by_line[8]
        assert not await exists(client, "0f0f0f0f-0000-4000-8000-00000000dead")
        expect = ["Run the migrations.", "Migrations applied: 0042_add_index, 0043_backfill."]
    else:
        sid = "1c2d3e4f-5a6b-4c7d-8e9f-0a1b2c3d4e5f"
        assert sorted(by_line) == [3, 4]
        assert by_line[3]["path"] == "$.payload.role"
        assert (by_line[4]["path"], by_line[4]["reason"]) == ("$.payload.call_id", "missing")
        # The last line, cut short without a newline: still being written (issue 44 §6),
        # pending, not a failure.
        [cut] = [i for i in out["imported"] if i["session_id"] == sid]
        assert cut["pending"] == 1 and "line 6 has no newline yet" in cut["warnings"][0]
        expect = ["List the open ports.", "Ports 22 and 5432 are open."]
    assert [m.content for m in (await client.list_messages(sid)).messages] == expect
    code, _, err = await sessionctl(daemon, "import", "--format", fmt, root)
    assert code == 1 and "Traceback" not in err and "line 3" in err


# --- --follow: a writer appends, rotates and rewrites while the follower runs and restarts

WRITER = r"""
import json, os, sys, time
fmt, path, sid, count, gates = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
pauses = {int(n): g for n, g in (x.split("=") for x in sys.argv[6:])}
rotate_at, rewrite_at = {20, 50}, {45}

def line(i):
    at = f"2026-03-01T10:{i // 60:02d}:{i % 60:02d}.000Z"
    if fmt == "codex":
        if i == 0:
            return {"timestamp": at, "type": "session_meta", "payload": {
                "id": sid, "timestamp": at, "cwd": "/w", "cli_version": "0.80.0"}}
        return {"timestamp": at, "type": "response_item", "payload": {
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": f"line {i}"}]}}
    if i == 0:
        return {"type": "summary", "summary": "followed", "leafUuid": "x"}
    return {"type": "user", "uuid": f"00000000-0000-4000-8000-{i:012d}", "sessionId": sid,
            "parentUuid": None, "cwd": "/w", "version": "2.1.12", "timestamp": at,
            "message": {"role": "user", "content": f"line {i}"}}

written = []  # the lines of the current file
f = open(path, "w")
for i in range(count + 1):
    gate = pauses.get(i)
    if gate:
        while not os.path.exists(os.path.join(gates, gate)):
            time.sleep(0.01)
    if i in rotate_at:  # as logrotate does: x.1 becomes x.2, x becomes x.1, a new x
        f.close()
        if os.path.exists(path + ".1"):
            os.rename(path + ".1", path + ".2")
        os.rename(path, path + ".1")
        f, written = open(path, "w"), []
    if i in rewrite_at:  # the CLI rewrites its file: same lines, a new inode
        f.close()
        with open(path + ".tmp", "w") as t:
            t.writelines(written)
        os.replace(path + ".tmp", path)
        f = open(path, "a")
    text = json.dumps(line(i)) + "\n"
    half = len(text) // 2
    f.write(text[:half]); f.flush()  # the follower may see half a line: it must wait
    time.sleep(0.005)
    f.write(text[half:]); f.flush()
    written.append(text)
    time.sleep(0.005)
f.close()
"""


@pytest.mark.slow_on_postgresql
@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
async def test_follow_appends_rotates_and_restarts(daemon: Daemon, client: AsyncClient,
                                                   short_dir: str, fmt: str) -> None:
    """Every line once, in order, across a follower stop (lines written meanwhile, a
    rotation among them), a restart, a rewrite and a rotation while it runs."""
    count = 60
    if fmt == "codex":
        sid = "019c0000-1111-7222-8333-444455556666"
        folder = os.path.join(short_dir, "sessions", "2026", "03", "01")
        path = os.path.join(folder, f"rollout-2026-03-01T10-00-00-{sid}.jsonl")
    else:
        sid = "11111111-2222-4333-8444-555555555555"
        folder = os.path.join(short_dir, "projects", "-w")
        path = os.path.join(folder, f"{sid}.jsonl")
    os.makedirs(folder)
    root = os.path.join(short_dir, "sessions" if fmt == "codex" else "projects")
    gates = os.path.join(short_dir, "gates")
    os.makedirs(gates)
    follow = [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "import",
              "--format", fmt, root, "--follow", "--interval", "0.02", "--json"]
    env = dict(os.environ)

    async def contents() -> list[str]:
        if not await exists(client, sid):
            return []
        return [m.content for m in (await client.list_messages(sid, limit=1000)).messages]

    async def has(n: int) -> bool:
        return len(await contents()) >= n

    def stop(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait() == 0

    follower = subprocess.Popen(follow, env=env)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, fmt, path, sid, str(count), gates,
                               "16=stop", "36=restarted"], env=env)
    try:
        await eventually(lambda: has(15), "the follower to take lines 1-15")
        await anyio.to_thread.run_sync(stop, follower)
        write(os.path.join(gates, "stop"), "")  # lines 16-35 (a rotation) while it is down
        def at_gate() -> bool:  # lines 20-35 in the new file, 35 ended by its newline
            with open(path, "rb") as f:
                return f.read().count(b"\n") == 16
        await eventually(lambda: os.path.exists(path + ".1") and at_gate(),
                         "the writer to reach line 35")
        follower = subprocess.Popen(follow, env=env)
        write(os.path.join(gates, "restarted"), "")
        assert await anyio.to_thread.run_sync(writer.wait) == 0
        await eventually(lambda: has(count), "every line to arrive")
    finally:
        for proc in (writer, follower):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert await contents() == [f"line {i}" for i in range(1, count + 1)]
    # A restarted follower, or a one-off import, finds nothing new.
    code, out = await import_json(daemon, "--format", fmt, root)
    assert code == 0 and out["imported"] == [] and out["failed"] == []
    assert await contents() == [f"line {i}" for i in range(1, count + 1)]
    assert (await client.verify()).ok


async def test_follow_reads_a_file_rewritten_in_place_again(
        daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """A transcript rewritten in place (same inode) that is as long as before or longer
    is read again from its start: its new first lines are not lost behind the offset the
    follower had reached (issue 45 §7); lines it held before count once."""
    from sessiond import Client
    from sessiond.importers.transcripts import TranscriptImporter

    sid = "11111111-2222-4333-8444-666666666666"
    folder = os.path.join(short_dir, "projects", "-w")
    os.makedirs(folder)
    path = os.path.join(folder, f"{sid}.jsonl")

    def line(n: int, text: str) -> str:
        return json.dumps({"type": "user", "uuid": f"00000000-0000-4000-8000-{n:012d}",
                           "sessionId": sid, "parentUuid": None, "cwd": "/w",
                           "timestamp": f"2026-03-01T10:00:{n:02d}.000Z",
                           "message": {"role": "user", "content": text}}) + "\n"

    def follow() -> None:
        with Client(daemon.socket) as sync_client:
            importer = TranscriptImporter(sync_client, "claude-code")
            write(path, line(1, "first") + line(2, "second"))
            assert importer.sync(path, final=False).error is None
            inode = os.stat(path).st_ino
            with open(path, "r+") as f:  # in place: truncated, then longer than before
                f.truncate(0)
                f.write(line(3, "a new start") + line(1, "first") + line(2, "second")
                        + line(4, "after"))
            assert os.stat(path).st_ino == inode
            result = importer.sync(path, final=False)
            importer.close()
            assert result.error is None, result.error

    await anyio.to_thread.run_sync(follow)
    contents = [m.content for m in (await client.list_messages(sid)).messages]
    assert contents == ["first", "second", "a new start", "after"]


async def test_an_idle_follow_pass_opens_no_transcript(
        daemon: Daemon, short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A --follow pass over transcripts that did not change since the last one reads
    none of them (a stat each), even those whose tails were closed to keep the open files
    bounded; one that changed is read (issue 45 §7: many idle transcripts)."""
    from sessiond import Client
    from sessiond.importers import transcripts
    from sessiond.importers.transcripts import OPEN_FILES, TranscriptImporter

    folder = os.path.join(short_dir, "projects", "-w")
    os.makedirs(folder)
    count = OPEN_FILES + 6  # more than stay open: some tails are closed between passes
    paths = []
    for i in range(count):
        sid = f"11111111-2222-4333-8444-{i:012d}"
        paths.append(write(os.path.join(folder, f"{sid}.jsonl"), json.dumps(
            {"type": "user", "uuid": f"00000000-0000-4000-8000-{i:012d}", "sessionId": sid,
             "parentUuid": None, "cwd": "/w", "timestamp": "2026-03-01T10:00:00.000Z",
             "message": {"role": "user", "content": f"hello {i}"}}) + "\n"))
    opened: list[str] = []
    real = transcripts.open_transcript

    def counted(path: str) -> Any:
        opened.append(path)
        return real(path)

    monkeypatch.setattr(transcripts, "open_transcript", counted)

    def passes() -> tuple[int, int, list[str]]:
        with Client(daemon.socket) as sync_client:
            importer = TranscriptImporter(sync_client, "claude-code")
            root = os.path.join(short_dir, "projects")

            def one_pass() -> int:
                before = len(opened)
                for path, inode in importer.files(root):
                    assert importer.sync(path, final=False, inode=inode).error is None
                return len(opened) - before

            first = one_pass()
            idle = one_pass()
            with open(paths[0], "a") as f:  # one grows: it alone is read
                f.write(json.dumps({"type": "summary", "summary": "s", "leafUuid": "x"})
                        + "\n")
            before = len(opened)
            one_pass()
            importer.close()
            return first, idle, opened[before:]

    first, idle, third = await anyio.to_thread.run_sync(passes)
    assert first == count and idle == 0
    assert third in ([], [paths[0]])  # read through its open handle, or opened again


# --- fuzz: malformed and truncated inputs to every importer ----------------------------

def _source(fmt: str) -> tuple[str, str]:
    """(file name inside a root, its text) of a good source of `fmt`, whose session id
    is the placeholder SID."""
    if fmt == "hive":
        with open(os.path.join(FIXTURES, "hive", "sessions", HIVE_GOOD, "state.json")) as f:
            return "sessions/SID/state.json", f.read().replace(HIVE_GOOD, "SID")
    if fmt == "cleveragents":
        with open(os.path.join(FIXTURES, "cleveragents", "session.json")) as f:
            text = f.read()
        return "SID.json", text.replace(json.loads(text)["session_id"], "SID")
    if fmt == "zwarm":
        [sid] = os.listdir(os.path.join(FIXTURES, "zwarm", ".zwarm", "sessions"))
        with open(os.path.join(FIXTURES, "zwarm", ".zwarm", "sessions", sid, "meta.json")) as f:
            return ".zwarm/sessions/SID/meta.json", f.read().replace(sid, "SID")
    if fmt == "claude-code":
        sid = "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"
        with open(os.path.join(CC, "-home-dev-shop", f"{sid}.jsonl")) as f:
            return "p/SID.jsonl", f.read().replace(sid, "SID")
    sid = "5a4b3c2d-1e0f-4a9b-8c7d-6e5f4a3b2c1d"
    [name] = os.listdir(os.path.join(CODEX, "2025", "10", "14"))
    with open(os.path.join(CODEX, "2025", "10", "14", name)) as f:
        return name.replace(sid, "SID"), f.read().replace(sid, "SID")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=3),
    max_leaves=6)


Mutation = tuple[str, float, bytes, list[int], Any]
mutations = st.tuples(st.sampled_from(["truncate", "bytes", "value", "drop"]),
                      st.floats(0, 1, exclude_max=True), st.binary(min_size=1, max_size=8),
                      st.lists(st.integers(0, 10**6), min_size=2, max_size=8), json_values)


def mutate(text: str, m: Mutation) -> bytes:
    """The source cut short, with bytes changed, or with one JSON value replaced or
    removed (in one line, for JSON Lines); `m`'s numbers pick where."""
    how, where, garbage, picks, value = m
    data = text.encode()
    if how == "truncate":
        return data[:int(where * len(data))]
    if how == "bytes":
        at = int(where * len(data))
        return data[:at] + garbage + data[at + 1:]
    jsonl_text = text.startswith("{\"") and "\n{" in text
    lines = text.splitlines(keepends=True) if jsonl_text else [text]
    i = int(where * len(lines))
    doc = json.loads(lines[i])
    node: Any = doc
    for depth, pick in enumerate(picks):
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if not keys:
            break
        key = keys[pick % len(keys)]
        below = node[key]
        if isinstance(below, (dict, list)) and below and depth < len(picks) - 1 and pick % 3:
            node = below
            continue
        if how == "drop" and isinstance(node, dict):
            del node[key]
        else:
            node[key] = value
        break
    lines[i] = json.dumps(doc) + ("\n" if lines[i].endswith("\n") else "")
    return "".join(lines).encode()


fuzz_counter = iter(range(10**9))


@pytest.mark.parametrize("fmt", ["hive", "cleveragents", "zwarm", "claude-code", "codex"])
@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@pytest.mark.slow_on_postgresql
@given(mutation=mutations)
async def test_fuzz_importers(daemon: Daemon, client: AsyncClient, short_dir: str, fmt: str,
                              mutation: Mutation) -> None:
    """No traceback, every failure names its file (and a path and a reason), and nothing
    half-imported: the daemon gains exactly the sessions and events reported imported."""
    from sessiond import Client
    from sessiond.importers.transcripts import TranscriptImporter

    name, text = _source(fmt)
    n = next(fuzz_counter)
    sid = f"fz{n:04d}" if fmt in ("hive", "cleveragents", "zwarm") else \
        f"{n:08d}-0000-4000-8000-000000000000"
    root = os.path.join(short_dir, f"fuzz{n}")
    path = write(os.path.join(root, name.replace("SID", sid)),
                 mutate(text.replace("SID", sid), mutation))
    before = await client.stats()

    def run() -> tuple[list[dict[str, Any]], int, int]:
        failures: list[dict[str, Any]] = []
        sessions = versions = 0
        with Client(daemon.socket) as c:
            if fmt in FORMATS:
                for found in FORMATS[fmt](root, False):
                    if found.problem is not None:
                        failures.append({"file": found.file, "problem": found.problem})
                        continue
                    try:
                        state = c.import_session(found.document)
                    except SessiondError as exc:
                        failures.append({"file": found.file, "problem": exc})
                        continue
                    sessions, versions = sessions + 1, versions + state.version
            else:
                importer = TranscriptImporter(c, fmt)
                listed = importer.files(root)
                importer.close()
                for file, inode in listed:
                    result = importer.sync(file, inode=inode)
                    failures += [{"file": file, "problem": p} for p in result.failures]
                    if result.error is not None:
                        failures.append({"file": file, "problem": result.error})
                    if result.created:
                        sessions, versions = sessions + 1, versions + (result.version or 0)
                        keys = {e.meta.idempotency_key for e in c.read_events(
                            result.session_id, limit=10_000).events} - {None}
                        assert len(keys) == result.appended, (keys, result)
                    importer.close()
        return failures, sessions, versions

    failures, sessions, versions = await anyio.to_thread.run_sync(run)
    for failure in failures:
        problem = failure["problem"]
        assert failure["file"] == path, failure  # the file, named once
        reason = problem.reason if isinstance(problem, Problem) else problem.message
        assert reason and not re.fullmatch(r"'[^']*'", reason), failure
        if isinstance(problem, Problem):
            assert problem.path.startswith("$")
    after = await client.stats()
    assert after.sessions - before.sessions == sessions
    assert after.events - before.events == versions


async def test_follow_is_live_and_waits_for_a_restarted_daemon(short_dir: str) -> None:
    """What the CLI writes reaches a subscriber (what `watch` and `top` read) while the
    CLI runs; the follower outlives a daemon restart, and the lines written meanwhile
    arrive after it, once each, in order."""
    config = daemon_config(short_dir)
    sid = "22222222-3333-4444-8555-666666666666"
    path = os.path.join(short_dir, "projects", "-w", f"{sid}.jsonl")

    def append(i: int) -> None:
        with open(path, "a") as f:
            f.write(json.dumps({
                "type": "user", "uuid": f"00000000-0000-4000-8000-{i:012d}", "sessionId": sid,
                "timestamp": f"2026-03-01T10:00:{i:02d}.000Z",
                "message": {"role": "user", "content": f"line {i}"}}) + "\n")

    write(path, "")
    append(1)
    follower: subprocess.Popen[bytes] | None = None
    try:
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            follower = subprocess.Popen(
                [sys.executable, "-m", "sessiond.cli", "--socket", d.socket, "import",
                 "--format", "claude-code", os.path.join(short_dir, "projects"), "--follow",
                 "--interval", "0.02"], stderr=subprocess.PIPE)
            await eventually(lambda: exists(c, sid), "the session")
            async with c.subscribe(sid, from_version=1) as sub:
                assert (await sub.__anext__()).type == "session.created"
                assert (await sub.__anext__()).data.content == "line 1"
                append(2)  # written by the CLI now: the subscriber sees it
                assert (await sub.__anext__()).data.content == "line 2"
        append(3)  # the daemon is down
        append(4)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            async def arrived() -> bool:
                return (await c.get_session(sid)).message_count == 4
            await eventually(arrived, "lines 3 and 4 after the restart")
            msgs = (await c.list_messages(sid)).messages
            assert [m.content for m in msgs] == [f"line {i}" for i in range(1, 5)]
            hits = (await c.search('"line 4"')).sessions
            assert [h.session_id for h in hits] == [sid]
    finally:
        if follower is not None:
            follower.send_signal(signal.SIGTERM)
            _, err = await anyio.to_thread.run_sync(follower.communicate)
    assert follower is not None and follower.returncode == 0
    said = err.decode()
    assert "Traceback" not in said
    assert said.count("waiting for the daemon") == 1 and "the daemon is back" in said


def _rollout_line(text: str, ts: str) -> str:
    return json.dumps({"timestamp": ts, "type": "response_item", "payload": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": text}]}}) + "\n"


class TestFollowKeepsItsFootprint:
    """--follow over many transcripts, and over one rewritten in place (review findings)."""

    async def test_many_files_hold_few_descriptors_and_all_are_read(
            self, daemon: Daemon, short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
        from sessiond import Client
        from sessiond.importers import transcripts

        monkeypatch.setattr(transcripts, "OPEN_FILES", 4)  # a small cap, so 12 files pass it
        paths = []
        for i in range(12):
            path = os.path.join(short_dir, f"rollout-2026-12-01T10-00-00-0199a1b2-c3d4-7e5f-"
                                f"8a9b-0c1d2e3f4a{i:02d}.jsonl")
            with open(path, "w") as f:
                f.write(_rollout_line(f"hello {i}", "2026-12-01T10:00:00Z"))
            paths.append(path)

        def follow() -> list[str]:
            with Client(daemon.socket) as c:
                imp = transcripts.TranscriptImporter(c, "codex")
                for path in paths:  # pass 1
                    assert imp.sync(path, final=False).error is None
                    assert sum(t.handle is not None for t in imp.tails.values()) <= 4
                for path in paths:
                    with open(path, "a") as f:
                        f.write(_rollout_line("again", "2026-12-01T10:00:01Z"))
                sids = [imp.sync(path, final=False).session_id for path in paths]  # pass 2
                imp.close()
                return [m.content for sid in sids
                        for m in c.list_messages(str(sid), limit=10).messages]

        texts = await anyio.to_thread.run_sync(follow)
        assert sorted(texts) == sorted([f"hello {i}" for i in range(12)] + ["again"] * 12)

    async def test_a_rollout_rewritten_in_place_is_read_once(
            self, daemon: Daemon, short_dir: str) -> None:
        from sessiond import Client
        from sessiond.importers.transcripts import TranscriptImporter

        path = os.path.join(short_dir, "rollout-2026-12-01T10-00-00-0199a1b2-c3d4-7e5f-8a9b-"
                            "0c1d2e3f4a5b.jsonl")
        a = _rollout_line("first", "2026-12-01T10:00:00Z")
        b = _rollout_line("second", "2026-12-01T10:00:01Z")
        with open(path, "w") as f:
            f.write(a + b)

        def follow() -> list[str]:
            with Client(daemon.socket) as c:
                imp = TranscriptImporter(c, "codex")
                imp.sync(path, final=False)
                with open(path, "w") as f:  # rewritten: cut to nothing, written again
                    f.write(a)
                imp.sync(path, final=False)
                with open(path, "a") as f:
                    f.write(b + _rollout_line("third", "2026-12-01T10:00:02Z"))
                sid = imp.sync(path, final=False).session_id
                imp.close()
                return [m.content for m in c.list_messages(str(sid), limit=10).messages]

        assert await anyio.to_thread.run_sync(follow) == ["first", "second", "third"]


CURRENT = os.path.join(SOURCES, "current")


async def test_current_claude_code_records(daemon: Daemon, client: AsyncClient,
                                           short_dir: str) -> None:
    """Claude Code 2.1.90: a sub-agent in subagents/, a compact_boundary and the summary
    after it, a custom title, progress and last-prompt lines (kept, nothing in the view)."""
    root = os.path.join(short_dir, "projects")
    shutil.copytree(os.path.join(CURRENT, "claude-code", "projects"), root)
    code, out = await import_json(daemon, "--format", "claude-code", root)
    assert code == 0 and out["failed"] == [] and len(out["imported"]) == 2
    sid = "9c8b7a6d-5e4f-4a3b-8c2d-1e0f9a8b7c6e"
    s = await client.get_session(sid)
    assert (s.namespace, s.task, s.model, s.metadata["title"], s.metadata["project"]) == (
        "claude-code:-home-dev-web", "Why does the build fail on CI only?", "claude-opus-4-6",
        "CI Node version", "-home-dev-web")
    msgs = (await client.list_messages(sid)).messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "system", "user",
                                      "assistant"]
    boundary, summary = msgs[3].metadata["claude_code"], msgs[4].metadata["claude_code"]
    assert (boundary["subtype"], boundary["compact_trigger"], boundary["compact_pre_tokens"],
            boundary["logical_parent_uuid"]) == (
        "compact_boundary", "manual", 48210, "d00dfeed-0000-4000-8000-000000000005")
    assert summary["is_compact_summary"] is True
    sub = await client.get_session(f"{sid}.agent-b7e1d20")
    assert (sub.namespace, sub.metadata["subpath"], sub.correlation_id) == (
        f"claude-code:-home-dev-web:{sid}", "subagents/agent-b7e1d20", sid)
    assert [m.role for m in (await client.list_messages(sub.session_id)).messages] == [
        "user", "assistant", "tool", "assistant"]
    assert (await client.verify()).ok


async def test_current_codex_rollout(daemon: Daemon, client: AsyncClient,
                                     short_dir: str) -> None:
    """Codex 0.169: a fork (forked_from_id, and the source's meta line copied after its
    own), a rollback (thread_rolled_back) and a compaction (compacted)."""
    root = os.path.join(short_dir, "sessions")
    shutil.copytree(os.path.join(CURRENT, "codex", "sessions"), root)
    code, out = await import_json(daemon, "--format", "codex", root)
    assert code == 0 and out["failed"] == []
    sid = "019ad0c4-7e21-7b3a-9f10-3c4d5e6f7a8b"
    assert [i["session_id"] for i in out["imported"]] == [sid]  # not the fork's source
    s = await client.get_session(sid)
    assert (s.metadata["forked_from_id"], s.metadata["cli_version"], s.model) == (
        "019ad0a0-1111-7222-8333-444455556666", "0.169.0", "gpt-5.3-codex")
    msgs = (await client.list_messages(sid)).messages
    assert [m.role for m in msgs] == ["user", "assistant", "tool", "assistant", "system",
                                      "user", "assistant"]
    assert msgs[4].metadata["codex"]["rolled_back_turns"] == 1
    assert (s.token_usage.input_tokens, s.token_usage.output_tokens) == (5000 + 6000, 80 + 40)
    with pytest.raises(SessionNotFoundError):
        await client.get_session("019ad0a0-1111-7222-8333-444455556666")


def cc_line(n: int, text: str, sid: str = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6") -> str:
    return json.dumps({"type": "user", "uuid": f"5e0c1d2a-0000-4000-8000-{n:012d}",
                       "sessionId": sid, "cwd": "/home/me/app",
                       "timestamp": f"2026-03-01T09:00:{n:02d}.000Z",
                       "message": {"role": "user", "content": text}})


def put(path: str, *lines: str) -> None:
    """A transcript of these lines, each with its newline."""
    with open(path, "w") as f:
        f.write("".join(line + "\n" for line in lines))


async def test_a_last_line_being_written_is_pending(daemon: Daemon, client: AsyncClient,
                                                    short_dir: str) -> None:
    """A one-off import while the CLI writes: the half line is pending, not a failure; a
    re-run says the good lines are in; once whole it goes in."""
    folder = os.path.join(short_dir, "projects", "-home-me-app")
    os.makedirs(folder)
    path = os.path.join(folder, "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl")
    last = cc_line(3, "and the third")
    with open(path, "w") as f:
        f.write(cc_line(1, "first") + "\n" + cc_line(2, "second") + "\n" + last[:40])
    code, out = await import_json(daemon, "--format", "claude-code", folder)
    assert code == 0 and out["failed"] == [], out
    [item] = out["imported"]
    assert (item["lines"], item["pending"]) == (2, 1)
    assert "no newline yet" in item["warnings"][0]
    code, out = await import_json(daemon, "--format", "claude-code", folder)
    assert code == 0 and out["failed"] == [] and out["imported"] == []
    assert [i["reason"] for i in out["skipped"]] == ["nothing new"]
    with open(path, "a") as f:
        f.write(last[40:] + "\n")
    code, out = await import_json(daemon, "--format", "claude-code", folder)
    assert code == 0 and [i["lines"] for i in out["imported"]] == [1]
    msgs = (await client.list_messages("0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")).messages
    assert [m.content for m in msgs] == ["first", "second", "and the third"]


async def test_a_line_over_max_request_bytes_is_stored_cut(short_dir: str, db_url: str
                                                           ) -> None:
    """The daemon takes no request over max_request_bytes: that line is stored cut, marked,
    and the lines after it go in."""
    config = daemon_config(short_dir, db=db_url, max_request_bytes=2 << 20)
    async with running_daemon(config) as d, AsyncClient(d.socket) as client:
        folder = os.path.join(short_dir, "projects", "-home-me-app")
        os.makedirs(folder)
        big = "x" * (3 << 20)
        put(os.path.join(folder, "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl"),
            cc_line(1, "before"), cc_line(2, big), cc_line(3, "after"))
        code, out = await import_json(d, "--format", "claude-code", folder)
        assert code == 0 and out["failed"] == [], out
        assert any("stored cut" in w for w in out["imported"][0]["warnings"])
        sid = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"
        msgs = (await client.list_messages(sid)).messages
        assert [m.content[:6] for m in msgs] == ["before", "xxxxxx", "after"]
        assert len(msgs[1].content) < len(big)  # cut (to SOURCE_LIMIT, as every long text)
        kept = [e.fields() for e in (await client.read_events(sid)).events
                if "transcript_line_cut" in e.fields()]
        assert [k["transcript_line_cut"] for k in kept] == [len(cc_line(2, big))]
        assert (await client.verify()).ok


async def test_a_transcript_never_appends_to_a_session_it_did_not_make(
        daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """A transcript named after a session someone else made, or another project's file of
    the same name: refused, named, and that session left as it was."""
    sid = "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"
    await client.create_session(sid, task="mine")
    before = (await client.get_session(sid)).version
    folder = os.path.join(short_dir, "projects", "-home-me-app")
    os.makedirs(folder)
    put(os.path.join(folder, f"{sid}.jsonl"), cc_line(1, "hello"))
    code, out = await import_json(daemon, "--format", "claude-code", folder)
    assert code == 1 and out["imported"] == []
    assert "was not made from this transcript" in out["failed"][0]["reason"]
    assert (await client.get_session(sid)).version == before
    # Imported from one project's folder, the same file name in another is not it either.
    await client.delete_session(sid)
    code, out = await import_json(daemon, "--format", "claude-code", folder)
    assert code == 0
    version = (await client.get_session(sid)).version
    other = os.path.join(short_dir, "projects", "-home-me-other")
    os.makedirs(other)
    put(os.path.join(other, f"{sid}.jsonl"), cc_line(2, "not the same session"))
    code, out = await import_json(daemon, "--format", "claude-code", other)
    assert code == 1 and "was not made from this transcript" in out["failed"][0]["reason"]
    assert (await client.get_session(sid)).version == version


async def test_fifos_and_symlinks_are_not_followed(daemon: Daemon, client: AsyncClient,
                                                   short_dir: str) -> None:
    """A FIFO named like a transcript would block a reader; a symlink could lead
    anywhere (another user's files): neither is read, the real file is."""
    root = os.path.join(short_dir, "projects")
    folder = os.path.join(root, "-home-me-app")
    os.makedirs(folder)
    put(os.path.join(folder, "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl"), cc_line(1, "real"))
    os.mkfifo(os.path.join(folder, "1d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl"))
    elsewhere = os.path.join(short_dir, "elsewhere")
    os.makedirs(os.path.join(elsewhere, "-home-x"))
    secret = os.path.join(elsewhere, "-home-x", "2d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl")
    put(secret, cc_line(1, "not to be read", "2d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"))
    os.symlink(secret, os.path.join(folder, "2d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl"))
    os.symlink(os.path.join(elsewhere, "-home-x"), os.path.join(root, "-home-linked"))
    with anyio.fail_after(120):  # a guard against the FIFO hanging the run, not a bound
        code, out = await import_json(daemon, "--format", "claude-code", root)
    assert code == 0 and out["failed"] == [], out
    assert [i["session_id"] for i in out["imported"]] == ["0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6"]
    # Given by name, a FIFO or a symlink is a failure that says why, not a hang.
    for name, why in (("1d1e2f3a", "not a regular file"), ("2d1e2f3a", "symbolic link")):
        path = os.path.join(folder, f"{name}-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl")
        with anyio.fail_after(120):
            code, out = await import_json(daemon, "--format", "claude-code", path)
        assert code == 1 and why in out["failed"][0]["reason"], out


async def test_a_long_transcript_goes_in_as_a_document_then_appends(
        daemon: Daemon, client: AsyncClient, short_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A first import sends at most about DOCUMENT_BYTES in its session.import (the lines
    keep their recorded times); the rest follow as appends, every line once."""
    from sessiond import Client
    from sessiond.importers import transcripts

    monkeypatch.setattr(transcripts, "DOCUMENT_BYTES", 2000)
    folder = os.path.join(short_dir, "projects", "-home-me-app")
    os.makedirs(folder)
    path = os.path.join(folder, "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6.jsonl")
    put(path, *(cc_line(n, f"line {n}") for n in range(1, 11)))
    with Client(daemon.socket) as sync:
        importer = transcripts.TranscriptImporter(sync, "claude-code")
        result = await anyio.to_thread.run_sync(lambda: importer.sync(path))
        importer.close()
    assert result.error is None and (result.created, result.appended) == (True, 10)
    msgs = (await client.list_messages("0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6")).messages
    assert [m.content for m in msgs] == [f"line {n}" for n in range(1, 11)]
    assert msgs[0].timestamp == rfc3339("2026-03-01T09:00:01.000Z")  # in the document
    assert msgs[-1].timestamp != rfc3339("2026-03-01T09:00:10.000Z")  # appended after it
    assert await keys_of(client, "0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6") == [
        f"cc:5e0c1d2a-0000-4000-8000-{n:012d}" for n in range(1, 11)]
