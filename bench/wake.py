"""How much of a one-writer append's event-loop CPU is the loop waking from idle (issue 31).

    python -m bench.wake                    # 3 rounds of 3,000 appends a variant
    python -m bench.wake --rounds 5 --appends 4000 --idle-ms 1.0
    python -m bench.wake --trees old=/tmp/old,new=. --variants hop   # two trees' loops

W1 of bench.peers (one blocking `Client` appending ~200 B messages, each acknowledged
before the next is sent) against three daemons that differ only in what the writer's
commit does (a wrapper around the SQLite store, everything else the daemon's own):

- `commit`: the real commit, as shipped;
- `hop`: nothing is stored; the batch goes to the SQLite writer thread and straight back;
- `hop+idle`: the same, the thread sleeping `--idle-ms` there (the GIL released), as long
  as about what a real one-event commit waits for its fsync.

The event loop runs the same Python in all three (decide, fold, adopt, ring, reply); only
how long it then sits idle differs. Printed per variant: appends/s, the loop thread's CPU
per append and the other threads' (the SQLite writer), medians (min-max) of the rounds,
the order reversed every other round; then each figure's loop CPU against the first
tree's `hop` (or first variant), measured in the same rounds. `--trees` runs the daemons
of other source trees (their `client/`, `daemon/`, `schemas/`) beside this one. (A daemon
whose commits store nothing is only a measuring device: never for the test run.)
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .daemon import threads_cpu_s
from .peers import load, result, tree_env, wait_for, worker

VARIANTS = ("commit", "hop", "hop+idle")


def _daemon(variant: str, sock: str, db: str, idle_s: float) -> None:
    """The daemon of `variant` (this process, until SIGTERM)."""
    import anyio

    from sessiond_daemon.__main__ import loop_options
    from sessiond_daemon.serve import lifecycle, logs
    from sessiond_daemon.serve.config import load as load_config

    class Wrapped:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def commit(self, batch: Any) -> None:
            if variant == "commit":
                return await self.inner.commit(batch)  # type: ignore[no-any-return]
            await self.inner._on_writer(time.sleep, idle_s if variant == "hop+idle" else 0)
            return None

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

    async def serve() -> None:
        config = load_config(None, {"socket": sock, "db": db, "log_level": "warning"}, env={})
        shutdown = anyio.Event()
        with anyio.open_signal_receiver(signal.SIGTERM) as signals:
            async with anyio.create_task_group() as tg:
                await tg.start(lambda task_status: lifecycle.run(
                    config, shutdown, task_status=task_status,
                    store_factory=lambda c: Wrapped(lifecycle.default_store(c))))
                async for _ in signals:
                    shutdown.set()
                    break

    logs.configure("warning", "json")
    anyio.run(serve, backend="asyncio", backend_options=loop_options())


def _threads_cpu_s(pid: int) -> tuple[float, float]:
    """CPU seconds of the process's main thread (the event loop) and of all the others."""
    threads = threads_cpu_s(pid)
    main = threads.pop(str(pid), 0.0)
    return main, sum(threads.values())


def figure(directory: str, tree: str | None, variant: str, appends: int,
           idle_s: float) -> tuple[float, ...]:
    """(appends/s, loop CPU us per append, other threads' CPU us per append)."""
    home = tempfile.mkdtemp(dir=directory)
    sock, db = os.path.join(home, "d.sock"), os.path.join(home, "d.db")
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = tree_env(tree)  # the tree's packages, and this tree's bench
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), here) if p)
    daemon = subprocess.Popen([sys.executable, "-m", "bench.wake", "--daemon", variant, sock,
                               db, str(idle_s)], cwd=here, env=env)
    try:
        wait_for(sock, daemon)
        client = worker(["client", sock, str(appends), "append"], stdin=subprocess.PIPE)
        assert client.stdout is not None and client.stdin is not None
        if client.stdout.readline().strip() != "ready":
            raise RuntimeError("the writer did not connect")
        main0, rest0 = _threads_cpu_s(daemon.pid)
        client.stdin.write("go\n")
        client.stdin.flush()
        r = result(client)
        main1, rest1 = _threads_cpu_s(daemon.pid)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    return (appends / (r["end"] - r["start"]), (main1 - main0) / appends * 1e6,
            (rest1 - rest0) / appends * 1e6)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.wake", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--appends", type=int, default=3_000)
    p.add_argument("--idle-ms", type=float, default=1.0)
    p.add_argument("--trees", help="NAME=DIR,... (default: this tree)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS))
    p.add_argument("--daemon", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.daemon:
        variant, sock, db, idle = args.daemon
        _daemon(variant, sock, db, float(idle))
        return
    trees: dict[str, str | None] = (dict(t.split("=", 1) for t in args.trees.split(","))
                                    if args.trees else {"this": None})
    variants = [v for v in args.variants.split(",") if v in VARIANTS]
    runs = [(name, v) for name in trees for v in variants]
    print(f"bench.wake: W1, {args.appends:,} appends a figure, {args.rounds} rounds,"
          f" idle {args.idle_ms} ms; load {load()}", flush=True)
    got: dict[tuple[str, str], list[tuple[float, ...]]] = {run: [] for run in runs}
    with tempfile.TemporaryDirectory(prefix="sdb-wake-") as directory:
        for r in range(args.rounds):
            for name, v in runs if r % 2 == 0 else runs[::-1]:
                f = figure(directory, trees[name], v, args.appends, args.idle_ms / 1000)
                got[name, v].append(f)
                print(f"  round {r + 1} {name} {v:<9} {f[0]:7,.0f} appends/s  loop"
                      f" {f[1]:4.0f} us  other threads {f[2]:4.0f} us per append", flush=True)
    print(f"load after: {load()}")
    print("| tree | variant | appends/s | event loop CPU per append | other threads' CPU per"
          " append | loop CPU / the first figure's |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = next(run for run in runs if run[1] == "hop") if "hop" in variants else runs[0]
    first = statistics.median(f[1] for f in got[base])
    for name, v in runs:
        cols = [[f[i] for f in got[name, v]] for i in range(3)]
        cells = [f"{statistics.median(c):,.0f} ({min(c):,.0f}-{max(c):,.0f})" for c in cols]
        print(f"| {name} | {v} | {' | '.join(cells)} |"
              f" {statistics.median(cols[1]) / first:.2f}x |")


if __name__ == "__main__":
    main()
