"""B15, the context read: `python -m bench.compaction [--quick] [--stores sqlite,postgresql]`.

On each store, one real daemon: a session of N messages (100,000; 10,000 with --quick)
compacted at message N - 100, and a session of 100 messages compacted before its first
(a summary of none), so both contexts are one summary and 100 messages. Then, sampled
alternately, the median of each read of both and the ratio large / small:

- `session.context` (limit 100: the whole context in one page);
- the drop-ins' own resume calls, where their SDK is installed: the OpenAI Agents SDK's
  `SessiondSession.get_items()` and ADK's `get_session` with
  `GetSessionConfig(num_recent_events=100)`, each on sessions written through it.

The target (issue 48) is at most 1.2x for every read. Nothing is asserted: CI may run
--quick. PostgreSQL is `$SESSIOND_TEST_POSTGRES` (default postgresql://127.0.0.1:5432/test);
a database is made for the run and dropped after it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sessiond import AsyncClient

from .fleet import DEFAULT_DSN, Databases, FleetDaemon

TARGET = 1.2
SMALL = 100
TAIL = 100
CONTENT = "x" * 200
SUMMARY = [{"role": "system", "content": "the summary of what came before"}]
Read = Callable[[str], Awaitable[Any]]


async def fill(c: AsyncClient, sid: str, count: int) -> None:
    """`count` messages, 5,000 a call, then a compaction leaving the last TAIL after it."""
    await c.create_session(sid)
    done = 0
    while done < count:
        n = min(5_000, count - done)
        await c.append_messages(sid, [{"role": "user", "content": CONTENT}] * n)
        done += n
    await c.compact(sid, SUMMARY, through_sequence=count - TAIL - 1)


async def paired(read: Read, small: str, large: str, n: int) -> tuple[float, float]:
    """Median ms of `read` on each side, sampled alternately (after a warm-up of each)."""
    a: list[float] = []
    b: list[float] = []
    await read(small)
    await read(large)
    for _ in range(n):
        for sid, out in ((small, a), (large, b)):
            t0 = time.perf_counter()
            await read(sid)
            out.append(time.perf_counter() - t0)
    return statistics.median(a) * 1000, statistics.median(b) * 1000


def report(store: str, what: str, small: float, large: float, n: int) -> dict[str, Any]:
    ratio = large / small
    print(f"B15 {store:<10} {what:<44} {SMALL} msgs: {small:7.3f} ms  {n:,} msgs:"
          f" {large:7.3f} ms  ratio {ratio:.2f}  {'ok' if ratio <= TARGET else 'MISSED'}",
          flush=True)
    return {"store": store, "read": what, "small_ms": small, "large_ms": large,
            "ratio": ratio, "met": ratio <= TARGET}


async def context_reads(c: AsyncClient, store: str, n: int, samples: int
                        ) -> list[dict[str, Any]]:
    await fill(c, "b15-small", SMALL)
    await fill(c, "b15-large", n)
    ctx = await c.context("b15-large", limit=TAIL)
    assert len(ctx.messages) == TAIL and ctx.summary, "the large context is not its tail"
    small, large = await paired(lambda sid: c.context(sid, limit=TAIL), "b15-small",
                                "b15-large", samples)
    return [report(store, "session.context (summary + 100 messages)", small, large, n)]


async def openai_reads(socket: str, store: str, n: int, samples: int
                       ) -> list[dict[str, Any]]:
    """SessiondSession.get_items() on sessions written through it and compacted as its
    SDK compacts (`_atomic_replace_items`: one session.compacted), TAIL items after."""
    try:
        from sessiond.integrations.openai_agents import SessiondSession
    except ImportError:
        print("B15 openai-agents: the SDK is not installed (pip install 'sessiond[openai-agents]')")
        return []
    item = {"role": "user", "content": CONTENT}
    sessions = {}
    for name, count in (("b15-oa-small", SMALL), ("b15-oa-large", n)):
        session = SessiondSession(name, socket=socket)
        await session.add_items([item] * (count - TAIL))
        await session._atomic_replace_items([{"role": "system", "content": "summary"}])
        await session.add_items([item] * TAIL)
        sessions[name] = session
    assert len(await sessions["b15-oa-large"].get_items()) == TAIL + 1
    small, large = await paired(lambda sid: sessions[sid].get_items(), "b15-oa-small",
                                "b15-oa-large", samples)
    for session in sessions.values():
        session.close()
    return [report(store, "SessiondSession.get_items() (1 + 100 items)", small, large, n)]


async def adk_reads(socket: str, store: str, n: int, samples: int) -> list[dict[str, Any]]:
    """ADK's get_session with GetSessionConfig(num_recent_events=100) on sessions of 100 and
    of N events written through SessiondSessionService (timestamps going forward, as ADK's
    runner writes them)."""
    try:
        from google.adk.events.event import Event
        from google.adk.sessions.base_session_service import GetSessionConfig
        from google.genai import types

        from sessiond.integrations.adk import SessiondSessionService, session_id_for
    except ImportError:
        print("B15 adk: the SDK is not installed (pip install 'sessiond[adk]')")
        return []
    service = SessiondSessionService(socket)
    async with AsyncClient(socket) as c:
        for name, count in (("small", SMALL), ("large", n)):
            session = await service.create_session(app_name="b15", user_id="u", session_id=name)
            event = Event(author="user", invocation_id="i", content=types.Content(
                role="user", parts=[types.Part(text=CONTENT)]))
            await service.append_event(session, event)  # one through the service, then bulk
            first = (await c.list_messages(session_id_for("b15", "u", name))).messages[0]
            stamp = event.timestamp
            sid = session_id_for("b15", "u", name)
            for done in range(1, count, 5_000):
                batch = []
                for i in range(done, min(count, done + 5_000)):
                    e = first.metadata["adk_event"] | {"id": f"e{i}", "timestamp": stamp + i}
                    batch.append({"role": "user", "content": first.content, "metadata": {
                        **first.metadata, "adk_event": e, "adk_newest": stamp + i}})
                await c.append_messages(sid, batch)
    config = GetSessionConfig(num_recent_events=TAIL)

    async def read(name: str) -> Any:
        return await service.get_session(app_name="b15", user_id="u", session_id=name,
                                         config=config)

    got = await read("large")
    assert got is not None and len(got.events) == TAIL, "the narrowed read is not the tail"
    small, large = await paired(read, "small", "large", samples)
    await service.close()
    return [report(store, "ADK get_session(num_recent_events=100)", small, large, n)]


async def trimmed(c: AsyncClient, store: str, db: str) -> list[dict[str, Any]]:
    """The large session trimmed behind its compaction (session.trim, older than 0 days):
    daemon.verify, and on SQLite the file after a VACUUM before and after the trim."""
    import os
    import sqlite3

    def vacuumed() -> int:
        with sqlite3.connect(db) as con:
            con.execute("VACUUM")
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return os.path.getsize(db)

    before = vacuumed() if store == "sqlite" else 0
    t0, events, calls = time.perf_counter(), 0, 0
    while (done := await c.trim("b15-large", older_than_days=0)).starts_at is not None:
        events, calls = events + done.trimmed_events, calls + 1  # 10,000 a call at most
    took = time.perf_counter() - t0
    ok = (await c.verify()).ok
    after = vacuumed() if store == "sqlite" else 0
    trimmed_bytes = events * len(CONTENT)
    print(f"B15 {store:<10} session.trim of {events:,} events ({calls} calls): {took:.2f} s;"
          f" verify {'ok' if ok else 'FAILED'}" + (
              f"; file after VACUUM {before / 1e6:.1f} MB -> {after / 1e6:.1f} MB"
              f" ({(before - after) / 1e6:.1f} MB freed; message text trimmed"
              f" {trimmed_bytes / 1e6:.1f} MB)" if store == "sqlite" else ""), flush=True)
    return [{"store": store, "read": "session.trim", "trimmed_events": events,
             "seconds": took, "verify_ok": ok, "file_before": before, "file_after": after,
             "met": ok and (store != "sqlite" or before - after >= trimmed_bytes)}]


async def run_store(store: str, db: str, n: int, samples: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sdb-b15-") as directory:
        d = FleetDaemon(directory, db or f"{directory}/b15.db", "b15")
        await d.start()
        try:
            async with AsyncClient(d.socket) as c:
                rows += await context_reads(c, store, n, samples)
            rows += await openai_reads(d.socket, store, n, samples)
            rows += await adk_reads(d.socket, store, n, samples)
            async with AsyncClient(d.socket) as c:
                rows += await trimmed(c, store, d.db)
        finally:
            d.stop()
    return rows


async def run(stores: list[str], n: int, samples: int, dsn: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for store in stores:
        if store == "sqlite":
            rows += await run_store(store, "", n, samples)
            continue
        databases = Databases(dsn)
        try:
            rows += await run_store(store, await databases.new(), n, samples)
        finally:
            await databases.drop_all()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.compaction", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="N = 10,000, fewer samples")
    p.add_argument("--messages", type=int, help="N, the large side (default 100,000)")
    p.add_argument("--stores", default="sqlite,postgresql")
    p.add_argument("--dsn", default=DEFAULT_DSN)
    args = p.parse_args()
    n = args.messages or (10_000 if args.quick else 100_000)
    samples = 50 if args.quick else 300
    print(f"B15: the context read, N = {n:,} messages compacted at {n - TAIL:,}, against"
          f" {SMALL}; {samples} samples a side; target <= {TARGET}x", flush=True)
    rows = anyio.run(run, args.stores.split(","), n, samples, args.dsn)
    missed = [f"{r['store']} {r['read']}" for r in rows if not r["met"]]
    print(f"missing the {TARGET}x target: {', '.join(missed) if missed else 'none'}")


if __name__ == "__main__":
    main()
