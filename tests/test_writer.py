"""The writer on a real database: a command that fails, in deciding or committing, fails alone."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from conftest import daemon_config, running_daemon
from faulty_store import FaultyStore, faulty, for_session, touches
from store_contract import Log, fork_event, message
from structlog.testing import capture_logs

from sessiond import AsyncClient
from sessiond_daemon.core.writer import Command, Delete, Import, Plan, Writer
from sessiond_daemon.stores.interface import Moved
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_schemas.errors import (
    InternalError,
    InvalidTransitionError,
    SessiondError,
    SessionImportError,
)
from sessiond_schemas.events import EventMeta, MessageAppended, MetadataUpdated, SessionCreated

pytestmark = pytest.mark.anyio


def creating(plan_result: Any) -> Any:
    def plan(state: Any) -> Plan:
        return Plan([("session.created", SessionCreated())], plan_result)
    return plan


async def test_a_failing_command_stores_nothing_and_leaves_no_gap(short_dir: str) -> None:
    """A bug late in one command (its result) fails only that command, whole."""
    db = os.path.join(short_dir, "w.db")
    store = SqliteStore(db)
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)

    def broken(state: Any, events: Any) -> Any:
        raise RuntimeError("bug in a result builder")

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            bad = Command(session_id="bad", plan=creating(broken), meta=EventMeta())
            good = Command(session_id="good", plan=creating(lambda s, ev: {"ok": True}),
                           meta=EventMeta())
            outcomes: dict[str, Any] = {}
            submit = recorder(writer, outcomes)
            async with anyio.create_task_group() as both:  # one batch, two commands
                both.start_soon(submit, bad)
                both.start_soon(submit, good)
            writer.close()
    finally:
        await store.close()
    assert isinstance(outcomes["bad"], InternalError) and "error_id" in outcomes["bad"].data
    assert outcomes["good"] == b'{"ok":true}'
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT session_id, position FROM events").fetchall() == [("good", 1)]
        assert con.execute("SELECT session_id FROM sessions").fetchall() == [("good",)]
    finally:
        con.close()


def recorder(writer: Writer, outcomes: dict[str, Any]) -> Callable[[Command], Awaitable[None]]:
    """Submit a command and keep its outcome (result bytes or SessiondError) by session."""
    async def submit(cmd: Command) -> None:
        try:
            outcomes[cmd.session_id] = await writer.submit(cmd)
        except SessiondError as err:
            outcomes[cmd.session_id] = err
    return submit


def poisoning(store: FaultyStore, session_id: str, exc: BaseException | None) -> None:
    """Make every commit holding `session_id` fail: raising `exc` (a bug below the writer),
    or, with None, by the store's own error midway through its transaction."""
    if exc is None:
        store.break_commits_midway(touches(session_id))
    else:
        store.fail_commits(for_session(session_id, exc))


async def test_the_writer_decides_again_when_the_store_moved(short_dir: str) -> None:
    """Another writer (a host sharing the store) appended to a session the writer holds in
    its cache: the commit reports it (`Moved`), and the writer reloads the session and
    decides the batch again, numbered after the store's last position."""
    store = FaultyStore(SqliteStore(os.path.join(short_dir, "w.db")))
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            await writer.submit(Command(session_id="a", plan=creating(lambda s, ev: 1),
                                        meta=EventMeta()))
            entry = await store.load_entry("a")
            assert entry is not None and writer.cached("a") is not None
            theirs = Log(head=1, entries={"a": entry})  # the other host's append
            await store.inner.commit(theirs.batch(("a", [message(0, "theirs")])))
            reported: list[Moved] = []

            def once(batch: Any) -> Moved | None:
                if reported:
                    return None
                reported.append(Moved(stale=frozenset({"a"}), head=2))
                return reported[0]
            store.report_moved(once)

            def appending(state: Any) -> Plan:
                return Plan([("message.appended", MessageAppended(
                    message_id="m", sequence=state.message_count, role="user",
                    content="ours"))], lambda s, ev: [s.version, ev[0].position])
            result = await writer.submit(Command(session_id="a", plan=appending,
                                                 meta=EventMeta()))
            writer.close()
    finally:
        await store.close()
    assert reported and store.commits == 2
    assert result == b"[3,3]"  # version 3 after theirs, at position 3


