"""B11, flat in history: `python -m bench.history [--quick] [--events N] [--types a,b]`.

For every event type a client can append (and `process.output`, which only the daemon's
executor runner writes, through a real executor), one real daemon, in one run:

- the cost of one append to a session holding ~100 events of that type and to one holding
  N (100,000; 10,000 with --quick): the median round trip, and the daemon's CPU per append
  read from /proc. The two sides are sampled in alternating blocks so machine noise hits
  both alike; the small side rotates over a pool of 100-event sessions so it stays small;
- the median `session.get` of each, sampled alternately;

and the ratio large / small. Also, since a cost may grow with the store rather than with
the session (an index every session shares), the daemon CPU per append at 100 events
before the large session was filled, against after ("store-wide", minutes apart). The
target (issue 15) is at most 1.3x for every figure; the types that miss it are listed at
the end. Nothing is asserted: CI may run --quick.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import anyio

from sessiond import AsyncClient

from .daemon import DaemonProcess

TARGET = 1.3
SMALL = 100
CONTENT = "x" * 200
TYPED = {"type": "json", "data": b'{"step": 1}'}
# Prints `n` lines, n read from the last word on stdin (the task, or an injected message).
EMITTER = ("import sys\nn = int(sys.stdin.read().split()[-1])\nw = sys.stdout.write\n"
           "for i in range(n):\n    w('output line %d of an executor turn, about 60 B\\n' % i)\n")


@dataclass
class Sizes:
    events: int  # the large side
    block: int  # appends per block (one /proc reading each side)
    rounds: int  # blocks per side (executor turns per side: an eighth, at least 3)
    gets: int  # session.get samples per side
    lines: int  # process.output lines per executor turn


# Small blocks, many rounds: load on a shared machine shifts within seconds, and the sum of
# many short /proc readings (10 ms ticks) is still a fair total.
QUICK = Sizes(events=10_000, block=10, rounds=30, gets=200, lines=500)
FULL = Sizes(events=100_000, block=10, rounds=80, gets=500, lines=1_000)


@dataclass
class Row:
    type: str
    n: int
    append_ms: tuple[float, float]  # median round trip, small / large
    append_cpu_us: tuple[float, float]  # daemon CPU per append, small / large
    get_ms: tuple[float, float]  # median session.get, small / large
    fill_s: float  # seconds to build the large side
    before_cpu_us: float  # daemon CPU per append at 100 events, before the large side existed
    note: str = ""
    ratios: dict[str, float] = field(default_factory=dict)
    store_ratio: float = 0.0

    def __post_init__(self) -> None:
        self.ratios = {"append": self.append_ms[1] / self.append_ms[0],
                       "append_cpu": self.append_cpu_us[1] / self.append_cpu_us[0],
                       "get": self.get_ms[1] / self.get_ms[0]}
        # Not the session's history but the store's: the same small appends after the large
        # session was filled, against before (minutes apart, so noisier than the others).
        self.store_ratio = self.append_cpu_us[0] / self.before_cpu_us

    @property
    def missed(self) -> list[str]:
        return [k for k, r in self.ratios.items() if r > TARGET]


Fill = Callable[[AsyncClient, str, int], Awaitable[None]]
Append = Callable[[AsyncClient, str, int], Awaitable[Any]]


async def by_events(c: AsyncClient, sid: str, count: int,
                    make: Callable[[int], dict[str, Any]]) -> None:
    """Fill through events.append, 10,000 events per call."""
    done = 0
    while done < count:
        n = min(10_000, count - done)
        await c.append_events(sid, [make(done + i) for i in range(n)])
        done += n


async def by_calls(c: AsyncClient, sid: str, count: int, one: Append) -> None:
    """Fill by one call per event, 16 clients at once (group commit)."""
    ids = itertools.count()
    socket = c.socket_path

    async def client() -> None:
        async with AsyncClient(socket) as own:
            while (i := next(ids)) < count:
                await one(own, sid, i)

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(client)


def progress_event(i: int) -> dict[str, Any]:
    node = f"node-{i % 10}"
    return {"type": "progress.recorded",
            "data": {"node_id": node, "edge": f"node-{(i - 1) % 10}->{node}",
                     "latency_ms": 12, "tokens": 40}}


def tokens_event(i: int) -> dict[str, Any]:
    return {"type": "tokens.recorded",
            "data": {"input_tokens": 120, "output_tokens": 40, "estimated_cost": 0.001,
                     "model": "m"}}


def memory_event(i: int) -> dict[str, Any]:
    return {"type": "memory.updated", "data": {"patch": {f"k{i % 50}": i}}}


def state_event(i: int) -> dict[str, Any]:
    return {"type": "state.updated",
            "data": {"scope": "session", "delta": {f"k{i % 50}": i}}}


async def append_message(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.append_message(sid, "user", CONTENT)


async def append_progress(c: AsyncClient, sid: str, i: int) -> Any:
    data = progress_event(i)["data"]
    return await c.record_progress(sid, **data)


async def append_tokens(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.record_tokens(sid, input_tokens=120, output_tokens=40,
                                 estimated_cost=0.001, model="m")


async def append_checkpoint(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.save_checkpoint(sid, {"step": i}, checkpoint_id=f"cp-{i}",
                                   node_id=f"node-{i % 10}")


async def append_memory(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.update_memory(sid, {f"k{i % 50}": i})


async def append_state(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.append_events(sid, [state_event(i)])


_graph_ids = itertools.count()


async def append_graph(c: AsyncClient, sid: str, i: int) -> Any:
    return await c.call("graph.put", session_id=sid, thread_id=sid,
                        checkpoint_id=f"{next(_graph_ids):012d}", checkpoint=TYPED,
                        channel_versions={"step": str(i)}, blobs={"step": TYPED})


async def fill_messages(c: AsyncClient, sid: str, count: int) -> None:
    done = 0
    while done < count:
        n = min(5_000, count - done)
        await c.append_messages(sid, [{"role": "user", "content": CONTENT}] * n)
        done += n


# type -> (fill, one append); the session itself is event 1, so a side of n events gets
# n - 1 of the type.
TYPES: dict[str, tuple[Fill, Append]] = {
    "message": (fill_messages, append_message),
    "progress": (lambda c, s, n: by_events(c, s, n, progress_event), append_progress),
    "tokens": (lambda c, s, n: by_events(c, s, n, tokens_event), append_tokens),
    "checkpoint": (lambda c, s, n: by_calls(c, s, n, append_checkpoint), append_checkpoint),
    "memory": (lambda c, s, n: by_events(c, s, n, memory_event), append_memory),
    "graph": (lambda c, s, n: by_calls(c, s, n, append_graph), append_graph),
    "state": (lambda c, s, n: by_events(c, s, n, state_event), append_state),
}
ALL_TYPES = [*TYPES, "process"]


async def paired_gets(c: AsyncClient, small: str, large: str, n: int) -> tuple[float, float]:
    """Median ms of session.get on each side, sampled alternately."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(n):
        for sid, out in ((small, a), (large, b)):
            t0 = time.perf_counter()
            await c.get_session(sid)
            out.append(time.perf_counter() - t0)
    return statistics.median(a) * 1000, statistics.median(b) * 1000


