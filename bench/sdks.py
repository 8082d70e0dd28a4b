"""The SDK adapters against each SDK's own SQLite store, same workloads, same process.

    python -m bench.sdks            # full sizes
    python -m bench.sdks --quick    # small sizes (CI runs this; it asserts nothing)

Workloads per store: appends/s with 1 writer and with 16 writers (one conversation each),
read of the latest 20 items and a full read of a 5,000-item history (median ms), and the
database size after 5,000 appends. An SDK that is not installed is skipped, said so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from .daemon import DaemonProcess

ITEM_TEXT = "x" * 200  # ~200 B of content per appended item


@dataclass
class Row:
    sdk: str
    workload: str
    sdk_store: float
    sessiond: float
    unit: str
    note: str = ""

    @property
    def ratio(self) -> float:
        """How many times better sessiond is (higher is better for /s, lower for ms and MB)."""
        if self.unit.endswith("/s"):
            return self.sessiond / self.sdk_store
        return self.sdk_store / self.sessiond


def db_bytes(path: str) -> int:
    """The database's size once its WAL is checkpointed into it (the WAL's size swings)."""
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size, pages = con.execute("PRAGMA page_size").fetchone()[0], \
            con.execute("PRAGMA page_count").fetchone()[0]
    finally:
        con.close()
    return page_size * pages


FAILURES: dict[str, list[str]] = {}  # store label -> errors its writers met (kept going)


async def appends_per_s(make: Callable[[int], Any], add: Callable[[Any, int], Awaitable[None]],
                        writers: int, total: int, label: str = "") -> float:
    """`writers` conversations appending one item at a time, concurrently. An append that
    fails is counted in FAILURES[label] and not in the rate; the writer goes on."""
    sessions = [make(w) for w in range(writers)]
    per = total // writers
    done = 0

    async def run(session: Any) -> None:
        nonlocal done
        for i in range(per):
            try:
                await add(session, i)
                done += 1
            except Exception as exc:  # the SDK store's own failures: report them
                FAILURES.setdefault(label, []).append(f"{type(exc).__name__}: {exc}"[:120])

    t0 = time.perf_counter()
    await asyncio.gather(*(run(s) for s in sessions))
    return done / (time.perf_counter() - t0)


def failures_note(label: str) -> str:
    errors = FAILURES.pop(label, [])
    if not errors:
        return ""
    kinds = sorted({e.split(":")[0] + ": " + ("database is locked" if "locked" in e else
                                               e.split(":", 1)[1].strip()[:60]) for e in errors})
    return f"{len(errors)} failed appends in the SDK's store ({'; '.join(kinds)})"


async def append_figures(f: dict[str, float], sdk: str, label: str,
                         make: Callable[[int, int], Any],
                         add: Callable[[Any, int], Awaitable[None]], total: int) -> None:
    """f["1w"], f["16w"]: appends/s with 1 and 16 writers; make(writers, w) opens writer w."""
    for writers in (1, 16):
        f[f"{writers}w"] = await appends_per_s(lambda w, n=writers: make(n, w), add, writers,
                                               total, label=f"{sdk}-{label}-{writers}")


def append_rows(sdk: str, what: str, unit: str, o: dict[str, float],
                s: dict[str, float]) -> list[Row]:
    """The rows of append_figures, with what the SDK's store failed at in the note."""
    return [Row(sdk, f"{what}, {n} writer{'s' if n > 1 else ''}", o[f"{n}w"], s[f"{n}w"], unit,
                failures_note(f"{sdk}-sdk_store-{n}")) for n in (1, 16)]