async def test_a_fork_and_a_delete_of_its_source_in_one_batch(short_dir: str) -> None:
    """The store checks preconditions against what is committed; the writer checks them
    against the batch itself: in one batch, a delete after a fork of the session is
    -32003 (the fork is written), a fork after a delete of its source is refused (the
    delete is written). One commit each: nothing else is held back."""
    store = SqliteStore(os.path.join(short_dir, "w.db"))
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
    outcomes: dict[str, Any] = {}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            submit = recorder(writer, outcomes)
            for sid in ("s1", "s2"):
                await submit(Command(session_id=sid, plan=creating(lambda s, ev: 1),
                                     meta=EventMeta()))
            entries = {sid: await store.load_entry(sid) for sid in ("s1", "s2")}

            def forking(source: str) -> Command:
                entry = entries[source]
                assert entry is not None
                event = fork_event(f"{source}-f", source, 1, entry.last_hash, entry.state, 0)
                return Command(session_id=event.session_id, meta=EventMeta(),
                               plan=lambda state: Import([event], {}))

            def deleting(sid: str) -> Command:
                return Command(session_id=sid, plan=lambda state: Delete(True),
                               meta=EventMeta())

            before = writer.transactions
            async with anyio.create_task_group() as batch:  # one batch, four commands
                for cmd in (forking("s1"), deleting("s1"), deleting("s2"), forking("s2")):
                    batch.start_soon(submit, cmd)
            assert writer.transactions == before + 1
            writer.close()
    finally:
        await store.close()
    assert outcomes["s1-f"] != b"" and not isinstance(outcomes["s1-f"], SessiondError)
    assert isinstance(outcomes["s1"], InvalidTransitionError)
    assert outcomes["s1"].data == {"session_id": "s1", "forks": 1}
    assert outcomes["s2"] == b"true"
    assert isinstance(outcomes["s2-f"], SessionImportError)
    assert "s2 was deleted" in outcomes["s2-f"].message


async def test_a_plan_that_takes_shared_history_requires_no_forks(short_dir: str) -> None:
    """A plan marked `unforked` (session.trim's: it takes out history a fork would share)
    is refused -32003 when the session has a fork, whether the fork was committed before
    (the store checks, inside the commit) or comes earlier in the same batch (the writer
    checks the batch); nothing of it is written. A session without forks takes it."""
    store = SqliteStore(os.path.join(short_dir, "w.db"))
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
    outcomes: dict[str, Any] = {}
    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            submit = recorder(writer, outcomes)
            for sid in ("s1", "s2", "s3"):
                await submit(Command(session_id=sid, plan=creating(lambda s, ev: 1),
                                     meta=EventMeta()))

            async def forking(source: str) -> Command:
                entry = await store.load_entry(source)
                assert entry is not None
                event = fork_event(f"{source}-f", source, 1, entry.last_hash, entry.state, 0)
                return Command(session_id=event.session_id, meta=EventMeta(),
                               plan=lambda state: Import([event], {}))

            def taking(sid: str) -> Command:
                return Command(session_id=sid, meta=EventMeta(), plan=lambda state: Plan(
                    [("metadata.updated", MetadataUpdated(patch={"k": 1}))],
                    lambda st, ev: st.version, unforked="trimmed"))

            await submit(await forking("s1"))  # committed before the plan
            async with anyio.create_task_group() as batch:  # s2's fork in the same batch
                for cmd in (await forking("s2"), taking("s1"), taking("s2"), taking("s3")):
                    batch.start_soon(submit, cmd)
            versions = {sid: (await store.load_entry(sid)).state.version  # type: ignore[union-attr]
                        for sid in ("s1", "s2", "s3")}
            writer.close()
    finally:
        await store.close()
    for sid in ("s1", "s2"):
        assert isinstance(outcomes[sid], InvalidTransitionError), outcomes[sid]
        assert outcomes[sid].data == {"session_id": sid, "forks": 1}
        assert "cannot be trimmed" in outcomes[sid].message
    assert outcomes["s3"] == b"2" and versions == {"s1": 1, "s2": 1, "s3": 2}


