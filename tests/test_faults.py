"""Storage faults: each is answered with -32012, nothing partial is stored, service goes on."""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from conftest import PATIENCE_S, Daemon, daemon_config, running_daemon
from faulty_store import FaultyStore, faulty, nth, touches

from sessiond import AsyncClient, StorageError
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.stores.sqlite import SqliteStore

pytestmark = pytest.mark.anyio


async def test_io_error_inside_a_batch(short_dir: str) -> None:
    """The store failing after the batch's rows were written: rolled back, -32012, then
    recovery (the retry under the same idempotency key is stored once, with no gap)."""
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client:
        await client.create_session("io")
        await client.append_message("io", "user", "before")
        before = daemon.sql("SELECT COUNT(*), MAX(position) FROM events")
        stores[0].break_commits_midway(touches("io"))  # the rows are in the transaction...
        with pytest.raises(StorageError) as err:  # ...and then the store fails
            await client.append_messages("io", [{"role": "user", "content": "lost"}] * 3,
                                         idempotency_key="retry-me")
        assert err.value.code == -32012 and "UNIQUE constraint" in err.value.data["detail"]
        assert stores[0].failed == 1
        assert daemon.sql("SELECT COUNT(*), MAX(position) FROM events") == before  # no part
        state = await client.get_session("io")  # reads go on, and show what was committed
        assert (state.version, state.message_count) == (2, 1)
        stores[0].heal()
        r = await client.append_messages("io", [{"role": "user", "content": "kept"}] * 3,
                                         idempotency_key="retry-me")
        assert (r.first_sequence, r.version) == (1, 5)
        positions = [p for (p,) in daemon.sql("SELECT position FROM events ORDER BY position")]
        assert positions == list(range(1, len(positions) + 1))  # no gap where it failed


async def test_disk_io_error_before_a_batch(short_dir: str) -> None:
    """A driver error raised by the store (a disk I/O error) is -32012 with its detail; the
    writer goes on with the next command."""
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client:
        await client.create_session("io")
        stores[0].fail_commits(nth(1, sqlite_storage_error("disk I/O error")))
        with pytest.raises(StorageError) as err:
            await client.append_message("io", "user", "lost")
        assert err.value.code == -32012 and "disk I/O error" in err.value.data["detail"]
        r = await client.append_message("io", "user", "kept")
        assert (r.version, r.sequence) == (2, 0)
        assert daemon.sql("SELECT MAX(position) FROM events") == [(2,)]


def sqlite_storage_error(message: str) -> StorageError:
    """The -32012 the SQLite store makes of a driver error with this message."""
    from sessiond_daemon.stores.sqlite.base import storage_error
    return storage_error(sqlite3.OperationalError(message))


async def test_disk_full_then_space_again(short_dir: str) -> None:
    """Past max_db_bytes writes get -32012 "full"; reads work; deleting frees room."""
    config = daemon_config(short_dir, max_db_bytes=512 * 1024)
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        await c.create_session("big")
        await c.create_session("keep")
        with pytest.raises(StorageError) as err:
            for i in range(1000):
                await c.append_message("big", "user", f"{i} " + "x" * 4000)
        assert "full" in err.value.data["detail"]
        full_at = (await c.get_session("big")).version
        assert d.sql("SELECT MAX(version) FROM events WHERE session_id = 'big'") == [(full_at,)]
        large = "y" * 100_000  # needs new pages; a small write may still fit in old ones
        with pytest.raises(StorageError):
            await c.append_message("keep", "user", large)
        assert (await c.get_session("keep")).message_count == 0
        assert await c.delete_session("big") is True  # frees pages inside the cap
        await c.append_message("keep", "user", large)
        assert (await c.get_session("keep")).message_count == 1


async def test_corrupt_database_at_start(short_dir: str) -> None:
    """A corrupt file: a message naming it and the next step, exit 1, the file untouched."""
    db = os.path.join(short_dir, "corrupt.db")
    garbage = b"this is not a database, " * 4000
    with open(db, "wb") as f:
        f.write(garbage)
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond_daemon", "--db", db,
         "--socket", os.path.join(short_dir, "s.sock"), "--log-format", "json"], check=False)
    assert result.returncode == 1
    err = result.stderr.decode()
    assert db in err and "not a database" in err and "backup" in err
    with open(db, "rb") as f:
        assert f.read() == garbage
    assert not os.path.exists(os.path.join(short_dir, "s.sock"))


@pytest.mark.slow_on_postgresql
async def test_slow_sender_does_not_hold_others(daemon: Daemon, client: AsyncClient) -> None:
    """A client that sends a request a byte at a time is served at the end; others meanwhile."""
    request = b'{"jsonrpc":"2.0","id":7,"method":"daemon.ping"}\n'
    done = anyio.Event()

    def dribble() -> bytes:
        s = socket.socket(socket.AF_UNIX)
        s.connect(daemon.socket)
        try:
            for byte in request:
                s.sendall(bytes([byte]))
                time.sleep(0.01)
            return s.makefile("rb").readline()
        finally:
            s.close()
            anyio.from_thread.run_sync(done.set)

    async with anyio.create_task_group() as tg:
        reply: list[bytes] = []

        async def slow() -> None:
            reply.append(await anyio.to_thread.run_sync(dribble))

        tg.start_soon(slow)
        served = 0
        while not done.is_set():
            assert (await client.ping()).pong
            served += 1
            await anyio.sleep(0.01)
    assert b'"id":7' in reply[0] and served > 5


