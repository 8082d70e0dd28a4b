"""The peers table of issue 31: sessiond's blocking `Client` beside openai-agents'
`SQLiteSession` and a raw sqlite3 in-process group commit, same workload, paired rounds.

    python -m bench.peers                       # 3 rounds, 4,000 appends a figure
    python -m bench.peers --quick               # 1 round, 800 appends
    python -m bench.peers --trees old=/tmp/old-9b19302,new=.   # sessiond of two trees
    python -m bench.peers --trees old=OLD,server=NEW:OLD        # a tree's daemon, another's client
    python -m bench.peers --floor               # and bench.floor: the work and SQL alone

The workload: appends of ~200 B messages, durable (acknowledged means on disk), each
writer its own conversation. W1: one writer, sequential appends. W2: 16 writers at once.

- sessiond: a real daemon (default settings: durability full) of each tree, on a fresh
  database each figure; each writer a process of its own with a `Client` of the same tree
  (16 agents on one host are 16 processes), started together once all have connected.
  Daemon CPU per append is read from /proc of the daemon; the writers' CPU from theirs.
- `SQLiteSession` (the SDK's own store; WAL, the sqlite3 module's default synchronous,
  printed): one process, asyncio, a session object per writer on one database file, as
  bench.sdks runs it. Its CPU per append is the whole process's.
- raw sqlite3, in-process group commit (WAL, synchronous=FULL): one process, a thread per
  writer handing its row to one committer thread, which inserts whatever is queued in one
  transaction and wakes the writers after COMMIT. The ceiling for W2; W1 is context.
- P1 (sessiond only): one `Client` calling daemon.ping in a loop, the serving path and the
  client's round trip alone (no writer, no SQLite): where the socket levers show.
- `--floor`: bench/floor.py, sessiond's per-append work and SQL with nothing else, served
  to the same client processes on a database this tree's daemon made (W1, W2 only):
  `floor`, `floor-log` (no view row in the commit), `floor-thread` (decided on the
  committing thread).

Each round runs every variant once, the order reversed every other round; printed are
each round's figures, then medians with min-max, and the ratios the issue's targets are
about (W1 >= 1.0x SQLiteSession; W2 >= 3x SQLiteSession and >= 0.6x raw group commit;
daemon CPU per append <= 150 us at 1 writer, <= 55 us at 16). `uptime`'s load is printed
before and after: on a shared machine read the ratios, measured in the same rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from .daemon import cpu_s

CONTENT = "x" * 200
WRITERS = (1, 16)
MAX_GROUP = 256  # rows one group commit takes at most


def self_cpu_s() -> float:
    """User + system CPU seconds this process (all its threads) has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def report(start: float, end: float, appends: int, cpu: float, **extra: object) -> None:
    """A worker's figures, one JSON line on stdout for the parent."""
    print(json.dumps({"start": start, "end": end, "appends": appends, "cpu": cpu, **extra}),
          flush=True)


# --- workers (each its own process) ----------------------------------------------------

def client_worker(socket_path: str, appends: int, what: str = "append",
                  session_id: str | None = None) -> None:
    """One sessiond writer: connect, say ready, wait for go, append (or ping), report.
    `session_id`: append to that session (made already) instead of a new one."""
    from sessiond import Client

    with Client(socket_path) as c:
        sid = session_id or c.create_session().session_id
        c.append_message(sid, "user", CONTENT)  # warm: the session is in the writer's cache
        print("ready", flush=True)
        sys.stdin.readline()
        cpu0, t0 = self_cpu_s(), time.monotonic()
        if what == "ping":  # the serving path alone: no writer, no SQLite
            for _ in range(appends):
                c.ping()
        for i in range(appends if what == "append" else 0):
            c.append_message(sid, "user" if i % 2 else "assistant", f"{i} {CONTENT}")
        t1, cpu1 = time.monotonic(), self_cpu_s()
    report(t0, t1, appends, cpu1 - cpu0)


def sqlitesession_worker(directory: str, writers: int, appends: int) -> None:
    """`writers` SQLiteSessions on one file, concurrent on one event loop."""
    from agents import SQLiteSession

    db = os.path.join(directory, "agents.db")
    sessions = [SQLiteSession(f"w{w}", db) for w in range(writers)]
    with sqlite3.connect(db) as con:
        synchronous = con.execute("PRAGMA synchronous").fetchone()[0]
        journal = con.execute("PRAGMA journal_mode").fetchone()[0]
    per = appends // writers

    async def write(session: SQLiteSession) -> None:
        for i in range(per):
            await session.add_items([{"role": "user" if i % 2 else "assistant",
                                      "content": f"{i} {CONTENT}"}])

    async def run() -> tuple[float, float, float]:
        await asyncio.gather(*(s.add_items([{"role": "user", "content": "warm"}])
                               for s in sessions))
        cpu0, t0 = self_cpu_s(), time.monotonic()
        await asyncio.gather(*(write(s) for s in sessions))
        return t0, time.monotonic(), self_cpu_s() - cpu0

    t0, t1, cpu = asyncio.run(run())
    for s in sessions:
        s.close()
    report(t0, t1, per * writers, cpu, synchronous=synchronous, journal=journal)


