"""The read models, defined once (daemon/sessiond_daemon/stores/models), through a real
daemon on each store: every index a rule keeps, read back through the client and held
to the rows stored (a SQLite file and a PostgreSQL database, the same scenarios).

Each scenario writes through the client, reads through the client, and checks the index
rows behind the daemon's back (`Daemon.sql`) against the events that hold them: a row
points at its event by position."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pg
import pytest
from conftest import Daemon, daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_daemon.stores.models.tables import TABLES

pytestmark = pytest.mark.anyio

DAEMON = Path(__file__).resolve().parent.parent / "daemon" / "sessiond_daemon"


def positions(daemon: Daemon, sid: str, event_type: str) -> list[int]:
    """The positions of a session's own events of a type, in order."""
    return [r[0] for r in daemon.sql("SELECT position FROM events WHERE session_id = ?"
                                     " AND type = ? ORDER BY version", sid, event_type)]


def message_rows(daemon: Daemon, sid: str) -> list[tuple[int, int]]:
    return [(r[0], r[1]) for r in daemon.sql(
        "SELECT sequence, position FROM messages WHERE session_id = ? ORDER BY sequence", sid)]


async def contents(client: AsyncClient, sid: str) -> list[str]:
    return [m.content for m in (await client.list_messages(sid)).messages]


