"""Appends per second with 1, 2, 4 daemons on one PostgreSQL database, 16 writers in all
(each on a session of its own, spread over the daemons). A quick A/B of the commit
protocol, not the B12 bench: `python tests/fleet_rate.py [--src CHECKOUT] [--seconds S]`
runs the daemons from CHECKOUT's sources (default: this one)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import subprocess
import sys
import tempfile
import time

import asyncpg

from sessiond import AsyncClient
from sessiond_schemas.errors import StorageError

SERVER = os.environ.get("SESSIOND_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


async def admin(sql: str) -> None:
    con = await asyncpg.connect(SERVER)
    try:
        await con.execute(sql)
    finally:
        await con.close()


async def run(daemons: int, writers: int, seconds: float,
              src: str | None) -> tuple[float, int, int]:
    """(appends/s, batches committed, batches decided again because the store moved)."""
    name = f"sessiond_rate_{secrets.token_hex(4)}"
    await admin(f'CREATE DATABASE "{name}"')
    url = SERVER.rsplit("/", 1)[0] + "/" + name
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(
            os.path.join(src, p) for p in ("daemon", "schemas", "client"))
    procs, socks = [], []
    with tempfile.TemporaryDirectory(dir="/tmp") as tmp:
        try:
            for i in range(daemons):
                sock = os.path.join(tmp, f"d{i}.sock")
                with open(sock + ".log", "wb") as log:  # the child keeps its own copy
                    procs.append(subprocess.Popen(
                        [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db",
                         url, "--log-level", "info", "--log-format", "json"], env=env,
                        stdout=subprocess.DEVNULL, stderr=log))
                socks.append(sock)
            for sock in socks:
                while True:
                    try:
                        async with AsyncClient(sock) as c:
                            await c.ping()
                        break
                    except Exception:
                        await asyncio.sleep(0.05)
            counts, failures = [0] * writers, [0] * writers
            stop = time.monotonic() + seconds

            async def writer(i: int) -> None:
                async with AsyncClient(socks[i % daemons]) as c:
                    while True:
                        try:
                            s = await c.create_session()
                            break
                        except StorageError:
                            failures[i] += 1
                    while time.monotonic() < stop:
                        try:
                            await c.append_message(s.session_id, "user", "x" * 100)
                        except StorageError:  # the store kept moving: retried, not counted
                            failures[i] += 1
                            continue
                        counts[i] += 1

            started = time.monotonic()
            await asyncio.gather(*(writer(i) for i in range(writers)))
            rate = sum(counts) / (time.monotonic() - started)
            batches = 0
            for sock in socks:
                async with AsyncClient(sock) as c:
                    stats = await c.call("daemon.stats")
                    batches += stats["write_transactions"]
            moved = 0
            for sock in socks:
                with open(sock + ".log", "rb") as f:
                    moved += f.read().count(b"writer.store_moved")
            if sum(failures):
                print(f"  ({sum(failures)} writes failed with -32012 and were retried)")
            return rate, batches, moved
        finally:
            for p in procs:
                p.terminate()
                p.wait()
            await admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writers", type=int, default=16)
    args = ap.parse_args()
    for n in (1, 2, 4):
        rate, batches, moved = asyncio.run(run(n, args.writers, args.seconds, args.src))
        print(f"{n} daemon(s), {args.writers} writers: {rate:.0f} appends/s,"
              f" {batches} batches, {(batches + moved) / max(batches, 1):.2f} attempts"
              " per batch", flush=True)


if __name__ == "__main__":
    main()
