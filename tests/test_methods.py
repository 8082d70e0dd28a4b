"""Every foundation method through the real client against a real daemon and database."""

from __future__ import annotations

import json
import re

import anyio
import pytest
from conftest import Daemon

from sessiond import (
    AmbiguousIdError,
    AsyncClient,
    CheckpointNotFoundError,
    InvalidParamsError,
    InvalidTransitionError,
    SessionExistsError,
    SessionNotFoundError,
    TooLargeError,
    VersionConflictError,
)
from sessiond_daemon.stores.schema import SESSION_TABLES
from sessiond_schemas import rpc

pytestmark = pytest.mark.anyio


def stored_types(daemon: Daemon, session_id: str) -> list[str]:
    rows = daemon.sql("SELECT type FROM events WHERE session_id = ? ORDER BY version", session_id)
    return [r[0] for r in rows]


class TestDaemonMethods:
    async def test_ping(self, client: AsyncClient) -> None:
        """daemon.ping answers pong, the version and the uptime."""
        r = await client.ping()
        assert r.pong and r.version and r.uptime_s >= 0

    async def test_stats_counts_sessions_and_events(self, client: AsyncClient,
                                                    store_kind: str) -> None:
        """daemon.stats counts sessions, events, positions and this connection (and the
        file's bytes: a PostgreSQL store has no file, nor a size cap)."""
        s = await client.create_session()
        await client.append_message(s.session_id, "user", "hi")
        st = await client.stats()
        assert (st.sessions, st.events, st.last_position) == (1, 2, 2)
        assert st.connections == 1 and st.write_queue_depth == 0
        assert st.db_bytes > 0 or store_kind == "postgresql"
        assert st.write_transactions >= 1 and st.write_commands == 2


class TestSessionCreate:
    async def test_create_with_fields(self, client: AsyncClient, daemon: Daemon) -> None:
        """Creation fields land in the state and in the stored session.created event."""
        s = await client.create_session(
            "session_20260101_120000_abcd1234", task="t", actor_name="ns/bot", goal_id="g",
            input_data={"q": 1}, metadata={"m": True}, status="pending")
        assert s.session_id == "session_20260101_120000_abcd1234"
        assert (s.status, s.version, s.task, s.actor_name, s.goal_id) == (
            "pending", 1, "t", "ns/bot", "g")
        assert s.input_data == {"q": 1} and s.metadata == {"m": True}
        [(data,)] = daemon.sql("SELECT data FROM events WHERE session_id = ?", s.session_id)
        assert json.loads(data)["task"] == "t"

    async def test_generated_id_is_a_ulid(self, client: AsyncClient) -> None:
        """Without an id the daemon makes a ULID."""
        s = await client.create_session()
        assert len(s.session_id) == 26 and s.status == "active"

    async def test_taken_id(self, client: AsyncClient, daemon: Daemon) -> None:
        """Creating with a taken id is -32004 and appends nothing."""
        await client.create_session("dup-1")
        with pytest.raises(SessionExistsError) as err:
            await client.create_session("dup-1")
        assert err.value.code == -32004 and err.value.data == {"session_id": "dup-1"}
        assert stored_types(daemon, "dup-1") == ["session.created"]

    async def test_bad_id_and_bad_actor(self, client: AsyncClient) -> None:
        """An id or actor_name of the wrong shape is -32602 naming the field."""
        with pytest.raises(InvalidParamsError) as err:
            await client.create_session("bad id!")
        assert err.value.data["path"] == "$.session_id"
        with pytest.raises(InvalidParamsError) as err:
            await client.create_session(actor_name="no-slash")
        assert err.value.data["path"] == "$.actor_name"

    async def test_unknown_field_is_refused(self, client: AsyncClient) -> None:
        """Params are decoded strictly: an unknown field is -32602 (sent with `call`, as
        the typed client method refuses it before sending: tests/test_clients.py)."""
        with pytest.raises(InvalidParamsError) as err:
            await client.call("session.create", colour="blue")
        assert "colour" in err.value.data["detail"]

    async def test_idempotent_create(self, client: AsyncClient, daemon: Daemon) -> None:
        """A repeated create with the same key returns the first result, appends nothing."""
        a = await client.create_session("idem-c", idempotency_key="k1")
        b = await client.create_session("idem-c", idempotency_key="k1")
        assert a == b
        assert stored_types(daemon, "idem-c") == ["session.created"]


