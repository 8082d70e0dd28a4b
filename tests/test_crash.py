"""Crash safety: SIGKILL the daemon at random moments; every acknowledged write survives once.

Cycles: $SESSIOND_CRASH_CYCLES (20 by default, as CI runs it). Workers retry an
unacknowledged request with the same idempotency key until it is acknowledged,
so after every restart each acknowledged write must be stored exactly once.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections import Counter

import anyio
import msgspec
import pytest
from conftest import eventually

from sessiond import AsyncClient, ConnectionLostError, SessiondError, ShuttingDownError
from sessiond_daemon.core.projection import fold
from sessiond_schemas.events import Event, EventMeta
from sessiond_schemas.export import link_ok
from sessiond_schemas.state import SessionState

pytestmark = pytest.mark.anyio
CYCLES = int(os.environ.get("SESSIOND_CRASH_CYCLES", "20"))
WORKERS = 4


class DaemonProcess:
    """A daemon process; `program`: what python runs (its arguments follow)."""

    def __init__(self, directory: str,
                 program: tuple[str, ...] = ("-m", "sessiond_daemon")) -> None:
        self.socket = os.path.join(directory, "s.sock")
        self.db = os.path.join(directory, "crash.db")
        self.program = program
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, *self.program, "--socket", self.socket, "--db", self.db,
             "--log-level", "error", "--snapshot-every", "7"])
        with anyio.fail_after(30):
            while True:
                try:
                    async with AsyncClient(self.socket) as c:
                        await c.ping()
                    return
                except (OSError, SessiondError):
                    assert self.proc.poll() is None, "the daemon exited"
                    await anyio.sleep(0.02)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


async def worker(path: str, k: int, stop: anyio.Event, acked: list[str]) -> None:
    """Appends and transitions on session w{k}, each retried with its key until acknowledged."""
    sid = f"w{k}"
    n = 0
    client: AsyncClient | None = None
    while not stop.is_set():
        key = f"{sid}-{n}"
        while True:  # this op, until acknowledged
            try:
                if client is None:
                    client = AsyncClient(path)
                    await client.connect()
                if n == 0:
                    await client.create_session(sid, idempotency_key=key)
                elif n % 3:
                    await client.append_message(sid, "user", key, idempotency_key=key)
                else:
                    to = "paused" if (n // 3) % 2 else "active"
                    await client.transition(sid, to, reason=key, idempotency_key=key)
                acked.append(key)
                break
            except (OSError, ConnectionLostError, ShuttingDownError):
                if client is not None:
                    await client.aclose()
                    client = None
                await anyio.sleep(0.02)  # the daemon is down: wait and send the same again
        n += 1
    if client is not None:
        await client.aclose()


def read_events(db: str) -> dict[str, list[Event]]:
    """Every stored event, by session, straight from the database file."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = con.execute("SELECT position, session_id, version, event_id, type, schema_version,"
                           " recorded_at, data, meta, hash FROM events"
                           " ORDER BY session_id, version").fetchall()
    finally:
        con.close()
    by_session: dict[str, list[Event]] = {}
    for r in rows:
        by_session.setdefault(r[1], []).append(Event(
            position=r[0], session_id=r[1], version=r[2], event_id=r[3], type=r[4],
            schema_version=r[5], recorded_at=r[6], data_json=msgspec.Raw(r[7]),
            meta=msgspec.json.decode(r[8], type=EventMeta), hash=r[9]))
    return by_session


def check_store(db: str, acked: list[str]) -> None:
    """Every acknowledged op stored once, gapless versions, chains, views equal to the fold."""
    by_session = read_events(db)
    keys = Counter(e.meta.idempotency_key for evs in by_session.values() for e in evs)
    assert all(count == 1 for count in keys.values()), "a write was stored twice"
    missing = [k for k in acked if k not in keys]
    assert not missing, f"acknowledged but lost: {missing[:5]}"
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        for sid, events in by_session.items():
            assert [e.version for e in events] == list(range(1, len(events) + 1)), sid
            prev = ""
            for e in events:
                assert link_ok(prev, e), f"hash chain broken in {sid} at version {e.version}"
                prev = e.hash
            [(state,)] = con.execute("SELECT state FROM sessions WHERE session_id = ?", (sid,))
            stored = msgspec.json.decode(state, type=SessionState)
            assert msgspec.to_builtins(stored) == msgspec.to_builtins(fold(None, events)), sid
            # Each session's ops are stored in the order its worker sent them.
            order = [int((e.meta.idempotency_key or "-0").rsplit("-", 1)[1]) for e in events]
            assert order == sorted(order), sid
    finally:
        con.close()


@pytest.mark.fleet
async def test_sigkill_cycles_lose_and_double_nothing(short_dir: str) -> None:
    """SIGKILL at random moments, CYCLES times; after each restart the store checks out."""
    rng = random.Random(int(os.environ.get("SESSIOND_CRASH_SEED", "7")))
    daemon = DaemonProcess(short_dir)
    acked: list[str] = []
    stop = anyio.Event()
    await daemon.start()
    try:
        async with anyio.create_task_group() as tg:
            for k in range(WORKERS):
                tg.start_soon(worker, daemon.socket, k, stop, acked)
            for _ in range(CYCLES):
                await anyio.sleep(rng.uniform(0.05, 0.4))
                daemon.kill()
                seen = list(acked)  # acknowledged before the kill: all must be there
                check_store(daemon.db, seen)
                await daemon.start()
            # Some writes must land on the last daemon too, not only on the killed ones.
            before = len(acked)
            await eventually(lambda: len(acked) >= before + WORKERS, "writes after the restart")
            stop.set()
        async with AsyncClient(daemon.socket) as c:
            verified = await c.verify()  # the daemon's own check agrees
        assert verified.ok and verified.checked_sessions == WORKERS, verified.problems
        daemon.stop()
        check_store(daemon.db, acked)
        assert len(acked) > CYCLES * WORKERS  # the workers made real progress
    finally:
        daemon.stop()
