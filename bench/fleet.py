"""B12, fleet mode: appends per second with 1, 2 and 4 daemons on one PostgreSQL database
(16 writers in all), one daemon on SQLite, raw one-transaction-per-row inserts through
asyncpg, and cross-host subscription lag (commit to delivery, p50 and p99).

    pip install -e '.[fleet]'
    python -m bench.fleet [--dsn postgresql://USER@HOST:5432/DB] [--quick] [--out FILE]

Every figure comes from the same run, each configuration in a database of its own made
for it and dropped after (default server: $SESSIOND_TEST_POSTGRES, else
postgresql://postgres@127.0.0.1:5432/test). The daemons are real `sessiond` processes,
each with its own socket and `--host-name`; the 16 writers are tasks of this process,
spread round-robin over the daemons, each appending one message at a time to a session of
its own (one request in flight per writer, as a lone agent writes). The raw figure is the
floor a daemon's commit is measured against: 16 asyncpg connections, each inserting one
row per transaction into a table shaped like `events`.

Lag: a subscriber on host 0 follows everything; a writer on host 1 appends one message at
a time; lag = delivery on host 0 - the writer's acknowledgement (the commit, as the writer
sees it; a delivery may beat the reply, so a lag can be slightly negative). Without
cross-host subscriptions the subscriber never sees host 1's events: "not available".

It prints every figure and asserts no timing.
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
from typing import Any
from urllib.parse import urlsplit

import anyio
import msgspec

from sessiond import AsyncClient
from sessiond_schemas.errors import StorageError

from .daemon import DaemonProcess

WRITERS = 16
DEFAULT_DSN = os.environ.get("SESSIOND_TEST_POSTGRES",
                             "postgresql://postgres@127.0.0.1:5432/test")


class FleetDaemon(DaemonProcess):
    """A sessiond on `db` (a PostgreSQL URL or a SQLite path) as host `name`."""

    def __init__(self, directory: str, db: str, name: str) -> None:
        super().__init__(directory, "--host-name", name, "--log-level", "error")
        self.db = db


def _with_database(url: str, name: str) -> str:
    return urlsplit(url)._replace(path="/" + name).geturl()


class Databases:
    """Databases made on the server for one run, dropped at its end."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.made: list[str] = []

    async def _admin(self, sql: str) -> None:
        import asyncpg

        con = await asyncpg.connect(self.dsn, timeout=10)
        try:
            await con.execute(sql)
        finally:
            await con.close()

    async def new(self) -> str:
        name = f"sessiond_b12_{os.getpid()}_{secrets.token_hex(4)}"
        await self._admin(f'CREATE DATABASE "{name}"')
        self.made.append(name)
        return _with_database(self.dsn, name)

    async def drop_all(self) -> None:
        for name in self.made:
            await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self.made.clear()


async def appends_per_s(sockets: list[str], seconds: float) -> dict[str, Any]:
    """16 writers, round-robin over `sockets`, appending for `seconds`; appends/s."""
    clients = [AsyncClient(sockets[w % len(sockets)]) for w in range(WRITERS)]
    counts = [0] * WRITERS
    refused = [0] * WRITERS  # -32012 answers (the database moved under the writer, say)
    try:
        for c in clients:
            await c.__aenter__()
        sids = [(await c.create_session(task="b12")).session_id for c in clients]
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
            for w in range(WRITERS):
                tg.start_soon(writer, w)
        took = time.perf_counter() - started
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)
    return {"appends": sum(counts), "refused": sum(refused), "seconds": round(took, 2),
            "appends_per_s": round(sum(counts) / took, 1)}


async def with_daemons(dbs: list[str], names: list[str], work: Any) -> Any:
    """Start one daemon per (db, name), run `work(sockets)`, stop them."""
    root = tempfile.mkdtemp(prefix="b12-")
    daemons = []
    try:
        for db, name in zip(dbs, names, strict=True):
            directory = os.path.join(root, name)
            os.makedirs(directory)
            daemons.append(FleetDaemon(directory, db, name))
            await daemons[-1].start()
        return await work([d.socket for d in daemons])
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


