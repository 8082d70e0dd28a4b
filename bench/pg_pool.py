"""The PostgreSQL store's read pool: the cost of one pooled read with asyncpg's default
reset on release (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`, one more
round trip) and with the store's (postgres/store.py `_kept_as_is`: none past asyncpg's
own rollback of an open transaction).

    python -m bench.pg_pool [--dsn postgresql://127.0.0.1:5432/test] [--quick]

One store, opened on a database of its own (dropped after); its reads (`state_json`, the
shape of session.get's) run on its own pool and on a pool made with the same settings but
asyncpg's default reset, in alternating rounds. Per read: wall time, this process's CPU
and the PostgreSQL backends' CPU (from /proc: the server runs on this machine). Prints
medians over the rounds and the ratio default / store; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from sessiond_daemon.stores.postgres.store import READ_TIMEOUT_S, PostgresStore

TICK = os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime + stime
        except OSError:
            return float("nan")  # not readable here: say so, do not guess
    return total / TICK


async def _backends(pool: Any, size: int) -> list[int]:
    held = [await pool.acquire() for _ in range(size)]
    pids = [con.get_server_pid() for con in held]
    for con in held:
        await pool.release(con)
    return pids


async def _round(store: PostgresStore, pool: Any, pids: list[int], n: int) -> tuple[float, ...]:
    store._pool = pool
    wall, cpu, server = time.perf_counter(), time.process_time(), _cpu_of(pids)
    for i in range(n):
        await store.state_json(f"s{i % 50}")
    return ((time.perf_counter() - wall) / n * 1e6, (time.process_time() - cpu) / n * 1e6,
            (_cpu_of(pids) - server) / n * 1e6)


async def main(dsn: str, n: int, rounds: int) -> None:
    name = f"sessiond_bench_pool_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = urlsplit(dsn)._replace(path="/" + name).geturl()
    try:
        store = PostgresStore(url)
        await store.open()
        ours = store._pool
        default = await asyncpg.create_pool(
            url, min_size=1, max_size=store._reader_count, command_timeout=READ_TIMEOUT_S,
            server_settings=store.server_settings)  # asyncpg's default reset
        pids = {"store": await _backends(ours, store._reader_count),
                "default": await _backends(default, store._reader_count)}
        pools = {"store": ours, "default": default}
        figures: dict[str, list[tuple[float, ...]]] = {"store": [], "default": []}
        for r in range(rounds):  # alternating, the order flipped each round
            for kind in (("store", "default") if r % 2 else ("default", "store")):
                figures[kind].append(await _round(store, pools[kind], pids[kind], n))
        store._pool = ours
        await default.close()
        await store.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    print(f"pooled read (state_json), {n} reads x {rounds} rounds, median per read:")
    print("| figure | default reset | store (no reset query) | default / store |")
    print("| --- | --- | --- | --- |")
    for i, label in enumerate(("wall µs", "daemon CPU µs", "PostgreSQL backend CPU µs")):
        d = statistics.median(f[i] for f in figures["default"])
        s = statistics.median(f[i] for f in figures["store"])
        ratio = d / s if s else float("nan")
        print(f"| {label} | {d:.1f} | {s:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get(
        "SESSIOND_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    args = parser.parse_args()
    asyncio.run(main(args.dsn, 200 if args.quick else 3000, 2 if args.quick else 8))