def raw_worker(directory: str, writers: int, appends: int) -> None:
    """`writers` threads; one committer thread commits whatever is queued, then wakes them."""
    db = os.path.join(directory, "raw.db")
    con = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, session TEXT NOT NULL,"
                " seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,"
                " created REAL NOT NULL, UNIQUE (session, seq))")
    pending: queue.SimpleQueue[tuple[tuple[str, int, str, str, float], threading.Event] | None]
    pending = queue.SimpleQueue()

    def committer() -> None:
        while True:
            first = pending.get()
            if first is None:
                return
            group = [first]
            while len(group) < MAX_GROUP:
                try:
                    item = pending.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    pending.put(None)
                    break
                group.append(item)
            con.execute("BEGIN")
            con.executemany("INSERT INTO messages (session, seq, role, content, created)"
                            " VALUES (?, ?, ?, ?, ?)", [row for row, _ in group])
            con.execute("COMMIT")
            for _, done in group:
                done.set()

    per = appends // writers
    go = threading.Barrier(writers + 1)

    def writer(w: int) -> None:
        done = threading.Event()
        go.wait()
        for i in range(per):
            done.clear()
            pending.put(((f"w{w}", i, "user" if i % 2 else "assistant", f"{i} {CONTENT}",
                          time.time()), done))
            done.wait()

    thread = threading.Thread(target=committer)
    thread.start()
    threads = [threading.Thread(target=writer, args=(w,)) for w in range(writers)]
    for t in threads:
        t.start()
    cpu0, t0 = self_cpu_s(), time.monotonic()
    go.wait()
    for t in threads:
        t.join()
    t1, cpu = time.monotonic(), self_cpu_s() - cpu0
    pending.put(None)
    thread.join()
    con.close()
    report(t0, t1, per * writers, cpu)


# --- the parent ------------------------------------------------------------------------

@dataclass
class Figure:
    variant: str  # sessiond[tree], SQLiteSession, raw
    writers: int
    rate: float  # appends/s
    cpu_us: float  # per append: the daemon's (sessiond) or the whole process's (peers)
    client_us: float = 0.0  # sessiond: its writer processes' CPU per append
    note: str = ""


def tree_env(tree: str | None) -> dict[str, str]:
    """The environment that makes a subprocess import `tree`'s sources (None: as installed)."""
    if tree is None:
        return dict(os.environ)
    root = os.path.abspath(tree)
    path = os.pathsep.join(os.path.join(root, d) for d in ("client", "daemon", "schemas"))
    return {**os.environ, "PYTHONPATH": path}


def worker(args: list[str], env: dict[str, str] | None = None,
           stdin: int | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "bench.peers", "--worker", *args],
                            stdout=subprocess.PIPE, stdin=stdin, text=True, env=env,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def result(proc: subprocess.Popen[str]) -> dict[str, float]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if proc.wait(timeout=600) != 0 or not line:
        raise RuntimeError(f"a worker failed (exit {proc.returncode})")
    parsed: dict[str, float] = json.loads(line)
    return parsed


def sessiond_figure(directory: str, name: str, tree: str | None, writers: int,
                    appends: int, what: str = "append") -> Figure:
    """A fresh daemon of `tree`; `writers` client processes of the same tree (a tree
    DAEMON_DIR:CLIENT_DIR: the daemon of one, the client of the other)."""
    daemon_tree, _, client_tree = (tree or "").partition(":")
    env = tree_env(daemon_tree or None)
    client_env = tree_env(client_tree or daemon_tree or None)
    home = tempfile.mkdtemp(dir=directory)
    sock, db = os.path.join(home, "d.sock"), os.path.join(home, "d.db")
    daemon = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                               "--db", db, "--log-level", "warning"], env=env)
    try:
        wait_for(sock, daemon)
        per = appends // writers
        return run_writers(name, daemon, [["client", sock, str(per), what]] * writers,
                           client_env, writers if what == "append" else 0)
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)


def run_writers(name: str, server: subprocess.Popen[bytes], workers: list[list[str]],
                env: dict[str, str], writers: int) -> Figure:
    """Start a client process for each of `workers` (their arguments), then, once all
    are ready, let them go together; the server's CPU is read from then to their last
    report (a little more than the appends' span, never less)."""
    procs = [worker(args, env, subprocess.PIPE) for args in workers]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != "ready":
            raise RuntimeError("a writer did not connect")
    cpu0 = cpu_s(server.pid)
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = [result(p) for p in procs]
    server_cpu = cpu_s(server.pid) - cpu0
    total = sum(r["appends"] for r in results)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return Figure(name, writers, total / span, server_cpu / total * 1e6,
                  sum(r["cpu"] for r in results) / total * 1e6)


