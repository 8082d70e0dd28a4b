"""Issue 24, sections 3, 6 and 7: stored and imported claims never drive work, one rule for
text on both stores, damaged histories answer -32012, and the default grant never takes
data out of a view. Through the real socket, on both stores where the class applies."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, running_daemon
from test_executors import finished
from test_migrate import run_migrate

from sessiond import AsyncClient
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import event_from_builtins
from sessiond_schemas.export import chain_hash, checksum

pytestmark = pytest.mark.anyio
INT64_MAX = 2**63 - 1


# --- helpers -----------------------------------------------------------------------------


async def edit(db_url: str, sql_sqlite: str, sql_pg: str, *args: Any) -> None:
    """Change stored rows behind the daemon's back, in each store's own dialect."""
    if db_url.startswith("postgresql://"):
        import asyncpg

        con = await asyncpg.connect(db_url)
        try:
            await con.execute(sql_pg, *args)
        finally:
            await con.close()
        return
    con3 = sqlite3.connect(db_url)
    try:
        with con3:
            con3.execute(sql_sqlite, args)
    finally:
        con3.close()


def reseal(doc: dict[str, Any], sid: str, first: dict[str, Any] | None = None) -> dict[str, Any]:
    """An exported document moved to session `sid` (new event ids), its first event's data
    changed by `first`, sealed again (hash chain and checksum) as a forger would."""
    events = [dict(e) for e in doc["events"]]
    if first:
        events[0]["data"] = {**events[0]["data"], **first}
    start = events[0]["data"]["from"]["hash"] if events[0]["type"] == "session.forked" else ""
    prev = start
    for i, e in enumerate(events):
        e.update(session_id=sid, event_id=f"{sid}-forged-{i}", hash="")
        prev = chain_hash(prev, event_from_builtins(e))
        e["hash"] = prev
    out = {**doc, "events": events, "session": None}
    out["checksum"] = checksum(out)
    return out


def high_water_mark() -> int:
    """This process's peak resident set (VmHWM), in bytes, from /proc."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")


async def error_of(call: Any) -> SessiondError:
    with pytest.raises(SessiondError) as err:
        await call
    return err.value


async def source_with_messages(client: AsyncClient, sid: str = "src", n: int = 3) -> None:
    await client.create_session(sid)
    for i in range(n):
        await client.append_message(sid, "user", f"message {i}")


# --- section 3: stored claims that drive work --------------------------------------------