class History:
    def __init__(self, d: DaemonProcess, c: AsyncClient, sizes: Sizes) -> None:
        self.d, self.c, self.sizes = d, c, sizes
        self.rows: list[Row] = []
        self.inject_s: list[float] = []  # session.inject round trips, in order

    async def new_session(self, kind: str) -> str:
        namespace = "langgraph" if kind == "graph" else "b11"
        return str((await self.c.create_session(namespace=namespace)).session_id)

    async def blocks(self, one: Append, pool: list[str], large: str) -> tuple[
            tuple[float, float], tuple[float, float]]:
        """Alternating blocks of appends: (median ms small, large), (CPU us small, large)."""
        times: dict[bool, list[float]] = {False: [], True: []}
        cpu = {False: 0.0, True: 0.0}
        i = 0
        per_small = max(1, self.sizes.block * self.sizes.rounds // len(pool))
        for r in range(self.sizes.rounds):
            for big in ((False, True) if r % 2 == 0 else (True, False)):
                cpu0 = self.d.cpu_s()
                for _ in range(self.sizes.block):
                    sid = large if big else pool[(i // per_small) % len(pool)]
                    t0 = time.perf_counter()
                    await one(self.c, sid, i)
                    times[big].append(time.perf_counter() - t0)
                    i += 1
                cpu[big] += self.d.cpu_s() - cpu0
        count = self.sizes.block * self.sizes.rounds
        return ((statistics.median(times[False]) * 1000, statistics.median(times[True]) * 1000),
                (cpu[False] / count * 1e6, cpu[True] / count * 1e6))

    async def measure(self, kind: str) -> Row:
        fill, one = TYPES[kind]
        n = self.sizes.events
        # The small side: a pool, each session taking 25 of the measured appends at most.
        pool = [await self.new_session(kind)
                for _ in range(max(1, self.sizes.block * self.sizes.rounds // 25))]
        for sid in pool:
            await fill(self.c, sid, SMALL - 1)
        large = await self.new_session(kind)
        before = await self.before(one, kind)
        t0 = time.perf_counter()
        await fill(self.c, large, n - 1)
        fill_s = time.perf_counter() - t0
        append_ms, cpu_us = await self.blocks(one, pool, large)
        get_ms = await paired_gets(self.c, pool[0], large, self.sizes.gets)
        return Row(kind, n, append_ms, cpu_us, get_ms, fill_s, before)

    async def before(self, one: Append, kind: str) -> float:
        """Daemon CPU per append to 100-event sessions before the large side is filled."""
        fill = TYPES[kind][0]
        pool = [await self.new_session(kind) for _ in range(4)]
        for sid in pool:
            await fill(self.c, sid, SMALL - 1)
        count = self.sizes.block * self.sizes.rounds // 2
        cpu0 = self.d.cpu_s()
        for i in range(count):
            await one(self.c, pool[i % len(pool)], i)
        return (self.d.cpu_s() - cpu0) / count * 1e6

    async def turn(self, sid: str, lines: int, inject: bool) -> tuple[float, float]:
        """One executor turn printing `lines` lines: (seconds, daemon CPU seconds)."""
        cpu0, t0 = self.d.cpu_s(), time.perf_counter()
        if inject:
            await self.c.inject(sid, str(lines))
            self.inject_s.append(time.perf_counter() - t0)
        else:
            await self.c.spawn([sys.executable, "-c", EMITTER], task=str(lines),
                               adapter="jsonl", session_id=sid, namespace="b11")
        while (await self.c.stats()).executors_running:
            await anyio.sleep(0.005)
        return time.perf_counter() - t0, self.d.cpu_s() - cpu0

    async def measure_process(self) -> Row:
        """process.output through real executor turns (a client cannot append it): a turn of
        `lines` lines on a ~100-event session and on an N-event one, alternately; the cost
        of one line is the turn's time and daemon CPU over its lines (the turn's own few
        events and the process start are in both sides alike)."""
        n, lines, rounds = self.sizes.events, self.sizes.lines, max(3, self.sizes.rounds // 8)
        # spawn writes session.created, the task message, process.started, the lines,
        # process.exited and the status change: 5 events besides the lines.
        pool = [f"b11-proc-small-{i}" for i in range(rounds + 1)]
        for sid in pool:
            await self.turn(sid, SMALL - 5, inject=False)
        before = (await self.turn(pool.pop(), lines, inject=True))[1] / lines * 1e6
        large = "b11-proc-large"
        t0 = time.perf_counter()
        await self.turn(large, n - 5, inject=False)
        fill_s = time.perf_counter() - t0
        wall = {False: 0.0, True: 0.0}
        cpu = {False: 0.0, True: 0.0}
        injects: dict[bool, list[float]] = {False: [], True: []}
        for r in range(rounds):
            for big in ((False, True) if r % 2 == 0 else (True, False)):
                w, c = await self.turn(large if big else pool[r], lines, inject=True)
                wall[big] += w
                cpu[big] += c
                injects[big].append(self.inject_s[-1] * 1000)
        inject_ms = [statistics.median(injects[big]) for big in (False, True)]
        per = lines * rounds
        row = Row("process", n, (wall[False] / per * 1000, wall[True] / per * 1000),
                  (cpu[False] / per * 1e6, cpu[True] / per * 1e6),
                  await paired_gets(self.c, pool[0], large, self.sizes.gets), fill_s, before,
                  note=f"per line of {lines}-line executor turns (the small side ends a "
                       f"turn at ~{SMALL + lines} events), append = turn time / lines; the "
                       f"turn's session.inject alone: {inject_ms[0]:.1f} -> "
                       f"{inject_ms[1]:.1f} ms")
        state = await self.c.get_session(large)
        assert state.version >= n, f"the large process session has {state.version} events"
        return row

    async def run(self, kinds: list[str]) -> None:
        for kind in kinds:
            row = await (self.measure_process() if kind == "process" else self.measure(kind))
            self.rows.append(row)
            print_row(row)


def print_row(r: Row) -> None:
    def pair(v: tuple[float, float], unit: str, key: str, fmt: str) -> str:
        return (f"{v[0]:{fmt}} -> {v[1]:{fmt}} {unit} ({r.ratios[key]:.2f}x"
                f"{'' if r.ratios[key] <= TARGET else ' MISSED'})")

    print(f"B11 {r.type:<10} n={r.n:,} (filled in {r.fill_s:.1f} s)\n"
          f"    append {pair(r.append_ms, 'ms', 'append', '.3f')}; daemon CPU/append "
          f"{pair(r.append_cpu_us, 'us', 'append_cpu', '.0f')}\n"
          f"    session.get {pair(r.get_ms, 'ms', 'get', '.3f')}\n"
          f"    store-wide: daemon CPU/append at {SMALL} before the fill {r.before_cpu_us:.0f} us,"
          f" after {r.append_cpu_us[0]:.0f} us ({r.store_ratio:.2f}x"
          f"{'' if r.store_ratio <= TARGET else ' MISSED'})"
          + (f"\n    note: {r.note}" if r.note else ""), flush=True)


def markdown(rows: list[Row]) -> str:
    out = [f"| type | append at {SMALL} / at N (ms) | ratio | daemon CPU per append (µs) "
           f"| ratio | session.get at {SMALL} / at N (ms) | ratio | met | CPU per append at "
           f"{SMALL}, before / after the fill (µs) | ratio |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        met = "yes" if not r.missed else "**no** (" + ", ".join(r.missed) + ")"
        out.append(f"| {r.type} | {r.append_ms[0]:.3f} / {r.append_ms[1]:.3f} | "
                   f"{r.ratios['append']:.2f} | {r.append_cpu_us[0]:.0f} / "
                   f"{r.append_cpu_us[1]:.0f} | {r.ratios['append_cpu']:.2f} | "
                   f"{r.get_ms[0]:.3f} / {r.get_ms[1]:.3f} | {r.ratios['get']:.2f} | {met} | "
                   f"{r.before_cpu_us:.0f} / {r.append_cpu_us[0]:.0f} | {r.store_ratio:.2f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.history", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 10,000 and small blocks")
    p.add_argument("--events", type=int, help="N, the large side (default 100,000)")
    p.add_argument("--types", help="comma-separated, of: " + ",".join(ALL_TYPES))
    p.add_argument("--out", help="JSON results (default bench/results-history.json)")
    args = p.parse_args()
    sizes = QUICK if args.quick else FULL
    if args.events:
        sizes.events = args.events
    kinds = args.types.split(",") if args.types else ALL_TYPES
    unknown = set(kinds) - set(ALL_TYPES)
    if unknown:
        p.error(f"unknown types: {', '.join(sorted(unknown))}")
    print(f"B11: N = {sizes.events:,} events against {SMALL}; blocks of {sizes.block} x "
          f"{sizes.rounds} per side; target <= {TARGET}x", flush=True)
    with tempfile.TemporaryDirectory(prefix="sdb-b11-") as directory:
        d = DaemonProcess(directory, "--max-output-lines-per-s", "1000000")

        async def run() -> History:
            await d.start()
            try:
                async with AsyncClient(d.socket) as c:
                    h = History(d, c, sizes)
                    await h.run(kinds)
                    return h
            finally:
                d.stop()

        h = anyio.run(run)
    print("\n" + markdown(h.rows))
    missed = [r.type for r in h.rows if r.missed]
    drift = [r.type for r in h.rows if r.store_ratio > TARGET]
    print(f"\nmissing the {TARGET}x target: {', '.join(missed) if missed else 'none'}"
          f"\nappends at {SMALL} costlier after the fill than before it (> {TARGET}x): "
          f"{', '.join(drift) if drift else 'none'}")
    out = args.out or os.path.join(os.path.dirname(__file__), "results-history.json")
    with open(out, "w") as f:
        json.dump({"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                              f"Python {platform.python_version()}",
                   "loop": os.environ.get("SESSIOND_LOOP", "default"),
                   "rows": [asdict(r) for r in h.rows]}, f, indent=2)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
