"""What one commit writes on SQLite: the pages of the b-trees it changes, and no others
(issue 31 §3: every page a commit touches is a WAL frame written and synced)."""

from __future__ import annotations

import collections
import sqlite3
import struct

import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


def empty_wal(db: str) -> None:
    """Checkpoint the WAL into the file and truncate it (the daemon idle meanwhile)."""
    con = sqlite3.connect(db)
    try:
        busy, _, _ = con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        con.close()


def wal_btrees(db: str) -> collections.Counter[str]:
    """How many frames the WAL holds of each b-tree (table or index), by name; overflow
    pages (a row's bytes past what its leaf holds) as "NAME overflow"."""
    with open(db + "-wal", "rb") as f:
        raw = f.read()
    page_size = struct.unpack(">I", raw[8:12])[0]
    pages = [struct.unpack(">I", raw[off:off + 4])[0]
             for off in range(32, len(raw) - 23, 24 + page_size)]
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        owner = {page: name + (" overflow" if kind == "overflow" else "") for page, name, kind
                 in con.execute("SELECT pageno, name, pagetype FROM dbstat")}
    finally:
        con.close()
    return collections.Counter(owner.get(p, "(free)") for p in pages)


async def test_an_append_rewrites_no_index_of_the_session_list(short_dir: str) -> None:
    """A view's row is updated in place: an append to a session writes no page of the
    session.list and expiry indexes, whose columns it leaves as they are (INSERT OR
    REPLACE deleted and inserted the row: a page of each of the six, at every commit).
    When an indexed column does change, the indexes follow it."""
    config = daemon_config(short_dir)
    assert config.db is not None
    async with running_daemon(config) as daemon, AsyncClient(daemon.socket) as c:
        sid = (await c.create_session(actor_name="me/agent")).session_id
        other = (await c.create_session(actor_name="me/agent")).session_id
        for i in range(3):
            await c.append_message(sid, "user", f"warm {i}")
        empty_wal(config.db)
        for i in range(5):
            await c.append_message(sid, "user", f"hello {i}")
        written = wal_btrees(config.db)
        assert written["sessions"] >= 1 and written["events"] >= 1
        assert not [name for name in written if name.startswith("sessions_by")], written
        # The whole view row sits in its leaf: no overflow page (WITHOUT ROWID spilled
        # the ~1.7 KB state to one, a page more in each commit).
        assert "sessions overflow" not in written, written
        assert written["sessions"] <= 5, written

        await c.transition(sid, "paused", reason="lunch")
        await c.set_ttl(other, 3600)
        paused = await c.list_sessions(status=["paused"])
        active = await c.list_sessions(status=["active"])
        assert [s.session_id for s in paused.sessions] == [sid]
        assert [s.session_id for s in active.sessions] == [other]
        assert [r[0] for r in daemon.sql(
            "SELECT session_id FROM sessions INDEXED BY sessions_by_expiry"
            " WHERE expires_at IS NOT NULL")] == [other]
        assert daemon.sql("SELECT status FROM sessions INDEXED BY sessions_by_status"
                          " WHERE session_id = ?", sid) == [("paused",)]
        assert (await c.verify()).ok