class TestMessages:
    async def test_appends_pops_and_clears_keep_the_index_to_the_conversation(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("m")
        for text in ("a", "b", "c"):
            await client.append_message("m", "user", text)
        await client.pop_message("m")  # messages.truncated from sequence 2
        await client.append_message("m", "user", "c2")
        assert await contents(client, "m") == ["a", "b", "c2"]
        appended = positions(daemon, "m", "message.appended")
        assert message_rows(daemon, "m") == [(0, appended[0]), (1, appended[1]),
                                             (2, appended[3])]
        await client.clear_messages("m")
        assert await contents(client, "m") == [] and message_rows(daemon, "m") == []
        await client.append_messages("m", [{"role": "user", "content": "x"},
                                           {"role": "assistant", "content": "y"}])
        assert await contents(client, "m") == ["x", "y"]
        assert [p for _, p in message_rows(daemon, "m")] == \
            positions(daemon, "m", "message.appended")[-2:]


class TestForks:
    async def test_a_fork_has_its_sources_messages_at_the_fork_point_found_by_walking_up(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """The source pops a message and appends another after the fork point: the fork
        (and a fork of the fork) still has the one the source held there."""
        await client.create_session("src")
        await client.append_message("src", "user", "m0")
        await client.append_message("src", "user", "m1")  # version 3
        await client.pop_message("src")
        await client.append_message("src", "user", "m1 again")
        await client.fork("src", at_version=3, new_session_id="f1")
        await client.append_message("f1", "user", "f1 own")
        await client.fork("f1", at_version=3, new_session_id="f2")
        assert await contents(client, "src") == ["m0", "m1 again"]
        assert await contents(client, "f1") == ["m0", "m1", "f1 own"]
        assert await contents(client, "f2") == ["m0", "m1"]
        src = positions(daemon, "src", "message.appended")
        assert message_rows(daemon, "f2") == [(0, src[0]), (1, src[1])]
        links = daemon.sql("SELECT session_id, source_id, version FROM forks"
                           " ORDER BY session_id")
        assert [tuple(r) for r in links] == [("f1", "src", 3), ("f2", "f1", 3)]
        forks = await client.forks("src")
        assert [f.session_id for f in forks.forks] == ["f1"]
        assert (await client.verify()).ok

    async def test_a_fork_gets_its_sources_progress_steps_up_to_the_fork_point(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("p")
        await client.record_progress("p", "plan")
        await client.record_progress("p", "act")  # version 3
        await client.record_progress("p", "late")
        await client.fork("p", at_version=3, new_session_id="pf")
        await client.record_progress("pf", "mine")
        steps = (await client.list_progress("pf")).steps
        assert [s.node_id for s in steps] == ["plan", "act", "mine"]
        source = (await client.list_progress("p")).steps
        assert [s.node_id for s in source] == ["plan", "act", "late"]
        rows = daemon.sql("SELECT version, position FROM progress_steps WHERE session_id = ?"
                          " ORDER BY version", "pf")
        own = positions(daemon, "p", "progress.recorded")
        assert [tuple(r) for r in rows[:2]] == [(2, own[0]), (3, own[1])]
        assert rows[2][1] == positions(daemon, "pf", "progress.recorded")[0]


    @pytest.mark.sqlite_only("daemon.reindex is SQLite's until PostgreSQL has full text")
    async def test_reindex_rebuilds_the_links_from_the_forked_events(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("o")
        for i in range(3):
            await client.fork("o", new_session_id=f"o{i}")
        import sqlite3

        con = sqlite3.connect(daemon.db)
        con.execute("DELETE FROM forks WHERE session_id = 'o1'")  # behind the daemon's back
        con.execute("INSERT INTO forks VALUES ('stray', 'o', 1, 'x', 1)")
        con.commit()
        con.close()
        assert not (await client.verify()).ok
        assert (await client.reindex()).forks == 3
        links = daemon.sql("SELECT session_id, source_id, version, position FROM forks"
                           " ORDER BY session_id")
        assert [tuple(r) for r in links] == [
            (f"o{i}", "o", 1, positions(daemon, f"o{i}", "session.forked")[0])
            for i in range(3)]
        assert (await client.verify()).ok


class TestCheckpoints:
    async def test_forks_share_payloads_across_a_save_again_and_a_delete(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Two forks share the source's payload (stored once); the source saves the same
        id again: the old payload is handed to a fork; that fork is deleted: handed on to
        the other. Each reads the payload it had all along."""
        await client.create_session("c")
        await client.save_checkpoint("c", {"v": "old"}, checkpoint_id="cp", node_id="n")
        await client.fork("c", new_session_id="cf1")
        await client.fork("c", new_session_id="cf2")

        def payloads() -> dict[str, int]:
            return {r[0]: int(r[1]) for r in daemon.sql(
                "SELECT session_id, length(payload) FROM checkpoints WHERE checkpoint_id = ?",
                "cp")}

        assert payloads()["cf1"] == payloads()["cf2"] == 0 < payloads()["c"]
        saved = positions(daemon, "c", "checkpoint.saved")
        assert {r[0] for r in daemon.sql("SELECT position FROM checkpoints")} == set(saved)
        await client.save_checkpoint("c", {"v": "new"}, checkpoint_id="cp")
        for sid, want in (("c", "new"), ("cf1", "old"), ("cf2", "old")):
            assert (await client.get_checkpoint(sid, "cp")).payload == {"v": want}, sid
        holder = next(sid for sid, n in payloads().items() if n and sid != "c")
        other = "cf2" if holder == "cf1" else "cf1"
        assert payloads()[other] == 0
        assert await client.delete_session(holder) is True
        assert (await client.get_checkpoint(other, "cp")).payload == {"v": "old"}
        assert payloads()[other] > 0 and holder not in payloads()
        assert [c.checkpoint_id for c in await client.list_checkpoints(other)] == ["cp"]
        assert (await client.verify()).ok


TYPED = {"type": "json", "data": "e30="}


async def put(client: AsyncClient, sid: str, checkpoint_id: str, **fields: Any) -> None:
    await client.call("graph.put", session_id=sid, thread_id=sid, checkpoint_id=checkpoint_id,
                      checkpoint=TYPED, **fields)


def write(idx: int, value: str) -> dict[str, Any]:
    return {"idx": idx, "channel": "ch", "value": {"type": "json", "data": value}}


class TestGraphs:
    async def test_first_write_wins_unless_idx_is_negative_and_a_prune_drops_the_index(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await put(client, "g", "0001", channel_versions={"ch": "1"},
                  blobs={"ch": {"type": "json", "data": "MQ=="}}, metadata={"run_id": "r1"})
        for first, again in (("MQ==", "Mg=="),):
            await client.call("graph.put_writes", session_id="g", thread_id="g",
                              checkpoint_id="0001", task_id="t",
                              writes=[write(0, first), write(-1, first)])
            await client.call("graph.put_writes", session_id="g", thread_id="g",
                              checkpoint_id="0001", task_id="t",
                              writes=[write(0, again), write(-1, again)])
        got = (await client.call("graph.get", session_id="g"))["tuple"]
        values = sorted(w["value"]["data"] for w in got["pending_writes"])
        assert values == ["MQ==", "Mg=="]  # idx 0: the first; idx -1: the latest
        rows = daemon.sql("SELECT idx, position FROM graph_writes WHERE session_id = ?"
                          " ORDER BY idx", "g")
        writes = positions(daemon, "g", "graph.writes")
        assert [tuple(r) for r in rows] == [(-1, writes[1]), (0, writes[0])]
        assert got["channel_values"] == {"ch": {"type": "json", "data": "MQ=="}}
        assert daemon.sql("SELECT run_id FROM graph_checkpoints WHERE session_id = ?",
                          "g") == [("r1",)]
        await put(client, "g", "0002", channel_versions={"ch": "1"})
        await client.call("graph.put", session_id="g", thread_id="g", checkpoint_id="0002",
                          checkpoint=TYPED, channel_versions={"ch": "2"},
                          blobs={"ch": {"type": "json", "data": "Mw=="}})  # saved again
        again = (await client.call("graph.get", session_id="g"))["tuple"]
        assert again["channel_values"] == {"ch": {"type": "json", "data": "Mw=="}}
        latest = positions(daemon, "g", "graph.checkpoint")[-1]
        assert daemon.sql("SELECT position FROM graph_checkpoints WHERE checkpoint_id = ?",
                          "0002") == [(latest,)]
        await client.call("graph.prune", session_ids=["g"], strategy="keep_latest")
        assert daemon.sql("SELECT checkpoint_id FROM graph_checkpoints") == [("0002",)]
        assert daemon.sql("SELECT COUNT(*) FROM graph_writes") == [(0,)]
        listed = await client.call("graph.list", session_id="g")
        assert [t["checkpoint_id"] for t in listed["tuples"]] == ["0002"]


class TestScopedState:
    async def test_app_and_user_keys_keep_the_latest_value_session_keys_stay_in_the_view(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("s1")
        await client.create_session("s2")
        await client.append_events("s1", [
            {"type": "state.updated", "data": {"scope": "app", "app_name": "a",
                                               "delta": {"k": 1, "j": "x"}}},
            {"type": "state.updated", "data": {"scope": "user", "app_name": "a",
                                               "user_id": "u", "delta": {"k": [2]}}},
            {"type": "state.updated", "data": {"scope": "app", "app_name": "a",
                                               "delta": {"k": 3}}},
            {"type": "state.updated", "data": {"scope": "session", "delta": {"mine": 1}}},
        ])
        await client.append_events("s2", [{"type": "state.updated", "data": {
            "scope": "app", "app_name": "a", "delta": {"j": None}}}])
        got = await client.call("state.get", app_name="a", user_ids=["u", "v"])
        assert got == {"app": {"k": 3, "j": None}, "users": {"u": {"k": [2]}, "v": {}}}
        rows = daemon.sql("SELECT user_id, key, position FROM scoped_state"
                          " ORDER BY user_id, key")
        s1 = positions(daemon, "s1", "state.updated")
        s2 = positions(daemon, "s2", "state.updated")
        assert [tuple(r) for r in rows] == [("", "j", s2[0]), ("", "k", s1[2]),
                                            ("u", "k", s1[1])]


class TestRunner:
    async def test_turn_events_and_lines_naming_a_resume_id_are_indexed(
            self, daemon: Daemon, client: AsyncClient) -> None:
        script = "echo plain; echo '{\"thread_id\": \"t-1\"}'; echo after"
        await client.spawn(["/bin/sh", "-c", script], session_id="r")
        with anyio.fail_after(60):  # a guard against a hang, not a timing assertion
            while (await client.get_session("r")).status == "active":
                await anyio.sleep(0.05)
        rows = daemon.sql("SELECT type, position FROM runner_events WHERE session_id = ?"
                          " ORDER BY version", "r")
        kinds = [r[0] for r in rows]
        assert kinds[0] == "process.started" and kinds[-1] == "process.exited"
        outputs = [r[1] for r in rows if r[0] == "process.output"]
        line = daemon.sql("SELECT position FROM events WHERE session_id = ? AND type ="
                          " 'process.output' ORDER BY version", "r")
        assert len(line) == 3 and outputs == [line[1][0]]  # only the line with a mark


class TestPositionsTakenInTheCommit:
    @pytest.fixture
    def pg_url(self) -> Iterator[str]:
        yield from pg.database()

    @pytest.mark.postgresql
    async def test_rows_point_at_the_events_as_the_shared_log_numbered_them(
            self, short_dir: str, pg_url: str) -> None:
        """Two daemons on one PostgreSQL database: each numbers its batch after the last
        position it knows, the commit takes others (Batch.renumber), and every index row
        a rule built from the writer's numbering points at its event as committed."""
        configs = [daemon_config(os.path.join(short_dir, n), db=pg_url) for n in "ab"]
        for config in configs:
            os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
        async with (running_daemon(configs[0]) as a, running_daemon(configs[1]) as b,
                    AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
            await on_a.create_session("x")
            for i in range(3):
                await on_b.append_message("x", "user", f"b{i}")
                await on_a.append_message("x", "user", f"a{i}")
                await on_b.record_progress("x", f"n{i}")
                await on_a.append_events("x", [{"type": "state.updated", "data": {
                    "scope": "app", "app_name": "p", "delta": {"k": i}}}])
                await on_b.fork("x", new_session_id=f"x{i}")
            assert message_rows(a, "x") == list(enumerate(
                positions(a, "x", "message.appended")))
            assert [r[0] for r in a.sql("SELECT position FROM progress_steps WHERE"
                                        " session_id = 'x' ORDER BY version")] == \
                positions(a, "x", "progress.recorded")
            assert a.sql("SELECT position FROM scoped_state") == [
                (positions(a, "x", "state.updated")[-1],)]
            assert [r[0] for r in a.sql("SELECT position FROM forks ORDER BY session_id")] \
                == [positions(a, f"x{i}", "session.forked")[0] for i in range(3)]
            assert [m.content for m in (await on_a.list_messages("x2")).messages] == [
                "b0", "a0", "b1", "a1", "b2", "a2"]


class TestOneDefinition:
    def test_no_read_model_table_is_written_outside_the_rules(self) -> None:
        """The rows of a read model are written only by stores/models' SQL: no store,
        feature or service writes one itself. (Migrations build new indexes from the
        stored events once, as history; the reindex rebuilds the search index in SQL.)"""
        tables = "|".join(t for t in TABLES if t != "search")
        write = re.compile(rf"(INSERT (OR \w+ )?INTO|DELETE FROM|UPDATE) ({tables})\b")
        found = []
        for path in DAEMON.rglob("*.py"):
            rel = path.relative_to(DAEMON).as_posix()
            if rel.startswith("stores/models/") or rel in ("stores/sqlite/migrations.py",
                                                          "stores/postgres/schema.py"):
                continue
            for n, text in enumerate(path.read_text().splitlines(), 1):
                if write.search(text):
                    found.append(f"{rel}:{n}: {text.strip()}")
        assert found == []
