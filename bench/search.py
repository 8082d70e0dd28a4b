"""Search figures: appends with and without the search index (B13a), and session.search
over a large store built by raw SQL inserts (B13). Run as part of `python -m bench`, or
alone: `python -m bench.search [--sessions N --messages M] [--keep DIR]`."""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import tempfile
import time
from typing import Any

import anyio

from sessiond import AsyncClient
from sessiond_schemas.errors import InvalidParamsError

from .daemon import DaemonProcess

# ~200 B of words: the index tokenizes real text, not one 200-character token.
TEXT = ("the agent ran the login test again after fixing the session cookie handling and"
        " the deploy script now retries the cache warmup before it reports success to ci ok")
QUICK = {"appends": 3_000, "rounds": 3, "sessions": 1_000, "messages": 100_000}
FULL = {"appends": 30_000, "rounds": 3, "sessions": 100_000, "messages": 10_000_000}
# The 'without' daemon: SQLite's commits leave the search rows out already (the index
# follows the log, stores/sqlite/store.py); its catch-up then indexes nothing.
NO_SEARCH = ("import sys; from sessiond_daemon import __main__; from sessiond_daemon.stores"
             ".sqlite import search; search.index_range = lambda db, after, upto: None;"
             " __main__.main(sys.argv[1:])")


class _Daemon(DaemonProcess):
    """A sessiond whose writer skips the search index (the 'without' of B13a)."""

    def __init__(self, directory: str, indexed: bool) -> None:
        super().__init__(directory)
        self.indexed = indexed

    def program(self) -> list[str]:
        return super().program() if self.indexed else ["-c", NO_SEARCH]


async def _appends(socket: str, total: int) -> float:
    """16 clients appending ~200 B text messages to one session: appends/s."""
    async with AsyncClient(socket) as c:
        sid = (await c.create_session()).session_id
    per = total // 16

    async def client() -> None:
        async with AsyncClient(socket) as own:
            for _ in range(per):
                await own.append_message(sid, "user", TEXT)

    t0 = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(client)
    return per * 16 / (time.perf_counter() - t0)


