"""How much of the writer's cycle the commit takes, at sixteen writers:
`python -m bench.cycle TREE [TREE ...] [--rounds N] [--appends N]`.

Each round starts one fresh daemon per tree (trees as in bench.levers: the first is the
baseline; the order reversed every other round) and runs W2 alone: sixteen `AsyncClient`
writers, each appending ~200 B messages to a session of its own. It prints the commands
per commit (counted over the appends), the mean time the writer waited for a commit
(`daemon.stats`' `commit_latency_ms`, over the daemon's last minute: the appends' commits
and the 16 creations before them; the store's call, the thread hop both ways included;
keep a run under a minute) and the cycle, the time per commit at that rate. A commit
share near 100 % means commits follow one another with nothing between them; the rest of
the cycle is the writer deciding and answering batches, the search index's catch-up
steps between them, and any wait for work.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile

import anyio

from sessiond import AsyncClient

from .levers import TreeDaemon, workload

KEYS = ("rate", "batch", "commit_ms", "cycle_ms", "share", "cpu", "thread")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--appends", type=int, default=500, help="appends of each of the 16")
    args = ap.parse_args()
    results: dict[str, dict[str, list[float]]] = {
        t: {k: [] for k in KEYS} for t in args.trees}
    for r in range(args.rounds):
        for tree in args.trees if r % 2 == 0 else list(reversed(args.trees)):
            with tempfile.TemporaryDirectory() as directory:
                d = TreeDaemon(tree, directory)
                await d.start()
                try:
                    rate, cpu, thread, batch = await workload(d, 16, args.appends)
                    async with AsyncClient(d.socket) as c:
                        latency = (await c.stats()).commit_latency_ms
                    if latency is None:
                        raise SystemExit(f"{tree}: its daemon.stats has no commit_latency_ms")
                    commit_ms = latency
                finally:
                    d.stop()
            cycle_ms = 1000 * batch / rate
            row = (rate, batch, commit_ms, cycle_ms, commit_ms / cycle_ms, cpu, thread)
            for k, v in zip(KEYS, row, strict=True):
                results[tree][k].append(v)
            print(f"round {r + 1} {tree}: {rate:,.0f} appends/s, {batch:.1f}/commit, commit"
                  f" {commit_ms:.2f} ms of a {cycle_ms:.2f} ms cycle ({commit_ms / cycle_ms:.0%});"
                  f" daemon CPU {cpu:.0f} us/append, writer thread {thread:.0f}", flush=True)
    base = {k: statistics.median(v) for k, v in results[args.trees[0]].items()}
    print("| tree | appends/s | appends/commit | commit ms | cycle ms | commit share"
          " | daemon CPU us/append | writer thread us/append |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for tree in args.trees:
        m = {k: statistics.median(v) for k, v in results[tree].items()}
        cells = [f"{m['rate']:,.0f} ({m['rate'] / base['rate']:.2f}x)", f"{m['batch']:.1f}",
                 f"{m['commit_ms']:.2f}", f"{m['cycle_ms']:.2f}", f"{m['share']:.0%}",
                 f"{m['cpu']:.0f} ({m['cpu'] / base['cpu']:.2f}x)",
                 f"{m['thread']:.0f} ({m['thread'] / base['thread']:.2f}x)"]
        print(f"| {tree} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(anyio.run(main))