class TestSessionGet:
    async def test_get_and_not_found(self, client: AsyncClient) -> None:
        """session.get returns the view; an unknown id is -32001 with the id."""
        s = await client.create_session(task="x")
        assert (await client.get_session(s.session_id)) == s
        with pytest.raises(SessionNotFoundError) as err:
            await client.get_session("missing")
        assert err.value.code == -32001 and err.value.data == {"session_id": "missing"}

    async def test_time_travel(self, client: AsyncClient) -> None:
        """at_version returns the state as it was after that version."""
        s = await client.create_session()
        for i in range(3):
            await client.append_message(s.session_id, "user", f"m{i}")
        past = await client.get_session(s.session_id, at_version=2)
        assert (past.version, past.message_count) == (2, 1)
        assert past.last_message is not None and past.last_message.content == "m0"
        with pytest.raises(InvalidParamsError) as err:
            await client.get_session(s.session_id, at_version=9)
        assert err.value.data["path"] == "$.at_version"

    async def test_view_survives_restart(self, short_dir: str) -> None:
        """After a restart the view is read from the database, equal to before."""
        import anyio
        from conftest import daemon_config

        from sessiond_daemon.serve import lifecycle

        config = daemon_config(short_dir)
        for round_ in range(2):
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                await tg.start(lifecycle.run, config, stop)
                async with AsyncClient(config.socket) as c:
                    if round_ == 0:
                        await c.create_session("keep-me")
                        await c.append_message("keep-me", "user", "persisted")
                        before = await c.get_session("keep-me")
                    else:
                        assert await c.get_session("keep-me") == before
                stop.set()


class TestSessionResolve:
    async def test_prefixes(self, client: AsyncClient) -> None:
        """A unique prefix resolves; a shared one is -32011 with candidates; none is -32001."""
        await client.create_session("alpha-one")
        await client.create_session("alpha-two")
        assert await client.resolve("alpha-o") == "alpha-one"
        assert await client.resolve("alpha-one") == "alpha-one"
        with pytest.raises(AmbiguousIdError) as err:
            await client.resolve("alpha")
        assert sorted(err.value.data["candidates"]) == ["alpha-one", "alpha-two"]
        with pytest.raises(SessionNotFoundError):
            await client.resolve("zzzz")
        with pytest.raises(InvalidParamsError):
            await client.resolve("abc")


class TestSessionList:
    async def test_filters_and_cursor_paging(self, client: AsyncClient) -> None:
        """Newest first; filters combine; the cursor walks every session once."""
        ids = []
        for i in range(7):
            s = await client.create_session(f"list-{i}", namespace="a" if i % 2 else "b",
                                            actor_name=f"ns/actor{i % 3}", source="user")
            ids.append(s.session_id)
        await client.transition("list-3", "completed")
        page = await client.list_sessions(limit=3)
        assert [s.session_id for s in page.sessions] == ids[::-1][:3]
        seen, cursor = [], None
        while True:
            page = await client.list_sessions(limit=3, cursor=cursor)
            seen += [s.session_id for s in page.sessions]
            cursor = page.next_cursor
            if cursor is None:
                break
        assert seen == ids[::-1]
        only_a = await client.list_sessions(namespace="a")
        assert {s.session_id for s in only_a.sessions} == {"list-1", "list-3", "list-5"}
        done = await client.list_sessions(status=["completed"])
        assert [s.session_id for s in done.sessions] == ["list-3"]
        actor = await client.list_sessions(actor_name="ns/actor0", namespace="b")
        assert {s.session_id for s in actor.sessions} == {"list-0", "list-6"}
        first = (await client.get_session("list-0")).timestamps.created_at
        after = await client.list_sessions(created_after=first)
        assert "list-0" not in {s.session_id for s in after.sessions}
        assert len(after.sessions) == 6

    async def test_summary_fields_and_bad_params(self, client: AsyncClient) -> None:
        """Summaries carry counts and token usage; bad limit, status or cursor is -32602."""
        s = await client.create_session(task="summ")
        await client.append_message(s.session_id, "user", "x")
        await client.record_tokens(s.session_id, input_tokens=3, output_tokens=4)
        [row] = (await client.list_sessions()).sessions
        assert (row.message_count, row.token_usage.output_tokens, row.task) == (1, 4, "summ")
        for bad in ({"limit": 0}, {"limit": 1001}, {"status": ["bogus"]}, {"cursor": "!!"},
                    {"created_after": "yesterday"}):
            with pytest.raises(InvalidParamsError):
                await client.list_sessions(**bad)


