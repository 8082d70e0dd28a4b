"""B8's subscribers: N raw connections following every event, counting lines; run apart.

They only count newlines, so what B8 measures is the daemon's cost of serving
them, not a Python client's cost of parsing.
"""

from __future__ import annotations

import selectors
import signal
import socket
import sys


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2])
    sel = selectors.DefaultSelector()
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe","params":{}}\n')
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