class TestOneCommandFailsAlone:
    """A batch whose commit fails is retried command by command: only the culprit fails."""

    @pytest.mark.parametrize("exc, code", [
        (OverflowError("Python int too large to convert to SQLite INTEGER"), -32603),
        (None, -32012),  # the store's own error (a UNIQUE constraint), midway
    ])
    async def test_batch_retried_one_by_one(self, short_dir: str,
                                            exc: BaseException | None, code: int) -> None:
        db = os.path.join(short_dir, "w.db")
        store = FaultyStore(SqliteStore(db))
        await store.open()
        writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
        poisoning(store, "bad", exc)
        outcomes: dict[str, Any] = {}
        submit = recorder(writer, outcomes)
        try:
            with capture_logs() as logs:
                async with anyio.create_task_group() as tg:
                    await tg.start(writer.run)
                    async with anyio.create_task_group() as batch:  # one batch of three
                        for sid in ("a", "bad", "b"):
                            batch.start_soon(submit, Command(
                                session_id=sid, plan=creating(lambda s, ev: {"ok": True}),
                                meta=EventMeta()))
                    assert writer.cached("bad") is None  # never a view that was not committed
                    await submit(Command(session_id="c", plan=creating(lambda s, ev: 1),
                                         meta=EventMeta()))  # the writer carries on
                    writer.close()
        finally:
            await store.close()
        assert outcomes["a"] == outcomes["b"] == b'{"ok":true}' and outcomes["c"] == b"1"
        bad = outcomes["bad"]
        assert isinstance(bad, SessiondError) and bad.code == code
        if code == -32603:
            logged = [e for e in logs if e.get("error_id") == bad.data["error_id"]]
            assert logged and logged[0]["log_level"] == "error"
        con = sqlite3.connect(db)
        try:
            rows = con.execute("SELECT session_id, position FROM events ORDER BY position")
            assert [r[0] for r in rows] == ["a", "b", "c"]
            # No gap where the failed command was (ORDER BY: a query without it may scan
            # an index, the event ids', whose order within a millisecond is random).
            assert [p for (p,) in con.execute("SELECT position FROM events ORDER BY position")
                    ] == [1, 2, 3]
        finally:
            con.close()


async def test_a_failing_commit_over_the_socket(short_dir: str) -> None:
    """Through the real client: the poisoned session's writes are -32603 with an incident id,
    everyone else's (in the same batches) commit, the daemon serves on, and the session's
    view stays what was committed."""
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client:
        for sid in ("ok1", "poison", "ok2"):
            await client.create_session(sid)
        store = stores[0]
        poisoning(store, "poison", OverflowError("int too large"))
        results: dict[str, Any] = {}

        async def append(sid: str, i: int) -> None:
            try:
                results[f"{sid}{i}"] = await client.append_message(sid, "user", f"m{i}")
            except SessiondError as err:
                results[f"{sid}{i}"] = err

        with capture_logs() as logs:  # (and no traceback rendering: it is slow)
            async with anyio.create_task_group() as tg:  # pipelined: group-committed together
                for i in range(5):
                    for sid in ("ok1", "poison", "ok2"):
                        tg.start_soon(append, sid, i)
        logged = {e.get("error_id") for e in logs if e["log_level"] == "error"}
        for i in range(5):
            err = results[f"poison{i}"]
            assert isinstance(err, SessiondError) and err.code == -32603
            assert err.data["error_id"] in logged
            assert not isinstance(results[f"ok1{i}"], SessiondError)
            assert not isinstance(results[f"ok2{i}"], SessiondError)
        assert (await client.ping()).pong
        assert (await client.get_session("poison")).version == 1
        store.heal()
        r = await client.append_message("poison", "user", "later")
        assert (r.version, r.sequence) == (2, 0)
        positions = [p for (p,) in daemon.sql("SELECT position FROM events ORDER BY position")]
        assert positions == list(range(1, len(positions) + 1))
        assert (await client.call("daemon.verify", Any))["ok"] is True


