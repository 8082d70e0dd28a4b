"""Issue 45 §3 and §6 on a daemon process (SQLite): a search for a word said N times in one
message, alone and two at once, with `session.get` timed meanwhile; and the writes of
another client while the search index catches up on one append_many of large messages
of distinct words. Alone: `python -m bench.search_budget [--repeats N ...] [--mib M]`."""

from __future__ import annotations

import argparse
import functools
import random
import string
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sessiond import AsyncClient, StorageError

from .daemon import DaemonProcess


async def _timed_search(socket: str, word: str) -> tuple[float, str]:
    async with AsyncClient(socket) as c:
        t0 = time.perf_counter()
        try:
            found = await c.search(word)
            outcome = f"ok, {sum(len(s.hits) for s in found.sessions)} hits"
        except StorageError as exc:
            outcome = f"-32012 {exc.data.get('setting') or exc.data.get('detail')}"
        return time.perf_counter() - t0, outcome


async def _timed(call: Callable[[], Awaitable[Any]], until: Callable[[], bool]) -> list[float]:
    """How long each `call` took, called every 10 ms until `until()`."""
    took: list[float] = []
    while not until():
        t0 = time.perf_counter()
        await call()
        took.append(time.perf_counter() - t0)
        await anyio.sleep(0.01)
    return took


def _both(done: list[tuple[float, str]]) -> bool:
    return len(done) == 2


async def _into(done: list[tuple[float, str]], socket: str) -> None:
    done.append(await _timed_search(socket, "x"))


async def repeated(repeats: list[int]) -> None:
    """§3: a search for `x` on a message of `x` said N times; two at once, and the
    slowest `session.get` while they run."""
    for n in repeats:
        with tempfile.TemporaryDirectory(prefix="sb-") as d:
            daemon = DaemonProcess(d)
            await daemon.start()
            try:
                async with AsyncClient(daemon.socket) as c:
                    await c.create_session(session_id="x", task="t")
                    await c.append_message("x", "user", " ".join(["x"] * n))
                    alone, outcome = await _timed_search(daemon.socket, "x")
                    done: list[tuple[float, str]] = []

                    async with anyio.create_task_group() as tg:
                        tg.start_soon(_into, done, daemon.socket)
                        tg.start_soon(_into, done, daemon.socket)
                        gets = await _timed(lambda: c.get_session("x"),
                                            functools.partial(_both, done))
                print(f"repeats {n:>7}: search alone {alone:6.2f} s ({outcome}); two at once"
                      f" {max(t for t, _ in done):6.2f} s ({', '.join(o for _, o in done)});"
                      f" session.get meanwhile: {len(gets)}, slowest {max(gets) * 1e3:.1f} ms")
            finally:
                daemon.stop()


async def catch_up(mib: int, messages: int) -> None:
    """§6: one append_many of `messages` x `mib` MiB of distinct words, then another
    client's appends while the index catches up: their slowest acknowledgement."""
    rng = random.Random(45)
    words = (1 << 20) * mib // 8
    texts = [" ".join("".join(rng.choices(string.ascii_lowercase, k=7)) for _ in range(words))
             for _ in range(messages)]
    with tempfile.TemporaryDirectory(prefix="sb-") as d:
        daemon = DaemonProcess(d)
        await daemon.start()
        try:
            async with AsyncClient(daemon.socket) as c, AsyncClient(daemon.socket) as other:
                await c.create_session(session_id="big", task="t")
                await other.create_session(session_id="small", task="t")
                t0 = time.perf_counter()
                await c.append_messages("big", [{"role": "user", "content": t}
                                                for t in texts])
                acked = time.perf_counter() - t0
                t_end = time.perf_counter() + 6 * messages * mib / 4 + 5
                waits = await _timed(lambda: other.append_message("small", "user", "a write"),
                                     lambda: time.perf_counter() > t_end)
                print(f"append_many {messages} x {mib} MiB: acknowledged in {acked:.2f} s;"
                      f" {len(waits)} writes after it, slowest {max(waits):.2f} s, median"
                      f" {sorted(waits)[len(waits) // 2] * 1e3:.1f} ms")
        finally:
            daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, nargs="*", default=[65_536, 131_072, 262_144])
    parser.add_argument("--mib", type=int, default=16)
    parser.add_argument("--messages", type=int, default=7)
    args = parser.parse_args()
    anyio.run(repeated, args.repeats)
    anyio.run(catch_up, args.mib, args.messages)


if __name__ == "__main__":
    main()
