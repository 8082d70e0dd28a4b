"""SessiondStore against LangGraph's AsyncSqliteStore: one operation's latency as the store grows.

    python -m bench.memory_stores            # 100 and 10,000 items
    python -m bench.memory_stores --quick    # 100 and 1,000 items

Per store and size (items spread over 100 namespaces, a real daemon for sessiond): the
median milliseconds of a get, an update (a put of an existing item), a filtered search
for a page of 10 in one namespace, a query search in one namespace, and a listing of
the namespaces. A get or put that costs the same at both sizes reads no more than it
must; a search or a listing grows with what it must look at (a namespace, the list of
namespaces), not with the store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .daemon import DaemonProcess

NAMESPACES = 100


async def median_ms(fn: Callable[[], Awaitable[Any]], n: int) -> float:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


async def figures(store: Any, items: int, reads: int) -> dict[str, float]:
    async def fill(start: int) -> None:
        await asyncio.gather(*(store.aput(("users", f"u{i % NAMESPACES}"), f"k{i}", {
            "text": f"memory number {i} about topic{i % 7}", "n": i})
            for i in range(start, min(start + 100, items))))

    for start in range(0, items, 100):
        await fill(start)
    ns = ("users", "u3")
    return {
        "get": await median_ms(lambda: store.aget(ns, "k3"), reads),
        "put (update)": await median_ms(lambda: store.aput(ns, "k3", {"text": "x", "n": 3}),
                                        reads),
        "search, filter, page of 10": await median_ms(
            lambda: store.asearch(ns, filter={"n": {"$gte": 0}}, limit=10), reads),
        "search, query": await median_ms(lambda: store.asearch(ns, query="topic3"), reads),
        "list_namespaces": await median_ms(lambda: store.alist_namespaces(limit=1000), reads),
    }


async def main(sizes: list[int], reads: int) -> None:
    from langgraph.store.sqlite.aio import AsyncSqliteStore

    from sessiond.integrations.langgraph_store import SessiondStore

    rows: dict[tuple[str, int], dict[str, float]] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="smb-") as directory:
            daemon = DaemonProcess(directory)
            await daemon.start()
            ours = SessiondStore(daemon.socket)
            try:
                rows[("sessiond", size)] = await figures(ours, size, reads)
            finally:
                ours.close()
                daemon.stop()
            path = os.path.join(directory, "store.db")
            async with AsyncSqliteStore.from_conn_string(path) as theirs:
                await theirs.setup()
                rows[("AsyncSqliteStore", size)] = await figures(theirs, size, reads)
    print("| operation | " + " | ".join(f"{s} at {n:,}" for s, n in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    for op in next(iter(rows.values())):
        print(f"| {op} (ms) | " + " | ".join(f"{r[op]:.2f}" for r in rows.values()) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.memory_stores")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    asyncio.run(main([100, 1_000] if args.quick else [100, 10_000], 20 if args.quick else 100))
