"""B8 tree by tree: `python -m bench.followers TREE [TREE ...] [--rounds N] [--client]`.

B8 is B1 (sixteen clients appending ~200 B messages to one session) with sixteen live
subscribers following every event (`bench.subscribers`: sixteen connections in one
process, counting lines; `--client`: sixteen of the client library's subscriptions),
against B1 without them. This runs it for each checkout of sessiond given (the first
is the baseline; `--extra` adds daemon arguments, for every tree), in paired rounds (the
trees' order reversed every other round, each round a fresh daemon and database a tree),
and prints, by tree, the medians of: appends/s without and with the followers and their
ratio (B8's target: with >= 80 % of without), the daemon's CPU per append both ways,
the subscriber process's CPU per append, and appends per commit both ways. Every line
the followers were owed must have come before a round ends.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

import anyio

from sessiond import AsyncClient

from .daemon import DaemonProcess, cpu_s
from .levers import TreeDaemon

CONTENT = "x" * 200
FOLLOWERS = 16
WRITERS = 16


async def appends(d: DaemonProcess, total: int) -> tuple[float, float, float]:
    """B1: (appends/s, daemon CPU us per append, appends per commit)."""
    async with AsyncClient(d.socket) as c:
        sid = (await c.create_session()).session_id
        before = await c.stats()
    per = total // WRITERS

    async def client() -> None:
        async with AsyncClient(d.socket) as own:
            for _ in range(per):
                await own.append_message(sid, "user", CONTENT)

    cpu0, t0 = d.cpu_s(), time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(WRITERS):
            tg.start_soon(client)
    elapsed, cpu = time.perf_counter() - t0, d.cpu_s() - cpu0
    async with AsyncClient(d.socket) as c:
        after = await c.stats()
    n = per * WRITERS
    batch = ((after.write_commands - before.write_commands)
             / max(1, after.write_transactions - before.write_transactions))
    return n / elapsed, cpu / n * 1e6, batch


async def followed(d: DaemonProcess, total: int,
                   client: bool) -> tuple[float, float, float, float]:
    """B1 with the followers: (appends/s, daemon CPU us per append, appends per commit,
    the subscriber process's CPU us per append)."""
    subs = subprocess.Popen([sys.executable, "-m", "bench.subscribers", d.socket,
                             str(FOLLOWERS), *(["--client"] if client else [])],
                            stdout=subprocess.PIPE)
    try:
        assert subs.stdout is not None and subs.stdout.readline().startswith(b"ready")
        async with AsyncClient(d.socket) as c:
            while (await c.stats()).subscriptions < FOLLOWERS:
                await anyio.sleep(0.01)
        sub0 = cpu_s(subs.pid)
        rate, cpu, batch = await appends(d, total)
        await anyio.sleep(0.2)  # what a follower is owed may still be on its way
        sub_cpu = cpu_s(subs.pid) - sub0
    finally:
        subs.terminate()
        out, _ = subs.communicate(timeout=60)
    n = total // WRITERS * WRITERS
    lines = int(out.split()[-1])  # the appends', and the new session's own events
    if lines < n * FOLLOWERS or lines % FOLLOWERS:
        raise RuntimeError(f"the followers got {lines:,} events for {n:,} appends")
    return rate, cpu, batch, sub_cpu / n * 1e6


async def round_of(tree: str, extra: list[str], total: int,
                   client: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory:
        d = TreeDaemon(tree, directory, *extra)
        await d.start()
        try:
            bare, bare_cpu, bare_batch = await appends(d, total)
            rate, cpu, batch, sub = await followed(d, total, client)
        finally:
            d.stop()
    return {"bare": bare, "with": rate, "ratio": rate / bare, "bare_cpu": bare_cpu,
            "with_cpu": cpu, "sub_cpu": sub, "bare_batch": bare_batch, "with_batch": batch}


async def main(trees: list[str], extra: list[str], rounds: int, total: int,
               client: bool) -> None:
    results: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    for r in range(rounds):
        for t in trees if r % 2 == 0 else trees[::-1]:
            got = await round_of(t, extra, total, client)
            results[t].append(got)
            print(f"round {r + 1} {t}: " + ", ".join(
                f"{k} {v:,.2f}" if k in ("ratio", "bare_batch", "with_batch")
                else f"{k} {v:,.0f}" for k, v in got.items()), flush=True)
    print()
    print("| tree | B1 appends/s | B8 appends/s | B8 / B1 | daemon CPU/append"
          " B1 -> B8 | subscriber process CPU/append | appends/commit B1 -> B8 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t, rs in results.items():
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {t} | {m['bare']:,.0f} | {m['with']:,.0f} | {m['ratio']:.2f} |"
              f" {m['bare_cpu']:.0f} -> {m['with_cpu']:.0f} us | {m['sub_cpu']:.0f} us |"
              f" {m['bare_batch']:.1f} -> {m['with_batch']:.1f} |")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trees", nargs="+", help="checkouts of sessiond (the first: baseline)")
    ap.add_argument("--extra", default="", help="daemon arguments, for every tree")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--appends", type=int, default=3000, help="per B1 run")
    ap.add_argument("--client", action="store_true",
                    help="the followers are the client library's subscriptions, not raw"
                         " connections that count lines")
    a = ap.parse_args()
    anyio.run(main, a.trees, a.extra.split(), a.rounds, a.appends, a.client)
