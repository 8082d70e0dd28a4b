"""B14, HTTP: appends per second and tail lag over sessiond's HTTP face (the Durable
Streams protocol, docs/http.md) against its socket API, and against the protocol's
reference Node server with file storage, all measured in the same run.

    python -m bench.http [--quick] [--out FILE] [--seconds S] [--samples N]

Needs Node 20+ and npm for the reference server (installed from
tests/http/conformance/package-lock.json with `npm ci` if not there yet).

Appends: 16 writers, each with a connection of its own, each appending one ~100 B JSON
message at a time to a stream (a session) of its own, for the same seconds on each
target: the socket API (`message.append` through the Python client), sessiond's HTTP
face (a POST a message), the reference server (the same POSTs). Both are durable before
they answer: sessiond with its default durability (an fsync before every
acknowledgement), the reference server's file store with an fdatasync of the stream's
segment file and an LMDB commit per append.

Tail lag: one reader follows a stream, one writer appends a message at a time and waits
for it to arrive; lag = arrival at the reader - the moment the writer sent the append
(so it holds the append's own commit: a delivery often beats the writer's reply), p50 and
p99. Over HTTP the reader
is an SSE GET (`live=sse`), then a long-poll loop (`live=long-poll`); on the socket it is
a subscription (`events.subscribe`).

It prints every figure and asserts no timing. A target it cannot reach (a daemon without
an HTTP face, no Node) is reported "not available" with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx
import msgspec

from sessiond import AsyncClient

from .daemon import DaemonProcess, cpu_s

WRITERS = 16
NODE_DIR = Path(__file__).resolve().parent.parent / "tests" / "http" / "conformance"
JSON = {"Content-Type": "application/json"}


def _message(label: str, n: int) -> dict[str, str]:
    return {"role": "user", "content": f"b14 {label} #{n:06d} " + "x" * 60}


def _figures(lags: list[float]) -> dict[str, Any]:
    lags.sort()
    return {"available": True, "samples": len(lags),
            "p50_ms": round(statistics.median(lags), 2),
            "p99_ms": round(lags[min(len(lags) - 1, int(len(lags) * 0.99))], 2)}


# --- an HTTP target: where its streams are and what an append's body is ------------------


class HttpTarget:
    """A Durable Streams server: streams under `base`, created with a PUT."""

    def __init__(self, name: str, base: str, pid: int) -> None:
        self.name, self.base = name, base
        self.pid = pid  # the server's process: its CPU is counted

    async def new_stream(self, http: httpx.AsyncClient, label: str) -> str:
        url = f"{self.base}/b14-{label}-{os.getpid()}-{time.monotonic_ns()}"
        r = await http.put(url, headers=JSON)
        if r.status_code not in (200, 201):
            raise RuntimeError(f"{self.name}: PUT {url}: {r.status_code} {r.text[:200]}")
        return url

    def body(self, message: dict[str, str]) -> bytes:
        """An append of `message` (a role and a content)."""
        return msgspec.json.encode(message)

    def content(self, item: Any) -> str:
        """The content of a message as a read returns it."""
        return str(item["content"])


class SessionTarget(HttpTarget):
    """sessiond's typed sessions as streams: a session made through the socket, each
    append a `message.appended` event POSTed as {type, data} (docs/http.md); a read
    returns the session's events."""

    def __init__(self, name: str, base: str, pid: int, sock: str) -> None:
        super().__init__(name, base, pid)
        self.sock = sock

    async def new_stream(self, http: httpx.AsyncClient, label: str) -> str:
        async with AsyncClient(self.sock) as c:
            sid = (await c.create_session(task=f"b14 {label}")).session_id
        return f"{self.base}/{sid}"

    def body(self, message: dict[str, str]) -> bytes:
        return msgspec.json.encode({"type": "message.appended", "data": message})

    def content(self, item: Any) -> str:
        return str(item["data"]["content"]) if item["type"] == "message.appended" else ""