class TestForkClaims:
    async def test_a_stored_claimed_count_sizes_nothing(self, daemon: Daemon,
                                                        client: AsyncClient,
                                                        db_url: str) -> None:
        """A fork whose stored session.forked claims 2^63-1 messages (written behind the
        daemon's back): a fork of it, a fork of that and its messages are answered from
        what the store holds (before: set(range(count)), an OOM kill)."""
        await source_with_messages(client)
        f = await client.fork("src", new_session_id="claims")
        await edit(db_url,
                   "UPDATE events SET data = CAST(json_set(CAST(data AS TEXT),"
                   " '$.state.message_count', ?) AS BLOB)"
                   " WHERE session_id = 'claims' AND type = 'session.forked'",
                   "UPDATE events SET data = convert_to(jsonb_set(convert_from(data, 'UTF8')"
                   "::jsonb, '{state,message_count}', to_jsonb($1::bigint))::text, 'UTF8')"
                   " WHERE session_id = 'claims' AND type = 'session.forked'", INT64_MAX)
        peak = high_water_mark()
        again = await client.fork(f.session_id, new_session_id="claims-2")
        assert again.message_count == INT64_MAX  # the view says what was stored ...
        third = await client.fork("claims-2", new_session_id="claims-3")
        for sid in ("claims-2", "claims-3"):  # ... the messages are what the store holds
            page = await client.list_messages(sid)
            assert [m.content for m in page.messages] == [f"message {i}" for i in range(3)]
        assert third.forked_from is not None and third.forked_from.session_id == "claims-2"
        # The daemon runs in this process: its high-water mark grew by no allocation the
        # claim sized (a generous bound: a memory figure, not a timing).
        assert high_water_mark() - peak < 256 << 20
        assert (await client.ping()).pong

    async def test_an_imported_claimed_count_is_refused(self, client: AsyncClient) -> None:
        """A fork document claiming more messages than its source held there: -32007."""
        await source_with_messages(client)
        f = await client.fork("src")
        doc = await client.export_session(f.session_id)
        for claimed in (3 * 10**7, INT64_MAX):
            state = {**doc["events"][0]["data"]["state"], "message_count": claimed}
            err = await error_of(client.import_session(reseal(doc, "claimed",
                                                              {"state": state})))
            assert err.code == -32007 and "3 at version 4" in err.message, err
        assert (await client.import_session(reseal(doc, "honest"))).message_count == 3

    async def test_import_of_a_fork_of_itself_is_refused(self, client: AsyncClient) -> None:
        """session.import (replace) of a fork whose source is the session itself: -32007,
        the session is as it was, and the writer goes on (before: a loop for ever)."""
        await source_with_messages(client, "me")
        f = await client.fork("me")
        doc = await client.export_session(f.session_id)
        await client.delete_session(f.session_id)
        before = await client.get_session("me")
        err = await error_of(client.import_session(reseal(doc, "me"), on_conflict="replace"))
        assert err.code == -32007 and "fork of itself" in err.message, err
        assert await client.get_session("me") == before
        await client.append_message("me", "user", "the writer goes on")
        assert (await client.ping()).pong

    async def test_import_that_would_close_a_cycle_is_refused(self, client: AsyncClient) -> None:
        """a -> b (a fork of a); importing a again as a fork of b is refused: a has forks
        (-32003), and the link would go round (-32007) were they gone."""
        await source_with_messages(client, "a")
        b = await client.fork("a", new_session_id="b")
        c = await client.fork("b", new_session_id="c")
        doc = await client.export_session(c.session_id)
        err = await error_of(client.import_session(reseal(doc, "a"), on_conflict="replace"))
        assert err.code in (-32003, -32007), err
        assert (await client.get_session("a")).forked_from is None
        assert b.forked_from is not None and (await client.ping()).pong

    @pytest.mark.slow_on_postgresql
    async def test_chains_deeper_than_the_recursion_limit(self, client: AsyncClient) -> None:
        """500 forks of forks (RecursionError at about 450 before): time travel to the
        first versions and a fork there walk the chain iteratively."""
        await source_with_messages(client, "root", 2)
        sid = "root"
        for i in range(500):
            sid = (await client.fork(sid, new_session_id=f"deep-{i}")).session_id
        at1 = await client.get_session(sid, at_version=2)
        assert at1.session_id == sid and at1.message_count == 1
        assert at1.forked_from is not None and at1.forked_from.session_id == "deep-498"
        low = await client.fork(sid, at_version=2, new_session_id="deep-low")
        assert [m.content for m in (await client.list_messages(low.session_id)).messages] == [
            "message 0"]
        assert (await client.ping()).pong

    async def test_max_fork_depth_bounds_forks_and_imports(self, short_dir: str,
                                                           db_url: str) -> None:
        """max_fork_depth = 3: the fourth fork of forks is -32602 naming the limit, and an
        import that would be one is -32007; shallower ones go on."""
        config = daemon_config(short_dir, db=db_url, max_fork_depth=3)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await source_with_messages(client, "r", 1)
            sid = "r"
            for i in range(3):
                sid = (await client.fork(sid, new_session_id=f"d{i}")).session_id
            err = await error_of(client.fork(sid))
            assert err.code == -32602 and err.data["limit"] == 3, err
            assert err.data["path"] == "$.session_id"
            doc = await client.export_session("d2")
            await client.delete_session("d2")
            assert (await client.import_session(reseal(doc, "d2"))).version == 5
            # A document whose fork of d2 (3 deep) would be 4 deep: refused.
            forged = await client.export_session(
                (await client.fork("d1", new_session_id="tmp")).session_id)
            src_hash = (await client.read_events("d2")).events[-1].hash
            forged["events"][0]["data"]["from"] = {"session_id": "d2", "version": 5,
                                                   "hash": src_hash}
            forged["events"][0]["version"] = 6
            err = await error_of(client.import_session(reseal(forged, "d3")))
            assert err.code == -32007 and "max_fork_depth" in err.message, err
            assert (await client.ping()).pong


