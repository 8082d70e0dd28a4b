"""Retention past a compaction (issue 48): session.trim takes the history behind the last
compaction and older than N days out of the store, to a snapshot; the session still
verifies from the anchor the trim records; reads before it answer -32015 (gone); a
session with forks is not trimmed; the file is smaller after a VACUUM."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import pytest
from conftest import Daemon, eventually

from sessiond import AsyncClient
from sessiond_daemon.core.projection import fold
from sessiond_schemas.errors import (
    HistoryGoneError,
    InvalidParamsError,
    InvalidTransitionError,
)

pytestmark = pytest.mark.anyio
SUMMARY = [{"role": "system", "content": "the summary"}]
BIG = "x" * 4000


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    from test_metrics import free_port
    # An HTTP listener: a peer (its token) compacts over /rpc.
    return {"trim_after_days": {"kept*": 0}, "cleanup_every_s": 0.05,
            "http_listen": [f"127.0.0.1:{free_port()}"]}


async def long_session(c: AsyncClient, sid: str, namespace: str = "local") -> int:
    """60 messages one write each (snapshots every few versions), a compaction through
    message 49, then 5 more; the version of the compaction's last covered event."""
    await c.create_session(sid, namespace=namespace)
    for i in range(60):
        await c.append_message(sid, "user", f"m{i} {BIG}", idempotency_key=f"k{i}")
    state = await c.compact(sid, SUMMARY, through_sequence=49)
    for i in range(60, 65):
        await c.append_message(sid, "user", f"m{i}")
    return state.version - 1