async def raw_inserts(url: str, seconds: float) -> dict[str, Any]:
    """16 asyncpg connections, one row per transaction, for `seconds`: rows/s."""
    import asyncpg

    setup = await asyncpg.connect(url, timeout=10)
    await setup.execute("CREATE TABLE raw (position BIGSERIAL PRIMARY KEY, session_id TEXT"
                        " NOT NULL, version BIGINT NOT NULL, data BYTEA NOT NULL,"
                        " UNIQUE (session_id, version))")
    await setup.close()
    cons = [await asyncpg.connect(url, timeout=10) for _ in range(WRITERS)]
    counts = [0] * WRITERS
    payload = msgspec.json.encode({"role": "user", "content": "b12 raw row"})
    started = time.perf_counter()
    deadline = started + seconds

    async def writer(w: int) -> None:
        while time.perf_counter() < deadline:
            async with cons[w].transaction():
                await cons[w].execute("INSERT INTO raw (session_id, version, data)"
                                      " VALUES ($1, $2, $3)", f"s{w}", counts[w] + 1, payload)
            counts[w] += 1

    try:
        await asyncio.gather(*(writer(w) for w in range(WRITERS)))
    finally:
        for con in cons:
            await con.close()
    took = time.perf_counter() - started
    return {"rows": sum(counts), "seconds": round(took, 2),
            "rows_per_s": round(sum(counts) / took, 1)}


async def cross_host_lag(sockets: list[str], samples: int) -> dict[str, Any]:
    """p50/p99 ms from host 1's acknowledgement to delivery on host 0's subscriber."""
    arrived: dict[str, float] = {}
    acked: dict[str, float] = {}
    async with AsyncClient(sockets[0]) as on_a, AsyncClient(sockets[1]) as on_b:
        sid = (await on_b.create_session(task="b12 lag")).session_id
        ready = anyio.Event()

        async def follow() -> None:
            async with on_a.subscribe() as events:
                ready.set()
                async for e in events:
                    if e.session_id == sid and e.type == "message.appended":
                        arrived[e.data["content"]] = time.perf_counter()

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


async def run(dsn: str, seconds: float, samples: int) -> dict[str, Any]:
    dbs = Databases(dsn)
    results: dict[str, Any] = {"writers": WRITERS, "seconds_each": seconds}
    try:
        for n in (1, 2, 4):
            url = await dbs.new()
            results[f"postgresql_{n}_daemons"] = await with_daemons(
                [url] * n, [f"host{i}" for i in range(n)],
                lambda sockets: appends_per_s(sockets, seconds))
            print(f"B12 {n} daemon(s) on PostgreSQL: {results[f'postgresql_{n}_daemons']}",
                  file=sys.stderr)
        root = tempfile.mkdtemp(prefix="b12-sqlite-")
        try:
            results["sqlite_1_daemon"] = await with_daemons(
                [os.path.join(root, "b12.db")], ["local"],
                lambda sockets: appends_per_s(sockets, seconds))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        results["raw_asyncpg"] = await raw_inserts(await dbs.new(), seconds)
        url = await dbs.new()
        results["cross_host_lag"] = await with_daemons(
            [url, url], ["host0", "host1"], lambda sockets: cross_host_lag(sockets, samples))
    finally:
        await dbs.drop_all()
    return results


def report(results: dict[str, Any]) -> None:
    print(f"B12 fleet mode: {WRITERS} writers in all, {results['seconds_each']} s each")
    for n in (1, 2, 4):
        r = results[f"postgresql_{n}_daemons"]
        print(f"  PostgreSQL, {n} daemon(s): {r['appends_per_s']:>9} appends/s"
              f" ({r['refused']} writes refused -32012 and retried)")
    print(f"  SQLite, 1 daemon:        {results['sqlite_1_daemon']['appends_per_s']:>9} appends/s")
    print(f"  raw asyncpg, 1 row/tx:   {results['raw_asyncpg']['rows_per_s']:>9} rows/s")
    lag = results["cross_host_lag"]
    if lag["available"]:
        print(f"  cross-host lag:          p50 {lag['p50_ms']} ms, p99 {lag['p99_ms']} ms"
              f" ({lag['samples']} samples)")
    else:
        print("  cross-host lag:          not available (a subscriber does not see"
              " another host's events yet)")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--dsn", default=DEFAULT_DSN, help="a PostgreSQL database to connect to"
                   " (trust auth); the runs make databases of their own on its server")
    p.add_argument("--quick", action="store_true", help="CI sizes: a smoke run")
    p.add_argument("--out", help="write the figures as JSON to this file")
    a = p.parse_args()
    seconds, samples = (1.0, 20) if a.quick else (10.0, 500)
    results = anyio.run(run, a.dsn, seconds, samples)
    report(results)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(msgspec.json.encode(results))


if __name__ == "__main__":
    main()
