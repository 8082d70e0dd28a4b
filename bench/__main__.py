"""Run the benchmarks: `python -m bench [--quick] [--only B1,B4] [--out FILE]`."""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio

from sessiond import AsyncClient

from . import baseline
from . import search as search_bench
from .daemon import DaemonProcess, cpu_s

anyio_open = asyncio.open_unix_connection

CONTENT = "x" * 200  # ~200 B messages, as the targets say
SNAPSHOT_EVERY = 1000  # the daemon's default


@dataclass
class Sizes:
    b1_appends: int
    b2_calls: int
    b3_round_trips: int
    b4_events: tuple[int, int]
    b5_history: tuple[int, int]
    b6_sessions: tuple[int, int]
    b7_events: int
    b7_sessions: int
    b9_events: int
    b10_runs: int
    baseline_rows: int


QUICK = Sizes(b1_appends=3_000, b2_calls=40, b3_round_trips=400, b4_events=(100, 10_000),
              b5_history=(100, 10_000), b6_sessions=(1_000, 5_000), b7_events=100_000,
              b7_sessions=1_000, b9_events=10_000, b10_runs=5, baseline_rows=1_000)
FULL = Sizes(b1_appends=30_000, b2_calls=400, b3_round_trips=3_000, b4_events=(100, 100_000),
             b5_history=(100, 100_000), b6_sessions=(10_000, 100_000), b7_events=1_000_000,
             b7_sessions=10_000, b9_events=10_000, b10_runs=20, baseline_rows=5_000)


@dataclass
class Figure:
    id: str
    name: str
    value: float
    unit: str
    baseline: float | None
    ratio: float | None
    target: str
    met: bool | None
    note: str = ""


def median_s(samples: list[float]) -> float:
    return statistics.median(samples)


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append(time.perf_counter() - t0)
    return samples


async def paired(fa: Callable[[], Awaitable[Any]], fb: Callable[[], Awaitable[Any]],
                 n: int) -> tuple[float, float]:
    """Median seconds of a and of b, sampled alternately so noise hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(n):
        a += await timed(fa, 1)
        b += await timed(fb, 1)
    return median_s(a), median_s(b)


ECHO_SERVER = """
import asyncio, sys
async def handle(r, w):
    while True:
        try:
            line = await r.readuntil(b"\\n")
        except Exception:
            return
        w.write(line)
        await w.drain()
async def main():
    server = await asyncio.start_unix_server(handle, sys.argv[1])
    print("ready", flush=True)
    await server.serve_forever()
