"""B8's subscribers: N raw connections following every event, counting lines; run apart.

`python -m bench.subscribers SOCKET N [SESSION PER]`: with SESSION, PER subscriptions
of that one session on each of the N connections (B8i's idle followers).

They only count newlines, so what B8 measures is the daemon's cost of serving
them, not a Python client's cost of parsing.
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import sys


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
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