class TestSessionTransition:
    async def test_allowed_path(self, client: AsyncClient, daemon: Daemon) -> None:
        """pending → active → paused → active → completed → active, each stored."""
        s = await client.create_session(status="pending")
        for to in ("active", "paused", "active", "completed", "active"):
            s = await client.transition(s.session_id, to, reason=f"to {to}")
            assert s.status == to
        rows = daemon.sql("SELECT data FROM events WHERE type = 'session.status_changed'"
                          " ORDER BY version")
        assert [(json.loads(d)["from"], json.loads(d)["to"]) for (d,) in rows] == [
            ("pending", "active"), ("active", "paused"), ("paused", "active"),
            ("active", "completed"), ("completed", "active")]

    async def test_invalid_transition_lists_allowed(self, client: AsyncClient,
                                                     daemon: Daemon) -> None:
        """A forbidden move is -32003 with from, to and allowed; nothing is stored."""
        s = await client.create_session()
        await client.transition(s.session_id, "cancelled")
        with pytest.raises(InvalidTransitionError) as err:
            await client.transition(s.session_id, "active")
        assert err.value.data == {"from": "cancelled", "to": "active", "allowed": []}
        s2 = await client.create_session()
        with pytest.raises(InvalidTransitionError) as err:
            await client.transition(s2.session_id, "pending")
        assert err.value.data["allowed"] == ["paused", "completed", "failed", "cancelled", "killed"]
        assert stored_types(daemon, s2.session_id) == ["session.created"]

    async def test_unknown_status_and_missing_session(self, client: AsyncClient) -> None:
        """An unknown status is -32602 at $.to; a missing session is -32001."""
        s = await client.create_session()
        with pytest.raises(InvalidParamsError) as err:
            await client.transition(s.session_id, "sleeping")
        assert err.value.data["path"] == "$.to"
        with pytest.raises(SessionNotFoundError):
            await client.transition("nope", "paused")

    async def test_expected_version(self, client: AsyncClient) -> None:
        """A stale expected_version is -32002 with expected and actual."""
        s = await client.create_session()
        await client.transition(s.session_id, "paused", expected_version=1)
        with pytest.raises(VersionConflictError) as err:
            await client.transition(s.session_id, "active", expected_version=1)
        assert err.value.data == {"expected": 1, "actual": 2}

    async def test_expected_version_of_a_missing_session_is_not_found(
            self, client: AsyncClient) -> None:
        """A version given for a session that is not there (never made, or deleted) is
        -32001 before -32002, for every write; 0 still means "does not exist yet"."""
        s = await client.create_session()
        await client.append_message(s.session_id, role="user", content="hi")
        await client.delete_session(s.session_id)
        for sid in (s.session_id, "never-made"):
            with pytest.raises(SessionNotFoundError) as err:
                await client.append_message(sid, role="user", content="x", expected_version=2)
            assert err.value.data == {"session_id": sid}
            with pytest.raises(SessionNotFoundError):
                await client.append_events(sid, [{"type": "state.updated", "data": {
                    "scope": "session", "delta": {"k": 1}}}], expected_version=1)
            with pytest.raises(SessionNotFoundError):
                await client.transition(sid, "paused", expected_version=5)
        again = await client.create_session(session_id=s.session_id, expected_version=0)
        assert again.version == 1


class TestSessionResume:
    async def test_resume_from_pause(self, client: AsyncClient) -> None:
        """Resume moves a paused session to active and returns where it paused."""
        s = await client.create_session()
        await client.record_progress(s.session_id, "n1")
        await client.update_memory(s.session_id, {"k": "v"})
        await client.transition(s.session_id, "paused", paused_at="n2")
        r = await client.resume(s.session_id)
        assert r.state.status == "active"
        assert (r.resume.paused_at, r.resume.resume_from, r.resume.memory) == (
            "n2", "n2", {"k": "v"})

    async def test_resume_from_checkpoint(self, client: AsyncClient) -> None:
        """Resume with a checkpoint returns that checkpoint's node and memory."""
        s = await client.create_session(checkpoint_enabled=True)
        cp = await client.save_checkpoint(s.session_id, {"p": 1}, node_id="n5",
                                          memory={"at": "n5"})
        await client.transition(s.session_id, "failed", error="crash")
        r = await client.resume(s.session_id, cp.checkpoint_id)
        assert r.resume.resume_from == "n5" and r.resume.memory == {"at": "n5"}
        assert r.resume.checkpoint_id == cp.checkpoint_id and r.state.status == "active"
        with pytest.raises(CheckpointNotFoundError) as err:
            await client.resume(s.session_id, "nope")
        assert err.value.data == {"checkpoint_id": "nope"}

    async def test_resume_of_active_is_invalid(self, client: AsyncClient) -> None:
        """An active session cannot be resumed: -32003."""
        s = await client.create_session()
        with pytest.raises(InvalidTransitionError):
            await client.resume(s.session_id)


