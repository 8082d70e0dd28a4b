"""Prometheus metrics: a real daemon's endpoint scraped over HTTP, checked by promtool and
against the load the test made; off by default; a missing client is a config error."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon, wait_for_daemon

from sessiond import AsyncClient, MethodNotFoundError, SessionNotFoundError
from sessiond_daemon import __main__ as daemon_main
from sessiond_daemon.core.hooks import NO_METRICS, Hooks
from sessiond_daemon.serve.metrics import MAX_LABEL_CHARS, OTHER, label, top_labels
from sessiond_daemon.serve.web.listen import parse as parse_address

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

pytestmark = pytest.mark.anyio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def promtool() -> str | None:
    path = shutil.which("promtool")
    if path is None and os.environ.get("SESSIOND_REQUIRE_PROMTOOL"):
        pytest.fail("promtool is missing (Debian package prometheus) and"
                    " SESSIOND_REQUIRE_PROMTOOL is set")
    return path


async def scrape(url: str, accept: str | None = None) -> tuple[str, str]:
    def get() -> tuple[str, str]:
        request = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.read().decode(), r.headers["Content-Type"]
    return await anyio.to_thread.run_sync(get)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """name and sorted labels -> value, for every sample of the exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(got: dict[Any, float], name: str, **labels: str) -> float:
    return got[(name, tuple(sorted(labels.items())))]


