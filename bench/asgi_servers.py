"""Requests/s of a trivial ASGI route on uvicorn and on hypercorn, in the same run.

Each server runs in a child process on a loopback port with one worker; the load is
raw keep-alive HTTP/1.1 from this process (the same client for both, so only the server
differs). `python -m bench.asgi_servers [seconds] [connections]`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

SERVER = r'''
import asyncio, sys
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})
which, port = sys.argv[1], int(sys.argv[2])
if which == "uvicorn":
    import uvicorn
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False,
                lifespan="off", http="h11", loop="asyncio")
else:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config
    c = Config(); c.bind = [f"127.0.0.1:{port}"]; c.loglevel = "WARNING"; c.accesslog = None
    c.keep_alive_max_requests = 10**9  # its default closes a connection after 1000
    asyncio.run(serve(app, c))
'''

REQUEST = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def one_connection(port: int, until: float) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    done = 0
    while time.perf_counter() < until:
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        done += 1
    writer.close()
    return done


async def load(port: int, seconds: float, connections: int) -> float:
    for _ in range(100):  # wait for the server to listen
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            break
        except OSError:
            await asyncio.sleep(0.05)
    await one_connection(port, time.perf_counter() + 0.3)  # warm up
    start = time.perf_counter()
    counts = await asyncio.gather(*(one_connection(port, start + seconds)
                                    for _ in range(connections)))
    return sum(counts) / (time.perf_counter() - start)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
    connections = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    print(f"trivial route, {connections} keep-alive connections, {seconds:.0f} s each")
    for which in ("uvicorn", "hypercorn", "uvicorn", "hypercorn"):
        port = free_port()
        child = subprocess.Popen([sys.executable, "-c", SERVER, which, str(port)],
                                 env={**os.environ, "PYTHONWARNINGS": "ignore"})
        try:
            rate = asyncio.run(load(port, seconds, connections))
        finally:
            child.terminate()
            child.wait()
        print(f"{which:10s} {rate:8.0f} requests/s")


if __name__ == "__main__":
    main()