def _rate(count: int, took: float, cpu: float, client_cpu: float) -> dict[str, Any]:
    """The figures of an appends run: `cpu` the server's CPU seconds meanwhile,
    `client_cpu` this process's (the 16 writers share the machine's 2 cores with it)."""
    return {"appends": count, "seconds": round(took, 2),
            "appends_per_s": round(count / took, 1),
            "server_cpu_pct": round(100 * cpu / took), "server_cpu_ms_per_append":
            round(1000 * cpu / count, 3) if count else None,
            "client_cpu_pct": round(100 * client_cpu / took)}


async def http_appends(target: HttpTarget, seconds: float) -> dict[str, Any]:
    clients = [httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1))
               for _ in range(WRITERS)]
    counts = [0] * WRITERS
    try:
        urls = [await target.new_stream(c, f"w{w}") for w, c in enumerate(clients)]
        cpu0, mine0, started = cpu_s(target.pid), time.process_time(), time.perf_counter()
        deadline = started + seconds

        async def writer(w: int) -> None:
            while time.perf_counter() < deadline:
                body = target.body(_message(f"w{w}", counts[w]))
                r = await clients[w].post(urls[w], content=body, headers=JSON)
                if r.status_code not in (200, 204):
                    raise RuntimeError(f"{target.name}: POST: {r.status_code} {r.text[:200]}")
                counts[w] += 1

        async with anyio.create_task_group() as tg:
            for w in range(WRITERS):
                tg.start_soon(writer, w)
        took, cpu = time.perf_counter() - started, cpu_s(target.pid) - cpu0
        mine = time.process_time() - mine0
    finally:
        for c in clients:
            await c.aclose()
    return _rate(sum(counts), took, cpu, mine)


async def _sse(http: httpx.AsyncClient, url: str, target: HttpTarget,
               arrived: dict[str, float], ready: anyio.Event) -> None:
    async with http.stream("GET", url, params={"offset": "-1", "live": "sse"}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{target.name}: SSE GET: {r.status_code}")
        ready.set()
        event, data = "", []
        async for line in r.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
            elif not line:
                if event == "data" and data:
                    now = time.perf_counter()
                    for item in json.loads("\n".join(data)):
                        arrived[target.content(item)] = now
                event, data = "", []


async def _long_poll(http: httpx.AsyncClient, url: str, target: HttpTarget,
                     arrived: dict[str, float], ready: anyio.Event) -> None:
    offset = "-1"
    while True:
        params = {"offset": offset} if offset == "-1" else {"offset": offset,
                                                             "live": "long-poll"}
        r = await http.get(url, params=params)
        ready.set()
        if r.status_code == 200:
            now = time.perf_counter()
            for item in r.json():
                arrived[target.content(item)] = now
        elif r.status_code != 204:
            raise RuntimeError(f"{target.name}: long-poll GET: {r.status_code}")
        offset = r.headers["Stream-Next-Offset"]


async def _lag(samples: int, read: Callable[[anyio.Event], Awaitable[None]],
               append: Callable[[str], Awaitable[None]], arrived: dict[str, float]
               ) -> dict[str, Any]:
    """One writer's `samples` appends, each waited for at the reader `read` runs."""
    sent: dict[str, float] = {}
    ready = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(read, ready)
        await ready.wait()
        for i in range(samples):
            content = f"lag {i}"
            sent[content] = time.perf_counter()
            await append(content)
            with anyio.move_on_after(10 if i == 0 else 5):
                while content not in arrived:
                    await anyio.sleep(0.0005)  # the poll's pace bounds how finely lag is seen
            if content not in arrived:
                tg.cancel_scope.cancel()
                return {"available": False, "why": f"{content!r} never arrived"}
            await anyio.sleep(0.01)
        tg.cancel_scope.cancel()
    return _figures([(arrived[k] - sent[k]) * 1000 for k in sent])


async def http_lag(target: HttpTarget, samples: int, mode: str) -> dict[str, Any]:
    reader = _sse if mode == "sse" else _long_poll
    async with httpx.AsyncClient(timeout=60) as w, httpx.AsyncClient(timeout=60) as r:
        url = await target.new_stream(w, f"lag-{mode}")
        arrived: dict[str, float] = {}

        async def append(content: str) -> None:
            resp = await w.post(url, content=target.body({"role": "user", "content": content}),
                                headers=JSON)
            if resp.status_code not in (200, 204):
                raise RuntimeError(f"{target.name}: POST: {resp.status_code}")

        return await _lag(samples, lambda ready: reader(r, url, target, arrived, ready),
                          append, arrived)


async def http_figures(target: HttpTarget, seconds: float, samples: int) -> dict[str, Any]:
    """Appends/s and both lags; a request the target refuses makes it "not available",
    with the refusal, rather than ending the run."""
    try:
        out = {"appends": await http_appends(target, seconds)}
        for mode in ("sse", "long-poll"):
            out[f"lag_{mode}"] = await http_lag(target, samples, mode)
    except (RuntimeError, httpx.HTTPError) as exc:  # the capability token is not printed
        return {"available": False, "why": re.sub(r"/t/[^/]+", "/t/<token>", str(exc))[:300]}
    return out


# --- the socket API -----------------------------------------------------------------------


async def socket_appends(sock: str, pid: int, seconds: float) -> dict[str, Any]:
    clients = [AsyncClient(sock) for _ in range(WRITERS)]
    counts = [0] * WRITERS
    try:
        for c in clients:
            await c.__aenter__()
        sids = [(await c.create_session(task="b14")).session_id for c in clients]
        cpu0, mine0, started = cpu_s(pid), time.process_time(), time.perf_counter()
        deadline = started + seconds

        async def writer(w: int) -> None:
            while time.perf_counter() < deadline:
                m = _message(f"w{w}", counts[w])
                await clients[w].append_message(sids[w], m["role"], m["content"])
                counts[w] += 1

        async with anyio.create_task_group() as tg:
            for w in range(WRITERS):
                tg.start_soon(writer, w)
        took, cpu = time.perf_counter() - started, cpu_s(pid) - cpu0
        mine = time.process_time() - mine0
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)
    return _rate(sum(counts), took, cpu, mine)


