"""B8's subscribers: N raw connections following every event, counting lines; run apart.

`python -m bench.subscribers SOCKET N [SESSION PER]`: with SESSION, PER subscriptions
of that one session on each of the N connections (B8i's idle followers).

They only count newlines, so what B8 measures is the daemon's cost of serving
them, not a Python client's cost of parsing. `python -m bench.subscribers SOCKET N
--client` follows with N of the client library's subscriptions instead (`AsyncClient
.subscribe`, each on a connection of its own), counting the events they yield.
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import sys


def clients(path: str, n: int) -> None:
    import anyio

    from sessiond import AsyncClient

    events = 0

    async def follow(c: AsyncClient, ready: anyio.Event) -> None:
        nonlocal events
        async with c.subscribe() as sub:
            ready.set()
            async for _ in sub:
                events += 1

    async def run() -> None:
        c = AsyncClient(path)
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                ready = anyio.Event()
                tg.start_soon(follow, c, ready)
                await ready.wait()
            print("ready", flush=True)
            with anyio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    break
            tg.cancel_scope.cancel()
        print(events, flush=True)

    anyio.run(run)


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    if sys.argv[3:] == ["--client"]:
        clients(path, n)
        return
    params: dict[str, str] = {}
    per = 1
    if len(sys.argv) > 3:
        params, per = {"session_id": sys.argv[3]}, int(sys.argv[4])
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "events.subscribe",
                       "params": params}).encode() + b"\n"
    sel = selectors.DefaultSelector()
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(line * per)
        sel.register(s, selectors.EVENT_READ)
    lines = 0
    running = True

    def stop(*_: object) -> None:
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, stop)
    print("ready", flush=True)
    while running:
        for key, _ in sel.select(timeout=0.2):
            data = key.fileobj.recv(1 << 20)  # type: ignore[union-attr]
            lines += data.count(b"\n")
    print(lines, flush=True)


if __name__ == "__main__":
    main()
