"""The event loop lever and the append path's CPU (issue 15):
`python -m bench.loops [--quick] [--rounds R] [--trees NAME=DIR,...] [--profile]`.

B1 (16 clients appending ~200 B messages to one session) and B3 (one client, sequential
appends) against a real daemon run with `SESSIOND_LOOP=asyncio` and with `uvloop`, back
to back on fresh databases, the order alternating each round. For each: appends/s or the
median round trip, and the daemon's CPU per append (user and system) read from /proc,
which the issue's targets are about (<= 120 us at 16 writers, <= 200 us at one).

`--trees base=/work/main,new=.` compares source trees instead of loops (both on the
default loop): each daemon runs with PYTHONPATH set to that tree's `daemon` and `schemas`
directories, rounds alternating, so a change is measured against its base in one run.

Each round also measures the latency floor of B3: a bare asyncio echo round trip (F0, as
`python -m bench` does) plus one fsync of a 4 KiB write (a file in the same directory),
medians of the same count; B3's median is printed beside that sum (aim: <= 1.5x).

`--profile` then samples the daemon with py-spy (if installed) during a B3 run and prints
where the one-writer path spends its time: the functions with the most samples, both as
the innermost frame (self) and anywhere on the stack (total), in us per append.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import anyio

from sessiond import AsyncClient

from . import baseline
from .__main__ import ECHO_SERVER
from .daemon import DaemonProcess

CONTENT = "x" * 200
LOOPS = ("asyncio", "uvloop")


def cpu_split(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds a process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def loop_in_use(pid: int) -> str:
    """Which loop the daemon runs: uvloop's extension is mapped into it, or it is not."""
    with open(f"/proc/{pid}/maps") as f:
        return "uvloop" if "uvloop" in f.read() else "asyncio"


@dataclass
class Run:
    loop: str  # the variant: a loop, or a source tree's name
    figure: str  # B1, B3, or FLOOR (F0 + one fsync, ms)
    value: float  # appends/s (B1) or median ms (B3)
    user_us: float  # daemon CPU per append
    sys_us: float

    @property
    def cpu_us(self) -> float:
        return self.user_us + self.sys_us


class Meter:
    """Daemon CPU (user, system) over a stretch of work, per append."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start = cpu_split(pid)

    def per(self, appends: int) -> tuple[float, float]:
        user, system = cpu_split(self.pid)
        return ((user - self.start[0]) / appends * 1e6, (system - self.start[1]) / appends * 1e6)


async def b1(d: DaemonProcess, total: int) -> tuple[float, tuple[float, float]]:
    """16 clients appending to one session: appends/s and daemon CPU per append."""
    async with AsyncClient(d.socket) as c:
        sid = (await c.create_session()).session_id
    per = total // 16

    async def client() -> None:
        async with AsyncClient(d.socket) as own:
            for _ in range(per):
                await own.append_message(sid, "user", CONTENT)

    assert d.proc is not None
    meter, t0 = Meter(d.proc.pid), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(client)
    rate = per * 16 / (time.perf_counter() - t0)
    return rate, meter.per(per * 16)


async def b3(d: DaemonProcess, count: int) -> tuple[float, tuple[float, float]]:
    """One client, sequential appends: median ms and daemon CPU per append."""
    assert d.proc is not None
    async with AsyncClient(d.socket) as c:
        sid = (await c.create_session()).session_id
        times = []
        meter = Meter(d.proc.pid)
        for _ in range(count):
            t0 = time.perf_counter()
            await c.append_message(sid, "user", CONTENT)
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1000, meter.per(count)


async def echo_ms(directory: str, count: int) -> float:
    """F0: a bare asyncio echo server's median round trip for an append-sized line."""
    path = os.path.join(directory, f"echo-{time.monotonic_ns()}.sock")
    proc = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, path], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith(b"ready")
        stream = await anyio.connect_unix(path)
        line = (b'{"jsonrpc":"2.0","id":1,"method":"message.append","params":{"content":"'
                + CONTENT.encode() + b'"}}\n')
        times = []
        async with stream:
            for _ in range(count):
                t0 = time.perf_counter()
                await stream.send(line)
                got = b""
                while not got.endswith(b"\n"):
                    got += await stream.receive()
                times.append(time.perf_counter() - t0)
    finally:
        proc.terminate()
        proc.wait()
    return statistics.median(times) * 1000


def fsync_ms(directory: str, count: int) -> float:
    """The median time of one 4 KiB write and fsync, appended to a file in `directory`."""
    path = os.path.join(directory, f"fsync-{time.monotonic_ns()}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    block, times = b"x" * 4096, []
    try:
        for _ in range(count):
            t0 = time.perf_counter()
            os.write(fd, block)
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)
    return statistics.median(times) * 1000