# --- section 6: text the stores disagree on ----------------------------------------------


class TestText:
    async def test_nul_is_refused_at_the_boundary(self, client: AsyncClient) -> None:
        """NUL in content, keys, ids and nested data: -32602 naming its path, on both
        stores; the six characters `\\u0000` as text are content like any other."""
        await client.create_session("t")
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("message.append", {"session_id": "t", "role": "user", "content": "a\x00b"},
             "$.content"),
            ("memory.update", {"session_id": "t", "patch": {"k\x00": 1}}, "$.patch"),
            ("events.append", {"session_id": "t", "events": [
                {"type": "decision.recorded", "data": {"why": ["x", {"y": "\x00"}]}}]},
             "$.events[0].data.why[1].y"),
            ("session.create", {"task": "\x00"}, "$.task"),
            ("session.list", {"namespace": "n\x00"}, "$.namespace"),
        ]
        for method, params, path in cases:
            err = await error_of(client.call(method, **params))
            assert err.code == -32602 and err.data["path"] == path, (method, err)
        err = await error_of(client.call("session.create", session_id="a\x00b"))
        assert err.code == -32602 and err.data["path"] == "$.session_id", err
        text = "backslash-u: \\u0000"
        await client.append_message("t", "user", text)
        assert (await client.list_messages("t")).messages[-1].content == text
        assert (await client.get_session("t")).version == 2

    async def test_executor_output_nul_is_replaced(self, client: AsyncClient) -> None:
        """What an executor prints is captured, not given: a NUL in it (raw, or escaped in
        a JSON line) is stored as U+FFFD on both stores, and the turn is recorded."""
        code = "import sys; sys.stdout.write('raw a\\x00b\\n' + '{\"x\": \"c\\\\u0000d\"}\\n')"
        s = await client.spawn([sys.executable, "-S", "-c", code])
        state = await finished(client, s.session_id)
        assert state.status == "completed", state
        lines = (await client.output(s.session_id)).lines
        assert "raw a\ufffdb" in lines and '{"x": "c\\ufffdd"}' in lines, lines

    @pytest.mark.parametrize("bad", ["", "x" * 200_000, "../../etc/passwd", "a\x00b", "a b"])
    async def test_imported_session_ids_are_the_daemons_kind(self, client: AsyncClient,
                                                             bad: str) -> None:
        await client.create_session("good")
        doc = reseal(await client.export_session("good"), bad)
        err = await error_of(client.import_session(doc))
        assert err.code == -32602, err
        assert err.data["path"] == "$.document.events[0].session_id", err
        assert (await client.ping()).pong

    @pytest.mark.parametrize("bad", ["zzzz-not-a-time", "", "2026-13-01T00:00:00.000000Z",
                                     "2026-01-01T00:00:00+00:00"])
    async def test_imported_times_are_the_daemons_kind(self, client: AsyncClient,
                                                       bad: str) -> None:
        await source_with_messages(client, "timed", 2)
        doc = await client.export_session("timed")
        doc["events"][2]["recorded_at"] = bad
        err = await error_of(client.import_session(reseal(doc, "retimed")))
        assert err.code == -32602, err
        assert err.data["path"] == "$.document.events[2].recorded_at", err
        assert (await client.import_session(reseal(await client.export_session("timed"),
                                                   "retimed"))).version == 3

    async def test_nul_in_a_document_given_as_text(self, client: AsyncClient) -> None:
        await client.create_session("good")
        doc = reseal(await client.export_session("good"), "textual")
        doc["events"][0]["data"]["task"] = "a\x00b"
        err = await error_of(client.import_session(json.dumps(doc)))
        assert err.code == -32602 and err.data["path"] == "$.document.events[0].data.task"