class TestEndpoint:
    async def test_scrape_matches_the_load_and_passes_promtool(self, short_dir: str) -> None:
        """A load of known shape; the scrape counts it exactly and promtool accepts it."""
        port = free_port()
        config = daemon_config(short_dir, metrics_listen=f"127.0.0.1:{port}",
                               max_metrics_labels=2)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            # Actors a (3 sessions), b (1), c (1) and d (none); b spends the most tokens.
            plan = [("s-a1", "t/a", "ns1"), ("s-a2", "t/a", "ns1"), ("s-a3", "t/a", "ns2"),
                    ("s-b1", "t/b", "ns2"), ("s-c1", "t/c", "ns3"), ("s-n1", None, "ns3")]
            for sid, actor, ns in plan:
                await c.create_session(sid, actor_name=actor, namespace=ns)
            for i in range(7):
                await c.append_message("s-a1", "user", f"hello {i}")
            tokens = {"s-a1": (100, 10, 0.5), "s-b1": (1000, 500, 2.0), "s-c1": (5, 5, 0.01),
                      "s-n1": (1, 2, 0.25)}
            for sid, (inp, out, cost) in tokens.items():
                await c.record_tokens(sid, input_tokens=inp, output_tokens=out,
                                      estimated_cost=cost)
            await c.transition("s-c1", "completed")
            for _ in range(3):
                with pytest.raises(SessionNotFoundError):
                    await c.get_session("nope")
            for name in ("no.such", "x" * 200):  # any name a client sends: one label
                with pytest.raises(MethodNotFoundError):
                    await c.call(name)
            stats = await c.stats()
            async with c.subscribe(from_position=0) as sub:
                async for _ in sub:
                    break  # one subscription open while we scrape
                db_files = [d.db, d.db + "-wal"]  # the WAL may be checkpointed meanwhile
                on_disk = [sum(os.path.getsize(f) for f in db_files if os.path.exists(f))]
                text, content_type = await scrape(f"http://127.0.0.1:{port}/metrics")
                on_disk.append(sum(os.path.getsize(f) for f in db_files if os.path.exists(f)))
                assert content_type.startswith("text/plain")
                om, om_type = await scrape(f"http://127.0.0.1:{port}/metrics",
                                           "application/openmetrics-text; version=1.0.0")
                assert om_type.startswith("application/openmetrics-text")
                assert om.rstrip().endswith("# EOF")

        tool = promtool()
        if tool is not None:
            checked = subprocess.run([tool, "check", "metrics"], input=text, text=True,
                                     capture_output=True, timeout=60)
            assert checked.returncode == 0, checked.stdout + checked.stderr

        got = samples(text)
        events = "sessiond_events_appended_total"
        assert value(got, events, type="session.created") == 6
        assert value(got, events, type="message.appended") == 7
        assert value(got, events, type="tokens.recorded") == 4
        assert value(got, events, type="session.status_changed") == 1
        assert value(got, events, type="graph.writes") == 0  # every type, from 0
        requests = "sessiond_requests_total"
        assert value(got, requests, method="message.append", code="0") == 7
        assert value(got, requests, method="session.create", code="0") == 6
        assert value(got, requests, method="session.get", code="-32001") == 3
        assert value(got, "sessiond_request_seconds_count", method="tokens.record") == 4
        assert value(got, requests, method=OTHER, code="-32601") == 2
        assert "no.such" not in text
        # One commit per write here (each waited for its answer): the batch histogram
        # counts the transactions daemon.stats counts, and the commands in them.
        assert value(got, "sessiond_commit_batch_commands_count") == stats.write_transactions
        assert value(got, "sessiond_commit_batch_commands_sum") == stats.write_commands == 18
        assert value(got, "sessiond_commit_seconds_count") == stats.write_transactions
        assert value(got, "sessiond_commit_seconds_sum") > 0
        assert value(got, "sessiond_sessions", status="active") == 5
        assert value(got, "sessiond_sessions", status="completed") == 1
        assert value(got, "sessiond_connections") == 2  # the client and its subscription
        assert value(got, "sessiond_subscriptions") == 1
        assert value(got, "sessiond_write_queue_capacity") == config.max_queue
        assert value(got, "sessiond_write_queue_depth") == 0
        assert value(got, "sessiond_executors_running") == 0
        assert value(got, "sessiond_last_position") == 18
        assert 0 < value(got, "sessiond_database_bytes") <= max(on_disk)
        # Two actors labelled (the most tokens first), the rest summed as (other).
        actor = "sessiond_actor_tokens"
        assert value(got, actor, actor="t/b", kind="input") == 1000
        assert value(got, actor, actor="t/a", kind="output") == 10
        assert value(got, actor, actor=OTHER, kind="input") == 6  # t/c and (none)
        assert value(got, "sessiond_actor_estimated_cost", actor=OTHER) == pytest.approx(0.26)
        assert {dict(k[1]).get("actor") for k in got if k[0] == actor} == {"t/a", "t/b", OTHER}
        ns = "sessiond_namespace_tokens"
        assert value(got, ns, namespace="ns2", kind="input") == 1000
        assert value(got, ns, namespace="ns1", kind="input") == 100
        assert value(got, ns, namespace=OTHER, kind="output") == 7
        # No session id is ever a label.
        assert not any(sid in text for sid, _, _ in plan)

    async def test_unix_socket_and_errors(self, short_dir: str) -> None:
        """A socket path serves the same text; other paths get 404, writes 405."""
        path = os.path.join(short_dir, "m.sock")
        async with running_daemon(daemon_config(short_dir, metrics_listen=path)):
            def ask(line: bytes) -> bytes:
                with socket.socket(socket.AF_UNIX) as s:
                    s.connect(path)
                    # Connection: close, or the answer ends only at the idle deadline
                    s.sendall(line + b"\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    chunks = []
                    while chunk := s.recv(65536):
                        chunks.append(chunk)
                    return b"".join(chunks)
            ok = await anyio.to_thread.run_sync(ask, b"GET /metrics HTTP/1.1")
            missing = await anyio.to_thread.run_sync(ask, b"GET /other HTTP/1.1")
            post = await anyio.to_thread.run_sync(ask, b"POST /metrics HTTP/1.1")
        assert ok.startswith(b"HTTP/1.1 200 ") and b"sessiond_write_queue_depth 0.0" in ok
        assert missing.startswith(b"HTTP/1.1 404 ")
        assert post.startswith(b"HTTP/1.1 405 ")

    async def test_executors_running(self, short_dir: str) -> None:
        """A spawned process is counted by the gauge and by daemon.stats until killed."""
        port = free_port()
        config = daemon_config(short_dir, metrics_listen=f"127.0.0.1:{port}")
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            await c.spawn(["sleep", "60"], session_id="exec-1")
            text, _ = await scrape(f"http://127.0.0.1:{port}/metrics")
            assert value(samples(text), "sessiond_executors_running") == 1
            assert (await c.stats()).executors_running == 1
            await c.kill("exec-1")

            async def reaped() -> bool:
                return (await c.stats()).executors_running == 0

            await eventually(reaped, "the killed process to be reaped")
            text, _ = await scrape(f"http://127.0.0.1:{port}/metrics")
            assert value(samples(text), "sessiond_executors_running") == 0
            assert value(samples(text), "sessiond_events_appended_total",
                         type="process.started") == 1

    async def test_subscription_lag(self, short_dir: str) -> None:
        """A subscriber that does not read stays behind: the lag gauges show it."""
        port = free_port()
        config = daemon_config(short_dir, metrics_listen=f"127.0.0.1:{port}")
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            await c.create_session("lag-1")
            for _ in range(6):  # 3,000 messages of 1 KiB: pages far past any socket buffer
                await c.append_messages("lag-1", [{"role": "user", "content": "x" * 1024}] * 500)
            last = (await c.stats()).last_position
            stalled = await anyio.connect_unix(d.socket)
            await stalled.send(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe",'
                               b'"params":{"from_position":0}}\n')
            # Catch-up sends a page (500 events), then waits for a reader that never reads.
            async def behind() -> Any:
                got = samples((await scrape(f"http://127.0.0.1:{port}/metrics"))[0])
                lagging = value(got, "sessiond_subscriptions") and \
                    value(got, "sessiond_subscription_lag_max_events") < last
                return got if lagging else None

            got = await eventually(behind, "the subscriber to be counted, behind")
            assert value(got, "sessiond_subscription_lag_max_events") >= last - 1000
            assert value(got, "sessiond_subscriptions_lagging") == 1
            await stalled.aclose()

    async def test_stats_report_commits(self, daemon: Daemon, client: AsyncClient) -> None:
        """daemon.stats carries the last minute's batch size, commit time, statuses."""
        await client.create_session("st1")
        await client.append_message("st1", "user", "x")
        stats = await client.stats()
        assert stats.commit_batch_size == 1.0
        assert stats.commit_latency_ms > 0
        assert stats.commit_latency_max_ms >= stats.commit_latency_ms
        assert stats.sessions_by_status == {"active": 1}
        assert stats.write_queue_capacity == 4096
        assert stats.executors_running == 0


class TestFlood:
    @pytest.mark.fleet
    def test_a_flood_of_connections_never_stops_the_daemon(self, short_dir: str) -> None:
        """The endpoint has no peer check: 300 idle connections against a daemon allowed 128
        descriptors. It serves a few at a time and leaves the rest queued, so it neither
        runs out of descriptors nor dies; its socket keeps answering, and scrapes come
        back once the flood goes."""
        import resource
        import time

        from sessiond import Client

        sock, port = os.path.join(short_dir, "s.sock"), free_port()
        limit = (128, 128)
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond_daemon", "--socket", sock,
             "--db", os.path.join(short_dir, "d.db"), "--log-level", "warning",
             "--metrics-listen", f"127.0.0.1:{port}"],
            preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        flood: list[socket.socket] = []
        try:
            wait_for_daemon(sock, proc)
            for _ in range(300):
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(("127.0.0.1", port))
                except OSError:  # the accept queue is full: the kernel drops the SYN
                    s.close()
                    continue
                flood.append(s)
            # The daemon's descriptors while it works through the queue, sampled over two
            # seconds: the sleep paces the sampling (the flood is what is under test), it
            # stands in for no event.
            most = 0
            for _ in range(20):
                most = max(most, len(os.listdir(f"/proc/{proc.pid}/fd")))
                time.sleep(0.1)
            assert most < 64, most
            with Client(sock) as c:
                assert c.ping().pong
            assert proc.poll() is None
            for s in flood:
                s.close()
            flood.clear()
            url = f"http://127.0.0.1:{port}/metrics"
            with urllib.request.urlopen(url, timeout=30) as r:
                assert b"sessiond_connections" in r.read()
            assert proc.poll() is None
        finally:
            for s in flood:
                s.close()
            proc.terminate()
            proc.wait(timeout=30)