def tree_env(tree: str) -> dict[str, str]:
    """The environment that makes a daemon subprocess import `tree`'s sources."""
    root = os.path.abspath(tree)
    path = os.pathsep.join(os.path.join(root, d) for d in ("daemon", "schemas", "client"))
    return {**os.environ, "PYTHONPATH": path}


async def one_round(directory: str, loop: str, b1_total: int, b3_count: int,
                    tree: str | None = None, label: str | None = None) -> list[Run]:
    label = label or loop
    saved = dict(os.environ)
    os.environ["SESSIOND_LOOP"] = loop  # the daemon subprocess inherits it
    if tree is not None:
        os.environ.update(tree_env(tree))
    d = DaemonProcess(tempfile.mkdtemp(dir=directory))
    try:
        await d.start()
        assert d.proc is not None
        running = loop_in_use(d.proc.pid)
        assert running == loop, f"asked for {loop}, the daemon runs {running}"
        rate, (u1, s1) = await b1(d, b1_total)
        floor = await echo_ms(directory, b3_count) + fsync_ms(directory, b3_count)
        med, (u3, s3) = await b3(d, b3_count)
    finally:
        d.stop()
        os.environ.clear()
        os.environ.update(saved)
    runs = [Run(label, "B1", rate, u1, s1), Run(label, "B3", med, u3, s3),
            Run(label, "FLOOR", floor, 0, 0)]
    for r in runs[:2]:
        value = f"{r.value:,.0f} appends/s" if r.figure == "B1" else f"{r.value:.3f} ms median"
        print(f"  {r.figure} {label:<8} {value:<20} daemon CPU/append {r.cpu_us:4.0f} us "
              f"(user {r.user_us:.0f}, system {r.sys_us:.0f})"
              + (f"; F0 + fsync {floor:.3f} ms, B3 {med / floor:.2f}x that" if r.figure == "B3"
                 else ""), flush=True)
    return runs


def loop_available() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def spread(values: list[float], fmt: str) -> str:
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}–{max(values):{fmt}})")


def summary(runs: list[Run], variants: tuple[str, ...], per_row: float) -> list[str]:
    out = ["| figure | variant | value: median (min–max) | daemon CPU/append µs | user µs "
           "| system µs | target |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for figure, unit, target in (("B1", "appends/s", "<= 120 µs; >= 2x raw per-row"),
                                 ("B3", "ms per append", "<= 200 µs; <= 1.5x F0 + fsync")):
        meds = {}
        for variant in variants:
            rs = [r for r in runs if r.figure == figure and r.loop == variant]
            if not rs:
                continue
            meds[variant] = (statistics.median(r.value for r in rs),
                             statistics.median(r.cpu_us for r in rs))
            out.append(f"| {figure} | {variant} | {spread([r.value for r in rs], ',.2f')} {unit} "
                       f"| {spread([r.cpu_us for r in rs], '.0f')} "
                       f"| {statistics.median(r.user_us for r in rs):.0f} "
                       f"| {statistics.median(r.sys_us for r in rs):.0f} | {target} |")
            if figure == "B1":
                out.append(f"| B1 / raw SQLite per-row | {variant} | "
                           f"{statistics.median(r.value for r in rs) / per_row:.2f}x | | | | |")
            else:
                floors = [r for r in runs if r.figure == "FLOOR" and r.loop == variant]
                ratios = [b.value / f.value for b, f in zip(rs, floors, strict=True)]
                out.append(f"| F0 + one fsync | {variant} | "
                           f"{spread([f.value for f in floors], '.3f')} ms | | | | |")
                out.append(f"| B3 / (F0 + fsync) | {variant} | {spread(ratios, '.2f')}x "
                           "| | | | <= 1.5x |")
        if len(meds) == 2:
            (na, (va, ca)), (nb, (vb, cb)) = meds.items()
            gain = vb / va if figure == "B1" else va / vb
            out.append(f"| {figure} | {nb} / {na} | {gain:.2f}x faster | CPU "
                       f"{cb / ca:.2f}x | | | |")
    return out


ROOTS = ("<module>", "_run_code", "_run_module_as_main", "main (sessiond_daemon/__main__",
         "run (anyio/_core/_eventloop", "AsyncIOBackend.run", "Runner.run (asyncio/runners",
         "Thread._bootstrap", "Thread.run (threading", "_worker (concurrent", "WorkerThread.run",
         "_WorkItem.run", "_connection_worker_thread", "Context.run", "Handle._run",
         "BaseEventLoop.run_", "BaseEventLoop._run_once")


