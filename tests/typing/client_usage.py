"""Uses every client method the way an application would; checked by `mypy --strict`
(tests/test_client_typing.py), never run. `assert_type` fails the check if a method's
declared result is not exactly the one named here (an `Any` included)."""

from __future__ import annotations

from typing import Any, assert_type

from sessiond import AsyncClient, Client
from sessiond.integrations._loop import LoopClient
from sessiond_schemas import rpc
from sessiond_schemas.state import SessionState


def blocking(c: Client, sid: str) -> None:
    assert_type(c.ping(), rpc.PingResult)
    assert_type(c.stats(), rpc.StatsResult)
    assert_type(c.verify(), rpc.VerifyResult)
    assert_type(c.backup("/tmp/b.db"), rpc.BackupResult)
    assert_type(c.create_session(sid, task="t"), SessionState)
    assert_type(c.get_session(sid, at_version=1), SessionState)
    assert_type(c.resolve(sid[:8]), str)
    assert_type(c.list_sessions(limit=10), rpc.SessionListResult)
    assert_type(c.transition(sid, "paused", reason="r"), SessionState)
    assert_type(c.set_ttl(sid, 3600), SessionState)
    assert_type(c.resume(sid), rpc.SessionResumeResult)
    assert_type(c.delete_session(sid), bool)
    document: dict[str, Any] = c.export_session(sid)
    assert_type(c.import_session(document, on_conflict="skip"), SessionState)
    assert_type(c.cleanup(older_than_days=1), rpc.CleanupResult)
    appended: rpc.MessageAppendResult = c.append_message(sid, "user", "hi")
    assert_type(appended.sequence, int)
    assert_type(c.append_messages(sid, [{"role": "user", "content": "a"}]),
                rpc.MessageAppendManyResult)
    assert_type(c.list_messages(sid, limit=5), rpc.MessageListResult)
    assert_type(c.pop_message(sid), rpc.MessagePopResult)
    assert_type(c.clear_messages(sid), rpc.MessageClearResult)
    assert_type(c.record_tokens(sid, input_tokens=1), rpc.TokensRecordResult)
    assert_type(c.record_progress(sid, "n1", latency_ms=3), rpc.ProgressRecordResult)
    assert_type(c.update_memory(sid, {"k": 1}), rpc.MemoryUpdateResult)
    assert_type(c.save_checkpoint(sid, {"p": 1}, node_id="n"), rpc.CheckpointSaveResult)
    assert_type(c.get_checkpoint(sid), rpc.CheckpointGetResult)
    infos: list[rpc.CheckpointInfo] = c.list_checkpoints(sid)
    assert_type(infos, list[rpc.CheckpointInfo])
    assert_type(c.append_events(sid, [{"type": "plan.linked", "data": {"plan_id": "p"}}]),
                rpc.WriteResult)
    assert_type(c.read_events(sid, from_version=0), rpc.EventsReadResult)
    assert_type(c.link_plan(sid, "p"), rpc.WriteResult)
    assert_type(c.record_result(sid, success=True), rpc.WriteResult)
    assert_type(c.spawn(["true"], task="t"), SessionState)
    assert_type(c.inject(sid, "more"), SessionState)
    assert_type(c.kill(sid), SessionState)
    assert_type(c.output(sid, turn=1), rpc.OutputResult)
    assert_type(c.trajectory(sid, full=True), list[rpc.Step])
    assert_type(c.search("needle", limit=3), rpc.SearchResult)
    assert_type(c.fork(sid, at_version=2), SessionState)
    assert_type(c.forks(sid), rpc.ForksResult)
    assert_type(c.reindex(), rpc.ReindexResult)
    assert_type(c.call("daemon.ping", rpc.PingResult), rpc.PingResult)
    with Client("/tmp/s.sock", timeout=1.0) as scoped:
        assert_type(scoped, Client)


async def awaited(c: AsyncClient, sid: str) -> None:
    assert_type(await c.ping(), rpc.PingResult)
    assert_type(await c.create_session(sid, task="t"), SessionState)
    assert_type(await c.set_ttl(sid, None), SessionState)
    appended: rpc.MessageAppendResult = await c.append_message(sid, "user", "hi")
    assert_type(appended.message_id, str)
    assert_type(await c.resolve(sid[:8]), str)
    assert_type(await c.delete_session(sid), bool)
    assert_type(await c.list_checkpoints(sid), list[rpc.CheckpointInfo])
    assert_type(await c.trajectory(sid), list[rpc.Step])
    assert_type(await c.export_session(sid), dict[str, Any])
    assert_type(await c.read_events(), rpc.EventsReadResult)
    assert_type(await c.forks(sid, limit=2), rpc.ForksResult)
    assert_type(await c.call("daemon.stats", rpc.StatsResult), rpc.StatsResult)
    async with AsyncClient("/tmp/s.sock") as scoped:
        assert_type(scoped, AsyncClient)
    async with c.subscribe(sid, from_version=0) as events:
        async for event in events:
            assert_type(event.version, int)


async def integrations(c: LoopClient, sid: str) -> None:
    assert_type(await c.get_session(sid), SessionState)
    assert_type(await c.append_message(sid, "user", "hi"), rpc.MessageAppendResult)
    c.close()


def keywords(c: Client, sid: str) -> None:
    """The options an editor completes, each by its own name and type."""
    c.append_message(sid, "tool", "out", tool_call_id="call-1", metadata={"k": 1},
                     expected_version=3, idempotency_key="k-1")
    c.record_tokens(sid, input_tokens=1, output_tokens=2, estimated_cost=0.5, model="m",
                    expected_version=4, idempotency_key="k-2")
    c.record_progress(sid, "n", edge="a->n", latency_ms=1, tokens=2, retries=0, failed=False)
    c.transition(sid, "failed", reason="r", error="e", expected_version=5)
    c.create_session(sid, namespace="ns", actor_name="o/n", status="pending",
                     metadata={}, input_data={}, checkpoint_enabled=True, idempotency_key="k")
    c.list_sessions(namespace="ns", status=["active"], created_after="2026-01-01T00:00:00Z")
    c.search("q", status=["completed"], since="2026-01-01T00:00:00Z", mark=("<", ">"))
    c.spawn(["true"], cwd="/", env={"A": "1"}, adapter="codex", session_id=sid)
    c.save_checkpoint(sid, {"p": 1}, checkpoint_id="c", resume_from="n", memory={})
    c.cleanup(older_than_days=1.5, statuses=["failed"], dry_run=True)
    c.fork(sid, 2, idempotency_key="k")
