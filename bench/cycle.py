"""How much of the writer's cycle the commit takes, at sixteen writers:
`python -m bench.cycle TREE [TREE ...] [--rounds N] [--appends N]`.

Each round starts one fresh daemon per tree (trees as in bench.levers: the first is the
baseline; the order reversed every other round) and runs W2 alone: sixteen `AsyncClient`
writers, each appending ~200 B messages to a session of its own. From `daemon.stats`
(nothing else ran in the daemon's minute) it prints the commands per commit, the mean
time the writer waited for a commit (`commit_latency_ms`: the store's call, the thread
hop both ways included) and the cycle, one commit's share of a second at that rate. A
commit share near 100 % means commits follow one another with nothing between them; the
rest of the cycle is the writer deciding the batch and answering it.
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
                        commit_ms = (await c.stats()).commit_latency_ms or 0.0
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