class TestTrim:
    async def test_a_trim_keeps_what_the_model_sees_and_verifies(
            self, client: AsyncClient) -> None:
        await long_session(client, "r1")
        before = {e.version: e.hash for e in (await client.read_events("r1",
                                                                       limit=1000)).events}
        dry = await client.trim("r1", older_than_days=0, dry_run=True)
        assert dry.starts_at is not None and (await client.get_session("r1")).history is None
        done = await client.trim("r1", older_than_days=0)
        assert done.starts_at == dry.starts_at and done.anchor == before[done.starts_at - 1]
        assert done.trimmed_events == done.starts_at - 1
        state = await client.get_session("r1")
        assert state.history is not None and state.history.version == done.starts_at
        # What the model sees is all there; the history before the start is gone.
        ctx = await client.context("r1")
        assert [m.content for m in ctx.summary] == ["the summary"]
        assert [m.content.split()[0] for m in ctx.messages] == [f"m{i}" for i in range(50, 65)]
        with pytest.raises(HistoryGoneError) as refused:
            await client.read_events("r1", from_version=1)
        assert refused.value.data == {"session_id": "r1", "starts_at": done.starts_at,
                                      "anchor": done.anchor}
        kept = (await client.read_events("r1", limit=1000)).events
        assert kept[0].version == done.starts_at and kept[-1].type == "session.trimmed"
        with pytest.raises(HistoryGoneError):
            await client.get_session("r1", at_version=done.starts_at - 1)
        assert (await client.get_session("r1", at_version=done.starts_at)).version \
            == done.starts_at
        with pytest.raises(HistoryGoneError):
            await client.list_messages("r1")
        with pytest.raises(HistoryGoneError):
            await client.export_session("r1")
        with pytest.raises(HistoryGoneError):
            await client.fork("r1", at_version=done.starts_at - 1)
        assert (await client.verify()).ok
        # The view is the fold of the snapshot kept at the anchor and the events kept.
        base = await client.get_session("r1", at_version=done.starts_at)
        assert fold(base, kept[1:]) == state
        # A retry of a trimmed write is answered, not applied again.
        retried = await client.append_message("r1", "user", f"m0 {BIG}", idempotency_key="k0")
        assert retried.sequence == 0 and (await client.get_session("r1")).version \
            == state.version
        # Nothing more to trim: a second trim writes nothing.
        again = await client.trim("r1", older_than_days=0)
        assert again.starts_at is None and again.version == state.version
        fork = await client.fork("r1", new_session_id="r1-fork")
        assert fork.history is not None
        assert [m.content for m in (await client.context("r1-fork")).messages][-1] == "m64"
        assert (await client.verify()).ok

    async def test_what_is_not_trimmed(self, client: AsyncClient) -> None:
        """Never compacted, nothing old enough, retention off for the namespace, and a
        session with forks (they share its history): nothing is taken out."""
        await client.create_session("n1")
        await client.append_message("n1", "user", "hi")
        assert (await client.trim("n1", older_than_days=0)).starts_at is None
        await long_session(client, "n2")
        assert (await client.trim("n2", older_than_days=1)).starts_at is None
        with pytest.raises(InvalidParamsError, match="retention is off"):
            await client.trim("n2")
        await client.fork("n2", new_session_id="n2-fork")
        with pytest.raises(InvalidTransitionError, match="cannot be trimmed"):
            await client.trim("n2", older_than_days=0)
        assert (await client.get_session("n2")).history is None

    async def test_a_peers_compaction_is_never_trimmed_behind(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """session.compact is a peer's by default (it adds a summary), session.trim is not
        (it deletes): so retention trims behind the owner's compactions only; a peer's
        moves the context, never what is deleted, by the sweep or by session.trim."""
        from pathlib import Path

        import httpx

        from sessiond_schemas.paths import http_token_path
        await client.create_session("kept-peer", namespace="kept-p")
        for i in range(20):
            await client.append_message("kept-peer", "user", f"m{i}")
        peer = Path(http_token_path(daemon.socket, peer=True)).read_text().strip()
        async with httpx.AsyncClient(base_url=f"http://{daemon.config.http_listen[0]}",
                                     headers={"authorization": f"Bearer {peer}"}) as http:
            done = await http.post("/rpc", json={
                "jsonrpc": "2.0", "id": 1, "method": "session.compact",
                "params": {"session_id": "kept-peer", "summary": SUMMARY}})
            assert "result" in done.json(), done.json()
        assert (await client.context("kept-peer")).summary[0].content == "the summary"
        assert (await client.trim("kept-peer", older_than_days=0)).starts_at is None
        assert (await client.get_session("kept-peer")).history is None  # nor the sweep
        assert len((await client.read_events("kept-peer", limit=100)).events) == 22

    async def test_the_namespace_setting_and_its_sweep(self, client: AsyncClient) -> None:
        """A namespace in trim_after_days is trimmed by the daemon's own sweep (every
        cleanup_every_s), and session.trim without older_than_days uses its setting;
        other namespaces are left alone."""
        await long_session(client, "k1", namespace="kept-here")
        await long_session(client, "k2", namespace="other")

        async def trimmed() -> bool:
            return (await client.get_session("k1")).history is not None

        await eventually(trimmed, "the sweep to trim k1")
        assert (await client.trim("k1")).starts_at is None  # nothing left to trim
        assert (await client.get_session("k2")).history is None
        with pytest.raises(InvalidParamsError, match="retention is off for namespace 'other'"):
            await client.trim("k2")
        assert (await client.verify()).ok


@pytest.mark.sqlite_only("the file and its VACUUM are SQLite's")
async def test_the_file_is_smaller_after_vacuum(daemon: Daemon, client: AsyncClient) -> None:
    await long_session(client, "v1")
    db = daemon.config.db

    def vacuum() -> bool:
        """VACUUM, and the WAL checkpointed into the file (which it shrinks); False while
        the daemon's reads (its retention sweep runs every 0.05 s here) hold it back."""
        con = sqlite3.connect(db, timeout=0)
        try:
            con.execute("VACUUM")
            busy = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            return not busy
        except sqlite3.OperationalError:
            return False
        finally:
            con.close()

    async def vacuumed() -> int:
        await eventually(vacuum, "a VACUUM and a whole checkpoint")
        return os.path.getsize(db)

    before = await vacuumed()
    done = await client.trim("v1", older_than_days=0)
    assert done.trimmed_events > 40
    after = await vacuumed()
    assert after < before - 40 * len(BIG)
    assert (await client.verify()).ok
