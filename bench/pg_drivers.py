"""Fleet mode's driver, chosen by measurement: psycopg 3 (async, psycopg_pool) or asyncpg.

    pip install -e '.[fleet-bench]'
    python -m bench.pg_drivers [--dsn postgresql://127.0.0.1:5432/test] [--quick]

Both drivers run the same workloads, in one process, in alternating rounds, each in a
database of its own made for the run and dropped after it. The workloads are the shapes
fleet mode will send (shared/ARCHITECTURE.md, "Fleet mode"):

- append, 1 writer: one transaction per event, as a lone agent's appends are: lock the
  session row (SELECT ... FOR UPDATE), bump its version, then one last statement that
  takes the positions from the counter row and inserts the events with them (a CTE:
  UPDATE log_head ... RETURNING feeding the INSERT), COMMIT. The counter's row lock is
  held only from that statement to the commit;
- append, 16 writers: the same from 16 connections of a pool, on 16 sessions;
- batch of 64: the writer's group commit, 64 events of one batch in one transaction;
- read latest 20: a session's last 20 events, the shape of session.get's paged reads;
- tail: read everything past a cursor, 500 rows at a time (a subscriber catching up).

It prints each figure per driver and the ratio asyncpg / psycopg, and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

SCHEMA = [
    """CREATE TABLE sessions (session_id TEXT PRIMARY KEY, version BIGINT NOT NULL)""",
    """CREATE TABLE events (
        position BIGINT PRIMARY KEY, session_id TEXT NOT NULL, version BIGINT NOT NULL,
        event_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, data BYTEA NOT NULL,
        UNIQUE (session_id, version))""",
    """CREATE TABLE log_head (id INT PRIMARY KEY, position BIGINT NOT NULL)""",
    """INSERT INTO log_head VALUES (1, 0)""",
]
PAYLOAD = ('{"role":"user","content":"' + "x" * 150 + '","sequence":0}').encode()
LOCK = "SELECT version FROM sessions WHERE session_id = $1 FOR UPDATE"
BUMP_SESSION = "UPDATE sessions SET version = version + $2 WHERE session_id = $1"
INSERT = """WITH head AS (
        UPDATE log_head SET position = position + cardinality($3::text[]) WHERE id = 1
        RETURNING position - cardinality($3::text[]) AS base)
    INSERT INTO events (position, session_id, version, event_id, type, data)
    SELECT head.base + e.ord, $1, $2 + e.ord, e.event_id, 'message.appended', e.data
    FROM head, unnest($3::text[], $4::bytea[]) WITH ORDINALITY AS e(event_id, data, ord)"""
LATEST = ("SELECT position, version, data FROM events WHERE session_id = $1"
          " ORDER BY version DESC LIMIT 20")
TAIL = ("SELECT position, session_id, data FROM events WHERE position > $1"
        " ORDER BY position LIMIT 500")


def psycopg_sql(sql: str) -> str:
    """asyncpg's $N placeholders as psycopg's %(pN)s (a parameter may appear twice)."""
    for i in range(9, 0, -1):
        sql = sql.replace(f"${i}", f"%(p{i})s")
    return sql


def named(*args: Any) -> dict[str, Any]:
    return {f"p{i}": v for i, v in enumerate(args, start=1)}


class Asyncpg:
    name = "asyncpg"

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn, self.size = dsn, size

    async def __aenter__(self) -> Asyncpg:
        import asyncpg

        self.pool = await asyncpg.create_pool(self.dsn, min_size=self.size, max_size=self.size)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.pool.close()

    async def append(self, sid: str, ids: list[str]) -> None:
        async with self.pool.acquire() as con, con.transaction():
            (version,) = await con.fetchrow(LOCK, sid)
            await con.execute(BUMP_SESSION, sid, len(ids))
            await con.execute(INSERT, sid, version, ids, [PAYLOAD] * len(ids))

    async def latest(self, sid: str) -> int:
        async with self.pool.acquire() as con:
            return len(await con.fetch(LATEST, sid))

    async def tail(self, after: int) -> list[Any]:
        async with self.pool.acquire() as con:
            return list(await con.fetch(TAIL, after))

    async def setup(self, sessions: list[str]) -> None:
        async with self.pool.acquire() as con:
            for sql in SCHEMA:
                await con.execute(sql)
            await con.executemany("INSERT INTO sessions VALUES ($1, 0)", [(s,) for s in sessions])


class Psycopg:
    name = "psycopg"

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn, self.size = dsn, size

    async def __aenter__(self) -> Psycopg:
        from psycopg_pool import AsyncConnectionPool

        # autocommit: transaction() then sends BEGIN and COMMIT itself, and reads run
        # outside a transaction, as asyncpg's do.
        self.pool = AsyncConnectionPool(self.dsn, min_size=self.size, max_size=self.size,
                                        kwargs={"autocommit": True}, open=False)
        await self.pool.open(wait=True)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.pool.close()

    async def append(self, sid: str, ids: list[str]) -> None:
        async with self.pool.connection() as con, con.transaction(), con.cursor() as cur:
            await cur.execute(psycopg_sql(LOCK), named(sid))
            (version,) = await cur.fetchone()  # type: ignore[misc]
            await cur.execute(psycopg_sql(BUMP_SESSION), named(sid, len(ids)))
            await cur.execute(psycopg_sql(INSERT), named(sid, version, ids, [PAYLOAD] * len(ids)))

    async def latest(self, sid: str) -> int:
        async with self.pool.connection() as con, con.cursor() as cur:
            await cur.execute(psycopg_sql(LATEST), named(sid))
            return len(await cur.fetchall())

    async def tail(self, after: int) -> list[Any]:
        async with self.pool.connection() as con, con.cursor() as cur:
            await cur.execute(psycopg_sql(TAIL), named(after))
            return await cur.fetchall()

    async def setup(self, sessions: list[str]) -> None:
        async with self.pool.connection() as con, con.cursor() as cur:
            for sql in SCHEMA:
                await cur.execute(sql)
            await cur.executemany("INSERT INTO sessions VALUES (%s, 0)", [(s,) for s in sessions])


Driver = Asyncpg | Psycopg
ids = (f"e{n:012d}" for n in range(10**12))


async def timed(n: int, op: Callable[[], Awaitable[Any]]) -> tuple[float, list[float]]:
    """Run `op` n times in sequence: (total seconds, each call's seconds)."""
    each = []
    start = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        await op()
        each.append(time.perf_counter() - t)
    return time.perf_counter() - start, each


async def run_driver(cls: type[Driver], dsn: str, n: int) -> dict[str, float]:
    sessions = [f"s{i}" for i in range(16)]
    out: dict[str, float] = {}
    async with cls(dsn, 16) as d:
        await d.setup(sessions)
        total, each = await timed(n, lambda: d.append("s0", [next(ids)]))
        out["append, 1 writer (events/s)"] = n / total
        out["append, 1 writer p50 (ms)"] = statistics.median(each) * 1000

        per = max(1, n // 16)
        start = time.perf_counter()
        await asyncio.gather(*(timed(per, lambda s=s: d.append(s, [next(ids)]))
                               for s in sessions))
        out["append, 16 writers (events/s)"] = per * 16 / (time.perf_counter() - start)

        batches = max(1, n // 64)
        total, _ = await timed(batches, lambda: d.append("s1", [next(ids) for _ in range(64)]))
        out["batch of 64 (events/s)"] = batches * 64 / total

        total, each = await timed(n, lambda: d.latest("s1"))
        out["read latest 20 p50 (ms)"] = statistics.median(each) * 1000

        start, rows, after = time.perf_counter(), 0, 0
        while page := await d.tail(after):
            rows += len(page)
            after = page[-1][0]
        out["tail from 0 (rows/s)"] = rows / (time.perf_counter() - start)
    return out


async def with_database(admin_dsn: str, body: Callable[[str], Awaitable[dict[str, float]]]
                        ) -> dict[str, float]:
    """Run `body` on a database made for it (dropped after)."""
    import asyncpg

    name = f"sessiond_bench_{os.getpid()}_{time.monotonic_ns()}"
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        try:
            return await body(admin_dsn.rsplit("/", 1)[0] + "/" + name)
        finally:
            await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def main(dsn: str, n: int, rounds: int) -> None:
    results: dict[str, dict[str, list[float]]] = {"asyncpg": {}, "psycopg": {}}
    for r in range(rounds):  # alternate, so drift on a shared machine hits both alike
        order: list[type[Driver]] = [Asyncpg, Psycopg] if r % 2 == 0 else [Psycopg, Asyncpg]
        for cls in order:
            figures = await with_database(dsn, lambda db, cls=cls: run_driver(cls, db, n))
            for k, v in figures.items():
                results[cls.name].setdefault(k, []).append(v)
    print(f"PostgreSQL drivers, {n} operations per figure, {rounds} rounds (median), "
          f"{os.cpu_count()} cores")
    print("| figure | asyncpg | psycopg | asyncpg / psycopg |\n| --- | --- | --- | --- |")
    for k in results["asyncpg"]:
        a, p = (statistics.median(results[d][k]) for d in ("asyncpg", "psycopg"))
        print(f"| {k} | {a:,.2f} | {p:,.2f} | {a / p:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "SESSIOND_TEST_POSTGRES", "postgresql://127.0.0.1:5432/test"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    asyncio.run(main(args.dsn, 200 if args.quick else 2000, 2 if args.quick else 4))
