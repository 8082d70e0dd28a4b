"""The fleet test: three real daemon processes, each with its own socket, on one
PostgreSQL database. Sixteen writers append to the same few sessions through them, each
write under an idempotency key, moving to another daemon when theirs fails; a raw
subscriber on each daemon follows the whole log from position 0; every daemon is killed
with SIGKILL and started again while the load runs. At the end every acknowledged write
is stored exactly once with the result it was acknowledged with, every session's
versions are gapless and its hash chain verifies, and every subscriber saw every event
exactly once, in position order.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import msgspec
import pg
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream
from conftest import eventually
from test_crash import DaemonProcess

from sessiond import AsyncClient
from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError

pytestmark = pytest.mark.anyio

DAEMONS = 3
WRITERS = 16
WRITES = 12  # per writer
SESSIONS = 4


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class Host(DaemonProcess):
    """One daemon process on the shared database (test_crash's, pointed at PostgreSQL)."""

    def __init__(self, directory: str, index: int, url: str) -> None:
        super().__init__(directory)
        self.socket = os.path.join(directory, f"d{index}.sock")
        self.db = url
        self.starts = 0

    async def start(self) -> None:
        await super().start()
        self.starts += 1


_decoder = msgspec.json.Decoder()


async def subscriber(host: Host, seen: list[int], done: anyio.Event) -> None:
    """Follow the whole log on `host` over a raw connection, from position 0; after a
    lost connection (its daemon was killed) subscribe again from the last position seen.
    Every event the daemon sends is recorded, so a duplicate or a gap would show."""
    while not done.is_set():
        try:
            stream = await anyio.connect_unix(host.socket)
        except OSError:
            await anyio.sleep(0.02)  # pacing while the daemon restarts
            continue
        try:
            async with stream:
                start = seen[-1] if seen else 0
                await stream.send(msgspec.json.encode({
                    "jsonrpc": "2.0", "id": 1, "method": "events.subscribe",
                    "params": {"from_position": start}}) + b"\n")
                lines = BufferedByteReceiveStream(stream)
                while True:
                    msg: Any = _decoder.decode(await lines.receive_until(b"\n", 1 << 24))
                    method = msg.get("method")
                    if method == "subscription.event":
                        seen.append(msg["params"]["event"]["position"])
                    elif method == "subscription.dropped" or "error" in msg:
                        break
        except (OSError, anyio.EndOfStream, anyio.IncompleteRead,
                anyio.BrokenResourceError, anyio.DelimiterNotFound):
            continue


async def writer(index: int, hosts: list[Host], sessions: list[str],
                 acked: dict[str, tuple[str, int, int]]) -> None:
    """Append WRITES messages, each under its own key, starting on daemon index % 3 and
    moving on to the next daemon whenever a call fails (killed daemon, retryable error)."""
    at = index % len(hosts)
    client: AsyncClient | None = None
    for n in range(WRITES):
        key = f"w{index}-{n}"
        sid = sessions[(index + n) % len(sessions)]
        while True:
            try:
                if client is None:
                    client = AsyncClient(hosts[at].socket)
                    await client.connect()
                r = await client.append_message(sid, "user", key, idempotency_key=key)
                acked[key] = (r.session_id, r.version, r.position)
                break
            except (SessiondError, OSError):
                if client is not None:
                    await client.aclose()
                client = None
                at = (at + 1) % len(hosts)
                await anyio.sleep(0.01)  # pacing: the next daemon may be restarting
    if client is not None:
        await client.aclose()


@pytest.mark.fleet
async def test_three_daemons_killed_and_restarted_under_load(pg_url: str,
                                                             short_dir: str) -> None:
    hosts = [Host(short_dir, i, pg_url) for i in range(DAEMONS)]
    acked: dict[str, tuple[str, int, int]] = {}
    seen: list[list[int]] = [[] for _ in hosts]
    done = anyio.Event()
    try:
        for host in hosts:
            await host.start()
        async with AsyncClient(hosts[0].socket) as c:
            sessions = [(await c.create_session()).session_id for _ in range(SESSIONS)]
        total = WRITERS * WRITES
        async with anyio.create_task_group() as followers:
            for host, positions in zip(hosts, seen, strict=True):
                followers.start_soon(subscriber, host, positions, done)
            async with anyio.create_task_group() as load:
                for i in range(WRITERS):
                    load.start_soon(writer, i, hosts, sessions, acked)
                # Each daemon in turn is killed once a further share of the load is
                # acknowledged, and started again at once.
                for i, host in enumerate(hosts):
                    share = total * (i + 1) // (DAEMONS + 2)
                    await eventually(_reached(acked, share), f"{share} acknowledged writes")
                    host.kill()
                    await host.start()
            assert len(acked) == total
            # Every subscriber reaches the end of the log.
            log = await _whole_log(hosts[0], sessions)
            end = max(p for _, _, p, _ in log)
            await eventually(lambda: all(s and s[-1] >= end for s in seen),
                             "every subscriber at the end of the log")
            done.set()
            followers.cancel_scope.cancel()
        assert all(host.starts >= 2 for host in hosts)
        # Every acknowledged write stored exactly once, as it was acknowledged.
        by_key: dict[str, list[tuple[str, int, int]]] = {}
        for sid, version, position, key in log:
            by_key.setdefault(key, []).append((sid, version, position))
        assert {k: v[0] for k, v in by_key.items() if k != ""} == acked
        assert all(len(v) == 1 for k, v in by_key.items() if k != "")
        # Versions gapless per session; positions gapless over the log.
        for sid in sessions:
            versions = [v for s, v, _, _ in log if s == sid]
            assert versions == list(range(1, len(versions) + 1))
        positions = [p for _, _, p, _ in log]
        assert sorted(positions) == list(range(1, len(positions) + 1))
        # Every subscriber saw every event once, in position order.
        for s in seen:
            assert s == sorted(positions)
        async with AsyncClient(hosts[2].socket) as c:
            verified = await c.call("daemon.verify", rpc.VerifyResult)
        assert verified.ok and verified.checked_sessions == SESSIONS, verified.problems
    finally:
        done.set()
        for host in hosts:
            host.stop()


def _reached(acked: dict[str, Any], share: int) -> Callable[[], bool]:
    return lambda: len(acked) >= share


async def _whole_log(host: Host, sessions: list[str]) -> list[tuple[str, int, int, str]]:
    """(session_id, version, position, idempotency key or "") of every event."""
    rows: list[tuple[str, int, int, str]] = []
    async with AsyncClient(host.socket) as c:
        for sid in sessions:
            after = 0
            while True:
                page = await c.read_events(sid, from_version=after + 1, limit=500)
                for e in page.events:
                    rows.append((e.session_id, e.version, e.position,
                                 e.meta.idempotency_key or ""))
                if not page.events:
                    break
                after = page.events[-1].version
    return rows