class TestStoredDataNeverStopsTheStart:
    """Rows written into the file behind the daemon's back: reported, marked, served around."""

    async def test_bad_event_rows_then_start(self, short_dir: str) -> None:
        config = daemon_config(short_dir)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            for sid in ("good", "bad", "nullcost"):
                await c.create_session(sid)
                await c.append_message(sid, "user", "hello")
                await c.call("tokens.record", Any, session_id=sid, input_tokens=5,
                             estimated_cost=0.25)
        con = sqlite3.connect(config.db)
        try:
            with con:
                (last,) = con.execute("SELECT MAX(position) FROM events").fetchone()
                row = ("1, '2026-01-01T00:00:00.000000Z'", "'{}'", "'x'")
                con.execute(  # data that does not decode: a count past int64
                    f"INSERT INTO events VALUES ({last + 1}, 'bad', 4, 'evil-1', 'tokens.recorded',"
                    f" {row[0]}, '{{\"input_tokens\": 9223372036854775808}}', {row[1]}, {row[2]})")
                con.execute(  # a session with no view whose first event is not even JSON
                    f"INSERT INTO events VALUES ({last + 2}, 'ghost', 1, 'evil-2',"
                    f" 'session.created', {row[0]}, 'not json', {row[1]}, {row[2]})")
                # the poison: a view whose cost was stored as null
                con.execute("UPDATE sessions SET state = CAST(json_set(state,"
                            " '$.token_usage.estimated_cost', json('null')) AS BLOB)"
                            " WHERE session_id = 'nullcost'")
        finally:
            con.close()
        with capture_logs() as logs:
            async with running_daemon(config) as d, AsyncClient(d.socket) as c:
                assert (await c.ping()).pong
                damaged = {e["session_id"] for e in logs if e["event"] == "writer.session_damaged"}
                assert damaged == {"bad", "ghost"}
                # The rest is served, reads and writes.
                r = await c.append_message("good", "user", "still here")
                assert r.version == 4
                # The damaged session: its last good view is served; writes are -32012
                # naming where its history breaks.
                assert (await c.get_session("bad")).version == 3
                with pytest.raises(SessiondError) as err:
                    await c.append_message("bad", "user", "refused")
                assert err.value.code == -32012 and "after version 3" in err.value.message
                assert err.value.data["session_id"] == "bad"
                with pytest.raises(SessiondError) as err:
                    await c.create_session("ghost")
                assert err.value.code == -32012
                # The row reads back as stored; an export (which folds it) is -32012.
                read = await c.call("events.read", Any, session_id="bad")
                assert read["events"][-1]["data"]["input_tokens"] == 2**63
                with pytest.raises(SessiondError) as err:
                    await c.call("session.export", Any, session_id="bad")
                assert err.value.code == -32012 and err.value.data["session_id"] == "bad"
                # The null cost: reads that need the view say so (-32012, not a bug); the
                # next write folds it again from its events.
                with pytest.raises(SessiondError) as err:
                    await c.list_messages("nullcost")
                assert err.value.code == -32012 and err.value.data["session_id"] == "nullcost"
                r = await c.append_message("nullcost", "user", "mended")
                assert r.version == 4
                assert (await c.get_session("nullcost")).token_usage.estimated_cost == 0.25
                verify = await c.call("daemon.verify", Any)
                # (Rows written behind the daemon's back are not in the search index
                # either: that database-wide problem has no session_id.)
                found = {p["session_id"]: p["problem"] for p in verify["problems"]
                         if p["session_id"] is not None}
                assert set(found) == {"bad", "ghost"}, verify
                assert "version 4" in found["bad"] and "input_tokens" in found["bad"]
                # Deleting the damaged session clears it.
                assert await c.delete_session("bad") is True
                verify = await c.call("daemon.verify", Any)
                assert {p["session_id"] for p in verify["problems"]} - {None} == {"ghost"}