async def socket_lag(sock: str, samples: int) -> dict[str, Any]:
    arrived: dict[str, float] = {}
    async with AsyncClient(sock) as c:
        sid = (await c.create_session(task="b14 lag")).session_id

        async def read(ready: anyio.Event) -> None:
            async with c.subscribe(sid) as events:
                ready.set()
                async for e in events:
                    if e.type == "message.appended":
                        arrived[e.data.content] = time.perf_counter()

        async def append(content: str) -> None:
            await c.append_message(sid, "user", content)

        return await _lag(samples, read, append, arrived)


# --- the servers --------------------------------------------------------------------------


class HttpDaemon(DaemonProcess):
    """A sessiond with its HTTP face on a loopback port (`http_listen`), if it has one."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.port = _free_port()
        config = os.path.join(directory, "sessiond.toml")
        with open(config, "w") as f:
            f.write(f'http_listen = ["127.0.0.1:{self.port}"]\n')
        super().__init__(directory, "--config", config)

    def base_url(self) -> str:
        """The streams' base URL: the capability URL with the daemon's token
        (docs/http.md)."""
        from sessiond_schemas import paths

        token = Path(paths.http_token_path(self.socket)).read_text().strip()
        return f"http://127.0.0.1:{self.port}/t/{token}/v1/stream"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def has_http_face() -> bool:
    from sessiond_daemon.serve.config import Config

    return "http_listen" in Config.__struct_fields__


class ReferenceServer:
    """tests/http/conformance/ref-server.mjs: the reference Node server, file storage."""

    def __init__(self, data_dir: str) -> None:
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            raise RuntimeError("no node or npm on PATH")
        if not (NODE_DIR / "node_modules" / "@durable-streams" / "server").exists():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                           cwd=NODE_DIR, check=True)
        self.proc = subprocess.Popen([node, "ref-server.mjs", data_dir], cwd=NODE_DIR,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("http://"):
                self.url = line.strip()
                break
        else:
            raise RuntimeError(f"the reference server exited {self.proc.wait()}")
        # its log lines must not fill the pipe
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def run(seconds: float, samples: int) -> dict[str, Any]:
    results: dict[str, Any] = {"writers": WRITERS, "seconds_each": seconds,
                               "lag_samples": samples}
    root = tempfile.mkdtemp(prefix="b14-")
    try:
        daemon = HttpDaemon(root) if has_http_face() else DaemonProcess(root)
        await daemon.start()
        try:
            assert daemon.proc is not None
            pid = daemon.proc.pid
            results["socket"] = {"appends": await socket_appends(daemon.socket, pid, seconds),
                                 "lag_subscribe": await socket_lag(daemon.socket, samples)}
            print(f"B14 socket: {results['socket']}", file=sys.stderr)
            if isinstance(daemon, HttpDaemon):
                base = daemon.base_url()
                results["sessiond_http"] = await http_figures(
                    SessionTarget("sessiond", base, pid, daemon.socket), seconds, samples)
                results["sessiond_http_generic"] = await http_figures(
                    HttpTarget("sessiond generic", base, pid), seconds, samples)
            else:
                results["sessiond_http"] = results["sessiond_http_generic"] = {
                    "available": False, "why": "this daemon has no HTTP face (http_listen)"}
            print(f"B14 sessiond HTTP: {results['sessiond_http']}", file=sys.stderr)
            print(f"B14 sessiond HTTP, generic: {results['sessiond_http_generic']}",
                  file=sys.stderr)
        finally:
            daemon.stop()
        try:
            ref = ReferenceServer(os.path.join(root, "reference"))
        except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
            results["reference"] = {"available": False, "why": str(exc)}
        else:
            try:
                results["reference"] = await http_figures(
                    HttpTarget("reference", f"{ref.url}/v1/stream", ref.proc.pid), seconds, samples)
            finally:
                ref.stop()
        print(f"B14 reference: {results['reference']}", file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def _lag_text(lag: dict[str, Any]) -> str:
    if not lag.get("available", True):
        return f"not available ({lag['why']})"
    return f"p50 {lag['p50_ms']} ms, p99 {lag['p99_ms']} ms ({lag['samples']} samples)"


def _appends_text(a: dict[str, Any]) -> str:
    return (f"{a['appends_per_s']:>9} appends/s (server CPU {a['server_cpu_pct']}%,"
            f" {a['server_cpu_ms_per_append']} ms an append; client CPU"
            f" {a['client_cpu_pct']}%)")


def report(results: dict[str, Any]) -> None:
    print(f"B14 HTTP: {WRITERS} writers, {results['seconds_each']} s each; "
          f"lag over {results['lag_samples']} appends")
    s = results["socket"]
    print(f"  sessiond socket API:    {_appends_text(s['appends'])};"
          f" subscription lag {_lag_text(s['lag_subscribe'])}")
    for key, name in (("sessiond_http", "sessiond HTTP, session:"),
                      ("sessiond_http_generic", "sessiond HTTP, generic:"),
                      ("reference", "reference Node (file): ")):
        r = results[key]
        if not r.get("available", True):
            print(f"  {name} not available ({r['why']})")
            continue
        print(f"  {name} {_appends_text(r['appends'])};"
              f" SSE lag {_lag_text(r['lag_sse'])}; long-poll lag"
              f" {_lag_text(r['lag_long-poll'])}")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.http",
                                description=(__doc__ or "").split("\n")[0])
    p.add_argument("--quick", action="store_true", help="CI sizes: a smoke run (~15 s)")
    p.add_argument("--seconds", type=float, help="seconds of appends per target")
    p.add_argument("--samples", type=int, help="lag samples per reader")
    p.add_argument("--out", help="write the figures as JSON to this file")
    a = p.parse_args()
    seconds, samples = (1.0, 20) if a.quick else (10.0, 300)
    results = anyio.run(run, a.seconds or seconds, a.samples or samples)
    report(results)
    if a.out:
        with open(a.out, "wb") as f:
            f.write(msgspec.json.encode(results))


if __name__ == "__main__":
    main()
