"""sessiond over HTTP against the Durable Streams protocol's own tools (issue 29).

- The server conformance suite (`@durable-streams/server-conformance-tests`, pinned in
  tests/http/conformance/) runs against the protocol's reference Node server (file
  storage) and against a real sessiond daemon on SQLite and on PostgreSQL; sessiond must
  pass every test the reference server passes. The suite takes about a minute a target,
  so these are marked `fleet`: off the default run, in .ci/run's second one
  (`pytest -m fleet tests/test_http_conformance.py` to run them alone). What differs is
  in tests/http/CONFORMANCE.md.
- The official TypeScript client (`@durable-streams/client`) reads a session's catch-up
  and tails it live (SSE and long-poll) while the test appends through the Python socket
  client: every event once, in order. The same script against the reference server
  checks the script itself. These are in the default run (a few seconds each).

Node and npm are needed (tests/http_harness.py): without them these skip, unless
SESSIOND_REQUIRE_NODE=1 (.ci/run), where they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import http_harness
import httpx
import pg
import pytest
from conftest import PATIENCE_S, wait_for_daemon

from sessiond import Client
from sessiond_daemon.serve.config import Config
from sessiond_schemas import paths

# --- starting the servers -----------------------------------------------------------------


@pytest.fixture(scope="module")
def node() -> str:
    return http_harness.node()


@pytest.fixture(scope="module")
def reference_url(node: str) -> Iterator[str]:
    """The reference Node server (file storage) for the module."""
    with tempfile.TemporaryDirectory(prefix="sd-ref-") as data, \
            http_harness.reference_server(node, data) as url:
        yield url


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class HttpDaemon:
    socket: str
    base_url: str  # the capability URL: the suite's base, streams under /v1/stream/
    proc: subprocess.Popen[bytes]

    def stream_url(self, session_id: str) -> str:
        return f"{self.base_url}/v1/stream/{session_id}"


# A long poll with nothing new answers 204 after this: the reference server's, so the two
# tests of the suite that wait one out wait as long on each.
LONG_POLL_S = http_harness.REFERENCE_LONG_POLL_MS / 1000


@contextmanager
def http_daemon(directory: str, db: str) -> Iterator[HttpDaemon]:
    """A real sessiond process with its HTTP face on a loopback port, on `db`; its base
    URL is the capability URL that carries the owner's token (docs/http.md)."""
    if "http_listen" not in Config.__struct_fields__:
        raise AssertionError("this daemon has no HTTP face (`http_listen`): issue 29's "
                             "server (branch b29) is not merged here yet")
    sock = os.path.join(directory, "s.sock")
    port = _free_port()
    config = os.path.join(directory, "sessiond.toml")
    with open(config, "w") as f:
        f.write(f'socket = "{sock}"\ndb = "{db}"\nlog_level = "warning"\n'
                f'http_listen = ["127.0.0.1:{port}"]\nhttp_long_poll_s = {LONG_POLL_S}\n')
    log_path = os.path.join(directory, "daemon.log")  # the suite's refusals fill it
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--config", config],
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            try:
                wait_for_daemon(sock, proc)
            except AssertionError as exc:
                raise AssertionError(f"{exc}:\n{Path(log_path).read_text()[-3000:]}") from None
            token = Path(paths.http_token_path(sock)).read_text().strip()
            yield HttpDaemon(sock, f"http://127.0.0.1:{port}/t/{token}", proc)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=PATIENCE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def sessiond_db(store_kind: str, short_dir: str, request: pytest.FixtureRequest) -> str:
    if store_kind == "postgresql":
        url: str = request.getfixturevalue("pg_module_database")
        pg.empty(url)
        return url
    return os.path.join(short_dir, "sessiond.db")


# --- the conformance suite ----------------------------------------------------------------

REPORTS = Path(os.environ.get("SESSIOND_CONFORMANCE_OUT")
               or Path(tempfile.gettempdir(), "sessiond-conformance"))


def _keep(run: http_harness.SuiteRun) -> None:
    """Write a run's results where a person can read them after the test (one JSON file
    a target, and one summary line in summary.txt)."""
    REPORTS.mkdir(parents=True, exist_ok=True)
    slug = run.target.replace(" ", "-")
    (REPORTS / f"{slug}.json").write_text(json.dumps(
        {name: {"status": t.status, "section": t.section, "failure": t.failure}
         for name, t in sorted(run.tests.items())}, indent=1))
    with open(REPORTS / "summary.txt", "a") as f:
        f.write(run.summary() + "\n")


@pytest.fixture(scope="module")
def reference_run(node: str, reference_url: str) -> http_harness.SuiteRun:
    (REPORTS / "summary.txt").unlink(missing_ok=True)  # this run's lines alone
    run = http_harness.run_suite(node, "reference", reference_url)
    _keep(run)
    return run


@pytest.mark.fleet
def test_reference_server_passes_most_of_the_suite(reference_run: http_harness.SuiteRun
                                                   ) -> None:
    """The yardstick itself: if the harness broke (no tests found, a server that does not
    start) the reference would pass little, and 'passes all the reference passes' would
    say nothing. In 0.3.6 it passes 324-326 of 338 on this machine."""
    counts = reference_run.counts()
    assert len(reference_run.tests) >= 300, reference_run.summary()
    assert counts["passed"] >= 0.9 * len(reference_run.tests), reference_run.summary()