def floor_figure(directory: str, name: str, floor_args: list[str], writers: int,
                 appends: int) -> Figure:
    """bench.floor (sessiond's per-append work and SQL, nothing else) on a database this
    tree's daemon made, with a session for each writer in it; `writers` client processes."""
    from sessiond import Client

    home = tempfile.mkdtemp(dir=directory)
    sock, db = os.path.join(home, "d.sock"), os.path.join(home, "d.db")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = tree_env(root)
    env["PYTHONPATH"] += os.pathsep + root  # bench.floor itself
    daemon = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                               "--db", db, "--log-level", "warning"], env=env)
    try:
        wait_for(sock, daemon)
        with Client(sock) as c:
            sids = [c.create_session().session_id for _ in range(writers)]
    finally:
        daemon.terminate()
        daemon.wait(timeout=60)
    floor = subprocess.Popen([sys.executable, "-m", "bench.floor", "--socket", sock, "--db", db,
                              *floor_args], env=env, cwd=root)
    try:
        wait_for(sock, floor)
        per = appends // writers
        return run_writers(name, floor, [["client", sock, str(per), "append", sid]
                                         for sid in sids], env, writers)
    finally:
        floor.terminate()
        floor.wait(timeout=60)


def wait_for(sock: str, daemon: subprocess.Popen[bytes]) -> None:
    """Until the daemon answers a ping."""
    from sessiond import Client

    deadline = time.monotonic() + 60
    while True:
        try:
            with Client(sock) as c:
                c.ping()
            return
        except OSError:
            if daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the daemon did not start") from None
            time.sleep(0.01)


