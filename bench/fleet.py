"""B12, fleet mode: appends per second with 1, 2 and 4 daemons on one PostgreSQL database
(16 writers in all, and 16 per daemon), what each commit costs (events, round trips, the
counter row's lock), CPU per append of the daemons and of their PostgreSQL backends, the
raw counter-row design in the same run, one daemon on SQLite, and cross-host
subscription lag (commit to delivery, p50 and p99).

    pip install -e '.[fleet]'
    python -m bench.fleet [--dsn postgresql://USER@HOST:5432/DB] [--quick] [--out FILE]
                          [--baseline DIR]

Every figure comes from the same run, each configuration in a database of its own made
for it and dropped after (default server: $SESSIOND_TEST_POSTGRES, else
postgresql://postgres@127.0.0.1:5432/test). The daemons are real `sessiond` processes,
each with its own socket and `--host-name`; the writers are tasks of this process,
spread round-robin over the daemons, each appending one message at a time to a session of
its own (one request in flight per writer, as a lone agent writes).

Per configuration: appends/s and its ratio to 1 daemon; from the daemons' own commit
timing (daemon.stats `store_commits`, summed over the hosts): events per commit, round
trips per commit (statements sent, BEGIN and COMMIT included) and those sent while the
counter row is locked, the lock's held time per commit and its share of the window (sum
of held times over the run's seconds: 1.0 means the row was never free); CPU µs per
append of the daemon processes and of the database's backends (/proc/PID/stat, backends
found in pg_stat_activity).

The raw counter-row design: asyncpg connections (as many as daemons), each committing
batches of B events (B: the events per commit the daemons reached, and 16) with one
`UPDATE log_head SET position = position + B RETURNING position` and one multi-row
insert into a table shaped like `events`, durable (BEGIN, the two, COMMIT); the ratio of
the daemons' appends/s to it at the same batch size.

Lag: a subscriber on host 0 follows everything; a writer on host 1 appends one message at
a time; lag = delivery on host 0 - the writer's acknowledgement (a delivery may beat the
reply, so a lag can be slightly negative).

`--baseline DIR`: a source tree of another commit (e.g. `git archive 9b19302 | tar -x -C
DIR`); each daemon configuration also runs from it, alternating with this tree, and the
ratios new/old are printed. It prints every figure and asserts no timing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec

from sessiond import AsyncClient
from sessiond_schemas.errors import StorageError

from .daemon import DaemonProcess, cpu_s

WRITERS = 16
DEFAULT_DSN = os.environ.get("SESSIOND_TEST_POSTGRES",
                             "postgresql://postgres@127.0.0.1:5432/test")
_FIGURES = ("commits", "events", "round_trips", "locked_round_trips", "locked_s",
            "locked_in_statement_s", "commit_s", "moved", "transactions", "commands")


class FleetDaemon(DaemonProcess):
    """A sessiond on `db` (a PostgreSQL URL or a SQLite path) as host `name`."""

    def __init__(self, directory: str, db: str, name: str) -> None:
        super().__init__(directory, "--host-name", name, "--log-level", "error")
        self.db = db


@contextmanager
def source_tree(tree: str | None) -> Iterator[None]:
    """Daemons started in the block run from `tree` (None: this one)."""
    if tree is None:
        yield
        return
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        os.path.join(tree, part) for part in ("client", "daemon", "schemas", "."))
    try:
        yield
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old


def _with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


class Databases:
    """Databases made on the server for one run, dropped at its end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.made: list[str] = []

    async def _admin(self, sql: str, *args: Any) -> list[Any]:
        import asyncpg

        con = await asyncpg.connect(self.dsn, timeout=10)
        try:
            return list(await con.fetch(sql, *args))
        finally:
            await con.close()

    async def new(self) -> str:
        name = f"sessiond_b12_{os.getpid()}_{secrets.token_hex(4)}"
        await self._admin(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return _with_database(self.dsn, name)

    async def backends(self, url: str) -> list[int]:
        """The server processes serving database `url` now (from another database)."""
        name = urlsplit(url).path.lstrip("/")
        return [r[0] for r in await self._admin(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1", name)]

    async def drop_all(self) -> None:
        for name in self.made:
            await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.made.clear()


def _cpu(pids: list[int]) -> dict[int, float]:
    seen = {}
    for pid in pids:
        with suppress(OSError):  # gone (a pooled connection closed, say)
            seen[pid] = cpu_s(pid)
    return seen


def _spent(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds used between the two samples by the processes in `after` (a process
    born in between: all of its time)."""
    return sum(t - before.get(pid, 0.0) for pid, t in after.items())


async def _commit_figures(sockets: list[str]) -> dict[str, float]:
    total = dict.fromkeys(_FIGURES, 0.0)
    for sock in sockets:
        async with AsyncClient(sock) as c:
            stats = await c.call("daemon.stats")
        total["transactions"] += stats["write_transactions"]
        total["commands"] += stats["write_commands"]
        for k, v in (stats.get("store_commits") or {}).items():
            if k in total:
                total[k] += v
    return total


async def appends_per_s(sockets: list[str], seconds: float, writers: int,
                        probe: Callable[[], Awaitable[dict[str, float]]] | None = None,
                        ) -> dict[str, Any]:
    """`writers` writers, round-robin over `sockets`, appending for `seconds`: appends/s,
    and (`probe`: CPU seconds so far of daemons and backends) what each append cost."""
    clients = [AsyncClient(sockets[w % len(sockets)]) for w in range(writers)]
    counts = [0] * writers
    refused = [0] * writers  # -32012 answers (the database moved under the writer, say)
    try:
        for c in clients:
            await c.__aenter__()
        sids = [(await c.create_session(task="b12")).session_id for c in clients]
        for w in range(writers):  # warm: every session cached, every connection open
            await clients[w].append_message(sids[w], "user", "warm")
        before = await _commit_figures(sockets)
        cpu_before = await probe() if probe else {}
        started = time.perf_counter()
        deadline = started + seconds

        async def writer(w: int) -> None:
            c, sid = clients[w], sids[w]
            while time.perf_counter() < deadline:
                try:
                    await c.append_message(sid, "user", f"b12 writer {w} #{counts[w]}")
                except StorageError:
                    refused[w] += 1  # retried: the next turn of the loop
                    continue
                counts[w] += 1

        async with anyio.create_task_group() as tg:
            for w in range(writers):
                tg.start_soon(writer, w)
        took = time.perf_counter() - started
        cpu_after = await probe() if probe else {}
        after = await _commit_figures(sockets)
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)
    n = sum(counts)
    out: dict[str, Any] = {"writers": writers, "appends": n, "refused": sum(refused),
                           "seconds": round(took, 2), "appends_per_s": round(n / took, 1)}
    d = {k: after[k] - before[k] for k in _FIGURES}
    if d["commits"]:
        c = d["commits"]
        out |= {"events_per_commit": round(d["events"] / c, 2),
                "round_trips_per_commit": round(d["round_trips"] / c, 2),
                "locked_round_trips_per_commit": round(d["locked_round_trips"] / c, 2),
                "lock_held_ms_per_commit": round(1000 * d["locked_s"] / c, 3),
                "lock_in_statement_ms_per_commit": round(
                    1000 * d["locked_in_statement_s"] / c, 3),
                "lock_share_of_window": round(d["locked_s"] / took, 3),
                "commit_ms": round(1000 * d["commit_s"] / c, 3),
                "moved": int(d["moved"])}
    elif d["transactions"]:  # a daemon without store_commits (an older one): commands
        out["events_per_commit"] = round(d["commands"] / d["transactions"], 2)
    for k in cpu_after:
        out[f"{k}_cpu_us_per_append"] = round(1e6 * (cpu_after[k] - cpu_before[k]) / max(n, 1), 1)
    return out


async def with_daemons(dbs: list[str], names: list[str], work: Any,
                       tree: str | None = None) -> Any:
    """Start one daemon per (db, name) (from `tree`), run `work(daemons)`, stop them."""
    root = tempfile.mkdtemp(prefix="b12-")
    daemons: list[FleetDaemon] = []
    try:
        with source_tree(tree):
            for db, name in zip(dbs, names, strict=True):
                directory = os.path.join(root, name)
                os.makedirs(directory)
                daemons.append(FleetDaemon(directory, db, name))
                await daemons[-1].start()
        return await work(daemons)
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


async def fleet_run(dbs: Databases, n: int, writers: int, seconds: float,
                    tree: str | None) -> dict[str, Any]:
    """`n` daemons on a new database, `writers` writers in all."""
    url = await dbs.new()

    async def work(daemons: list[FleetDaemon]) -> dict[str, Any]:
        async def probe() -> dict[str, float]:
            # The backends live as long as their daemon's connections: all of the window.
            seen = _cpu(await dbs.backends(url))
            return {"daemon": sum(d.cpu_s() for d in daemons),
                    "postgresql": sum(seen.values())}

        return await appends_per_s([d.socket for d in daemons], seconds, writers, probe)

    return dict(await with_daemons([url] * n, [f"host{i}" for i in range(n)], work, tree))


async def raw_counter_row(url: str, connections: int, batch: int,
                          seconds: float) -> dict[str, Any]:
    """The design's floor: `connections` asyncpg connections, each committing batches of
    `batch` events (the counter row moved by `batch`, one multi-row insert), durable."""
    import asyncpg

    setup = await asyncpg.connect(url, timeout=10)
    await setup.execute(
        "CREATE TABLE log_head (id INT PRIMARY KEY, position BIGINT NOT NULL);"
        " INSERT INTO log_head VALUES (1, 0);"
        " CREATE TABLE raw (position BIGINT PRIMARY KEY, session_id TEXT NOT NULL,"
        " version BIGINT NOT NULL, event_id TEXT NOT NULL, type TEXT NOT NULL,"
        " data BYTEA NOT NULL, UNIQUE (session_id, version))")
    await setup.close()
    cons = [await asyncpg.connect(url, timeout=10) for _ in range(connections)]
    counts = [0] * connections
    payload = msgspec.json.encode({"role": "user", "content": "b12 raw event"})
    started = time.perf_counter()
    deadline = started + seconds

    async def writer(w: int) -> None:
        con, version = cons[w], 0
        while time.perf_counter() < deadline:
            versions = list(range(version + 1, version + batch + 1))
            async with con.transaction():
                top = await con.fetchval("UPDATE log_head SET position = position + $1"
                                         " WHERE id = 1 RETURNING position", batch)
                await con.execute(
                    "INSERT INTO raw (position, session_id, version, event_id, type, data)"
                    " SELECT $1::bigint - $2::int + n, $3, v, $3 || '-' || v, 'message.appended',"
                    " $4 FROM unnest($5::bigint[]) WITH ORDINALITY AS t(v, n)",
                    top, batch, f"s{w}", payload, versions)
            version += batch
            counts[w] += batch

    try:
        await asyncio.gather(*(writer(w) for w in range(connections)))
    finally:
        for con in cons:
            await con.close()
    took = time.perf_counter() - started
    return {"connections": connections, "batch": batch, "events": sum(counts),
            "seconds": round(took, 2), "events_per_s": round(sum(counts) / took, 1)}


async def cross_host_lag(sockets: list[str], samples: int) -> dict[str, Any]:
    """p50/p99 ms from host 1's acknowledgement to delivery on host 0's subscriber."""
    arrived: dict[str, float] = {}
    acked: dict[str, float] = {}
    async with AsyncClient(sockets[0]) as on_a, AsyncClient(sockets[1]) as on_b:
        sid = (await on_b.create_session(task="b12 lag")).session_id
        ready = anyio.Event()

        async def follow() -> None:
            async with on_a.subscribe() as events:
                async def caught_up() -> None:  # live from here: its catch-up is done
                    while not events.caught_up:
                        await anyio.sleep(0.001)
                    ready.set()

                tg.start_soon(caught_up)
                async for e in events:
                    if e.session_id == sid and e.type == "message.appended":
                        arrived[e.data.content] = time.perf_counter()

        async with anyio.create_task_group() as tg:
            tg.start_soon(follow)
            await ready.wait()
            for i in range(samples):
                content = f"lag {i}"
                await on_b.append_message(sid, "user", content)
                acked[content] = time.perf_counter()
                with anyio.move_on_after(5 if i == 0 else 2):  # the first: is it there at all?
                    while content not in arrived:
                        await anyio.sleep(0.0005)
                if content not in arrived:
                    tg.cancel_scope.cancel()
                    return {"available": False}
                await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
    lags = sorted((arrived[k] - acked[k]) * 1000 for k in acked)
    return {"available": True, "samples": len(lags),
            "p50_ms": round(statistics.median(lags), 2),
            "p99_ms": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))], 2)}


HOSTS = (1, 2, 4)


async def run(dsn: str, seconds: float, samples: int, *, per_daemon: bool,
              baseline: str | None) -> dict[str, Any]:
    dbs = Databases(dsn)
    results: dict[str, Any] = {"writers": WRITERS, "seconds_each": seconds,
                               "baseline": baseline, "fleet": {}}
    trees: list[tuple[str, str | None]] = [("new", None)]
    if baseline:
        trees.append(("old", baseline))
    shapes = [("in_all", False), *([("per_daemon", True)] if per_daemon else [])]
    raw: dict[str, Any] = results.setdefault("raw_counter_row", {})

    async def floor(n: int, b: int) -> None:
        if f"{n}x{b}" not in raw:
            raw[f"{n}x{b}"] = await raw_counter_row(await dbs.new(), n, b, seconds)
            print(f"B12 raw {n}x{b}: {raw[f'{n}x{b}']}", file=sys.stderr)

    try:
        for shape, each in shapes:
            for n in HOSTS:
                for label, tree in trees:  # old and new alternate, configuration by one
                    key = f"{label}_{shape}_{n}"
                    r = await fleet_run(dbs, n, WRITERS * n if each else WRITERS, seconds,
                                        tree)
                    results["fleet"][key] = r | {"tree": label, "shape": shape, "daemons": n}
                    print(f"B12 {key}: {r}", file=sys.stderr)
                    if label == "new":  # the raw design at the batch size reached, next to it
                        await floor(n, max(1, round(r.get("events_per_commit", 1))))
        for n in HOSTS:
            await floor(n, 16)
        root = tempfile.mkdtemp(prefix="b12-sqlite-")
        try:
            results["sqlite_1_daemon"] = await with_daemons(
                [os.path.join(root, "b12.db")], ["local"],
                lambda ds: appends_per_s([d.socket for d in ds], seconds, WRITERS))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        url = await dbs.new()
        results["cross_host_lag"] = await with_daemons(
            [url, url], ["host0", "host1"],
            lambda ds: cross_host_lag([d.socket for d in ds], samples))
    finally:
        await dbs.drop_all()
    return results


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "-"


def report(results: dict[str, Any]) -> None:
    fleet, raw = results["fleet"], results["raw_counter_row"]
    print(f"B12 fleet mode: {results['seconds_each']} s per figure")
    cols = ("daemons", "writers", "appends/s", "vs 1", "ev/commit", "rt/commit",
            "rt locked", "lock ms/commit (in stmt)", "lock share", "daemon µs/app",
            "pg µs/app",
            "vs raw", "refused")
    print("  " + " | ".join(cols))
    for r in fleet.values():
        label, shape, n = r["tree"], r["shape"], r["daemons"]
        one = fleet.get(f"{label}_{shape}_1", {})
        b = max(1, round(r.get("events_per_commit", 1)))
        floor = raw.get(f"{n}x{b}", {}).get("events_per_s")
        print(f"  {label} {shape} {n} | {r['writers']} | {r['appends_per_s']} |"
              f" {_ratio(r['appends_per_s'], one.get('appends_per_s'))} |"
              f" {r.get('events_per_commit', '-')} | {r.get('round_trips_per_commit', '-')} |"
              f" {r.get('locked_round_trips_per_commit', '-')} |"
              f" {r.get('lock_held_ms_per_commit', '-')}"
              f" ({r.get('lock_in_statement_ms_per_commit', '-')}) |"
              f" {r.get('lock_share_of_window', '-')} |"
              f" {r.get('daemon_cpu_us_per_append', '-')} |"
              f" {r.get('postgresql_cpu_us_per_append', '-')} |"
              f" {_ratio(r['appends_per_s'], floor)} (raw {n}x{b}) | {r['refused']}")
        old = fleet.get(f"old_{shape}_{n}")
        if label == "new" and old:
            pg_new, pg_old = (x.get("postgresql_cpu_us_per_append") for x in (r, old))
            print(f"    new/old: appends/s {_ratio(r['appends_per_s'], old['appends_per_s'])},"
                  f" pg µs/append {_ratio(pg_new, pg_old)}")
    for key, r in raw.items():
        print(f"  raw counter row {key} (connections x batch): {r['events_per_s']} events/s")
    print(f"  SQLite, 1 daemon: {results['sqlite_1_daemon']['appends_per_s']} appends/s")
    lag = results["cross_host_lag"]
    if lag["available"]:
        print(f"  cross-host lag: p50 {lag['p50_ms']} ms, p99 {lag['p99_ms']} ms"
              f" ({lag['samples']} samples)")
    else:
        print("  cross-host lag: not available")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=DEFAULT_DSN, help="a PostgreSQL database to connect to"
                   " (trust auth); the runs make databases of their own on its server")
    p.add_argument("--quick", action="store_true", help="CI sizes: a smoke run")
    p.add_argument("--out", help="write the figures as JSON to this file")
    p.add_argument("--baseline", help="a source tree to run the daemons from too, alternating")
    p.add_argument("--seconds", type=float, help="seconds per figure (default 10; quick 0.5)")
    a = p.parse_args()
    seconds, samples = (0.5, 20) if a.quick else (10.0, 500)
    if a.seconds:
        seconds = a.seconds
    results = anyio.run(lambda: run(a.dsn, seconds, samples, per_daemon=not a.quick,
                                    baseline=a.baseline))
    report(results)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(msgspec.json.encode(results))


if __name__ == "__main__":
    main()
