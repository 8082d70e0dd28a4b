"""Issue 24, sections 2 and 4: reads built in bounded pages, work with a cost bound, and
forks that share their source's checkpoint payloads, through the real client and socket on
both stores."""

from __future__ import annotations

import base64
import json
import os
import random
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import anyio
import msgspec
import pg
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon, wait_for_daemon
from test_cli import ctl, ctl_json

from sessiond import AsyncClient
from sessiond_daemon.stores.interface import SearchBudget, SearchQuery
from sessiond_schemas import export
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessionNotFoundError,
    StorageError,
    TooLargeError,
)

pytestmark = pytest.mark.anyio
BIG = "x" * (512 << 10)  # a checkpoint payload of half a MiB


def payload_bytes(daemon: Daemon) -> int:
    """The checkpoint payload bytes the store holds, every session's rows counted."""
    return int(daemon.sql("SELECT COALESCE(SUM(length(payload)), 0) FROM checkpoints")[0][0])


class TestForksShareCheckpoints:
    async def test_a_fork_stores_no_payload_and_reads_the_sources(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Forking a session with large checkpoints adds none of their bytes; the fork's
        checkpoints still read back whole, also after the source saves one again."""
        await client.create_session(session_id="src", task="t")
        for i in range(4):
            await client.save_checkpoint("src", {"i": i, "blob": BIG}, checkpoint_id=f"cp{i}")
        before = payload_bytes(daemon)
        assert before > 4 * len(BIG)
        for n in range(3):
            await client.fork("src", new_session_id=f"f{n}")
        await client.fork("f0", new_session_id="f0-0")  # a fork of a fork shares them too
        assert payload_bytes(daemon) == before  # not multiplied by the forks
        for sid in ("f0", "f1", "f2", "f0-0"):
            got = await client.get_checkpoint(sid, "cp2")
            assert got.payload == {"i": 2, "blob": BIG}
            assert (await client.get_checkpoint(sid)).payload["i"] == 3  # the latest
        # The source saves cp1 again: its old payload moves to one fork that shares it,
        # so every fork still reads the checkpoint as it was at its fork point.
        await client.save_checkpoint("src", {"i": "new"}, checkpoint_id="cp1")
        assert (await client.get_checkpoint("src", "cp1")).payload == {"i": "new"}
        for sid in ("f0", "f1", "f2", "f0-0"):
            assert (await client.get_checkpoint(sid, "cp1")).payload["i"] == 1
        # Deleting the fork that now holds it hands it on again.
        holder = daemon.sql("SELECT session_id FROM checkpoints WHERE checkpoint_id = 'cp1'"
                            " AND session_id != 'src' AND length(payload) > 0")
        assert len(holder) == 1
        if holder[0][0] != "f0":  # f0 has a fork of its own: it cannot be deleted first
            await client.delete_session(holder[0][0])
            for sid in {"f0", "f1", "f2", "f0-0"} - {holder[0][0]}:
                assert (await client.get_checkpoint(sid, "cp1")).payload["i"] == 1
        # The source is still not deletable while forks share its history.
        with pytest.raises(InvalidTransitionError):
            await client.delete_session("src")
        # An export of a fork holds its own checkpoints' payloads only; of the source, all.
        doc = await client.export_session("src")
        assert {c["checkpoint_id"] for c in doc["checkpoints"]} == {"cp0", "cp1", "cp2", "cp3"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class TestPostgresStatementTimeout:
    @pytest.mark.postgresql
    async def test_a_write_behind_a_held_lock_fails_retryable_then_works(
            self, short_dir: str, pg_url: str) -> None:
        """A row locked from another connection: the write ends at db_statement_timeout_s
        with a retryable -32012 naming the setting (never acknowledged, nothing stored),
        and once the lock goes the same keyed write is acknowledged once."""
        import asyncpg

        config = daemon_config(short_dir, db=pg_url, db_statement_timeout_s=0.5)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await client.create_session(session_id="s1", task="t")
            blocker = await asyncpg.connect(pg_url)
            try:
                tx = blocker.transaction()
                await tx.start()
                await blocker.execute("SELECT position FROM log_head FOR UPDATE")
                with pytest.raises(StorageError) as failed:
                    await client.append_message("s1", "user", "hi", idempotency_key="k1")
                assert failed.value.data["retryable"] is True
                assert failed.value.data["setting"] == "db_statement_timeout_s"
                assert "nothing was written" in failed.value.message
                assert (await client.get_session("s1")).message_count == 0
                await tx.rollback()
            finally:
                await blocker.close()
            first = await client.append_message("s1", "user", "hi", idempotency_key="k1")
            again = await client.append_message("s1", "user", "hi", idempotency_key="k1")
            assert first.sequence == again.sequence == 0
            assert (await client.get_session("s1")).message_count == 1
            assert (await client.list_messages("s1")).messages[0].content == "hi"


WORDS = ["alpha", "alpine", "beta", "bet", "gamma", "game", "delta", "deli", "echo", "eco"]


async def wordy_sessions(client: AsyncClient, sessions: int = 20, each: int = 100) -> None:
    rng = random.Random(24)
    for n in range(sessions):
        sid = f"w{n}"
        await client.create_session(session_id=sid, task="words")
        await client.append_messages(sid, [
            {"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(30))}
            for _ in range(each)])


@asynccontextmanager
async def index_locked(db_url: str) -> AsyncIterator[None]:
    """PostgreSQL's search index locked from another connection for the block: a query
    that reads it waits, so only its budget ends it."""
    import asyncpg

    blocker = await asyncpg.connect(db_url)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE search_index IN ACCESS EXCLUSIVE MODE")
        yield
        await tx.rollback()
    finally:
        await blocker.close()


def waiting_on_the_index(db_url: str) -> int:
    """The server's backends waiting for the index's lock (a query still running)."""
    return int(pg.query(db_url, "SELECT COUNT(*) FROM pg_locks WHERE NOT granted"
                                " AND relation = 'search_index'::regclass")[0][0])


class TestSearchBudget:
    @pytest.mark.slow_on_postgresql
    async def test_queries_past_the_budget_are_refused_or_stopped(
            self, store_kind: str, short_dir: str, db_url: str) -> None:
        """Too many terms or prefixes: -32602 before the query runs, naming the setting.
        Past the VM steps it may take (SQLite), or its time (PostgreSQL, behind a lock):
        -32012 naming the setting, and the daemon serves the next query as before."""
        config = daemon_config(short_dir, db=db_url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await wordy_sessions(client)
            whole = await client.search("a* b* g* d* e*", limit=100)
            assert len(whole.sessions) == 20
            with pytest.raises(InvalidParamsError) as refused:
                await client.search(" ".join(["a*"] * 9))
            assert refused.value.data["setting"] == "search_max_prefixes"
            assert refused.value.data["limit"] == 8 and refused.value.data["found"] == 9
            assert refused.value.data["path"] == "$.query"
            with pytest.raises(InvalidParamsError) as refused:
                await client.search(" OR ".join(["alpha"] * 65))
            assert refused.value.data["setting"] == "search_max_terms"
        if store_kind == "sqlite":
            setting, limit = "search_max_steps", 20_000
        else:  # PostgreSQL counts no steps: its time bounds a query
            setting, limit = "search_timeout_s", 0.5
        config = daemon_config(short_dir, db=db_url, **{setting: limit})
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            async with (index_locked(db_url) if store_kind == "postgresql"
                        else nullcontext()):
                with pytest.raises(StorageError) as stopped:
                    await client.search("a* b* g* d* e*", limit=100)
            assert stopped.value.data["setting"] == setting
            assert stopped.value.data["limit"] == limit
            assert setting in stopped.value.message
            assert (await client.ping()).pong
            assert (await client.get_session("w3")).message_count == 100
            if store_kind == "postgresql":  # the lock gone, the same query answers
                assert len((await client.search("a* b* g* d* e*", limit=100)).sessions) == 20

    async def test_a_broad_prefix_is_refused_before_it_runs(
            self, store_kind: str, short_dir: str, db_url: str) -> None:
        """A query whose prefix terms' words are in more indexed events than
        search_max_prefix_matches allows (as the store estimates from its index: SQLite
        from FTS5's pages, PostgreSQL from the planner's statistics) is -32602 before it
        runs, naming the setting and what to do: neither a tiny step budget (SQLite) nor
        a locked index (PostgreSQL) is reached. A narrower query answers as it did."""
        config = daemon_config(short_dir, db=db_url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await wordy_sessions(client)  # "alpha" and "alpine" in almost every message
            await client.create_session(session_id="rare", task="words")
            await client.append_messages("rare", [{"role": "user",
                                                   "content": "zanzibar zanzibars alpha"}])
            if store_kind == "postgresql":
                pg.query(db_url, "ANALYZE search_index")  # as autovacuum would
            narrow = await client.search("zanz*", limit=100)
            assert [s.session_id for s in narrow.sessions] == ["rare"]
            broad = await client.search("alp* zanz*", limit=100)  # under the default
            assert [s.session_id for s in broad.sessions] == ["rare"]
        if store_kind == "sqlite":
            setting, limit = "search_max_steps", 20_000  # stops "a* b* g* d* e*" above
        else:
            setting, limit = "search_timeout_s", 0.5
        config = daemon_config(short_dir, db=db_url, search_max_prefix_matches=1_000,
                               **{setting: limit})
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            async with (index_locked(db_url) if store_kind == "postgresql"
                        else nullcontext()):
                with pytest.raises(InvalidParamsError) as refused:
                    await client.search("alp* zanz*", limit=100)
            data = refused.value.data
            assert data["setting"] == "search_max_prefix_matches"
            assert data["limit"] == 1_000 and data["found"] > 1_000
            assert data["path"] == "$.query"
            assert "longer prefix" in refused.value.message
            assert "search_max_prefix_matches" in refused.value.message
            assert await client.search("zanz*", limit=100) == narrow
            assert await client.search("alpha zanz*", limit=100) == broad

    @pytest.mark.sqlite_only("SQLite's progress handler; PostgreSQL's watcher is tested below")
    async def test_a_query_whose_client_went_stops(self, store_kind: str,
                                                   short_dir: str) -> None:
        """The query stops at its progress handler once its client is gone (or its request
        cancelled), on the read connection's thread, instead of running on."""
        import sqlite3

        from sessiond_daemon.stores.sqlite import search

        config = daemon_config(short_dir)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await wordy_sessions(client)
        con = sqlite3.connect(f"file:{config.db}?mode=ro", uri=True, isolation_level=None)
        search.register(con)
        try:
            q = SearchQuery(text="a* b* g* d* e*", limit=100)
            assert len(search.query(con, q, SearchBudget()).sessions) == 20
            with pytest.raises(StorageError) as stopped:
                search.query(con, q, SearchBudget(gone=lambda: True))
            assert "client went away" in stopped.value.message
            cancelled = SearchBudget()
            cancelled.stop.set()
            with pytest.raises(StorageError):
                search.query(con, q, cancelled)
            # The connection serves the next query: the handler is gone with its query.
            assert len(search.query(con, q).sessions) == 20
        finally:
            con.close()

    @pytest.mark.postgresql
    async def test_a_postgresql_query_whose_client_went_is_cancelled(
            self, short_dir: str, pg_url: str) -> None:
        """On PostgreSQL the query's watcher sees its client gone and cancels it on the
        server (no backend waits on it after), and the pool serves the next query."""
        from sessiond_daemon.stores.postgres.store import PostgresStore

        config = daemon_config(short_dir, db=pg_url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await wordy_sessions(client, sessions=3, each=10)
        store = PostgresStore(pg_url)
        await store.open()
        try:
            full_text = store.capabilities.full_text
            assert full_text is not None
            q = SearchQuery(text="alpha", limit=100)
            gone = False
            failed: list[BaseException] = []

            async def run() -> None:
                try:
                    await full_text.search(q, SearchBudget(gone=lambda: gone))
                except StorageError as exc:
                    failed.append(exc)

            async with index_locked(pg_url), anyio.create_task_group() as tg:
                tg.start_soon(run)
                await eventually(lambda: waiting_on_the_index(pg_url) == 1,
                                 "the query to wait on the lock")
                gone = True
                await eventually(lambda: failed, "the query to stop")
                assert "client went away" in str(failed[0])
                await eventually(lambda: waiting_on_the_index(pg_url) == 0,
                                 "the server to cancel the query")
                await eventually(lambda: waiting_on_the_index(pg_url) == 0,
                                 "the server to cancel the query")
            assert len((await full_text.search(q, SearchBudget())).sessions) == 3
        finally:
            await store.close()

    async def test_a_client_gone_is_told_from_one_that_stopped_sending(
            self, short_dir: str) -> None:
        """The server's check the progress handler calls: a client that closed its socket
        is gone; one that only shut its sending side waits for its answers."""
        import asyncio
        import socket

        from sessiond_daemon.serve.server import _gone

        path = os.path.join(short_dir, "g.sock")
        writers: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

        async def accepted(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            await writers.put(w)

        server = await asyncio.start_unix_server(accepted, path)
        try:
            for how in ("half", "closed"):
                peer = socket.socket(socket.AF_UNIX)
                peer.connect(path)
                w = await writers.get()
                gone = _gone(w)
                assert not gone()
                if how == "half":
                    peer.shutdown(socket.SHUT_WR)
                    assert not await anyio.to_thread.run_sync(gone)
                    peer.close()
                else:
                    peer.close()
                assert await anyio.to_thread.run_sync(gone)
                w.close()
        finally:
            server.close()

    async def test_hits_carry_their_fields_not_their_events(
            self, store_kind: str, daemon: Daemon, client: AsyncClient) -> None:
        """A hit on a huge message: sequence and role come, the snippet is short."""
        await client.create_session(session_id="big", task="t")
        await client.append_message("big", "assistant", "needle " + "hay " * 200_000)
        found = await client.search("needle")
        hit = found.sessions[0].hits[0]
        assert (hit.sequence, hit.role, hit.current) == (0, "assistant", True)
        assert "«needle»" in hit.snippet and len(hit.snippet) < 1_000


async def rich(client: AsyncClient, sid: str, messages: int = 60) -> None:
    await client.create_session(session_id=sid, task="paged")
    await client.append_messages(sid, [{"role": "user", "content": f"message {i} " + "w" * 300}
                                       for i in range(messages)])
    for i in range(5):
        await client.save_checkpoint(sid, {"i": i, "blob": "c" * 2000}, checkpoint_id=f"c{i}")


class TestPagedExport:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_page_bytes": 4096}

    @pytest.mark.slow_on_postgresql
    async def test_pages_are_bounded_and_make_the_document(
            self, daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
        """Each page stays near max_page_bytes; the pages put together are the export
        document (checksum and all) that session.import takes, also from sessionctl's
        file; a request without a cursor is the first page and says there is more."""
        await rich(client, "p1")
        first = await client.call("session.export", dict, session_id="p1")
        assert first["next_cursor"] and "checksum" not in first
        pages, cursor = [first], first["next_cursor"]
        while cursor is not None:
            page = await client.call("session.export", dict, session_id="p1", cursor=cursor)
            pages.append(page)
            cursor = page["next_cursor"]
        assert len(pages) > 5
        assert all(len(msgspec.json.encode(p["events"] + p["checkpoints"])) < 3 * 4096
                   for p in pages)
        assembled = {k: first[k] for k in ("format", "format_version", "exported_at")} | {
            "events": [e for p in pages for e in p["events"]],
            "checkpoints": [c for p in pages for c in p["checkpoints"]],
            "session": pages[-1]["session"]}
        assert pages[-1]["checksum"] == export.checksum(assembled)
        doc = await client.export_session("p1")
        assert doc["checksum"] == export.checksum(doc)
        assert [e["version"] for e in doc["events"]] == list(range(1, 67))
        assert [c["checkpoint_id"] for c in doc["checkpoints"]] == [f"c{i}" for i in range(5)]
        assert doc["session"]["version"] == 66 and "next_cursor" not in doc
        path = os.path.join(short_dir, "p1.json")
        await ctl(daemon, "export", "p1", "-o", path)
        with open(path) as f:
            written = json.load(f)
        assert written["checksum"] == export.checksum(written)
        assert {k: v for k, v in written.items() if k not in ("exported_at", "checksum")} \
            == {k: v for k, v in doc.items() if k not in ("exported_at", "checksum")}
        await client.delete_session("p1")
        back = await client.import_session(doc)
        assert back.version == 66 and back.message_count == 60
        await client.delete_session("p1")
        summary = await ctl_json(daemon, "import", path)
        assert [i["session_id"] for i in summary["imported"]] == ["p1"]
        assert (await client.get_checkpoint("p1", "c3")).payload["i"] == 3
        # A fork's export: its own events, its own checkpoints, imported back.
        await client.save_checkpoint("p1", {"own": 1}, checkpoint_id="c9")
        await client.fork("p1", new_session_id="pf")
        await client.append_message("pf", "user", "fork's own")
        fdoc = await client.export_session("pf")
        assert fdoc["events"][0]["type"] == "session.forked"
        assert export.checksum(fdoc) == fdoc["checksum"] and fdoc["checkpoints"] == []
        await client.delete_session("pf")
        assert (await client.import_session(fdoc)).message_count == 61

    async def test_a_small_session_is_one_whole_document(self, client: AsyncClient) -> None:
        """Without a cursor, a session that fits one page answers the old document."""
        await client.create_session(session_id="tiny", task="t")
        doc = await client.call("session.export", dict, session_id="tiny")
        assert set(doc) == {"format", "format_version", "exported_at", "session", "events",
                            "checkpoints", "checksum"}
        assert doc["checksum"] == export.checksum(doc)

    async def test_a_history_changed_between_pages_is_refused(self, client: AsyncClient
                                                               ) -> None:
        await rich(client, "p2")
        first = await client.call("session.export", dict, session_id="p2")
        doc = await client.export_session("p2")
        await client.delete_session("p2")
        await client.import_session({**doc, "events": doc["events"][:3], "session": None,
                                     "checkpoints": []} | {"checksum": export.checksum(
                                         {**doc, "events": doc["events"][:3], "session": None,
                                          "checkpoints": []})})
        await client.append_messages("p2", [{"role": "user", "content": "other"}] * 70)
        with pytest.raises(InvalidParamsError) as moved:
            await client.call("session.export", dict, session_id="p2",
                              cursor=first["next_cursor"])
        assert moved.value.data["path"] == "$.cursor"

    async def test_trajectory_pages_make_every_step(self, client: AsyncClient) -> None:
        """session.trajectory reads a page of events (max_page_bytes) at a time; the client
        follows next_cursor and gets every step, in order; one request is one page."""
        await rich(client, "t1", messages=80)
        page = await client.trajectory_page("t1")
        assert page.next_cursor is not None and page.truncated_by_bytes
        assert 0 < len(page.steps) < 80
        found = await client.trajectory("t1", full=True)
        assert [s.summary.split()[1] for s in found] == [str(i) for i in range(80)]
        assert all(s.type == "user" and s.turn == 1 for s in found)
        cut = await client.trajectory("t1", max_output_len=10)
        assert len(cut) == 80 and cut[0].summary == "message 0 …"


def blob(i: int, size: int = 20_000) -> dict[str, Any]:
    return {"type": "bytes", "data": base64.b64encode(bytes([i % 256]) * size).decode()}


async def graph_thread(client: AsyncClient, thread: str, steps: int = 12) -> None:
    """Each step stores one new distinct value and refers to every earlier one."""
    for i in range(steps):
        await client.call("graph.put", session_id=thread, thread_id=thread,
                          checkpoint_id=f"{i:04d}", checkpoint={"type": "json", "data": "e30="},
                          channel_versions={f"ch{j}": "1" for j in range(i + 1)},
                          blobs={f"ch{i}": blob(i)})


def event_bytes(daemon: Daemon, sid: str) -> int:
    return int(daemon.sql("SELECT COALESCE(SUM(length(data)), 0) FROM events"
                          " WHERE session_id = ?", sid)[0][0])


class TestGraphCopyMovesReferences:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_checkpoint_bytes": 200_000}

    async def test_the_copy_weighs_what_the_source_does(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """12 checkpoints, each referring to every earlier value: the copy stores each
        value once (not once per checkpoint that refers to it) and reads back the same."""
        await graph_thread(client, "g1")
        done = await client.call("graph.copy", source_session_id="g1",
                                 target_session_id="g2", target_thread_id="g2")
        assert done["checkpoints"] == 12
        assert event_bytes(daemon, "g2") < 1.2 * event_bytes(daemon, "g1")
        src = (await client.call("graph.get", session_id="g1"))["tuple"]
        dst = (await client.call("graph.get", session_id="g2"))["tuple"]
        assert dst["channel_values"] == src["channel_values"] and len(src["channel_values"]) == 12
        listed = await client.call("graph.list", session_id="g2")
        assert [t["checkpoint_id"] for t in listed["tuples"]] == [f"{i:04d}" for i in
                                                                 reversed(range(12))]
        assert all(len(t["channel_values"]) == int(t["checkpoint_id"]) + 1
                   for t in listed["tuples"])

    async def test_values_of_pruned_checkpoints_come_along_within_the_cap(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """After keep_latest, the latest checkpoint refers to values only pruned events
        hold: the copy carries them with it, and a copied event that would pass
        max_checkpoint_bytes is refused (-32005) with nothing written."""
        await graph_thread(client, "g3", steps=6)
        await client.call("graph.prune", session_ids=["g3"], strategy="keep_latest")
        await client.call("graph.copy", source_session_id="g3", target_session_id="g4",
                          target_thread_id="g4")
        dst = (await client.call("graph.get", session_id="g4"))["tuple"]
        assert dst["channel_values"] == {f"ch{j}": blob(j) for j in range(6)}
        await graph_thread(client, "g5", steps=12)  # 12 values of 20 kB: past 200 kB
        await client.call("graph.prune", session_ids=["g5"], strategy="keep_latest")
        with pytest.raises(TooLargeError) as refused:
            await client.call("graph.copy", source_session_id="g5", target_session_id="g6",
                              target_thread_id="g6")
        assert "0011" in refused.value.message
        with pytest.raises(SessionNotFoundError):
            await client.get_session("g6")


def vm(pid: int, field: str) -> int:
    """A /proc/<pid>/status figure (VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


@pytest.fixture
def process_daemon(db_url: str, short_dir: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A daemon in its own process (its memory is its own), on this run's store."""
    path = os.path.join(short_dir, "p.sock")
    proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", path,
                             "--db", db_url, "--log-level", "error"])
    try:
        wait_for_daemon(path, proc)
        yield proc, path
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


MIB = 1 << 20


class TestReadMemory:
    @pytest.mark.fleet
    @pytest.mark.slow_on_postgresql
    async def test_a_big_export_and_trajectory_stay_near_a_page(
            self, process_daemon: tuple[subprocess.Popen[bytes], str], short_dir: str) -> None:
        """A 96 MiB session: its export (written to a file as the pages come) and four
        trajectory reads side by side raise the daemon's high-water mark by a small part
        of the session's size (the whole answer built at once took several times it)."""
        proc, path = process_daemon
        async with AsyncClient(path) as client:
            await client.create_session(session_id="big", task="t")
            for i in range(96):
                await client.append_message("big", "user", f"{i} " + "m" * MIB)
                await client.save_checkpoint("big", {"n": i}, checkpoint_id=f"c{i}")
            await client.ping()
            before = vm(proc.pid, "VmHWM")
            out = os.path.join(short_dir, "big.json")
            with open(out, "w", encoding="utf-8") as f:
                written = await client.export_session_to("big", f)
            assert written.events == 193 and written.checkpoints == 96
            async with anyio.create_task_group() as tg:
                for _ in range(4):
                    tg.start_soon(client.trajectory, "big")
            grown = vm(proc.pid, "VmHWM") - before
            assert grown < 48 * MIB, f"the high-water mark grew by {grown / MIB:.0f} MiB"
            with open(out, encoding="utf-8") as f:
                doc = json.load(f)
            assert doc["checksum"] == export.checksum(doc)
            assert len(await client.trajectory("big", max_output_len=5)) == 96