async def append_overhead(directory: str, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """B13a: B1's appends with the index and without it, in alternating rounds (each on a
    fresh database), so machine noise hits both alike."""
    rates: dict[bool, list[float]] = {True: [], False: []}
    for r in range(sizes["rounds"]):
        for indexed in (False, True):
            d = _Daemon(tempfile.mkdtemp(dir=directory, prefix=f"b13a-{r}-"), indexed)
            await d.start()
            try:
                rates[indexed].append(await _appends(d.socket, sizes["appends"]))
            finally:
                d.stop()
    with_, without = statistics.median(rates[True]), statistics.median(rates[False])
    ratio = with_ / without
    return [{"id": "B13a", "name": "B1 appends with the search index", "value": with_,
             "unit": "appends/s", "baseline": without, "ratio": ratio,
             "target": ">= 90% of the same without it", "met": ratio >= 0.9,
             "note": f"~200 B text messages; {sizes['rounds']} alternating rounds, medians;"
                     f" without: {', '.join(f'{x:,.0f}' for x in rates[False])};"
                     f" with: {', '.join(f'{x:,.0f}' for x in rates[True])}"}]


# --- B13: a large store, built by raw SQL inserts ------------------------------------------

VOCABULARY = [f"{a}{b}{c}" for a in ("ka", "lo", "mi", "ne", "po", "ru", "si", "te", "vu", "zo")
              for b in ("bar", "cen", "dor", "fin", "gal", "hum", "jet", "kor", "lim", "mos")
              for c in ("", "a", "e", "i", "o", "u", "y", "an", "el", "is")]  # 1,000 words
RARE = "zanzibar"  # in about 1 message in 100,000
PHRASE = "login test"  # in one message of about 1 session in 100
STATUSES = ("completed", "failed", "active", "paused")


def build(path: str, sessions: int, messages: int, seed: int = 13) -> dict[str, int]:
    """Fill a migrated, empty database: `sessions` sessions sharing `messages` messages,
    with Zipf-distributed words; hashes are placeholders (verify is not part of B13)."""
    from sessiond_daemon.stores.models.search_text import text_of
    from sessiond_daemon.stores.sqlite import search

    rng = random.Random(seed)
    weights = [1 / (i + 1) for i in range(len(VOCABULARY))]
    cum = [sum(weights[:i + 1]) for i in range(len(weights))]
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA synchronous = OFF")
    con.execute("PRAGMA journal_mode = WAL")
    search.register(con)
    per = messages // sessions
    position, planted = 0, {"rare": 0, "phrase": 0}
    t0 = "2026-11-01T00:00:00.000000Z"
    con.execute("BEGIN")
    for s in range(sessions):
        sid = f"b13-{s:07}"
        status = STATUSES[s % len(STATUSES)]
        events, index, msgs = [], [], []
        position += 1
        created = {"namespace": f"team{s % 10}", "actor_name": f"org/agent{s % 50}",
                   "task": " ".join(rng.choices(VOCABULARY, cum_weights=cum, k=6)),
                   "status": "active"}
        events.append((position, sid, 1, f"e{position:012}", "session.created", 1, t0,
                       json.dumps(created), "{}", "0" * 64))
        index.append((position, *text_of("session.created", created)))
        phrase_at = rng.randrange(per) if rng.random() < 0.01 else -1
        for m in range(per):
            position += 1
            words = rng.choices(VOCABULARY, cum_weights=cum, k=12)
            if rng.random() < 0.00001:
                words[3] = RARE
                planted["rare"] += 1
            if m == phrase_at:
                words[5:7] = PHRASE.split()
                planted["phrase"] += 1
            data = {"role": "user" if m % 2 else "assistant", "content": " ".join(words),
                    "message_id": f"m{position:012}", "sequence": m}
            at = f"2026-11-{1 + (s * 29) // sessions:02}T00:00:00.{m:06}Z"
            events.append((position, sid, m + 2, f"e{position:012}", "message.appended", 1, at,
                           json.dumps(data), "{}", "0" * 64))
            index.append((position, data["content"], None))
            msgs.append((sid, m, position))
        con.executemany("INSERT INTO events (position, session_id, version, event_id, type,"
                        " schema_version, recorded_at, data, meta, hash)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", events)
        con.executemany("INSERT INTO search (rowid, body, tags) VALUES (?, ?, ?)", index)
        con.executemany("INSERT INTO messages (session_id, sequence, position) VALUES (?, ?, ?)",
                        msgs)
        state = {"session_id": sid, "version": per + 1, "namespace": created["namespace"],
                 "actor_name": created["actor_name"], "task": created["task"],
                 "status": status, "message_count": per,
                 "timestamps": {"created_at": t0, "updated_at": at}}
        con.execute("INSERT INTO sessions (session_id, version, status, namespace, actor_name,"
                    " source, task, created_at, updated_at, message_count, input_tokens,"
                    " output_tokens, estimated_cost, last_position, last_hash, state)"
                    " VALUES (?, ?, ?, ?, ?, 'user', ?, ?, ?, ?, 0, 0, 0, ?, ?, ?)",
                    (sid, per + 1, status, created["namespace"], created["actor_name"],
                     created["task"], t0, at, per, position, "0" * 64, json.dumps(state)))
        if s % 1000 == 999:
            con.execute("COMMIT")
            con.execute("BEGIN")
    con.execute("COMMIT")
    con.execute("INSERT INTO search (search) VALUES ('optimize')")  # as after a reindex
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    return {"events": position, **planted}


async def b13(directory: str, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """B13: session.search latency over `sessions` sessions and `messages` messages."""
    sessions, messages = sizes["sessions"], sizes["messages"]
    d = DaemonProcess(tempfile.mkdtemp(dir=directory, prefix="b13-"))
    await d.start()  # creates and migrates the database
    d.stop()
    t0 = time.perf_counter()
    made = await anyio.to_thread.run_sync(build, d.db, sessions, messages)
    built = time.perf_counter() - t0
    size_gb = os.path.getsize(d.db) / 1e9
    await d.start()
    queries = [
        ("a rare word", RARE, {}),
        ("a phrase", f'"{PHRASE}"', {}),
        ("a phrase, status and time filters", f'"{PHRASE}"',
         {"status": ["completed", "failed"], "since": "2026-11-10T00:00:00Z"}),
        ("a word AND a rare word", f"{VOCABULARY[40]} {RARE}", {}),
        ("a prefix of 10 rare words", f"{VOCABULARY[999][:-2]}*", {}),
        ("a 3-letter prefix of 100 words", f"{VOCABULARY[0][:3]}*", {}),
        ("a mid-frequency word", VOCABULARY[300], {}),
        ("the most common word", VOCABULARY[0], {}),
    ]
    figures: list[dict[str, Any]] = []
    try:
        async with AsyncClient(d.socket) as c:
            for name, query, filters in queries:
                samples, found, outcome = [], 0, ""
                for _ in range(7):
                    q0 = time.perf_counter()
                    try:
                        result = await c.search(query, limit=20, **filters)
                        found = len(result.sessions)
                    except InvalidParamsError as exc:  # refused by the search budget
                        outcome = (f" (refused: {exc.data['setting']}, about"
                                   f" {exc.data['found']:,} index entries)")
                    samples.append(time.perf_counter() - q0)
                med = statistics.median(samples[1:]) * 1000  # the first warms the cache
                selective = not any(w in name for w in ("common", "mid"))
                figures.append({
                    "id": "B13", "name": f"session.search, {name}", "value": med,
                    "unit": "ms median",
                    "baseline": None, "ratio": None,
                    "target": "<= 50 ms" if selective else "(context)",
                    "met": (med <= 50) if selective else None,
                    "note": f"{query!r} {filters or ''} -> {found} sessions on the first page"
                            f"{outcome};"
                            f" {sessions:,} sessions, {messages:,} messages"})
    finally:
        d.stop()
    figures.append({"id": "B13", "name": "B13 store built by raw SQL", "value": built,
                    "unit": "s", "baseline": None, "ratio": None, "target": "(context)",
                    "met": None,
                    "note": f"{made['events']:,} events, {size_gb:.2f} GB with the index;"
                            f" planted {made['rare']} rare words, {made['phrase']} phrases"})
    return figures


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.search", description=__doc__)
    p.add_argument("--sessions", type=int, default=QUICK["sessions"])
    p.add_argument("--messages", type=int, default=QUICK["messages"])
    p.add_argument("--appends", action="store_true", help="also run B13a")
    args = p.parse_args()
    sizes = {**QUICK, "sessions": args.sessions, "messages": args.messages}
    with tempfile.TemporaryDirectory(prefix="sdb-") as directory:
        async def run() -> list[dict[str, Any]]:
            figs = await b13(directory, sizes)
            if args.appends:
                figs += await append_overhead(directory, sizes)
            return figs
        for f in anyio.run(run, backend="asyncio"):
            print(f"{f['id']:<5} {f['name']:<52} {f['value']:>10,.2f} {f['unit']:<10}"
                  f" {f['target']:<28} {f['note']}", flush=True)


if __name__ == "__main__":
    main()
