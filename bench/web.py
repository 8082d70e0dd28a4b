"""W1 and W2: the web view's time to first render, against `sessionctl` on the same data.

    python -m bench.web            # 100,000 sessions and a session of 100,000 events
    python -m bench.web --quick    # 2,000 and 2,000 (CI runs this; it asserts no timing)

One daemon with its HTTP face on loopback; a small store (1,000 sessions, a session of
1,000 events) and a large one are measured in the same run, so the ratio large/small says
whether a page loads the whole list or history (it should not: both are paged). W1 is the
sessions list: the page until its first row is drawn, and `sessionctl list` until it has
printed. W2 is one session: the page until its timeline is drawn, and `sessionctl events
ID` (a page of events) until it has printed. Needs playwright and Debian's chromium
(tests/test_web.py says how); prints the figures and writes them as JSON with --out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import anyio

from sessiond import AsyncClient
from sessiond_schemas.paths import http_token_path

from .daemon import DaemonProcess

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
ROUNDS = 5


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def fill(sock: str, sessions: int, events: int, tag: str) -> str:
    """`sessions` sessions (16 writers), and one of them with `events` messages; its id."""
    big = f"{tag}-big"
    async with AsyncClient(sock) as c:
        await c.create_session(big, task="the long one", actor_name="bench/web")
        for start in range(0, events - 1, 500):  # created is one event
            n = min(500, events - 1 - start)
            await c.append_messages(big, [{"role": "user", "content": f"message {start + i}"}
                                          for i in range(n)])
    todo = iter(range(sessions - 1))

    async def writer() -> None:
        async with AsyncClient(sock) as c:
            for i in todo:
                await c.create_session(f"{tag}-{i:07d}", task=f"task {i}",
                                       actor_name=f"bench/a{i % 7}")

    async with anyio.create_task_group() as tg:
        for _ in range(16):
            tg.start_soon(writer)
    return big


def ctl_s(sock: str, *args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sessiond.cli", "--socket", sock, *args],
                   check=True, capture_output=True, env={**os.environ, "COLUMNS": "120"})
    return time.perf_counter() - t0


async def page_s(browser: Any, url: str, ready: str) -> float:
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    t0 = time.perf_counter()
    await page.goto(url)
    await page.locator(ready).first.wait_for(timeout=120_000)
    took = time.perf_counter() - t0
    await context.close()
    return took


async def run(sizes: list[tuple[int, int]]) -> dict[str, Any]:
    from playwright.async_api import async_playwright

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sd-bw-") as directory:
        port = free_port()
        daemon = DaemonProcess(directory, "--http-listen", f"127.0.0.1:{port}")
        await daemon.start()
        try:
            with open(http_token_path(daemon.socket)) as f:
                token = f.read().strip()
            base = f"http://127.0.0.1:{port}/t/{token}/ui/"
            async with async_playwright() as p:
                browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
                total = 0
                for sessions, events in sizes:
                    tag = f"s{sessions}"
                    t0 = time.perf_counter()
                    big = await fill(daemon.socket, sessions - total, events, tag)
                    total = sessions
                    print(f"  filled to {sessions:,} sessions, a session of {events:,} events"
                          f" in {time.perf_counter() - t0:.1f} s", flush=True)
                    figures: dict[str, list[float]] = {k: [] for k in (
                        "list_page", "list_ctl", "session_page", "session_ctl")}
                    for _ in range(ROUNDS):  # interleaved, medians kept
                        figures["list_page"].append(await page_s(
                            browser, base, "#sessions tbody tr"))
                        figures["list_ctl"].append(ctl_s(daemon.socket, "list", "--limit",
                                                         "50"))
                        figures["session_page"].append(await page_s(
                            browser, base + f"#/s/{big}", "#timeline li"))
                        figures["session_ctl"].append(ctl_s(daemon.socket, "events", big,
                                                            "--limit", "200"))
                    out[str(sessions)] = {k: statistics.median(v) for k, v in figures.items()}
                    out[str(sessions)]["events"] = events
                await browser.close()
        finally:
            daemon.stop()
    return out


def report(out: dict[str, Any]) -> None:
    keys = list(out)
    print(f"{'store':>22} {'W1 list page':>13} {'sessionctl list':>16} {'W2 session page':>16}"
          f" {'sessionctl events':>18}")
    for k in keys:
        f = out[k]
        print(f"{int(k):>9,} sessions {f['events']:>7,} ev {f['list_page'] * 1000:>10.0f} ms"
              f" {f['list_ctl'] * 1000:>13.0f} ms {f['session_page'] * 1000:>13.0f} ms"
              f" {f['session_ctl'] * 1000:>15.0f} ms")
    small, large = out[keys[0]], out[keys[-1]]
    print(f"large/small: list page {large['list_page'] / small['list_page']:.2f}x,"
          f" session page {large['session_page'] / small['session_page']:.2f}x"
          f" (1.0x: the page does not grow with the store)")
    print(f"page/sessionctl at the large store: list {large['list_page'] / large['list_ctl']:.2f}x,"
          f" session {large['session_page'] / large['session_ctl']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 sessions and events")
    ap.add_argument("--out", help="write the figures as JSON here")
    a = ap.parse_args()
    sizes = [(1000, 1000), (2000, 2000)] if a.quick else [(1000, 1000), (100_000, 100_000)]
    out = anyio.run(run, sizes, backend="asyncio")
    report(out)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
