"""Start and stop a real `sessiond` process for a benchmark, and read its memory use."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time

import anyio

from sessiond import AsyncClient


def _stat_cpu_s(path: str) -> float:
    """User + system CPU seconds from a /proc stat file (a process's or a thread's)."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    return _stat_cpu_s(f"/proc/{pid}/stat")


def threads_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds of each of the process's threads so far, by thread id (the main
    thread's is the pid; Python does not name its threads for the OS). A thread that
    ends meanwhile is left out."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError):
            found[tid] = _stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
    return found


class DaemonProcess:
    """A sessiond subprocess on a socket and database inside `directory`."""

    def __init__(self, directory: str, *extra: str) -> None:
        self.socket = os.path.join(directory, "bench.sock")
        self.db = os.path.join(directory, "bench.db")
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def program(self) -> list[str]:
        """What python runs as the daemon (its arguments follow)."""
        return ["-m", "sessiond_daemon"]

    async def start(self) -> float:
        """Start the daemon; return seconds until its first answered daemon.ping."""
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, *self.program(), "--socket", self.socket, "--db", self.db,
             "--log-level", "warning", *self.extra])
        while True:
            try:
                async with AsyncClient(self.socket) as c:
                    await c.ping()
                return time.perf_counter() - t0
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"sessiond exited with {self.proc.returncode}") from None
                await anyio.sleep(0.005)  # the poll's pace bounds how finely start time is seen

    def rss_mb(self) -> float:
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_s(self) -> float:
        """User + system CPU seconds the daemon has used so far."""
        assert self.proc is not None
        return cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)
        self.proc = None