async def median_ms(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def openai_agents(directory: str, daemon: DaemonProcess,
                        sizes: argparse.Namespace) -> list[Row]:
    from agents import SQLiteSession

    from sessiond.integrations.openai_agents import SessiondSession

    sdk_db = os.path.join(directory, "agents.db")
    def item(i: int) -> dict[str, Any]:
        return {"role": "user" if i % 2 else "assistant", "content": f"{i} {ITEM_TEXT}"}

    async def add(session: Any, i: int) -> None:
        await session.add_items([item(i)])

    stores: dict[str, Callable[[str], Any]] = {
        "sdk_store": lambda name: SQLiteSession(name, sdk_db),
        # One connection per conversation, as separate agent processes would have.
        "sessiond": lambda name: SessiondSession(name, socket=daemon.socket),
    }
    figures: dict[str, dict[str, float]] = {}
    for label, make in stores.items():
        f = figures[label] = {}
        await append_figures(f, "openai-agents", label,
                             lambda n, w, make=make: make(f"w{n}-{w}"), add, sizes.appends)
        history = make("history")
        before = db_bytes(sdk_db) if label == "sdk_store" else db_bytes(daemon.db)
        for i in range(sizes.history):
            await history.add_items([item(i)])
        f["size"] = ((db_bytes(sdk_db) if label == "sdk_store" else db_bytes(daemon.db))
                     - before) / 1e6
        f["latest20"] = await median_ms(lambda h=history: h.get_items(20), sizes.reads)
        f["full"] = await median_ms(lambda h=history: h.get_items(), max(3, sizes.reads // 20))
    o, s = figures["sdk_store"], figures["sessiond"]
    return [
        *append_rows("openai-agents", "append", "items/s", o, s),
        Row("openai-agents", "read latest 20", o["latest20"], s["latest20"], "ms"),
        Row("openai-agents", f"full read of {sizes.history:,}", o["full"], s["full"], "ms"),
        Row("openai-agents", f"db growth for {sizes.history:,} appends",
            o["size"], s["size"], "MB"),
    ]


async def langgraph(directory: str, daemon: DaemonProcess, sizes: argparse.Namespace) -> list[Row]:
    """Checkpoints as a graph step writes them: a 4 KB context channel set once, and two
    small channels (a step counter and the last message) that change every step."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from sessiond.integrations.langgraph import SessiondSaver

    context = "c" * 4096
    sdk_db = os.path.join(directory, "langgraph.db")

    class Thread:
        """One thread's steps against a saver, each put carrying the changed channels only."""

        def __init__(self, saver: Any, thread_id: str) -> None:
            self.saver, self.step = saver, 0
            self.config: dict[str, Any] = {"configurable": {"thread_id": thread_id,
                                                            "checkpoint_ns": ""}}
            self.versions: dict[str, Any] = {}

        async def put(self, _: int = 0) -> None:
            cp = empty_checkpoint()
            changed = ["context", "step", "last"] if self.step == 0 else ["step", "last"]
            for channel in changed:
                self.versions[channel] = self.saver.get_next_version(
                    self.versions.get(channel), None)
            cp["channel_values"] = {"context": context, "step": self.step,
                                    "last": f"{self.step} {ITEM_TEXT}"}
            cp["channel_versions"] = dict(self.versions)
            self.config = await self.saver.aput(
                self.config, cp, {"source": "loop", "step": self.step},
                {c: self.versions[c] for c in changed})
            self.step += 1

    async def add(thread: Thread, i: int) -> None:
        await thread.put()

    figures: dict[str, dict[str, float]] = {}
    async with AsyncSqliteSaver.from_conn_string(sdk_db) as sdk_saver:
        ours = SessiondSaver(daemon.socket)
        for label, saver, db in (("sdk_store", sdk_saver, sdk_db), ("sessiond", ours, daemon.db)):
            f = figures[label] = {}
            await append_figures(f, "langgraph", label,
                                 lambda n, w, saver=saver: Thread(saver, f"lg{n}-{w}"), add,
                                 sizes.appends)
            history = Thread(saver, "history")
            before = db_bytes(db)
            for _ in range(sizes.history):
                await history.put()
            f["size"] = (db_bytes(db) - before) / 1e6
            latest = {"configurable": {"thread_id": "history", "checkpoint_ns": ""}}
            f["latest"] = await median_ms(lambda s=saver, c=latest: s.aget_tuple(c), sizes.reads)

            async def listed(s: Any = saver, c: Any = latest, limit: int | None = None) -> None:
                async for _ in s.alist(c, limit=limit):
                    pass

            f["latest20"] = await median_ms(lambda: listed(limit=20), sizes.reads)
            f["full"] = await median_ms(listed, 3)
        await ours.aclose()
        ours.close()
    o, s = figures["sdk_store"], figures["sessiond"]
    return [
        *append_rows("langgraph", "put", "checkpoints/s", o, s),
        Row("langgraph", "get_tuple (latest)", o["latest"], s["latest"], "ms"),
        Row("langgraph", "list latest 20", o["latest20"], s["latest20"], "ms"),
        Row("langgraph", f"full list of {sizes.history:,}", o["full"], s["full"], "ms"),
        Row("langgraph", f"db growth for {sizes.history:,} puts", o["size"], s["size"], "MB"),
    ]


async def adk(directory: str, daemon: DaemonProcess, sizes: argparse.Namespace) -> list[Row]:
    """Events with a text part and a one-key state delta, as an agent turn writes them; and
    list_sessions of one user among `sizes.sessions` sessions of the app."""
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions import DatabaseSessionService
    from google.adk.sessions.base_session_service import GetSessionConfig
    from google.genai import types

    from sessiond.integrations.adk import SessiondSessionService

    sdk_db = os.path.join(directory, "adk.db")
    stores = {"sdk_store": DatabaseSessionService(f"sqlite+aiosqlite:///{sdk_db}"),
              "sessiond": SessiondSessionService(daemon.socket)}

    def event(i: int) -> Event:
        return Event(author="agent", invocation_id=f"inv{i}",
                     content=types.Content(role="model",
                                           parts=[types.Part(text=f"{i} {ITEM_TEXT}")]),
                     actions=EventActions(state_delta={"turn": i}))

    figures: dict[str, dict[str, float]] = {}
    for label, service in stores.items():
        f = figures[label] = {}

        sessions = {(n, w): await service.create_session(
            app_name="bench", user_id=f"w{n}", session_id=f"w{n}-{w}")
            for n in (1, 16) for w in range(n)}
        await append_figures(
            f, "adk", label, lambda n, w, sessions=sessions: sessions[(n, w)],
            lambda session, i, service=service: service.append_event(session, event(i)),
            sizes.appends)
        db = sdk_db if label == "sdk_store" else daemon.db
        before = db_bytes(db)
        history = await service.create_session(app_name="bench", user_id="h", session_id="h")
        for i in range(sizes.history):
            await service.append_event(history, event(i))
        f["size"] = (db_bytes(db) - before) / 1e6
        recent = GetSessionConfig(num_recent_events=20)
        f["latest20"] = await median_ms(lambda s=service, c=recent: s.get_session(
            app_name="bench", user_id="h", session_id="h", config=c), sizes.reads)
        f["full"] = await median_ms(lambda s=service: s.get_session(
            app_name="bench", user_id="h", session_id="h"), 3)
        for i in range(sizes.sessions):
            await service.create_session(app_name="many", user_id=f"user{i % 100}",
                                         session_id=f"m{i}")
        f["list"] = await median_ms(lambda s=service: s.list_sessions(
            app_name="many", user_id="user7"), max(3, sizes.reads // 10))
    await stores["sessiond"].close()
    o, s = figures["sdk_store"], figures["sessiond"]
    return [
        *append_rows("adk", "append_event", "events/s", o, s),
        Row("adk", "get_session, latest 20 events", o["latest20"], s["latest20"], "ms"),
        Row("adk", f"get_session, all {sizes.history:,} events", o["full"], s["full"], "ms"),
        Row("adk", f"list_sessions of a user, {sizes.sessions:,} sessions in the app",
            o["list"], s["list"], "ms"),
        Row("adk", f"db growth for {sizes.history:,} events", o["size"], s["size"], "MB"),
    ]


SDKS: dict[str, tuple[str, Callable[..., Awaitable[list[Row]]]]] = {
    "openai-agents": ("agents", openai_agents),
    "langgraph": ("langgraph.checkpoint.sqlite", langgraph),
    "adk": ("sqlalchemy", adk),  # DatabaseSessionService needs google-adk[db]
}


async def main(sizes: argparse.Namespace) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="sdb-") as directory:
        daemon = DaemonProcess(directory)
        await daemon.start()
        try:
            for name, (module, bench) in SDKS.items():
                try:
                    __import__(module)
                except ImportError:
                    if sizes.require_all:
                        raise
                    print(f"{name}: not installed (pip install -e '.[{name},sdk-tests]');"
                          " skipped")
                    continue
                rows += await bench(directory, daemon, sizes)
        finally:
            daemon.stop()
    return rows


def print_table(rows: list[Row]) -> None:
    print("| SDK | workload | SDK's own SQLite store | sessiond | unit | sessiond / SDK | note |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r.sdk} | {r.workload} | {r.sdk_store:,.2f} | {r.sessiond:,.2f} | {r.unit} "
              f"| {r.ratio:.2f}× | {r.note} |")
    if FAILURES:
        print("sessiond failures:", FAILURES)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.sdks")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--require-all", action="store_true",
                        help="fail, not skip, when an SDK is not installed (CI)")
    args = parser.parse_args()
    sizes = argparse.Namespace(appends=320, history=1_000, reads=20, sessions=1_000) \
        if args.quick else argparse.Namespace(appends=3_200, history=5_000, reads=200,
                                              sessions=10_000)
    sizes.require_all = args.require_all
    result = asyncio.run(main(sizes))
    print_table(result)
    if args.out:
        with open(args.out, "w") as f:
            json.dump([asdict(r) | {"ratio": r.ratio} for r in result], f, indent=2)