def collapse(raw: str, appends: int, rate: int, top: int) -> list[str]:
    """Top frames of py-spy's collapsed stacks, self and total, and self time by file, in us
    per append (the loop and thread roots are left out of the totals)."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    files: Counter[str] = Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        where = frames[-1].rpartition("(")[2].split(":")[0]
        files[where.split("/site-packages/")[-1]] += n
        for f in set(frames):
            if not f.startswith(ROOTS):
                total[f] += n
    us = 1e6 / rate / appends
    out = [f"{samples} samples at {rate}/s over {appends} appends: {samples * us:.0f} us "
           "per append"]
    for title, counter in (("self time", own), ("total time", total), ("self time by file",
                                                                      files)):
        out.append(f"-- top {top} by {title}, us per append (share of samples)")
        out += [f"{n * us:8.1f} us  {n / samples:6.1%}  {frame}"
                for frame, n in counter.most_common(top)]
    return out


async def profile(directory: str, count: int, rate: int, top: int,
                  keep: str | None = None) -> list[str]:
    """B3 twice under py-spy: sampling only the thread holding the GIL (the Python work),
    then every thread not idle (SQLite and fsync too)."""
    pyspy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    if not os.path.exists(pyspy):
        return ["py-spy is not installed (pip install py-spy): no profile"]
    out: list[str] = []
    for mode, flags in (("holding the GIL", ["--gil"]), ("all threads, not idle", [])):
        d = DaemonProcess(tempfile.mkdtemp(dir=directory))
        await d.start()
        out_file = os.path.join(directory, f"b3-{len(out)}.txt")
        try:
            assert d.proc is not None
            loop = loop_in_use(d.proc.pid)
            spy = subprocess.Popen([pyspy, "record", "--pid", str(d.proc.pid), "--rate",
                                    str(rate), "--format", "raw", "--output", out_file,
                                    "--nonblocking", *flags],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            await anyio.sleep(1.0)  # py-spy attaches
            med, (user, system) = await b3(d, count)
            spy.send_signal(2)
            _, err = spy.communicate(timeout=60)
        finally:
            d.stop()
        if not os.path.exists(out_file):
            return [f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}"]
        with open(out_file) as f:
            raw = f.read()
        if keep:
            shutil.copy(out_file, os.path.join(keep, f"b3-{'gil' if flags else 'all'}.txt"))
        out += ["", f"B3 under py-spy, {mode} ({loop}): {med:.3f} ms median, daemon "
                f"CPU/append {user + system:.0f} us (user {user:.0f}, system {system:.0f})",
                *collapse(raw, count, rate, top)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.loops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes, one round")
    p.add_argument("--rounds", type=int, help="rounds of both loops (default 3; 0: profile only)")
    p.add_argument("--trees", help="compare source trees, NAME=DIR,NAME=DIR (default loop)")
    p.add_argument("--profile", action="store_true", help="then profile B3 with py-spy")
    p.add_argument("--profile-appends", type=int, default=5_000)
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--profile-raw", help="keep py-spy's collapsed stacks in this directory")
    args = p.parse_args()
    b1_total, b3_count = (3_200, 500) if args.quick else (16_000, 3_000)
    rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="sdb-loops-") as directory:
        per_row = baseline.write_rows(directory, 1_000 if args.quick else 3_000, 1)
        print(f"raw SQLite, one transaction per row (WAL, synchronous=FULL): "
              f"{per_row.rows_per_s:,.0f} rows/s, {per_row.median_row_s * 1e3:.3f} ms/row; "
              f"B1 {b1_total:,} appends by 16 clients, B3 {b3_count:,} sequential", flush=True)

        trees = dict(t.split("=", 1) for t in args.trees.split(",")) if args.trees else {}
        variants = tuple(trees) if trees else LOOPS
        default_loop = "uvloop" if loop_available() else "asyncio"

        async def run() -> list[str]:
            runs: list[Run] = []
            for r in range(rounds):
                print(f"round {r + 1}", flush=True)
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    if trees:
                        runs += await one_round(directory, default_loop, b1_total, b3_count,
                                                trees[variant], variant)
                    else:
                        runs += await one_round(directory, variant, b1_total, b3_count)
            lines = summary(runs, variants, per_row.rows_per_s)
            if args.profile:
                lines += ["", *await profile(directory, args.profile_appends, 1000, args.top,
                                                args.profile_raw)]
            return lines

        print("\n".join(anyio.run(run)))


if __name__ == "__main__":
    main()
