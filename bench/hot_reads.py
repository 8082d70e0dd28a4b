"""session.get of a session being written back to back, beside one that is not (issue 31).

    python -m bench.hot_reads                              # this tree, 3 rounds
    python -m bench.hot_reads --trees old=/tmp/old,new=. --rounds 4 --gets 2000
    python -m bench.hot_reads --writers 4      # four writers of "hot": commits back to back

A daemon (of each tree) on a fresh SQLite file, a writer process (`--writers` of them)
appending ~200 B messages to session "hot" back to back (the blocking `Client`, each
append acknowledged before the next), and this process reading with `session.get`, one
call after another, once the writers have written for `--warm-s` seconds: `--gets` reads
of "hot", then as many of "cold" (a session of 20 messages nobody writes), while the
writers go on (`--phases` reads them in other turns, such as cold,hot,cold,hot). A read
of "hot" nearly always meets a commit in flight that changes it. Printed for each phase:
the reads' rate and latency (p50, p99), the writers' appends/s meanwhile, and the
daemon's CPU per operation (its whole CPU over reads plus appends). Rounds alternate the
trees' order.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from .daemon import cpu_s
from .peers import load, tree_env, wait_for

CONTENT = "x" * 200
WRITER = """
import sys
from sessiond import Client
with Client(sys.argv[1]) as c:
    print("ready", flush=True)
    while True:
        c.append_message("hot", "user", sys.argv[2])
"""


def figures(directory: str, tree: str | None, gets: int, warm_s: float, phases: list[str],
            writers: int) -> dict[str, tuple[float, ...]]:
    """{phase ("hot", "cold", "hot 2", ...): (reads/s, p50 us, p99 us, writer appends/s,
    daemon CPU us/op)}."""
    from sessiond import Client

    home = tempfile.mkdtemp(dir=directory)
    sock, db = os.path.join(home, "d.sock"), os.path.join(home, "d.db")
    env = tree_env(tree)
    daemon = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                               "--db", db, "--log-level", "warning"], env=env)
    procs: list[subprocess.Popen[str]] = []
    try:
        wait_for(sock, daemon)
        got: dict[str, tuple[float, ...]] = {}
        with Client(sock) as c:
            for sid in ("hot", "cold"):
                c.create_session(sid)
                for _ in range(20):
                    c.append_message(sid, "user", CONTENT)
            procs = [subprocess.Popen([sys.executable, "-c", WRITER, sock, CONTENT], env=env,
                                      stdout=subprocess.PIPE, text=True)
                     for _ in range(writers)]
            for writer in procs:
                assert writer.stdout is not None
                if writer.stdout.readline().strip() != "ready":
                    raise RuntimeError("a writer did not connect")
            time.sleep(warm_s)  # past the first WAL checkpoints: the steady state
            for i, sid in enumerate(phases):
                v0, cpu0, t0 = c.get_session("hot").version, cpu_s(daemon.pid), time.monotonic()
                lat = []
                for _ in range(gets):
                    a = time.perf_counter()
                    c.get_session(sid)
                    lat.append(time.perf_counter() - a)
                t1, cpu1 = time.monotonic(), cpu_s(daemon.pid)
                appends = c.get_session("hot").version - v0
                lat.sort()
                seen = phases[:i].count(sid)
                got[f"{sid} {seen + 1}" if seen else sid] = (
                    gets / (t1 - t0), lat[len(lat) // 2] * 1e6, lat[int(len(lat) * 0.99)] * 1e6,
                    appends / (t1 - t0), (cpu1 - cpu0) / (gets + appends) * 1e6)
        return got
    finally:
        for writer in procs:
            writer.kill()
            writer.wait()
        daemon.terminate()
        daemon.wait(timeout=60)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.hot_reads", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gets", type=int, default=2_000)
    p.add_argument("--warm-s", type=float, default=3.0,
                   help="seconds the writer writes before the reads start")
    p.add_argument("--trees", help="NAME=DIR,... (default: this tree)")
    p.add_argument("--writers", type=int, default=1, help='processes writing "hot"')
    p.add_argument("--phases", default="hot,cold",
                   help="the sessions read, in turn, on each daemon (hot or cold)")
    args = p.parse_args()
    trees: dict[str, str | None] = (dict(t.split("=", 1) for t in args.trees.split(","))
                                    if args.trees else {"this": None})
    names = list(trees)
    phases = [ph for ph in args.phases.split(",") if ph in ("hot", "cold")]
    print(f"bench.hot_reads: {args.gets:,} reads a figure, {args.writers} writer(s),"
          f" {args.rounds} rounds;"
          f" load {load()}", flush=True)
    got: dict[tuple[str, str], list[tuple[float, ...]]] = {}
    with tempfile.TemporaryDirectory(prefix="sdb-hot-") as directory:
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                run = figures(directory, trees[name], args.gets, args.warm_s, phases,
                              args.writers)
                for sid, f in run.items():
                    got.setdefault((name, sid), []).append(f)
                    print(f"  round {r + 1} {name} {sid:<6} {f[0]:6,.0f} reads/s  p50"
                          f" {f[1]:5.0f} us  p99 {f[2]:5.0f} us  writer {f[3]:5,.0f}"
                          f" appends/s  daemon CPU {f[4]:4.0f} us/op", flush=True)
    print(f"load after: {load()}")
    print("| tree | session | reads/s | read p50, us | read p99, us | writers' appends/s"
          " | daemon CPU per read or append, us |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for (name, sid), fs in got.items():
        cells = [f"{statistics.median(c):,.0f} ({min(c):,.0f}-{max(c):,.0f})"
                 for c in zip(*fs, strict=True)]
        print(f"| {name} | {sid} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