@pytest.fixture
def pg_url() -> Iterator[str]:
    import pg

    yield from pg.database()


@pytest.mark.postgresql
async def test_migrate_names_the_session_it_cannot_copy(short_dir: str, pg_url: str) -> None:
    """A SQLite database holding a NUL (an older daemon took it): migrate into PostgreSQL
    copies every other session, names that one with why, and exits non-zero."""
    for url in [pg_url]:
        db = os.path.join(short_dir, "old", "sessiond.db")
        os.makedirs(os.path.dirname(db))
        async with (running_daemon(daemon_config(os.path.dirname(db), db=db)) as d,
                    AsyncClient(d.socket) as client):
            for sid in ("m1", "m2", "m3"):
                await source_with_messages(client, sid, 2)
        await edit(db, "UPDATE events SET data = CAST(json_set(CAST(data AS TEXT), '$.content',"
                   " 'a' || char(0) || 'b') AS BLOB) WHERE session_id = 'm2' AND version = 2",
                   "")
        code, report, err = await run_migrate(db, url)
        assert code == 2, (code, report, err)
        assert list(report["refused"]) == ["m2"] and "NUL" in report["refused"]["m2"]
        assert "m2" in err and "NUL" in err
        fleet = daemon_config(os.path.join(short_dir, "fleet"), db=url)
        os.makedirs(os.path.join(short_dir, "fleet"))
        async with running_daemon(fleet) as d, AsyncClient(d.socket) as client:
            for sid in ("m1", "m3"):
                assert (await client.get_session(sid)).message_count == 2
            assert (await error_of(client.get_session("m2"))).code == -32001
            assert (await client.verify()).ok


# --- section 7: damaged histories, and what the default grant may take away ----------------


