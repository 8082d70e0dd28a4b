"""Raw-SQLite baselines: the plain sqlite3 module writing the same rows in-process."""

from __future__ import annotations

import os
import sqlite3
import statistics
import time
from dataclasses import dataclass

SCHEMA = """
CREATE TABLE events (
    position INTEGER PRIMARY KEY, session_id TEXT NOT NULL, version INTEGER NOT NULL,
    event_id TEXT NOT NULL UNIQUE, type TEXT NOT NULL, recorded_at TEXT NOT NULL,
    data BLOB NOT NULL, UNIQUE (session_id, version))
"""


@dataclass
class WriteBaseline:
    rows_per_s: float
    median_row_s: float


def _open(path: str, synchronous: str) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute(f"PRAGMA synchronous = {synchronous}")
    con.executescript(SCHEMA)
    return con


def write_rows(directory: str, rows: int, per_transaction: int,
               synchronous: str = "FULL") -> WriteBaseline:
    """Insert `rows` message-sized rows, `per_transaction` per commit; rows/s and median per row."""
    path = os.path.join(directory, f"baseline-{per_transaction}-{time.monotonic_ns()}.db")
    con = _open(path, synchronous)
    payload = ('{"role":"user","content":"' + "x" * 150 + '","sequence":0}').encode()
    times: list[float] = []
    start = time.perf_counter()
    version = 0
    for _ in range(rows // per_transaction):
        t0 = time.perf_counter()
        con.execute("BEGIN IMMEDIATE")
        for _ in range(per_transaction):
            version += 1
            con.execute(
                "INSERT INTO events (session_id, version, event_id, type, recorded_at, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                ("s", version, f"e{version}", "message.appended", "2026-01-01T00:00:00Z", payload))
        con.execute("COMMIT")
        times.append((time.perf_counter() - t0) / per_transaction)
    elapsed = time.perf_counter() - start
    con.close()
    return WriteBaseline(rows_per_s=version / elapsed, median_row_s=statistics.median(times))


def point_read_s(directory: str, reads: int = 2000) -> float:
    """Median time of one primary-key read of a ~2 KB row, the floor for a view read."""
    path = os.path.join(directory, f"baseline-read-{time.monotonic_ns()}.db")
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("CREATE TABLE views (id TEXT PRIMARY KEY, state BLOB)")
    con.executemany("INSERT INTO views VALUES (?, ?)",
                    [(f"s{i}", b"x" * 2048) for i in range(1000)])
    times = []
    for i in range(reads):
        t0 = time.perf_counter()
        con.execute("SELECT state FROM views WHERE id = ?", (f"s{i % 1000}",)).fetchone()
        times.append(time.perf_counter() - t0)
    con.close()
    return statistics.median(times)
