"""The store contract: what every store (stores.interface.Store) does, whatever it runs on.

Subclass `StoreContract` in a test module and give it a `store` fixture that yields a
fresh, opened, empty store (and closes it); set `shared = True` and give an `other`
fixture (a second store on the same database) when several writers may share it, as
PostgreSQL's daemons do. tests/test_store_sqlite.py runs it on SQLite.

The tests build batches as the writer does (positions, versions, the hash chain, views
folded by projection.fold), without the writer, so they hold the store alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from sessiond_daemon.core import projection
from sessiond_daemon.stores.interface import (
    Batch,
    Entry,
    HasNoForks,
    HasVersion,
    Moved,
    SessionFilters,
    Store,
)
from sessiond_schemas.errors import InvalidParamsError, StorageError
from sessiond_schemas.events import CURRENT_SCHEMA_VERSION, Event, EventMeta, new_id
from sessiond_schemas.export import canonical, chain_hash
from sessiond_schemas.state import SessionState


@dataclass
class Log:
    """Writes as the writer would: one batch at a time, numbered after `head`."""

    head: int = 0
    entries: dict[str, Entry] = field(default_factory=dict)
    clock: int = 0

    def batch(self, *writes: tuple[str, list[tuple[str, dict[str, Any]]]],
              key: str | None = None, snapshot: bool = False,
              payloads: dict[str, bytes] | None = None) -> Batch:
        """A batch of (session_id, [(type, data), ...]) writes; `key`: an idempotency key
        stored for each session written, with its new version as the result."""
        batch = Batch()
        position = self.head
        for sid, items in writes:
            entry = self.entries.get(sid)
            batch.bases.setdefault(sid, entry.state.version if entry else 0)
            version = entry.state.version if entry else 0
            prev = entry.last_hash if entry else ""
            events = []
            for kind, data in items:
                position += 1
                version += 1
                self.clock += 1
                event = Event(position=position, session_id=sid, version=version,
                              event_id=new_id(), type=kind,
                              schema_version=CURRENT_SCHEMA_VERSION,
                              recorded_at=f"2026-01-01T00:00:{self.clock:02d}.000000Z",
                              data_json=msgspec.Raw(canonical(data)), meta=EventMeta(),
                              hash="")
                prev = chain_hash(prev, event)
                events.append(msgspec.structs.replace(event, hash=prev))
            state = projection.fold(entry.state if entry else None, events)
            new = Entry(state, events[-1].hash, events[-1].position)
            batch.events.extend(events)
            batch.views[sid] = self.entries[sid] = new
            if key is not None:
                batch.idempotency.append((sid, key, str(version).encode()))
            if snapshot:
                batch.snapshots.append(state)
        for e in batch.events:
            if e.type == "checkpoint.saved":
                batch.payloads[e.event_id] = (payloads or {}).get(e.data.checkpoint_id,
                                                                  b'{"p":1}')
        self.head = position
        return batch

    def delete(self, sid: str) -> Batch:
        """A delete decided from the version held (a shared store checks it)."""
        entry = self.entries.pop(sid, None)
        return Batch(deletes=[sid], bases={sid: entry.state.version if entry else 0})


def created(namespace: str = "local", **fields: Any) -> tuple[str, dict[str, Any]]:
    return ("session.created", {"namespace": namespace, **fields})


def message(sequence: int, content: str = "hi", role: str = "user") -> tuple[str, dict[str, Any]]:
    return ("message.appended", {"message_id": new_id(), "sequence": sequence, "role": role,
                                 "content": content})


def checkpoint(cid: str, size: int = 7) -> tuple[str, dict[str, Any]]:
    return ("checkpoint.saved", {"checkpoint_id": cid, "size": size, "memory": {"m": cid}})


def status(to: str) -> tuple[str, dict[str, Any]]:
    return ("session.status_changed", {"from": "active", "to": to})


@pytest.mark.anyio
class StoreContract:
    """Every store passes these. Subclasses provide the `store` fixture."""

    @pytest.fixture
    def log(self) -> Log:
        return Log()

    @pytest.fixture
    async def store(self) -> AsyncIterator[Store]:
        raise NotImplementedError("a store's test module gives a fresh, opened store")
        yield  # pragma: no cover

    # --- append and read ----------------------------------------------------------------

    async def test_empty(self, store: Store) -> None:
        assert await store.last_position() == 0
        assert await store.load_entry("nobody") is None
        assert await store.state_json("nobody") is None
        assert list(await store.read_events(session_id=None, from_version=1, after_position=0,
                                            limit=10, types=None)) == []
        assert await store.counts() == (0, 0)
        assert await store.sessions_behind() == []

    async def test_append_then_read_a_stream_and_the_log(self, store: Store, log: Log) -> None:
        b1 = log.batch(("a", [created(), message(0)]), ("b", [created()]))
        assert await store.commit(b1) is None
        b2 = log.batch(("a", [message(1, "second")]))
        assert await store.commit(b2) is None
        assert await store.last_position() == 4
        stream = await store.read_events(session_id="a", from_version=2, after_position=0,
                                         limit=10, types=None)
        assert [(e.version, e.position) for e in stream] == [(2, 2), (3, 4)]
        assert list(stream) == [b1.events[1], b2.events[0]]  # exactly as written
        whole = await store.read_events(session_id=None, from_version=1, after_position=1,
                                        limit=10, types=None)
        assert [e.position for e in whole] == [2, 3, 4]
        typed = await store.read_events(session_id=None, from_version=1, after_position=0,
                                        limit=10, types=["session.created"])
        assert [e.session_id for e in typed] == ["a", "b"]
        after = await store.read_after(1, 3, None, None, 10)
        assert [e.position for e in after] == [2, 3]
        assert [e.position for e in await store.read_after(0, 4, "a", frozenset(
            {"message.appended"}), 10)] == [2, 4]
        assert [e.position for e in await store.read_after(0, 4, None, None, 2)] == [1, 2]
        assert await store.first_position("a", 3) == 4
        assert await store.first_position("a", 9) is None
        assert await store.events_of_types("a", ("message.appended",)) == [
            ("message.appended", e.fields()) for e in (b1.events[1], b2.events[0])]
        assert await store.foreign_event_ids("b", [b1.events[0].event_id, "unknown"]) == [
            b1.events[0].event_id]

    async def test_views_read_back(self, store: Store, log: Log) -> None:
        batch = log.batch(("a", [created(task="t"), message(0)]))
        await store.commit(batch)
        entry = await store.load_entry("a")
        assert entry is not None
        assert entry.state == log.entries["a"].state
        assert (entry.last_hash, entry.last_position) == (batch.events[-1].hash, 2)
        raw = await store.state_json("a")
        assert raw is not None and msgspec.json.decode(raw, type=SessionState) == entry.state
        assert await store.counts() == (1, 2)

    async def test_positions_are_gapless_across_batches(self, store: Store, log: Log) -> None:
        for i in range(5):
            await store.commit(log.batch((f"s{i}", [created(), message(0), message(1)])))
        page = await store.read_events(session_id=None, from_version=1, after_position=0,
                                       limit=100, types=None)
        assert [e.position for e in page] == list(range(1, 16))
        assert await store.last_position() == 15

    async def test_a_failing_batch_stores_nothing(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()])))
        good = log.batch(("b", [created(), message(0)]), key="k")
        bad = Batch(events=[*good.events, good.events[0]], views=good.views,
                    idempotency=good.idempotency, bases=good.bases)  # a repeated event
        with pytest.raises(StorageError) as err:
            await store.commit(bad)
        assert err.value.code == -32012
        assert await store.last_position() == 1
        assert await store.load_entry("b") is None
        assert await store.idempotent_results([("b", "k")]) == {}
        assert await store.commit(good) is None  # and the store goes on
        assert await store.last_position() == 3

    async def test_sessions_behind_their_view(self, store: Store, log: Log) -> None:
        batch = log.batch(("a", [created(), message(0)]), ("b", [created()]))
        batch.views.pop("b")  # events with no view: as if written behind the daemon's back
        await store.commit(batch)
        assert await store.sessions_behind() == ["b"]

    # --- idempotency --------------------------------------------------------------------

    async def test_idempotency_results(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()]), ("b", [created()]), key="k1"))
        found = await store.idempotent_results([("a", "k1"), ("b", "k1"), ("a", "k2")])
        assert found == {("a", "k1"): b"1", ("b", "k1"): b"1"}
        many = [(f"s{i}", f"k{i}") for i in range(1000)] + [("a", "k1")]
        assert await store.idempotent_results(many) == {("a", "k1"): b"1"}

    async def test_prefetch_reads_views_and_keys(self, store: Store, log: Log) -> None:
        """The writer's one read before a batch: views (None for a missing session) and
        stored key results, as load_entry and idempotent_results give them."""
        await store.commit(log.batch(("a", [created(), message(0)]), ("b", [created()]),
                                     key="k1"))
        sids = ["a", "nope", "b", *(f"x{i}" for i in range(600))]
        views, found = await store.prefetch(sids, [("a", "k1"), ("a", "k2")])
        assert set(views) == set(sids)
        assert views["a"] == await store.load_entry("a") and views["a"] is not None
        assert views["b"] == await store.load_entry("b") and views["b"] is not None
        assert views["nope"] is None and views["x599"] is None
        assert found == {("a", "k1"): b"2"}  # the key's result: a's version then
        assert await store.prefetch([], []) == ({}, {})

    async def test_a_session_s_results_by_page(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()]), ("b", [created()]), key="k1"))
        for n, key in enumerate(("k3", "k2")):
            await store.commit(log.batch(("a", [message(n)]), key=key))
        # The result is the session's version after the write: k3 then k2 were written.
        assert await store.idempotency_page("a", "", 2) == [("k1", b"1"), ("k2", b"3")]
        assert await store.idempotency_page("a", "k2", 2) == [("k3", b"2")]
        assert await store.idempotency_page("b", "", 10) == [("k1", b"1")]
        assert await store.idempotency_page("c", "", 10) == []

    async def test_a_key_is_stored_once(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()]), key="k"))
        again = log.batch(("a", [message(0)]), key="k")
        # A bug of the writer, or (shared stores) another writer's: stored once, never twice.
        with contextlib.suppress(StorageError):
            assert isinstance(await store.commit(again), Moved)
        assert await store.last_position() == 1

    # --- snapshots and deletes ---------------------------------------------------------

    async def test_snapshots(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created(), message(0)]), snapshot=True))
        at_two = log.entries["a"].state
        await store.commit(log.batch(("a", [message(1), message(2)]), snapshot=True))
        assert await store.snapshot("a", 3) == at_two
        assert await store.snapshot("a", 1) is None
        assert await store.snapshots("a") == {2: at_two, 4: log.entries["a"].state}

    async def test_delete_takes_a_session_whole(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created(), message(0), checkpoint("c")]),
                                     key="k", snapshot=True))
        await store.commit(log.batch(("b", [created(), message(0)])))
        assert await store.commit(log.delete("a")) is None
        assert await store.load_entry("a") is None
        assert await store.idempotent_results([("a", "k")]) == {}
        assert await store.snapshots("a") == {}
        assert await store.checkpoint("a", None) is None
        assert list(await store.list_messages("a", first=0, limit=10, descending=False)) == []
        assert [e.session_id for e in await store.read_after(0, 10, None, None, 10)] == [
            "b", "b"]
        assert await store.session_ids("", 10) == ["b"]
        # A delete and a new session of that id in one batch: the delete goes first.
        batch = log.delete("b")
        batch.events, batch.views = (again := log.batch(("b", [created()]))).events, again.views
        await store.commit(batch)
        assert [e.version for e in await store.read_events(
            session_id="b", from_version=1, after_position=0, limit=10, types=None)] == [1]

    async def test_deleting_the_newest_events_keeps_the_head(self, store: Store,
                                                             log: Log) -> None:
        """Positions are never handed out twice: with the session holding the log's
        newest events deleted, last_position and a refused batch's Moved.head still name
        the last position handed out, not the newest event left."""
        await store.commit(log.batch(("a", [created()])))
        gone = log.batch(("b", [created(), message(0)]))
        await store.commit(gone)
        top = log.head
        assert await store.commit(log.delete("b")) is None
        assert await store.last_position() == top
        refused = log.batch(("a", [message(0)]))
        refused.requires = [("a", HasVersion("b", 2, gone.events[-1].hash))]
        moved = await store.commit(refused)
        assert moved is not None and moved.refused == {refused.requires[0][1]: 0}
        assert moved.head == top
        assert await store.last_position() == top

    # --- paging -------------------------------------------------------------------------

    async def test_pages_stop_at_their_byte_budget(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()] + [message(i, "x" * 1000)
                                                         for i in range(10)])))
        page = await store.read_events(session_id="a", from_version=1, after_position=0,
                                       limit=100, types=None, max_bytes=3500)
        assert page.cut and 1 < len(page) < 11
        one = await store.read_events(session_id="a", from_version=2, after_position=0,
                                      limit=100, types=None, max_bytes=1)
        assert one.cut and len(one) == 1  # the first row always comes
        whole = await store.read_events(session_id="a", from_version=1, after_position=0,
                                        limit=100, types=None, max_bytes=0)
        assert not whole.cut and len(whole) == 11

    async def test_list_sessions_pages_newest_first(self, store: Store, log: Log) -> None:
        for i in range(7):
            await store.commit(log.batch((f"s{i}", [created("team" if i % 2 else "solo")])))
        seen: list[str] = []
        cursor: str | None = None
        while True:
            page, cursor = await store.list_sessions(SessionFilters(), 3, cursor)
            seen += [s.session_id for s in page]
            if cursor is None:
                break
        assert seen == [f"s{i}" for i in reversed(range(7))]
        team, _ = await store.list_sessions(SessionFilters(namespace="team"), 10, None)
        assert [s.session_id for s in team] == ["s5", "s3", "s1"]
        with pytest.raises(InvalidParamsError):
            await store.list_sessions(SessionFilters(), 3, "not a cursor")

    async def test_session_queries(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("ab1", [created("n/x")]), ("ab2", [created("n/y")]),
                                     ("c", [created("m")])))
        await store.commit(log.batch(("c", [status("completed")])))
        assert await store.resolve("ab") == ["ab1", "ab2"]
        assert await store.session_ids("ab1", 10) == ["ab2", "c"]
        assert await store.stale_sessions(["completed"], "2100-01-01", 10) == ["c"]
        assert await store.stale_sessions(["completed"], "2000-01-01", 10) == []
        under = await store.states("n/", True, "", 10)
        assert [msgspec.json.decode(s)["session_id"] for s in under] == ["ab1", "ab2"]
        assert [r[:2] for r in sorted(await store.session_totals("status"))] == [
            ("active", 2), ("completed", 1)]
        assert await store.sessions_with_process() == []

    # --- read models --------------------------------------------------------------------

    async def test_messages_follow_appends_truncations(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created()] + [message(i, f"m{i}") for i in range(5)])))
        page = await store.list_messages("a", first=1, limit=2, descending=False)
        assert [(m.sequence, m.content) for m in page] == [(1, "m1"), (2, "m2")]
        latest = await store.list_messages("a", first=4, limit=2, descending=True)
        assert [m.sequence for m in latest] == [4, 3]
        await store.commit(log.batch(("a", [("messages.truncated", {"from_sequence": 3}),
                                            message(3, "again")])))
        assert [(m.sequence, m.content) for m in await store.list_messages(
            "a", first=0, limit=10, descending=False)] == [
            (0, "m0"), (1, "m1"), (2, "m2"), (3, "again")]

    async def test_progress_steps_and_the_runner_index(self, store: Store, log: Log) -> None:
        """progress.list's rows (a range of versions, oldest first) and the runner index
        (turn events, and only the output lines that may name a resume id); a delete
        takes both."""
        steps = [("progress.recorded", {"node_id": f"n{i}", "edge": f"e{i}"}) for i in range(5)]
        await store.commit(log.batch(("a", [created(), *steps])))
        page = await store.progress_steps("a", 0, 100, 3)
        assert [(s.version, s.node_id, s.edge) for s in page] == [
            (2, "n0", "e0"), (3, "n1", "e1"), (4, "n2", "e2")]
        assert [s.node_id for s in await store.progress_steps("a", 4, 5, 10)] == ["n3"]
        turn = [("process.started", {"pid": 1, "turn": 1, "argv": ["x"]}),
                ("process.output", {"turn": 1, "stream": "stdout", "line": "plain"}),
                ("process.output", {"turn": 1, "stream": "stdout",
                                    "line": '{"type":"thread.started","thread_id":"t"}'}),
                ("process.exited", {"pid": 1, "turn": 1, "exit_code": 0})]
        await store.commit(log.batch(("x", [created(), *turn])))
        rows = await store.runner_events("x", ("process.started", "process.output",
                                               "process.exited"))
        assert [(kind, version) for kind, version, _ in rows] == [
            ("process.started", 2), ("process.output", 4), ("process.exited", 5)]
        newest = await store.runner_events("x", ("process.output",), newest_first=True,
                                           limit=1)
        assert newest[0][2]["line"].endswith('"thread_id":"t"}')
        assert await store.runner_events("x", ("process.output",), before_version=4) == []
        await store.commit(log.delete("a"))
        await store.commit(log.delete("x"))
        assert list(await store.progress_steps("a", 0, 100, 10)) == []
        assert await store.runner_events("x", ("process.started",)) == []

    async def test_checkpoints(self, store: Store, log: Log) -> None:
        await store.commit(log.batch(("a", [created(), checkpoint("c1"), checkpoint("c2")]),
                                     payloads={"c1": b'{"one":1}', "c2": b'{"two":2}'}))
        latest = await store.checkpoint("a", None)
        assert latest is not None and (latest.checkpoint_id, latest.version) == ("c2", 3)
        assert latest.payload == b'{"two":2}' and latest.memory == {"m": "c2"}
        first = await store.checkpoint("a", "c1")
        assert first is not None and first.payload == b'{"one":1}'
        assert await store.checkpoint("a", "nope") is None
        listed = await store.checkpoints("a", 2)
        assert [(c.checkpoint_id, c.version, c.size) for c in listed] == [("c2", 3, 7)]
        assert await store.checkpoint_payloads("a") == {"c1": b'{"one":1}',
                                                        "c2": b'{"two":2}'}

    async def test_fork_reads_of_a_plain_session(self, store: Store, log: Log) -> None:
        batch = log.batch(("a", [created(), message(0)]))
        await store.commit(batch)
        assert await store.hash_at("a", 2) == batch.events[1].hash
        assert await store.hash_at("a", 3) is None
        assert await store.fork_count("a") == 0
        assert await store.forks_page("a", "", 10) == (0, [])

    # --- capabilities -------------------------------------------------------------------

    async def test_capabilities(self, store: Store, log: Log, tmp_path: Any) -> None:
        await store.commit(log.batch(("a", [created(), message(0)])))
        caps = store.capabilities
        assert caps.engine
        if caps.integrity is not None:
            assert await caps.integrity.integrity_check() == ["ok"]
        if caps.size is not None:
            assert await caps.size.db_bytes() > 0 and caps.size.max_bytes >= 0
        if caps.backup is not None:
            target = os.path.join(str(tmp_path), "copy")
            size, position = await caps.backup.backup(target)
            assert position == 2 and size == os.path.getsize(target) > 0
            with pytest.raises(FileExistsError):
                await caps.backup.backup(target)  # never over a file

    # --- several writers (stores that are shared) ----------------------------------------

    @pytest.fixture
    async def other(self) -> AsyncIterator[Store]:
        """A second store on the same database as `store`: shared stores override this."""
        pytest.skip("this store has one writer")
        yield  # pragma: no cover

    async def test_commit_reports_a_moved_store(self, store: Store, other: Store,
                                                log: Log) -> None:
        """Another writer moved a session past the batch's base: nothing is written, and
        commit says which session and where the log ends now; deciding again succeeds."""
        await store.commit(log.batch(("a", [created()])))
        theirs = Log(head=1, entries=dict(log.entries))
        await other.commit(theirs.batch(("a", [message(0)])))
        moved = await store.commit(log.batch(("a", [message(0)])))
        assert moved == Moved(stale=frozenset({"a"}), head=2)
        assert await store.last_position() == 2
        entry = await store.load_entry("a")
        assert entry is not None and entry.state.version == 2
        again = Log(head=moved.head, entries={"a": entry})
        assert await store.commit(again.batch(("a", [message(1)]))) is None
        assert await store.last_position() == 3

    # --- preconditions (what a batch requires of the sessions it does not write) ------------

    async def test_preconditions_hold_or_nothing_is_written(self, store: Store,
                                                            log: Log) -> None:
        """HasVersion holds while the session has that version with that hash (later
        versions do not matter); HasNoForks while no fork has it as its source, those the
        batch deletes not counted. A batch with one that does not hold writes nothing and
        says which, with what the store found."""
        first = log.batch(("a", [created(), message(0)]), ("b", [created()]))
        await store.commit(first)
        at2 = first.events[1].hash
        fork = _fork_batch("f", "a", 2, at2, log.entries["a"].state, head=log.head)
        fork.requires = [("f", HasVersion("a", 2, at2))]
        assert await store.commit(fork) is None
        log.head += 1
        head = await store.last_position()
        wrong = [HasVersion("a", 2, "not-the-hash"), HasVersion("a", 3, at2),
                 HasVersion("gone", 2, at2), HasNoForks("a")]
        for p, found in zip(wrong, [2, 2, 0, 1], strict=True):
            batch = Log(head=log.head, entries=dict(log.entries)).batch(("b", [message(0)]))
            batch.requires = [("b", HasVersion("a", 2, at2)), ("b", p)]
            moved = await store.commit(batch)
            assert moved is not None and moved.refused == {p: found}, p
            assert not moved.stale and moved.head == head
            assert await store.last_position() == head
            entry = await store.load_entry("b")
            assert entry is not None and entry.state.version == 1
        # Deleting the fork and its source in one batch leaves no fork behind: it holds.
        both = Batch(deletes=["f", "a"], bases={"f": 3, "a": 2},
                     requires=[("f", HasNoForks("f")), ("a", HasNoForks("a"))])
        assert await store.commit(both) is None
        assert await store.load_entry("a") is None and await store.fork_count("a") == 0


def fork_event(sid: str, source: str, version: int, source_hash: str, state: SessionState,
               position: int) -> Event:
    """A fork's session.forked of `source` at `version`, its view there `state`, chained
    on from `source_hash` (as forks.fork builds it)."""
    event = Event(position=position, session_id=sid, version=version + 1, event_id=new_id(),
                  type="session.forked", schema_version=CURRENT_SCHEMA_VERSION,
                  recorded_at="2026-01-01T00:01:00.000000Z", meta=EventMeta(), hash="",
                  data_json=msgspec.Raw(canonical({
                      "from": {"session_id": source, "version": version, "hash": source_hash},
                      "state": msgspec.to_builtins(state)})))
    return msgspec.structs.replace(event, hash=chain_hash(source_hash, event))


def _fork_batch(sid: str, source: str, version: int, source_hash: str, state: SessionState,
                head: int) -> Batch:
    """The batch of that fork, numbered after `head`."""
    event = fork_event(sid, source, version, source_hash, state, head + 1)
    view = projection.fold(None, [event])
    return Batch(events=[event], views={sid: Entry(view, event.hash, event.position)},
                 bases={sid: 0})