@pytest.mark.fleet
def test_sessiond_passes_what_the_reference_passes(
        node: str, reference_run: http_harness.SuiteRun, store_kind: str,
        sessiond_db: str, short_dir: str) -> None:
    with http_daemon(short_dir, sessiond_db) as d:
        run = http_harness.run_suite(node, f"sessiond {store_kind}", d.base_url)
    _keep(run)
    assert set(run.tests) == set(reference_run.tests), "the two runs ran different tests"
    allowed = http_harness.allowed()
    unknown = sorted(set(allowed) - set(run.tests))
    assert not unknown, f"tests/http/differences.toml names tests the suite has not: {unknown}"
    missing = http_harness.differences(reference_run, run, allowed)
    more = sorted(run.names("passed") - reference_run.names("passed"))
    assert not missing, (
        f"{run.summary()}; {reference_run.summary()}\n"
        f"sessiond fails what the reference passes (and tests/http/differences.toml does"
        f" not explain):\n{missing}\n(and passes {len(more)} the reference does not)")
    fixed = sorted(set(allowed) & run.names("passed"))
    assert not fixed, f"these pass now: take them out of tests/http/differences.toml: {fixed}"


# --- the TypeScript client tails ----------------------------------------------------------


class Tail:
    """tests/http/conformance/tail.mjs under node: the official client's catch-up read,
    then its live tail; what it printed, a JSON object a line, on `lines`."""

    def __init__(self, node: str, url: str, total: int, live: str) -> None:
        self.proc = subprocess.Popen(
            [node, "tail.mjs", url, str(total), live], cwd=http_harness.NODE_DIR,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: Queue[dict[str, Any]] = Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put({"exit": self.proc.wait()})

    def next(self) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=PATIENCE_S)
        except Empty:
            raise AssertionError("gave up waiting for the TypeScript client") from None
        if "error" in line or "exit" in line:
            assert self.proc.stderr is not None
            raise AssertionError(f"the TypeScript client failed: {line}\n"
                                 f"{self.proc.stderr.read()[-3000:]}")
        return line

    def items(self, count: int) -> list[Any]:
        """The next `count` live items (from as many batches as it takes)."""
        got: list[Any] = []
        while len(got) < count:
            got.extend(self.next()["items"])
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.close()
        self.proc.stderr.close()


@contextmanager
def tail(node: str, url: str, total: int, live: str) -> Iterator[Tail]:
    t = Tail(node, url, total, live)
    try:
        yield t
    finally:
        t.close()


CATCHUP, ROUNDS, PER_ROUND = 5, 3, 4  # events before the reader starts; then live rounds


def _tail_all(node: str, url: str, live: str, append: Any, created: int = 0) -> list[Any]:
    """Append CATCHUP events, start the TypeScript client, then append ROUNDS rounds of
    PER_ROUND, each once the client has printed the round before (so those events reach
    it through its live tail, not its catch-up). Returns every item it saw, in order
    (`created`: how many items the stream held before the first append)."""
    for n in range(CATCHUP):
        append(n)
    total = created + CATCHUP + ROUNDS * PER_ROUND
    with tail(node, url, total, live) as t:
        first = t.next()
        seen = list(first["catchup"])
        assert t.next() == {"tailing": first["offset"]}
        for r in range(ROUNDS):
            for n in range(PER_ROUND):
                append(CATCHUP + r * PER_ROUND + n)
            seen.extend(t.items(PER_ROUND))
        assert t.proc.wait(timeout=PATIENCE_S) == 0
        assert t.lines.get(timeout=PATIENCE_S) == {"exit": 0}, "more than it was sent"
    return seen


@pytest.mark.parametrize("live", ["sse", "long-poll"])
def test_typescript_client_tails_the_reference_server(node: str, reference_url: str,
                                                      live: str) -> None:
    """The tail script against the reference server: what it reads is what was appended,
    once each, in order (so a failure against sessiond is sessiond's, not the script's)."""
    url = f"{reference_url}/v1/stream/tail-{live}-{os.getpid()}"
    with httpx.Client(timeout=PATIENCE_S) as http:
        created = http.put(url, headers={"Content-Type": "application/json"})
        assert created.status_code == 201, created.text

        def append(n: int) -> None:
            r = http.post(url, json={"n": n}, headers={"Content-Type": "application/json"})
            assert r.status_code in (200, 204), r.text

        seen = _tail_all(node, url, live, append)
    assert seen == [{"n": n} for n in range(CATCHUP + ROUNDS * PER_ROUND)]


@pytest.mark.slow_on_postgresql
@pytest.mark.parametrize("live", ["sse", "long-poll"])
def test_typescript_client_tails_a_session(node: str, store_kind: str, sessiond_db: str,
                                           short_dir: str, live: str) -> None:
    """The official client reads a real daemon's session over HTTP while the test appends
    through the Python socket client: every event of the session once, in order, as the
    socket API's events.read returns it."""
    with http_daemon(short_dir, sessiond_db) as d, Client(d.socket) as client:
        session = client.create_session(task="tailed over HTTP").session_id

        def append(n: int) -> None:
            client.append_message(session, "user", f"message {n}")

        # the session.created event counts as one of the catch-up's
        seen = _tail_all(node, d.stream_url(session), live, append, created=1)
        stored = client.call("events.read", dict, session_id=session, limit=1000)["events"]
    assert [e["version"] for e in seen] == list(range(1, len(stored) + 1))
    assert seen == stored
    assert [e["data"]["content"] for e in seen if e["type"] == "message.appended"] == [
        f"message {n}" for n in range(CATCHUP + ROUNDS * PER_ROUND)]