class TestDamaged:
    async def test_time_travel_and_fork_of_a_damaged_history(self, daemon: Daemon,
                                                             client: AsyncClient,
                                                             db_url: str) -> None:
        """An event that no longer folds: session.get at_version and session.fork across it
        are -32012 naming the session (before: -32603); the current view is served."""
        await source_with_messages(client, "hurt")
        await edit(db_url, "UPDATE events SET data = '{}' WHERE session_id = 'hurt'"
                   " AND version = 2",
                   "UPDATE events SET data = convert_to('{}', 'UTF8') WHERE session_id = 'hurt'"
                   " AND version = 2")
        for call in (client.get_session("hurt", at_version=3),
                     client.fork("hurt", at_version=3)):
            err = await error_of(call)
            assert err.code == -32012 and err.data["session_id"] == "hurt", err
        assert (await client.get_session("hurt")).version == 4

    async def test_a_damaged_session_without_a_view_is_deleted(self, short_dir: str,
                                                               db_url: str) -> None:
        """A session whose view row is gone and whose events do not fold (as an upgraded
        database may hold): verify names it and session.delete deletes it (before:
        -32001)."""
        config = daemon_config(short_dir, db=db_url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await source_with_messages(client, "broken")
            await client.create_session("fine")
        await edit(db_url, "UPDATE events SET data = '{}' WHERE session_id = 'broken'"
                   " AND version = 3",
                   "UPDATE events SET data = convert_to('{}', 'UTF8') WHERE session_id = 'broken'"
                   " AND version = 3")
        await edit(db_url, "DELETE FROM sessions WHERE session_id = 'broken'",
                   "DELETE FROM sessions WHERE session_id = 'broken'")
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            assert "broken" in {p.session_id for p in (await client.verify()).problems}
            assert await client.delete_session("broken") is True
            assert (await error_of(client.get_session("broken"))).code == -32001
            assert (await client.verify()).ok
            assert (await client.get_session("fine")).version == 1


class TestRemovingForms:
    @pytest.mark.sqlite_only("grants are decided before the store; one store shows it")
    async def test_default_peers_cannot_take_data_out_of_views(self, short_dir: str,
                                                               store_kind: str) -> None:
        """memory.update deleting a key (at any depth), events.append of such a
        memory.updated, and graph.put over an existing checkpoint are withheld from other
        users by default, as message.pop and message.clear are; changing a value and adding
        a checkpoint are not. Granted by name, they are served."""
        from test_security import as_peer, peer_user, req

        user = peer_user()
        os.chmod(short_dir, 0o755)
        checkpoint = {"session_id": "g", "thread_id": "t", "checkpoint_id": "c1",
                      "checkpoint": {"type": "json", "data": "e30="}}
        for granted in ([], ["memory.update:delete", "graph.put:replace"]):
            directory = os.path.join(short_dir, f"g{len(granted)}")
            os.makedirs(directory)
            os.chmod(directory, 0o755)
            config = daemon_config(directory, socket_mode=0o666, allowed_uids=[user.pw_uid],
                                   peer_methods=granted)
            async with running_daemon(config) as d, AsyncClient(d.socket) as owner:
                await owner.create_session("m")
                await owner.update_memory("m", {"k": 1, "n": {"a": 1}})
                await owner.call("graph.put", **checkpoint)
                answers = await as_peer(d.socket, user, [
                    req(1, "memory.update", session_id="m", patch={"k": 2}),
                    req(2, "graph.put", **{**checkpoint, "checkpoint_id": "c2"}),
                    req(3, "memory.update", session_id="m", patch={"k": None}),
                    req(4, "memory.update", session_id="m", patch={"n": {"a": None}}),
                    req(5, "events.append", session_id="m", events=[
                        {"type": "memory.updated", "data": {"patch": {"k": None}}}]),
                    req(6, "graph.put", **checkpoint),
                ])
                assert "result" in answers[1] and "result" in answers[2], answers
                for i, grant in ((3, "memory.update:delete"), (4, "memory.update:delete"),
                                 (5, "memory.update:delete"), (6, "graph.put:replace")):
                    if granted:
                        assert "result" in answers[i], answers[i]
                        continue
                    error = answers[i]["error"]
                    assert error["code"] == -32006 and error["data"]["grant"] == grant, error
                memory = (await owner.get_session("m")).memory
                assert memory == ({"n": {}} if granted else {"k": 2, "n": {"a": 1}}), memory
                # the owner is never limited
                await owner.update_memory("m", {"n": None})
                await owner.call("graph.put", **checkpoint)


async def test_stores_never_loop_on_a_cycle_written_behind_the_daemons_back(
        daemon: Daemon, client: AsyncClient, db_url: str) -> None:
    """A fork link made to point at itself in the store: reads that walk the chain stop
    (bounded), answer with contract codes, and verify reports the session."""
    await source_with_messages(client, "o", 2)
    await client.fork("o", new_session_id="loop")
    await edit(db_url, "UPDATE forks SET source_id = 'loop' WHERE session_id = 'loop'",
               "UPDATE forks SET source_id = 'loop' WHERE session_id = 'loop'")
    with anyio.fail_after(60):  # a guard against the old endless loop, not a timing
        for at in (2, None):
            err = await error_of(client.fork("loop", at_version=at))
            assert err.code == -32012 and err.data["session_id"] == "loop", err
        problems = (await client.verify()).problems
    assert "loop" in {p.session_id for p in problems}, problems
    assert (await client.ping()).pong