@contextlib.contextmanager
def tmpfs(size: str, *, read_only: bool = False) -> Iterator[str]:
    """A small filesystem of our own (root only); skips where mounting is not allowed."""
    point = tempfile.mkdtemp(prefix="sd-fs-")
    opts = f"size={size},mode=0700" + (",ro" if read_only else "")  # a tmpfs root is 1777
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", point],
                             capture_output=True)
    if mounted.returncode != 0:
        os.rmdir(point)
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], check=False)
        os.rmdir(point)


async def test_filesystem_fills_then_grows() -> None:
    """A real full filesystem: -32012, reads go on, writes recover once there is room."""
    with tmpfs("2m") as point:
        async with running_daemon(daemon_config(point)) as d, AsyncClient(d.socket) as c:
            await c.create_session("fs")
            with pytest.raises(StorageError) as err:
                for _ in range(1000):
                    await c.append_message("fs", "user", "q" * 50_000)
            assert "full" in err.value.data["detail"]
            stored = (await c.get_session("fs")).message_count
            assert d.sql("SELECT COUNT(*) FROM messages") == [(stored,)]
            subprocess.run(["mount", "-o", "remount,size=16m", point], check=True)
            await c.append_message("fs", "user", "q" * 50_000)
            assert (await c.get_session("fs")).message_count == stored + 1


async def test_database_on_a_read_only_filesystem() -> None:
    """A database that cannot be written: the daemon says so and exits 1; nothing changes."""
    with tmpfs("1m") as point:
        db = os.path.join(point, "ro.db")
        con = sqlite3.connect(db)
        con.execute("CREATE TABLE t (x)")
        con.close()
        subprocess.run(["mount", "-o", "remount,ro", point], check=True)
        with tempfile.TemporaryDirectory(prefix="sd-") as run:
            result = await anyio.run_process(
                [sys.executable, "-m", "sessiond_daemon", "--db", db,
                 "--socket", os.path.join(run, "s.sock"), "--log-format", "json"], check=False)
        assert result.returncode == 1
        assert db in result.stderr.decode() and "readonly" in result.stderr.decode()


async def test_database_turns_read_only(short_dir: str) -> None:
    """SQLite refusing to write (as for an unwritable file): -32012, reads go on, recovery."""
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client:
        await client.create_session("ro")
        sqlite = stores[0].inner
        assert isinstance(sqlite, SqliteStore)
        await query_only(sqlite, True)
        with pytest.raises(StorageError) as err:
            await client.append_message("ro", "user", "refused")
        assert "readonly" in err.value.data["detail"]
        assert daemon.sql("SELECT COUNT(*) FROM events WHERE session_id = 'ro'") == [(1,)]
        assert (await client.get_session("ro")).version == 1
        await query_only(sqlite, False)
        await client.append_message("ro", "user", "accepted")
        assert (await client.get_session("ro")).message_count == 1


async def query_only(store: SqliteStore, on: bool) -> None:
    """Set PRAGMA query_only on the store's write connection, outside any transaction
    (with it on, SQLite refuses even BEGIN IMMEDIATE, so `on_writer` cannot turn it off)."""
    await store._on_writer(
        lambda: store._w.execute(f"PRAGMA query_only = {'ON' if on else 'OFF'}"))




async def test_a_failing_read_fails_only_its_request(short_dir: str) -> None:
    """A store read that fails (the writer's idempotency look-up, a reader's events.read):
    that request gets -32012, nothing is written, and the next requests are served."""
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client:
        await client.create_session("r")
        lost = StorageError("storage error: disk I/O error; nothing was written",
                            {"detail": "disk I/O error"})
        stores[0].fail_reads("idempotent_results", lost)
        with pytest.raises(StorageError) as err:
            await client.append_message("r", "user", "lost", idempotency_key="k")
        assert err.value.code == -32012
        assert daemon.sql("SELECT COUNT(*) FROM events") == [(1,)]
        stores[0].fail_reads("read_events", lost)
        with pytest.raises(StorageError):
            await client.call("events.read", Any, session_id="r")
        r = await client.append_message("r", "user", "kept", idempotency_key="k")
        assert (r.version, r.sequence) == (2, 0)
        page = await client.call("events.read", Any, session_id="r")
        assert [e["version"] for e in page["events"]] == [1, 2]


class _CloseFails(FaultyStore):
    async def close(self) -> None:
        await self.inner.close()
        raise RuntimeError("the store's close failed")


async def test_a_store_whose_close_fails_still_stops(short_dir: str, db_url: str) -> None:
    """A store's close that raises (a bug, a server gone) does not keep the daemon from
    stopping, on either store: the block ends, the error is what it ends with, and what
    was acknowledged is stored."""
    # fail_after: a hang fails the test (a guard, not a bound under test)
    with pytest.raises(BaseExceptionGroup) as ended, anyio.fail_after(PATIENCE_S):
        async with running_daemon(daemon_config(short_dir, db=db_url),
                                  lambda config: _CloseFails(
                                      lifecycle.default_store(config))) as daemon, \
                AsyncClient(daemon.socket) as client:
            await client.append_message((await client.create_session()).session_id,
                                        "user", "kept")
    assert ended.group_contains(RuntimeError, match="the store's close failed")
    assert daemon.sql("SELECT COUNT(*) FROM events WHERE type = 'message.appended'") \
        == [(1,)]