class TestConfig:
    def test_off_by_default(self) -> None:
        """Without --metrics-listen the hooks are the shared no-op object."""
        assert daemon_config("/tmp").metrics_listen is None
        assert type(NO_METRICS) is Hooks
        assert NO_METRICS.clock() == 0.0

    def test_missing_client_exits_78(self, short_dir: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
        """--metrics-listen without prometheus-client is a config error, named as such."""
        monkeypatch.setitem(sys.modules, "prometheus_client", None)
        with pytest.raises(SystemExit) as exited:
            daemon_main.main(["--socket", os.path.join(short_dir, "s.sock"), "--db",
                              os.path.join(short_dir, "d.db"), "--metrics-listen",
                              "127.0.0.1:9464"])
        assert exited.value.code == 78
        assert "sessiond[metrics]" in capsys.readouterr().err

    def test_bad_address_exits_78(self, short_dir: str,
                                  capsys: pytest.CaptureFixture[str]) -> None:
        with pytest.raises(SystemExit) as exited:
            daemon_main.main(["--socket", os.path.join(short_dir, "s.sock"), "--db",
                              os.path.join(short_dir, "d.db"), "--metrics-listen", "nowhere"])
        assert exited.value.code == 78
        assert "host:port" in capsys.readouterr().err

    def test_addresses(self) -> None:
        assert parse_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
        assert parse_address("[::1]:9464") == ("::1", 9464)
        assert parse_address("/run/sessiond/metrics.sock") == "/run/sessiond/metrics.sock"

    def test_top_labels(self) -> None:
        rows = [("a", 1, 5, 5, 0.1), ("b", 1, 50, 0, 0.0), (None, 2, 1, 1, 1.0)]
        assert top_labels(rows, 1) == [("b", 1, 50, 0, 0.0), (OTHER, 3, 6, 6, 1.1)]
        assert top_labels(rows, 5)[-1][0] == "(none)"

    def test_label_values_are_capped(self) -> None:
        """An actor name of any length is a label of at most MAX_LABEL_CHARS, and two long
        names that share a prefix stay two labels."""
        a, b = "x" * 5000 + "a", "x" * 5000 + "b"
        kept = top_labels([(a, 1, 1, 0, 0.0), (b, 1, 2, 0, 0.0)], 5)
        assert all(len(row[0]) <= MAX_LABEL_CHARS for row in kept)
        assert len({row[0] for row in kept}) == 2
        assert label("short") == "short"


class TestSlowScrapers:
    def test_clients_that_never_read(self, short_dir: str) -> None:
        """8 clients send scrape after scrape and never read: the daemon neither hangs nor
        grows (each is dropped once it has not read for http_send_timeout_s, and its unread
        bytes stay bounded meanwhile); a real scrape and the socket keep answering."""
        from sessiond import Client

        sock, port = os.path.join(short_dir, "s.sock"), free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond_daemon", "--socket", sock,
             "--db", os.path.join(short_dir, "d.db"), "--log-level", "warning",
             "--metrics-listen", f"127.0.0.1:{port}", "--http-send-timeout-s", "1"])

        def rss_kib() -> int:
            with open(f"/proc/{proc.pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("VmRSS"))

        stalled: list[socket.socket] = []
        try:
            wait_for_daemon(sock, proc)
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
            before = rss_kib()
            request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            for _ in range(8):
                s = socket.create_connection(("127.0.0.1", port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.setblocking(False)
                stalled.append(s)
            for _ in range(2000):  # as many requests as the sockets take, never reading
                for s in stalled:
                    with contextlib.suppress(BlockingIOError, ConnectionError):
                        s.send(request * 8)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
                assert b"sessiond_connections" in r.read()
            with Client(sock) as c:
                assert c.ping().pong
            assert rss_kib() - before < 64 << 10, (before, rss_kib())
            assert proc.poll() is None
        finally:
            for s in stalled:
                s.close()
            proc.terminate()
            proc.wait(timeout=30)


RULE_TESTS = """\
rule_files:
  - sessiond-alerts.yml
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'sessiond_write_queue_depth{instance="h"}'
        values: '0 4000x10'
      - series: 'sessiond_write_queue_capacity{instance="h"}'
        values: '4096x10'
      - series: 'sessiond_commit_seconds_bucket{instance="h",le="0.25"}'
        values: '0+10x20'
      - series: 'sessiond_commit_seconds_bucket{instance="h",le="0.5"}'
        values: '0+10x20'
      - series: 'sessiond_commit_seconds_bucket{instance="h",le="+Inf"}'
        values: '0+100x20'
    alert_rule_test:
      - eval_time: 1m
        alertname: SessiondWriteQueueNearFull
        exp_alerts: []
      - eval_time: 3m
        alertname: SessiondWriteQueueNearFull
        exp_alerts:
          - exp_labels: {severity: warning, instance: h}
            exp_annotations:
              summary: "sessiond's write queue is 97.66% full on h"
              description: "Past full, writes get -32008 (overloaded). Check the commit
                latency and the disk."
      - eval_time: 5m
        alertname: SessiondCommitLatencyHigh
        exp_alerts: []
      - eval_time: 15m
        alertname: SessiondCommitLatencyHigh
        exp_alerts:
          - exp_labels: {severity: warning, instance: h}
            exp_annotations:
              summary: "sessiond commits take 500ms (p99) on h"
              description: "Every write waits for its commit's fsync. A slow or failing
                disk, or a full one."
"""


class TestDocs:
    def test_scrape_config_and_alerts(self, short_dir: str) -> None:
        """docs/metrics.md's config and rules pass promtool, and each alert fires on the
        series it is written for (97% of the queue; commits of 0.5 s at p99)."""
        tool = promtool()
        if tool is None:
            pytest.skip("promtool is not installed")
        with open(os.path.join(os.path.dirname(__file__), "..", "docs", "metrics.md")) as f:
            doc = f.read()
        config, rules = re.findall(r"```yaml\n(.*?)```", doc, re.S)
        for name, text in (("prometheus.yml", config), ("sessiond-alerts.yml", rules),
                           ("tests.yml", RULE_TESTS)):
            with open(os.path.join(short_dir, name), "w") as f:
                f.write(text)
        for args in (["check", "config", "prometheus.yml"], ["test", "rules", "tests.yml"]):
            done = subprocess.run([tool, *args], cwd=short_dir, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stdout + done.stderr