asyncio.run(main())
"""


async def fill_messages(c: AsyncClient, session_id: str, count: int) -> None:
    """Append `count` messages in calls of up to 5,000."""
    done = 0
    while done < count:
        n = min(5_000, count - done)
        await c.append_messages(session_id, [{"role": "user", "content": CONTENT}] * n)
        done += n


async def concurrently(n: int, fn: Callable[[int], Awaitable[None]]) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(fn, i)


class Bench:
    def __init__(self, sizes: Sizes, directory: str, only: set[str] | None) -> None:
        self.sizes = sizes
        self.dir = directory
        self.only = only
        self.figures: list[Figure] = []
        self.per_row = baseline.write_rows(directory, sizes.baseline_rows, 1)
        self.batched = baseline.write_rows(directory, sizes.baseline_rows * 10, 100)

    def wanted(self, fid: str) -> bool:
        return self.only is None or fid in self.only

    def add(self, fig: Figure) -> None:
        self.figures.append(fig)
        ratio = f"{fig.ratio:.2f}" if fig.ratio is not None else "-"
        base = f"{fig.baseline:,.3f}" if fig.baseline is not None else "-"
        mark = {True: "met", False: "MISSED", None: "-"}[fig.met]
        print(f"{fig.id:<4} {fig.name:<44} {fig.value:>12,.3f} {fig.unit:<10} base {base:>12}"
              f"  ratio {ratio:>6}  target {fig.target:<28} {mark}", flush=True)

    async def floor(self) -> None:
        """A bare asyncio echo server's round trip: what any local RPC costs on this machine."""
        path = os.path.join(self.dir, "echo.sock")
        proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE)
        try:
            assert proc.stdout is not None and proc.stdout.readline().startswith(b"ready")
            reader, writer = await anyio_open(path)
            line = b'{"jsonrpc":"2.0","id":1,"method":"message.append","params":{"content":"' + \
                CONTENT.encode() + b'"}}\n'

            async def echo() -> None:
                writer.write(line)
                await writer.drain()
                await reader.readuntil(b"\n")

            med = median_s(await timed(echo, 2000)) * 1000
            writer.close()
            done = 0

            async def echo_client(i: int) -> None:
                nonlocal done
                r, w = await anyio_open(path)
                for _ in range(self.sizes.b1_appends // 16):
                    w.write(line)
                    await w.drain()
                    await r.readuntil(b"\n")
                    done += 1
                w.close()

            t0 = time.perf_counter()
            await concurrently(16, echo_client)
            echo_rate = done / (time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait()
        self.add(Figure("F0", "floor: bare asyncio echo round trip", med, "ms median", None,
                        None, "(context for B3, B4)", None))
        self.add(Figure("F1", "ceiling: bare asyncio echo, 16 clients", echo_rate, "req/s",
                        None, None, "(context for B1)", None,
                        "a server doing no work, on the same 2 cores as its clients"))

    async def run(self) -> None:
        await self.floor()
        d = DaemonProcess(self.dir)
        await d.start()
        try:
            async with AsyncClient(d.socket) as c:
                for fid, fn in (("B1", self.b1), ("B2", self.b2), ("B3", self.b3),
                                ("B4", self.b4), ("B5", self.b5), ("B6", self.b6),
                                ("B8", self.b8), ("B8i", self.b8i), ("B9", self.b9),
                                ("B10", self.b10)):
                    if self.wanted(fid):
                        await fn(c, d)
        finally:
            d.stop()
        if self.wanted("B7"):
            await self.b7()
        sizes = search_bench.QUICK if self.sizes is QUICK else search_bench.FULL
        for fid, run in (("B13a", search_bench.append_overhead), ("B13", search_bench.b13)):
            if self.wanted(fid):
                for fig in await run(self.dir, sizes):
                    self.add(Figure(**fig))

    async def _appends(self, d: DaemonProcess, total: int) -> float:
        """16 clients appending ~200 B messages to one session: appends/s."""
        async with AsyncClient(d.socket) as c:
            sid = (await c.create_session()).session_id
        per = total // 16

        async def client(i: int) -> None:
            async with AsyncClient(d.socket) as own:
                for _ in range(per):
                    await own.append_message(sid, "user", CONTENT)

        t0 = time.perf_counter()
        await concurrently(16, client)
        return per * 16 / (time.perf_counter() - t0)

    async def b1(self, c: AsyncClient, d: DaemonProcess) -> None:
        cpu0, t0 = d.cpu_s(), time.perf_counter()
        rate = await self._appends(d, self.sizes.b1_appends)
        cpu = (d.cpu_s() - cpu0) / (time.perf_counter() - t0)
        ratio = rate / self.per_row.rows_per_s
        self.add(Figure("B1", "16 clients, message.append, one session", rate, "appends/s",
                        self.per_row.rows_per_s, ratio, ">= 15,000/s and >= 6x per-row",
                        rate >= 15_000 and ratio >= 6, f"daemon CPU {cpu:.0%} of one core"))

    async def b2(self, c: AsyncClient, d: DaemonProcess) -> None:
        per = self.sizes.b2_calls // 4
        ids = [(await c.create_session()).session_id for _ in range(4)]
        batch = [{"role": "user", "content": CONTENT}] * 100

        async def client(i: int) -> None:
            async with AsyncClient(d.socket) as own:
                for _ in range(per):
                    await own.append_messages(ids[i], batch)

        t0 = time.perf_counter()
        await concurrently(4, client)
        rate = per * 4 * 100 / (time.perf_counter() - t0)
        ratio = rate / self.batched.rows_per_s
        self.add(Figure("B2", "4 clients, message.append_many x100", rate, "msgs/s",
                        self.batched.rows_per_s, ratio, ">= 50% of batched-100", ratio >= 0.5))

    async def b3(self, c: AsyncClient, d: DaemonProcess) -> None:
        sid = (await c.create_session()).session_id
        samples = await timed(lambda: c.append_message(sid, "user", CONTENT),
                              self.sizes.b3_round_trips)
        med = median_s(samples) * 1000
        base = self.per_row.median_row_s * 1000
        self.add(Figure("B3", "1 client, sequential message.append", med, "ms median",
                        base, med / base, "<= 1.6x per-row time", med / base <= 1.6))

    async def b4(self, c: AsyncClient, d: DaemonProcess) -> None:
        small, large = self.sizes.b4_events
        ids = {}
        for n in (small, large):
            ids[n] = (await c.create_session()).session_id
            await fill_messages(c, ids[n], n - 1)
        a, b = await paired(lambda: c.get_session(ids[small]), lambda: c.get_session(ids[large]),
                            1000)
        meds = {small: a * 1000, large: b * 1000}
        base = baseline.point_read_s(self.dir) * 1000
        flat = meds[large] / meds[small]
        self.add(Figure("B4", f"session.get, {small:,} events", meds[small], "ms median", base,
                        meds[small] / base, "<= 0.3 ms", meds[small] <= 0.3))
        self.add(Figure("B4", f"session.get, {large:,} events", meds[large], "ms median",
                        meds[small], flat, "<= 0.3 ms, <= 1.5x the small",
                        meds[large] <= 0.3 and flat <= 1.5))

    async def b5(self, c: AsyncClient, d: DaemonProcess) -> None:
        small, large = self.sizes.b5_history
        ids = {}
        for n in (small, large):
            ids[n] = (await c.create_session()).session_id
            await fill_messages(c, ids[n], n)
        results: dict[tuple[int, str], float] = {}
        a, b = await paired(lambda: c.list_messages(ids[small], limit=20, order="desc"),
                            lambda: c.list_messages(ids[large], limit=20, order="desc"), 500)
        results[(small, "latest")], results[(large, "latest")] = a * 1000, b * 1000
        a, b = await paired(
            lambda: c.list_messages(ids[small], limit=20, after_sequence=small // 2),
            lambda: c.list_messages(ids[large], limit=20, after_sequence=large // 2), 500)
        results[(small, "middle")], results[(large, "middle")] = a * 1000, b * 1000
        for page in ("latest", "middle"):
            flat = results[(large, page)] / results[(small, page)]
            self.add(Figure("B5", f"message.list {page} 20 of {large:,}", results[(large, page)],
                            "ms median", results[(small, page)], flat,
                            f"<= 1.5x the same on {small}", flat <= 1.5))

    async def b6(self, c: AsyncClient, d: DaemonProcess) -> None:
        small, large = self.sizes.b6_sessions
        spaces = {n: f"b6-{n}" for n in (small, large)}
        async def make(n: int, i: int) -> None:
            async with AsyncClient(d.socket) as own:
                for _ in range(n // 16 + (1 if i < n % 16 else 0)):
                    await own.create_session(namespace=spaces[n])

        for n in (small, large):
            await concurrently(16, functools.partial(make, n))
        a, b = await paired(
            lambda: c.list_sessions(namespace=spaces[small], status=["active"], limit=50),
            lambda: c.list_sessions(namespace=spaces[large], status=["active"], limit=50), 300)
        meds = {small: a * 1000, large: b * 1000}
        flat = meds[large] / meds[small]
        self.add(Figure("B6", f"session.list 50 of {large:,}, status filter", meds[large],
                        "ms median", meds[small], flat, f"<= 1.5x the same among {small:,}",
                        flat <= 1.5))

    async def b7(self) -> None:
        directory = tempfile.mkdtemp(dir=self.dir)
        d = DaemonProcess(directory)
        await d.start()
        sessions, events = self.sizes.b7_sessions, self.sizes.b7_events
        per_session = events // sessions
        try:
            async def client(i: int) -> None:
                async with AsyncClient(d.socket) as own:
                    for _ in range(i, sessions, 16):
                        sid = (await own.create_session()).session_id
                        await own.append_messages(
                            sid, [{"role": "user", "content": CONTENT}] * (per_session - 1))

            await concurrently(16, client)
        finally:
            d.stop()
        starts, rss = [], []
        for _ in range(3):
            starts.append(await d.start())
            rss.append(d.rss_mb())
            d.stop()
        start = median_s(starts)
        self.add(Figure("B7", f"start on {events:,} events / {sessions:,} sessions", start, "s",
                        None, None, "<= 1.5 s", start <= 1.5))
        self.add(Figure("B7", "RSS after start", max(rss), "MB", None, None, "<= 100 MB",
                        max(rss) <= 100))

    async def b8(self, c: AsyncClient, d: DaemonProcess) -> None:
        # Rounds without and with subscribers alternate, so machine noise hits both alike.
        n = self.sizes.b1_appends
        bare, followed, delivered = [], [], 0
        cpu = {"bare": 0.0, "followed": 0.0, "subscribers": 0.0}
        for _ in range(3):
            cpu0 = d.cpu_s()
            bare.append(await self._appends(d, n))
            cpu["bare"] += d.cpu_s() - cpu0
            subs = subprocess.Popen([sys.executable, "-m", "bench.subscribers", d.socket, "16"],
                                    stdout=subprocess.PIPE)
            try:
                assert subs.stdout is not None and subs.stdout.readline().startswith(b"ready")
                while (await c.stats()).subscriptions < 16:  # all 16 followers in place
                    await anyio.sleep(0.01)
                cpu0, sub0 = d.cpu_s(), cpu_s(subs.pid)
                followed.append(await self._appends(d, n))
                cpu["followed"] += d.cpu_s() - cpu0
                cpu["subscribers"] += cpu_s(subs.pid) - sub0
            finally:
                subs.terminate()
                out, _ = subs.communicate(timeout=60)
            delivered += int(out.split()[-1])
            while (await c.stats()).subscriptions:  # and gone, before the next bare round
                await anyio.sleep(0.01)
        rate, base = statistics.median(followed), statistics.median(bare)
        per = {k: v / (3 * n) * 1e6 for k, v in cpu.items()}
        self.add(Figure("B8", "B1 with 16 live subscribers", rate, "appends/s", base,
                        rate / base, ">= 80% of B1 (interleaved rounds)", rate / base >= 0.8,
                        f"{delivered:,} lines delivered; daemon CPU/append {per['bare']:.0f} us"
                        f" -> {per['followed']:.0f} us; subscriber process "
                        f"{per['subscribers']:.0f} us/append on the same 2 cores"))

    async def b8i(self, c: AsyncClient, d: DaemonProcess) -> None:
        # B1 with 200 idle followers: subscriptions of another session (4 connections of
        # 50), which no append touches. Rounds without and with them alternate.
        n = self.sizes.b1_appends
        idle = (await c.create_session()).session_id
        bare, followed = [], []
        cpu = {"bare": 0.0, "followed": 0.0}
        for _ in range(3):
            cpu0 = d.cpu_s()
            bare.append(await self._appends(d, n))
            cpu["bare"] += d.cpu_s() - cpu0
            subs = subprocess.Popen([sys.executable, "-m", "bench.subscribers", d.socket, "4",
                                     idle, "50"], stdout=subprocess.PIPE)
            try:
                assert subs.stdout is not None and subs.stdout.readline().startswith(b"ready")
                while (await c.stats()).subscriptions < 200:
                    await anyio.sleep(0.01)
                cpu0 = d.cpu_s()
                followed.append(await self._appends(d, n))
                cpu["followed"] += d.cpu_s() - cpu0
            finally:
                subs.terminate()
                subs.communicate(timeout=60)
            while (await c.stats()).subscriptions:
                await anyio.sleep(0.01)
        rate, base = statistics.median(followed), statistics.median(bare)
        per = {k: v / (3 * n) * 1e6 for k, v in cpu.items()}
        self.add(Figure("B8i", "B1 with 200 idle subscriptions of another session", rate,
                        "appends/s", base, rate / base, ">= 95% of B1 (interleaved rounds)",
                        rate / base >= 0.95,
                        f"daemon CPU/append {per['bare']:.0f} us -> {per['followed']:.0f} us;"
                        " bare rounds " + ", ".join(f"{r:,.0f}" for r in bare)
                        + "; followed " + ", ".join(f"{r:,.0f}" for r in followed)))

    async def b9(self, c: AsyncClient, d: DaemonProcess) -> None:
        n = self.sizes.b9_events
        sid = (await c.create_session()).session_id
        await fill_messages(c, sid, n - 1)
        # The worst case near the middle: 999 events past the snapshot at n/2.
        at = n // 2 + SNAPSHOT_EVERY - 1
        med = median_s(await timed(lambda: c.get_session(sid, at_version=at), 20)) * 1000
        self.add(Figure("B9", f"session.get at_version {at:,} of {n:,}", med, "ms median",
                        None, None, "<= 20 ms", med <= 20,
                        f"snapshots every {SNAPSHOT_EVERY}: folds {SNAPSHOT_EVERY - 1} events"))

    async def b10(self, c: AsyncClient, d: DaemonProcess) -> None:
        sid = (await c.create_session(task="b10")).session_id
        ctl = [sys.executable, "-m", "sessiond.cli", "--socket", d.socket, "show", sid, "--json"]

        def run(cmd: list[str]) -> float:
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            return time.perf_counter() - t0

        runs = self.sizes.b10_runs
        show = median_s([await anyio.to_thread.run_sync(run, ctl) for _ in range(runs)]) * 1000
        bare = median_s([await anyio.to_thread.run_sync(run, [sys.executable, "-c", "pass"])
                         for _ in range(runs)]) * 1000
        self.add(Figure("B10", "sessionctl show --json, fresh process", show, "ms median", bare,
                        show / bare, "<= 150 ms and <= 6x python -c pass",
                        show <= 150 and show / bare <= 6))


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--quick", action="store_true", help="small sizes, about a minute")
    p.add_argument("--only", help="comma-separated figure ids, e.g. B1,B4")
    p.add_argument("--out", help="JSON results file (default bench/results-{quick,full}.json)")
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    only = set(args.only.split(",")) if args.only else None
    with tempfile.TemporaryDirectory(prefix="sdb-") as directory:
        bench = Bench(sizes, directory, only)
        print(f"baseline per-row: {bench.per_row.rows_per_s:,.0f} rows/s, "
              f"{bench.per_row.median_row_s * 1000:.3f} ms/row; batched-100: "
              f"{bench.batched.rows_per_s:,.0f} rows/s", flush=True)
        anyio.run(bench.run, backend="asyncio")
    out = args.out or os.path.join(os.path.dirname(__file__),
                                   f"results-{'quick' if args.quick else 'full'}.json")
    with open(out, "w") as f:
        json.dump({"mode": "quick" if args.quick else "full",
                   "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                              f"Python {platform.python_version()}",
                   "baseline": {"per_row_rows_per_s": bench.per_row.rows_per_s,
                                "per_row_median_s": bench.per_row.median_row_s,
                                "batched100_rows_per_s": bench.batched.rows_per_s},
                   "figures": [asdict(f) for f in bench.figures]}, f, indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
