"""One budget of reply bytes for the whole daemon (max_reply_buffer_total,
docs/reliability.md): many clients that send and never read cannot take the host's
memory, and what they held is given back to the system once they are gone."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import pytest
from conftest import eventually
from test_memory import MESSAGE, call, process_client, process_daemon, rpc_line, session_of, vm

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio
__all__ = ["process_client", "process_daemon"]  # fixtures used here

BUDGET = 256 << 20
# What the daemon holds besides the replies counted against the budget: the interpreter
# and its libraries (about 60 MiB), SQLite's caches, answers being built past the share
# they reserved (one item always comes whole), copies in flight, allocator slack.
# Measured: a peak of 550-1000 MiB with this budget, 2.3-5 GB without one
# (docs/reliability.md, "Budgets").
MARGIN = 1 << 30
PAGE = 4 << 20  # max_page_bytes: what the stats request itself reserves while it runs
NEAR_BASELINE = 64 << 20
CONNECTIONS = 64


def flood(socks: list[socket.socket], line: bytes) -> tuple[int, int]:
    """Send `line` on every socket, round after round, until each blocks (the daemon has
    stopped reading it) or is closed by the daemon. Returns (blocked, closed)."""
    open_ = set(range(len(socks)))
    blocked = closed = 0
    while open_:
        for i in list(open_):
            try:
                socks[i].send(line)
            except BlockingIOError:
                blocked += 1
                open_.discard(i)
            except (BrokenPipeError, ConnectionResetError):
                closed += 1
                open_.discard(i)
    return blocked, closed


class TestDaemonWideBudget:
    @pytest.fixture
    def daemon_flags(self) -> list[str]:
        return ["--max-reply-buffer-total", str(BUDGET)]

    @pytest.mark.fleet
    async def test_64_connections_that_never_read(
            self, process_daemon: Any, process_client: AsyncClient) -> None:
        """64 connections send message.list lines (4 MiB answers) and never read. The
        daemon stops reading those holding the most and closes the worst; its peak RSS
        stays under the budget plus a fixed margin, it answers ping throughout, says so in
        daemon.stats, and its RSS comes back near where it started once they close."""
        proc, path = process_daemon
        sid = await session_of(process_client, 150, MESSAGE)
        stats = await process_client.stats()
        # Held: real bytes only (the stats request's own page estimate pauses, never counts).
        assert stats.reply_bytes_budget == BUDGET and stats.reply_bytes_held == 0
        baseline = vm(proc.pid, "VmRSS")
        line = rpc_line(call(1, "message.list", session_id=sid, limit=1000))
        socks = []
        try:
            for _ in range(CONNECTIONS):
                s = socket.socket(socket.AF_UNIX)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.connect(path)
                s.setblocking(False)
                socks.append(s)
            with anyio.fail_after(300):  # a guard: the daemon stops reading each at some point
                blocked, closed = await anyio.to_thread.run_sync(flood, socks, line)
            assert blocked + closed == CONNECTIONS

            async def budget_acted() -> bool:
                s = await process_client.stats()
                return bool(s.connections_closed_by_budget or s.connections_paused)

            await eventually(budget_acted, "the budget to pause or close connections",
                             patience=300)
            assert (await process_client.ping()).pong
            stats = await process_client.stats()
            assert stats.reply_bytes_held is not None and stats.reply_bytes_held <= BUDGET
        finally:
            for s in socks:
                s.close()

        async def released() -> bool:
            s = await process_client.stats()
            return (s.connections == 1 and s.reply_bytes_held is not None
                    and s.reply_bytes_held <= PAGE)

        await eventually(released, "every flooding connection to be gone")
        peak = vm(proc.pid, "VmHWM")
        assert peak < BUDGET + MARGIN, f"peak RSS {peak >> 20} MiB"
        await eventually(lambda: vm(proc.pid, "VmRSS") < baseline + NEAR_BASELINE,
                         "RSS to come back near its baseline")
        assert proc.poll() is None