def peer_figure(directory: str, name: str, writers: int, appends: int) -> Figure:
    home = tempfile.mkdtemp(dir=directory)
    r = result(worker([name, home, str(writers), str(appends)]))
    note = (f"journal {r['journal']}, synchronous {r['synchronous']}"
            if "journal" in r else "WAL, synchronous 2 (FULL)")
    return Figure(name, writers, r["appends"] / (r["end"] - r["start"]),
                  r["cpu"] / r["appends"] * 1e6, note=note)


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def spread(values: list[float], fmt: str) -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def summary(figures: list[Figure], sessiond: list[str]) -> list[str]:
    def rates(variant: str, writers: int) -> list[float]:
        return [f.rate for f in figures if f.variant == variant and f.writers == writers]

    def cpu(variant: str, writers: int) -> list[float]:
        return [f.cpu_us for f in figures if f.variant == variant and f.writers == writers]

    def med(variant: str, writers: int) -> float:
        found = rates(variant, writers)
        return statistics.median(found) if found else float("nan")

    out = ["| figure | variant | appends/s: median (min-max) | CPU us/append (daemon or"
           " process) | sessiond writers' CPU us/append | note |",
           "| --- | --- | --- | --- | --- | --- |"]
    for writers in WRITERS:
        w = f"W{1 if writers == 1 else 2}: {writers} writer{'s' if writers > 1 else ''}"
        for variant in (*sessiond, "SQLiteSession", "raw"):
            fs = [f for f in figures if f.variant == variant and f.writers == writers]
            if not fs:
                continue
            client = spread([f.client_us for f in fs], ".0f") if variant in sessiond else ""
            out.append(f"| {w} | {variant} | {spread([f.rate for f in fs], ',.0f')} "
                       f"| {spread([f.cpu_us for f in fs], '.0f')} | {client} | {fs[0].note} |")
    for variant in sessiond:
        fs = [f for f in figures if f.variant == variant and f.writers == 0]
        if fs:
            out.append(f"| P1: 1 client, daemon.ping | {variant} "
                       f"| {spread([f.rate for f in fs], ',.0f')} pings/s "
                       f"| {spread([f.cpu_us for f in fs], '.0f')} "
                       f"| {spread([f.client_us for f in fs], '.0f')} | |")
    out += ["", "| ratio | " + " | ".join(sessiond) + " | target |",
            "| --- | " + " | ".join("---" for _ in sessiond) + " | --- |"]
    for label, den, writers, target in (
            ("W1 / SQLiteSession", "SQLiteSession", 1, ">= 1.0x"),
            ("W2 / SQLiteSession", "SQLiteSession", 16, ">= 3x"),
            ("W2 / raw group commit", "raw", 16, ">= 0.6x")):
        if not rates(den, writers):
            continue
        cells = [f"{med(s, writers) / med(den, writers):.2f}x" for s in sessiond]
        out.append(f"| {label} | " + " | ".join(cells) + f" | {target} |")
    for writers, target in ((1, "<= 150 us"), (16, "<= 55 us")):
        if not all(cpu(s, writers) for s in sessiond):
            continue
        cells = [f"{statistics.median(cpu(s, writers)):.0f} us" for s in sessiond]
        out.append(f"| daemon CPU/append, {writers} writer{'s' if writers > 1 else ''} | "
                   + " | ".join(cells) + f" | {target} |")
    base = sessiond[0]
    for b in sessiond[1:]:  # each beside the first, in the same rounds
        for writers in (0, *WRITERS):
            ra = [f for f in figures if f.variant == base and f.writers == writers]
            rb = [f for f in figures if f.variant == b and f.writers == writers]
            if not ra or not rb:
                continue
            gain = statistics.median(f.rate for f in rb) / statistics.median(f.rate for f in ra)
            cpu = (statistics.median(f.cpu_us for f in rb)
                   / statistics.median(f.cpu_us for f in ra))
            what = ("P1 (pings)" if not writers
                    else f"{writers} writer{'s' if writers > 1 else ''}")
            out.append(f"| {b} / {base}, {what} | rate {gain:.2f}x | daemon CPU {cpu:.2f}x "
                       "| |")
    return out


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="800 appends a figure, one round")
    p.add_argument("--rounds", type=int, help="paired rounds (default 3)")
    p.add_argument("--appends", type=int, help="appends a figure (default 4,000)")
    p.add_argument("--trees", help="sessiond of these source trees, NAME=DIR,NAME=DIR"
                                   " (default: the installed one)")
    p.add_argument("--only", help="figures to run: P1, W1, W2 (default all)")
    p.add_argument("--floor", action="store_true",
                   help="also bench.floor (sessiond's per-append work and SQL, nothing else)"
                        " with the view rows in the commit (floor), without (floor-log), and"
                        " deciding on the committing thread (floor-thread)")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        kind, *rest = args.worker
        if kind == "client":
            client_worker(rest[0], int(rest[1]), rest[2], *rest[3:])
        elif kind == "SQLiteSession":
            sqlitesession_worker(rest[0], int(rest[1]), int(rest[2]))
        else:
            raw_worker(rest[0], int(rest[1]), int(rest[2]))
        return
    appends = args.appends or (800 if args.quick else 4_000)
    rounds = args.rounds or (1 if args.quick else 3)
    trees: dict[str, str | None] = (dict(t.split("=", 1) for t in args.trees.split(","))
                                    if args.trees else {"sessiond": None})
    only = ({w.strip().upper() for w in args.only.split(",")} if args.only
            else {"P1", "W1", "W2"})
    writers_run = [w for w in WRITERS if f"W{1 if w == 1 else 2}" in only]
    floors = {"floor": ["--sql", "view"], "floor-log": ["--sql", "log"],
              "floor-thread": ["--sql", "view", "--decide", "thread"]} if args.floor else {}
    print(f"bench.peers: {appends:,} appends a figure, {rounds} rounds; load {load()}",
          flush=True)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="sdb-peers-") as directory:
        runs: list[tuple[str, Callable[[int], Figure]]] = [
            *((name, lambda w, n=name, t=tree: sessiond_figure(directory, n, t, w, appends))
              for name, tree in trees.items()),
            *((name, lambda w, n=name, a=floor_args: floor_figure(directory, n, a, w, appends))
              for name, floor_args in floors.items()),
            ("SQLiteSession", lambda w: peer_figure(directory, "SQLiteSession", w, appends)),
            ("raw", lambda w: peer_figure(directory, "raw", w, appends)),
        ]
        for r in range(rounds):
            if "P1" in only:
                for name, tree in trees.items() if r % 2 == 0 else list(trees.items())[::-1]:
                    f = sessiond_figure(directory, name, tree, 1, appends, "ping")
                    figures.append(f)
                    print(f"  round {r + 1} P1 {name:<14} {f.rate:8,.0f} pings/s     "
                          f"CPU/ping {f.cpu_us:4.0f} us, client {f.client_us:.0f} us",
                          flush=True)
            for writers in writers_run:
                for name, run in runs if r % 2 == 0 else runs[::-1]:
                    f = run(writers)
                    figures.append(f)
                    extra = f", writers {f.client_us:.0f} us" if f.client_us else ""
                    print(f"  round {r + 1} W{1 if writers == 1 else 2} {name:<14} "
                          f"{f.rate:8,.0f} appends/s  CPU/append {f.cpu_us:4.0f} us{extra}",
                          flush=True)
    print(f"load after: {load()}")
    print("\n".join(summary(figures, [*trees, *floors])))


if __name__ == "__main__":
    main()
