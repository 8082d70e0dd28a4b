"""Old against new, daemon by daemon: `python -m bench.levers TREE [TREE ...] [--rounds N]`.

Each TREE is a checkout of sessiond (its daemon/, schemas/ and client/ go first on the
daemon's PYTHONPATH); the first is the baseline. Every round starts one fresh daemon per
tree, in turn, on a fresh database, and runs the issue-31 workload through the real
`AsyncClient` of this tree:

- W1: one writer, sequential `message.append` of ~200 B to its own session;
- W2: sixteen writers, each appending to its own session.

It prints appends/s and daemon CPU per append (user + system, from /proc) for each tree,
the medians over the rounds and each tree's ratio to the first. Trees alternate within a
round, so load on the machine falls on every side alike; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time

import anyio

from sessiond import AsyncClient

from .daemon import DaemonProcess, threads_cpu_s

CONTENT = "x" * 200
KEYS = ("w1", "w1cpu", "w1thr", "w2", "w2cpu", "w2thr", "w2batch", "pages")


class TreeDaemon(DaemonProcess):
    """A daemon run from another checkout's sources."""

    def __init__(self, tree: str, directory: str, *extra: str) -> None:
        super().__init__(directory, *extra)
        self.tree = tree

    async def start(self) -> float:
        paths = [os.path.join(self.tree, p) for p in ("client", "daemon", "schemas", "")]
        old = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join(paths)
        try:
            return await super().start()
        finally:
            if old is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = old


async def workload(d: DaemonProcess, writers: int,
                   per: int) -> tuple[float, float, float, float]:
    """`writers` clients, each `per` appends to a session of its own: (appends/s, daemon
    CPU us per append, the writer thread's CPU us per append, commands per commit)."""
    async with AsyncClient(d.socket) as c:
        sids = [(await c.create_session()).session_id for _ in range(writers)]
        before = await c.stats()

    async def writer(sid: str) -> None:
        async with AsyncClient(d.socket) as own:
            for _ in range(per):
                await own.append_message(sid, "user", CONTENT)

    assert d.proc is not None
    pid = d.proc.pid
    cpu0, threads0, t0 = d.cpu_s(), threads_cpu_s(pid), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for sid in sids:
            tg.start_soon(writer, sid)
    elapsed, cpu = time.perf_counter() - t0, d.cpu_s() - cpu0
    # The busiest thread but the main one: the SQLite writer's.
    wcpu = max(v - threads0.get(t, 0.0) for t, v in threads_cpu_s(pid).items()
               if t != str(pid))
    n = writers * per
    async with AsyncClient(d.socket) as c:
        after = await c.stats()
    batch = ((after.write_commands - before.write_commands)
             / max(1, after.write_transactions - before.write_transactions))
    return n / elapsed, cpu / n * 1e6, wcpu / n * 1e6, batch


async def pages_per_commit(d: DaemonProcess, commits: int = 50) -> float:
    """WAL frames (pages) one single-event commit writes: the WAL emptied from outside
    while the daemon is idle, then `commits` sequential appends (one commit each)."""
    async with AsyncClient(d.socket) as c:
        sid = (await c.create_session()).session_id
        for _ in range(10):
            await c.append_message(sid, "user", CONTENT)
        con = sqlite3.connect(d.db)
        try:
            page = con.execute("PRAGMA page_size").fetchone()[0]
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            con.close()
        for _ in range(commits):
            await c.append_message(sid, "user", CONTENT)
    frames = (os.path.getsize(d.db + "-wal") - 32) / (page + 24)
    return frames / commits


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--w1", type=int, default=1500, help="appends of the one writer")
    ap.add_argument("--w2", type=int, default=300, help="appends of each of the 16")
    ap.add_argument("--extra", default="", help="daemon arguments, for every tree")
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        t: {k: [] for k in KEYS} for t in args.trees}
    for r in range(args.rounds):
        order = args.trees if r % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            with tempfile.TemporaryDirectory() as directory:
                d = TreeDaemon(tree, directory, *args.extra.split())
                await d.start()
                try:
                    pages = await pages_per_commit(d)
                    w1, w1cpu, w1thr, _ = await workload(d, 1, args.w1)
                    w2, w2cpu, w2thr, w2batch = await workload(d, 16, args.w2)
                finally:
                    d.stop()
            res = results[tree]
            for k, v in zip(KEYS, (w1, w1cpu, w1thr, w2, w2cpu, w2thr, w2batch, pages),
                            strict=True):
                res[k].append(v)
            print(f"round {r + 1} {tree}: W1 {w1:,.0f}/s {w1cpu:.0f} ({w1thr:.0f}) us/append;"
                  f" W2 {w2:,.0f}/s {w2cpu:.0f} ({w2thr:.0f}) us/append, {w2batch:.1f}/commit;"
                  f" {pages:.1f} pages/commit", flush=True)
    base = {k: statistics.median(v) for k, v in results[args.trees[0]].items()}
    print(f"load: {os.getloadavg()[0]:.2f} (1 min)")
    print("| tree | W1 appends/s | W1 CPU us/append | W1 writer thread | W2 appends/s"
          " | W2 CPU us/append | W2 writer thread | W2 appends/commit | pages/commit (W1) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for tree in args.trees:
        m = {k: statistics.median(v) for k, v in results[tree].items()}
        cells = [f"{m[k]:,.{1 if k in ('pages', 'w2batch') else 0}f}"
                 f" ({m[k] / base[k]:.2f}x)" for k in KEYS]
        print(f"| {tree} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(anyio.run(main))