class TestSessionDelete:
    async def test_delete_removes_everything(self, client: AsyncClient, daemon: Daemon) -> None:
        """Delete removes events, view, messages, checkpoints; the id can be reused."""
        s = await client.create_session("gone")
        await client.append_message("gone", "user", "x")
        await client.save_checkpoint("gone", {"p": 1})
        await client.append_message("gone", "user", "y", idempotency_key="k")
        assert daemon.sql("SELECT COUNT(*) FROM snapshots WHERE session_id = 'gone'") == [(1,)]
        assert await client.delete_session("gone") is True
        for table in SESSION_TABLES:
            assert daemon.sql(f"SELECT COUNT(*) FROM {table} WHERE session_id = 'gone'") == [(0,)]
        with pytest.raises(SessionNotFoundError):
            await client.get_session("gone")
        with pytest.raises(SessionNotFoundError):
            await client.delete_session("gone")
        again = await client.create_session("gone")
        assert again.version == 1 and s.session_id == again.session_id


class TestMessages:
    async def test_append_and_sequence(self, client: AsyncClient, daemon: Daemon) -> None:
        """Sequences start at 0; the result carries write fields; the event is stored."""
        s = await client.create_session()
        r0 = await client.append_message(s.session_id, "user", "hello", metadata={"a": 1})
        r1 = await client.append_message(s.session_id, "tool", "42", tool_call_id="c1")
        assert (r0.sequence, r1.sequence, r1.version) == (0, 1, 3)
        assert r1.position > r0.position and r1.session_id == s.session_id
        assert stored_types(daemon, s.session_id) == ["session.created", "message.appended",
                                                      "message.appended"]

    async def test_bad_messages(self, client: AsyncClient, daemon: Daemon) -> None:
        """Blank content, tool without tool_call_id, bad role: -32602 naming the field."""
        s = await client.create_session()
        cases = [({"role": "user", "content": "  \n"}, "$.content"),
                 ({"role": "tool", "content": "x"}, "$.tool_call_id"),
                 ({"role": "robot", "content": "x"}, "$.role"),
                 ({"role": "user", "content": 5}, "$.content")]
        for params, path in cases:
            with pytest.raises(InvalidParamsError) as err:
                await client.call("message.append", session_id=s.session_id, **params)
            assert err.value.data["path"] == path
        with pytest.raises(SessionNotFoundError):
            await client.append_message("missing", "user", "x")
        assert stored_types(daemon, s.session_id) == ["session.created"]

    async def test_too_large(self, daemon: Daemon, client: AsyncClient) -> None:
        """Content over max_message_bytes is -32005 with limit and size."""
        s = await client.create_session()
        big = "x" * (daemon.config.max_message_bytes + 1)
        with pytest.raises(TooLargeError) as err:
            await client.append_message(s.session_id, "user", big)
        assert err.value.data == {"limit": daemon.config.max_message_bytes, "size": len(big)}

    async def test_idempotent_append(self, client: AsyncClient, daemon: Daemon) -> None:
        """A repeat with the same key returns the first result and appends nothing."""
        s = await client.create_session()
        a = await client.append_message(s.session_id, "user", "once", idempotency_key="k")
        b = await client.append_message(s.session_id, "user", "once", idempotency_key="k")
        assert a == b
        assert stored_types(daemon, s.session_id).count("message.appended") == 1
        c = await client.append_message(s.session_id, "user", "other", idempotency_key="k2")
        assert c.sequence == 1

    async def test_append_many_is_atomic(self, client: AsyncClient, daemon: Daemon) -> None:
        """append_many stores all messages in one version run, or none if one is bad."""
        s = await client.create_session()
        r = await client.append_messages(s.session_id, [
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
        assert r.first_sequence == 0 and len(r.message_ids) == 2 and r.version == 3
        with pytest.raises(InvalidParamsError) as err:
            await client.append_messages(s.session_id, [
                {"role": "user", "content": "c"}, {"role": "user", "content": " "}])
        assert err.value.data["path"] == "$.messages[1].content"
        with pytest.raises(InvalidParamsError):
            await client.append_messages(s.session_id, [])
        assert (await client.get_session(s.session_id)).message_count == 2

    async def test_list_pages(self, client: AsyncClient) -> None:
        """limit, offset, after_sequence and order pick the right page; total is the count."""
        s = await client.create_session()
        await client.append_messages(s.session_id, [
            {"role": "user", "content": f"m{i}"} for i in range(10)])
        seqs = lambda r: [m.sequence for m in r.messages]  # noqa: E731
        r = await client.list_messages(s.session_id)
        assert seqs(r) == list(range(10)) and r.total == 10
        assert seqs(await client.list_messages(s.session_id, limit=3, offset=2)) == [2, 3, 4]
        assert seqs(await client.list_messages(s.session_id, after_sequence=6)) == [7, 8, 9]
        assert seqs(await client.list_messages(s.session_id, after_sequence=2, limit=2)) == [3, 4]
        assert seqs(await client.list_messages(s.session_id, order="desc", limit=3)) == [9, 8, 7]
        desc = await client.list_messages(s.session_id, order="desc", limit=3, offset=8)
        assert seqs(desc) == [1, 0]
        desc = await client.list_messages(s.session_id, order="desc", after_sequence=7)
        assert seqs(desc) == [9, 8]
        r = await client.list_messages(s.session_id, limit=1)
        assert r.messages[0].content == "m0" and r.messages[0].role == "user"
        with pytest.raises(SessionNotFoundError):
            await client.list_messages("missing")
        with pytest.raises(InvalidParamsError):
            await client.list_messages(s.session_id, order="sideways")


class TestPopAndClear:
    async def test_pop_takes_the_last_message_and_history_keeps_it(
            self, client: AsyncClient, daemon: Daemon) -> None:
        """pop returns the last message; list, count and last_message move back; events stay."""
        await client.create_session("pc")
        await client.append_messages("pc", [{"role": "user", "content": t} for t in "abc"])
        popped = await client.pop_message("pc")
        assert (popped.message.content, popped.message.sequence, popped.version) == ("c", 2, 5)
        state = await client.get_session("pc")
        assert state.message_count == 2 and state.last_message.content == "b"
        assert [m.content for m in (await client.list_messages("pc")).messages] == ["a", "b"]
        appended = await client.append_message("pc", "assistant", "d")
        assert appended.sequence == 2  # the popped sequence is taken again
        assert [m.content for m in (await client.list_messages("pc", order="desc")).messages] \
            == ["d", "b", "a"]
        rows = daemon.sql("SELECT type, data FROM events WHERE session_id = 'pc' ORDER BY version")
        assert [r[0] for r in rows] == ["session.created"] + ["message.appended"] * 3 + [
            "messages.truncated", "message.appended"]
        assert json.loads(rows[4][1])["from_sequence"] == 2
        assert daemon.sql("SELECT sequence FROM messages WHERE session_id = 'pc'"
                          " ORDER BY sequence") == [(0,), (1,), (2,)]

    async def test_clear_then_pop_on_empty(self, client: AsyncClient, daemon: Daemon) -> None:
        """clear empties the conversation; popping or clearing nothing writes nothing."""
        await client.create_session("cl")
        await client.append_messages("cl", [{"role": "user", "content": t} for t in "ab"])
        cleared = await client.clear_messages("cl")
        assert (cleared.removed, cleared.version) == (2, 4)
        state = await client.get_session("cl")
        assert (state.message_count, state.last_message) == (0, None)
        empty = await client.pop_message("cl")
        assert (empty.message, empty.position, empty.version) == (None, None, 4)
        assert (await client.clear_messages("cl")).removed == 0
        assert daemon.sql("SELECT count(*) FROM events WHERE session_id = 'cl'") == [(4,)]
        with pytest.raises(InvalidParamsError, match=r"message\.pop or message\.clear"):
            await client.append_events("cl", [{"type": "messages.truncated",
                                               "data": {"from_sequence": 0}}])

    async def test_concurrent_pops_take_different_messages(self, client: AsyncClient,
                                                           daemon: Daemon) -> None:
        """Pops racing each other each take one message: none twice, none lost."""
        await client.create_session("race")
        await client.append_messages("race", [{"role": "user", "content": str(i)}
                                              for i in range(20)])
        taken: list[str] = []

        async def pop() -> None:
            async with AsyncClient(daemon.socket) as c:
                taken.append((await c.pop_message("race")).message.content)

        async with anyio.create_task_group() as tg:
            for _ in range(8):
                tg.start_soon(pop)
        assert sorted(taken, key=int) == [str(i) for i in range(12, 20)]
        assert (await client.get_session("race")).message_count == 12


    async def test_append_many_replace_from_swaps_the_suffix_in_one_write(
            self, client: AsyncClient, daemon: Daemon) -> None:
        """append_many with replace_from: the messages from that sequence on leave the
        conversation and the new ones take their place, in one write (one version step per
        event, nothing between); refused past the end, on a stale version, or when gone."""
        await client.create_session("rp")
        await client.append_messages("rp", [{"role": "user", "content": t} for t in "abcd"])
        with pytest.raises(InvalidParamsError, match="replace_from 5 is past"):
            await client.append_messages("rp", [{"role": "user", "content": "x"}],
                                         replace_from=5)
        with pytest.raises(VersionConflictError):
            await client.append_messages("rp", [{"role": "user", "content": "x"}],
                                         replace_from=1, expected_version=4)
        r = await client.append_messages("rp", [{"role": "user", "content": t} for t in "xy"],
                                         replace_from=1, expected_version=5)
        assert (r.first_sequence, r.version, len(r.message_ids)) == (1, 8, 2)
        state = await client.get_session("rp")
        assert (state.message_count, state.last_message.content) == (3, "y")
        assert [m.content for m in (await client.list_messages("rp")).messages] == \
            ["a", "x", "y"]
        rows = daemon.sql("SELECT type, data FROM events WHERE session_id = 'rp'"
                          " AND version > 5 ORDER BY version")
        assert [t for t, _ in rows] == ["messages.truncated", "message.appended",
                                        "message.appended"]
        assert json.loads(rows[0][1])["reason"] == "replaced"
        # At the end (replace_from = the count) it is a plain append; from 0, a whole swap.
        await client.append_messages("rp", [{"role": "user", "content": "z"}], replace_from=3)
        await client.append_messages("rp", [{"role": "user", "content": "only"}],
                                     replace_from=0)
        assert [m.content for m in (await client.list_messages("rp")).messages] == ["only"]
        assert (await client.get_session("rp")).last_message.content == "only"
        await client.delete_session("rp")
        with pytest.raises(SessionNotFoundError):
            await client.append_messages("rp", [{"role": "user", "content": "x"}],
                                         replace_from=0, expected_version=9)


class TestTokensProgressMemory:
    async def test_tokens(self, client: AsyncClient, daemon: Daemon) -> None:
        """tokens.record adds up and returns the running usage; negatives are refused."""
        s = await client.create_session()
        await client.record_tokens(s.session_id, input_tokens=10, output_tokens=2,
                                   estimated_cost=0.5)
        r = await client.record_tokens(s.session_id, input_tokens=5, model="m")
        assert (r.token_usage.input_tokens, r.token_usage.output_tokens) == (15, 2)
        assert r.token_usage.estimated_cost == 0.5 and r.version == 3
        with pytest.raises(InvalidParamsError) as err:
            await client.record_tokens(s.session_id, output_tokens=-1)
        assert err.value.data["path"] == "$.output_tokens"
        assert stored_types(daemon, s.session_id).count("tokens.recorded") == 2

    async def test_progress(self, client: AsyncClient) -> None:
        """progress.record returns the progress view after the step; progress.list pages
        through the steps the view does not keep."""
        s = await client.create_session()
        await client.record_progress(s.session_id, "a", latency_ms=5)
        r = await client.record_progress(s.session_id, "b", edge="a->b", retries=1, failed=True)
        assert r.progress.steps_executed == 2 and r.progress.current_node == "b"
        assert r.progress.node_visit_counts == {"a": 1, "b": 1}
        assert r.progress.execution_quality == "degraded"
        page = await client.list_progress(s.session_id)
        assert [(x.node_id, x.edge, x.latency_ms, x.retries, x.failed) for x in page.steps] == [
            ("a", None, 5, 0, False), ("b", "a->b", 0, 1, True)]
        assert page.total == 2 and page.next is None
        first = await client.list_progress(s.session_id, limit=1)
        assert [x.node_id for x in first.steps] == ["a"] and first.next == first.steps[0].version
        rest = await client.list_progress(s.session_id, after_version=first.next)
        assert [x.node_id for x in rest.steps] == ["b"] and rest.next is None
        then = await client.list_progress(s.session_id, at_version=first.steps[0].version)
        assert [x.node_id for x in then.steps] == ["a"]
        whole = await client.session_state_dict(s.session_id)
        assert whole["progress"]["path"] == ["a", "b"]
        assert whole["metrics"]["edges_traversed"] == ["a->b"]
        with pytest.raises(InvalidParamsError) as err:
            await client.record_progress(s.session_id, "")
        assert err.value.data["path"] == "$.node_id"

    async def test_memory_merge_patch(self, client: AsyncClient) -> None:
        """memory.update applies merge patches; a non-object patch is refused."""
        s = await client.create_session()
        await client.update_memory(s.session_id, {"a": {"b": 1, "c": 2}, "d": 3})
        r = await client.update_memory(s.session_id, {"a": {"b": None}, "d": None})
        assert r.memory == {"a": {"c": 2}}
        with pytest.raises(InvalidParamsError) as err:
            await client.call("memory.update", session_id=s.session_id, patch=[1])
        assert err.value.data["path"] == "$.patch"


class TestCheckpoints:
    async def test_save_get_list(self, client: AsyncClient, daemon: Daemon) -> None:
        """Payloads come back whole; latest is the default; the list is in save order."""
        s = await client.create_session()
        a = await client.save_checkpoint(s.session_id, {"step": 1}, node_id="n1")
        b = await client.save_checkpoint(s.session_id, [1, "two"], checkpoint_id="mine-2",
                                         resume_from="n3", memory={"m": 1})
        assert b.checkpoint_id == "mine-2"
        latest = await client.get_checkpoint(s.session_id)
        assert (latest.checkpoint_id, latest.payload, latest.resume_from, latest.memory) == (
            "mine-2", [1, "two"], "n3", {"m": 1})
        first = await client.get_checkpoint(s.session_id, a.checkpoint_id)
        assert first.payload == {"step": 1} and first.node_id == "n1" and first.version == 2
        listed = await client.list_checkpoints(s.session_id)
        assert [c.checkpoint_id for c in listed] == [a.checkpoint_id, "mine-2"]
        assert listed[0].size == len(b'{"step":1}')
        state = await client.get_session(s.session_id)
        assert state.latest_checkpoint_id == "mine-2" and state.checkpoint_count == 2
        assert stored_types(daemon, s.session_id).count("checkpoint.saved") == 2

    @pytest.mark.slow_on_postgresql
    async def test_checkpoint_errors(self, client: AsyncClient, daemon: Daemon) -> None:
        """Unknown checkpoint -32009; none saved -32009; unknown session -32001; too big -32005."""
        s = await client.create_session()
        with pytest.raises(CheckpointNotFoundError):
            await client.get_checkpoint(s.session_id)
        with pytest.raises(CheckpointNotFoundError) as err:
            await client.get_checkpoint(s.session_id, "x")
        assert err.value.data == {"checkpoint_id": "x"}
        with pytest.raises(SessionNotFoundError):
            await client.list_checkpoints("missing")
        with pytest.raises(TooLargeError):
            await client.save_checkpoint(s.session_id, "x" * daemon.config.max_checkpoint_bytes)


class TestEvents:
    async def test_append_typed_events(self, client: AsyncClient, daemon: Daemon) -> None:
        """events.append stores a batch atomically; the view folds each type."""
        s = await client.create_session()
        r = await client.append_events(s.session_id, [
            {"type": "message.appended", "data": {"role": "user", "content": "via events"}},
            {"type": "plan.linked", "data": {"plan_id": "p1"}},
            {"type": "plan.linked", "data": {"plan_id": "p1"}},
            {"type": "problem.recorded", "data": {"what": "slow", "extra": [1]}},
            {"type": "decision.recorded", "data": {"pick": "a"}},
            {"type": "session.status_changed", "data": {"to": "paused"}},
            {"type": "session.status_changed", "data": {"to": "active"}},
            {"type": "result.recorded", "data": {"success": True, "output": {"x": 1}}},
            {"type": "metadata.updated", "data": {"patch": {"k": "v"}}},
            {"type": "tokens.recorded", "data": {"input_tokens": 3, "future_field": "kept"}},
        ])
        assert r.version == 11
        st = await client.get_session(s.session_id)
        assert st.message_count == 1 and st.linked_plan_ids == ["p1"]
        assert st.problems == [{"what": "slow", "extra": [1]}] and st.metrics.decision_count == 1
        assert st.status == "active" and st.result.output == {"x": 1} and st.metadata == {"k": "v"}
        [(data,)] = daemon.sql("SELECT data FROM events WHERE type = 'tokens.recorded'")
        assert json.loads(data)["future_field"] == "kept"

    async def test_append_is_all_or_nothing(self, client: AsyncClient, daemon: Daemon) -> None:
        """One bad event refuses the whole batch, with the path to the bad field."""
        s = await client.create_session()
        with pytest.raises(InvalidParamsError) as err:
            await client.append_events(s.session_id, [
                {"type": "plan.linked", "data": {"plan_id": "ok"}},
                {"type": "tokens.recorded", "data": {"input_tokens": "many"}}])
        assert err.value.data["path"] == "$.events[1].data.input_tokens"
        with pytest.raises(InvalidTransitionError):
            await client.append_events(s.session_id, [
                {"type": "plan.linked", "data": {"plan_id": "ok"}},
                {"type": "session.status_changed", "data": {"to": "pending"}}])
        for bad_type in ("session.created", "checkpoint.saved", "no.such"):
            with pytest.raises(InvalidParamsError):
                await client.append_events(s.session_id, [{"type": bad_type, "data": {}}])
        assert stored_types(daemon, s.session_id) == ["session.created"]

    async def test_read_one_session_and_all(self, client: AsyncClient) -> None:
        """events.read by version or by global position, filtered and paged by `next`."""
        a = await client.create_session("ev-a")
        b = await client.create_session("ev-b")
        for i in range(3):
            await client.append_message(a.session_id, "user", f"a{i}")
            await client.append_message(b.session_id, "user", f"b{i}")
        r = await client.read_events("ev-a")
        assert [e.version for e in r.events] == [1, 2, 3, 4] and r.next is None
        r = await client.read_events("ev-a", from_version=3, limit=1)
        assert [e.version for e in r.events] == [3] and r.next == 4
        everything = await client.read_events()
        positions = [e.position for e in everything.events]
        assert positions == sorted(positions) and len(positions) == 8
        after = await client.read_events(from_position=positions[3])
        assert [e.position for e in after.events] == positions[4:]
        created = await client.read_events(types=["session.created"])
        assert {e.session_id for e in created.events} == {"ev-a", "ev-b"}
        e = r.events[0]
        # a hash of version 2: "2:" data digest, link and seal, 64 hex digits each
        assert e.meta.peer_uid is not None and e.meta.peer_pid is not None
        assert re.fullmatch(r"2:[0-9a-f]{64}:[0-9a-f]{64}:[0-9a-f]{64}", e.hash), e.hash
        with pytest.raises(InvalidParamsError):
            await client.read_events(from_version=1)
        with pytest.raises(SessionNotFoundError):
            await client.read_events("missing")
        with pytest.raises(InvalidParamsError):
            await client.read_events(types=["nope"])


class TestScopedStateAndStates:
    async def test_create_with_events_is_one_write(self, client: AsyncClient,
                                                   daemon: Daemon) -> None:
        """session.create appends its events with session.created, or nothing at all."""
        state = await client.create_session("ce", events=[
            {"type": "state.updated", "data": {"scope": "session", "delta": {"a": 1}}},
            {"type": "message.appended", "data": {"role": "user", "content": "hi"}}])
        assert (state.version, state.memory, state.message_count) == (3, {"a": 1}, 1)
        with pytest.raises(InvalidParamsError, match=r"events\[1\]"):
            await client.create_session("bad", events=[
                {"type": "state.updated", "data": {"scope": "session", "delta": {}}},
                {"type": "state.updated", "data": {"scope": "user", "delta": {"x": 1}}}])
        assert daemon.sql("SELECT count(*) FROM events WHERE session_id = 'bad'") == [(0,)]

    async def test_scoped_state_is_set_not_merged_and_outlives_sessions(
            self, client: AsyncClient, daemon: Daemon) -> None:
        """app and user keys: latest value wins, null is a value, deleting a session keeps them."""
        await client.create_session("s1")
        await client.append_events("s1", [
            {"type": "state.updated", "data": {"scope": "app", "app_name": "a",
                                               "delta": {"theme": "dark", "n": None}}},
            {"type": "state.updated", "data": {"scope": "user", "app_name": "a",
                                               "user_id": "u1", "delta": {"lang": "fr"}}},
            {"type": "state.updated", "data": {"scope": "session", "delta": {"k": None}}}])
        await client.create_session("s2", events=[
            {"type": "state.updated", "data": {"scope": "app", "app_name": "a",
                                               "delta": {"theme": "light"}}}])
        await client.delete_session("s2")
        got = await client.call("state.get", rpc.StateGetResult, app_name="a",
                                user_ids=["u1", "u2"])
        assert (got.app, got.users) == ({"theme": "light", "n": None},
                                        {"u1": {"lang": "fr"}, "u2": {}})
        assert (await client.get_session("s1")).memory == {"k": None}

    async def test_session_states_pages_by_namespace_or_prefix(self, client: AsyncClient) -> None:
        for i in range(5):
            await client.create_session(f"ns{i}", namespace=f"team:{i % 2}")
        await client.create_session("other", namespace="teams")
        exact = await client.call("session.states", rpc.SessionStatesResult, namespace="team:1")
        assert [s.session_id for s in exact.states] == ["ns1", "ns3"] and exact.next is None
        seen, cursor = [], None
        while True:
            page = await client.call("session.states", rpc.SessionStatesResult,
                                     namespace="team:", prefix=True, limit=2, cursor=cursor)
            seen += [s.session_id for s in page.states]
            if page.next is None:
                break
            cursor = page.next
        assert seen == [f"ns{i}" for i in range(5)]
