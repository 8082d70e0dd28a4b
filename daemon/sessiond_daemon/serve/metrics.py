"""Prometheus metrics: the hooks of core/hooks.py counted, and the text of /metrics.

The HTTP face (web/) serves the text at /metrics, with --metrics-listen or http_listen.

The hot path only counts: the writer reports each commit, the server each
request. Everything that needs the database (sessions by status, token totals)
is read when Prometheus scrapes, with one GROUP BY over the sessions table. The
text is written by prometheus_client (an optional extra, `sessiond[metrics]`)
from a registry of this daemon's own, never the process-wide default one.
"""

from __future__ import annotations

import hashlib
import time
import weakref
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import structlog

from sessiond_daemon.core.hooks import Hooks, Subscribed
from sessiond_daemon.serve.config import Config, ConfigError
from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EVENT_TYPES, Event

if TYPE_CHECKING:
    from sessiond_daemon.core.writer import Writer
    from sessiond_daemon.features.executors.methods import Executors
    from sessiond_daemon.serve.server import Server
    from sessiond_daemon.stores.interface import Store

log = structlog.get_logger("sessiond.metrics")

OTHER = "(other)"  # the label of everything past the top N actors or namespaces
NONE = "(none)"  # sessions without an actor_name
_MAX_HEAD_BYTES = 8192
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
_SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0)


class MetricsUnavailable(Exception):
    """--metrics-listen was given, but prometheus-client is not installed."""


def require_client() -> None:
    """Raise MetricsUnavailable unless prometheus_client can be imported."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise MetricsUnavailable(
            "metrics_listen is set but prometheus-client is not installed;"
            " install sessiond[metrics] (pip install 'sessiond[metrics]')") from exc


def check_config(config: Config) -> None:
    """Refuse (ConfigError) a metrics_listen without prometheus-client (the address is the
    HTTP face's to check: web/face.py)."""
    if config.metrics_listen is None:
        return
    try:
        require_client()
    except MetricsUnavailable as exc:
        raise ConfigError(str(exc)) from exc


MAX_LABEL_CHARS = 64  # a label value past this is cut, with a hash to keep it distinct


def label(value: str) -> str:
    """A label value of at most MAX_LABEL_CHARS: long actor names or namespaces (anyone
    may create sessions) cannot make every scrape large."""
    if len(value) <= MAX_LABEL_CHARS:
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    return f"{value[:MAX_LABEL_CHARS - 10]}…{digest}"


def top_labels(rows: Iterable[tuple[Any, int, int, int, float]], limit: int,
               ) -> list[tuple[str, int, int, int, float]]:
    """Keep the `limit` values with the most tokens (then cost); sum the rest as OTHER."""
    ranked = sorted(rows, key=lambda r: (r[2] + r[3], r[4], str(r[0])), reverse=True)
    kept = [(NONE if r[0] is None else label(str(r[0])), *r[1:]) for r in ranked[:limit]]
    rest = ranked[limit:]
    if rest:
        kept.append((OTHER, sum(r[1] for r in rest), sum(r[2] for r in rest),
                     sum(r[3] for r in rest), sum(r[4] for r in rest)))
    return kept


class Prometheus(Hooks):
    """Counters and histograms fed by the hooks; gauges read at scrape time."""

    __slots__ = (
        "_batch",
        "_children",
        "_commit",
        "_events",
        "_latency",
        "_lock",
        "_requests",
        "_scraped",
        "_subscribers",
        "executors",
        "max_labels",
        "max_queue",
        "registry",
        "server",
        "store",
        "writer",
    )

    def __init__(self, *, writer: Writer, store: Store, max_queue: int,
                 max_labels: int) -> None:
        require_client()
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        self.writer, self.store = writer, store
        self.server: Server | None = None
        self.executors: Executors | None = None
        self.max_queue, self.max_labels = max_queue, max_labels
        r = self.registry
        events = Counter("sessiond_events_appended", "Events committed, by event type.",
                         ["type"], registry=r)
        self._events = {t: events.labels(t) for t in EVENT_TYPES}  # all shown, from 0
        self._requests = Counter("sessiond_requests", "Requests answered, by method and"
                                 " JSON-RPC error code (0: success).", ["method", "code"],
                                 registry=r)
        self._latency = Histogram("sessiond_request_seconds", "Time to answer a request,"
                                  " by method.", ["method"], buckets=_SECONDS_BUCKETS,
                                  registry=r)
        self._batch = Histogram("sessiond_commit_batch_commands", "Commands per committed"
                                " transaction (group commit).", buckets=_BATCH_BUCKETS,
                                registry=r)
        self._commit = Histogram("sessiond_commit_seconds", "Time to commit one transaction,"
                                 " its fsync included.", buckets=_SECONDS_BUCKETS, registry=r)
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._subscribers: weakref.WeakSet[Subscribed] = weakref.WeakSet()
        self._scraped: dict[str, Any] = {}
        self._lock = anyio.Lock()
        r.register(_ScrapeCollector(self))

    # --- the hooks (hot path) ------------------------------------------------------

    def clock(self) -> float:
        return time.perf_counter()

    def committed(self, commands: int, events: list[Event], seconds: float) -> None:
        self._batch.observe(commands)
        self._commit.observe(seconds)
        for event_type, n in Tally(e.type for e in events).items():
            child = self._events.get(event_type)
            if child is not None:  # every stored type is a known one
                child.inc(n)

    def request(self, method: str, code: int, started: float) -> None:
        children = self._children.get((method, code))
        if children is None:
            # A client may send any name: only the protocol's methods become labels, so
            # this cache is bounded too (methods x error codes).
            known = method in rpc.METHODS
            label = method if known else OTHER
            children = (self._requests.labels(label, str(code)), self._latency.labels(label))
            if known:
                self._children[(method, code)] = children
        children[0].inc()
        children[1].observe(time.perf_counter() - started)

    def connection(self, subscriptions: Subscribed) -> None:
        self._subscribers.add(subscriptions)

    # --- scrape --------------------------------------------------------------------

    async def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """Read the scrape-time figures, then the text prometheus_client writes."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept or "")
        async with self._lock:
            self._scraped = await self._gather()
            body = await anyio.to_thread.run_sync(encoder, self.registry)
        return body, content_type

    async def _gather(self) -> dict[str, Any]:
        writer, server = self.writer, self.server
        lags = [writer.committed_position - c for s in list(self._subscribers)
                for c in s.cursors()]
        figures: dict[str, Any] = {
            "queue": writer.queue_depth, "capacity": self.max_queue,
            "connections": server.connections if server else 0,
            "subscriptions": server.subscriptions if server else 0,
            "lag_max": max(lags, default=0),
            "lagging": sum(1 for lag in lags if lag > 0),
            "executors": len(self.executors.running) if self.executors else 0,
            "position": writer.committed_position,
            "redacted": dict(writer.redactor.counts) if writer.redactor else {},
        }
        try:  # a store's size may be a read of the database too (PostgreSQL's)
            size = self.store.capabilities.size
            figures["db_bytes"] = await size.db_bytes() if size else 0
            figures["status"] = await self.store.session_totals("status")
            figures["namespace"] = top_labels(
                await self.store.session_totals("namespace"), self.max_labels)
            figures["actor"] = top_labels(
                await self.store.session_totals("actor_name"), self.max_labels)
        except SessiondError as exc:  # serve what needs no database; say why the rest is missing
            log.warning("metrics.scrape_failed", error=exc.message)
        return figures


class _ScrapeCollector:
    """The gauges, from the figures gathered just before the text is written."""

    def __init__(self, metrics: Prometheus) -> None:
        self.metrics = metrics

    def describe(self) -> list[Any]:
        return []  # families are only known once scraped; none collide with the others

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        f = self.metrics._scraped
        if not f:
            return
        plain = [
            ("sessiond_write_queue_depth", "Commands waiting for the writer.", "queue"),
            ("sessiond_write_queue_capacity", "Commands the write queue holds before"
             " callers get -32008 (max_queue).", "capacity"),
            ("sessiond_connections", "Open client connections.", "connections"),
            ("sessiond_subscriptions", "Live event subscriptions.", "subscriptions"),
            ("sessiond_subscription_lag_max_events", "Events committed but not yet sent to"
             " the furthest-behind subscription.", "lag_max"),
            ("sessiond_subscriptions_lagging", "Subscriptions with events still to send.",
             "lagging"),
            ("sessiond_executors_running", "Executor processes (session.spawn) running.",
             "executors"),
            ("sessiond_database_bytes", "Bytes of the database file and its WAL.",
             "db_bytes"),
            ("sessiond_last_position", "Global position of the last committed event.",
             "position"),
        ]
        for name, doc, key in plain:
            if key in f:  # db_bytes: not when the database could not be read
                yield GaugeMetricFamily(name, doc, value=f[key])
        redacted = CounterMetricFamily(
            "sessiond_redacted", "Credentials replaced before they were stored, by kind.",
            labels=["kind"])
        for kind, count in sorted(f.get("redacted", {}).items()):
            redacted.add_metric([kind], count)
        yield redacted
        if "status" in f:
            g = GaugeMetricFamily("sessiond_sessions", "Stored sessions, by status.",
                                  labels=["status"])
            for status, count, *_ in f["status"]:
                g.add_metric([status], count)
            yield g
        for dim, label in (("namespace", "namespace"), ("actor", "actor")):
            if dim not in f:
                continue
            tokens = GaugeMetricFamily(
                f"sessiond_{dim}_tokens", f"Tokens recorded by stored sessions, by {label}"
                " (top N, the rest as (other)) and kind (input, output).",
                labels=[label, "kind"])
            cost = GaugeMetricFamily(
                f"sessiond_{dim}_estimated_cost", "Estimated cost recorded by stored"
                f" sessions, by {label} (top N, the rest as (other)).", labels=[label])
            for value, _, inp, out, spent in f[dim]:
                tokens.add_metric([value, "input"], inp)
                tokens.add_metric([value, "output"], out)
                cost.add_metric([value], spent)
            yield tokens
            yield cost


# --- hooking it in ------------------------------------------------------------------


def install(config: Config, store: Store, writer: Writer, server: Server,
            executors: Executors) -> Prometheus:
    """Hook Prometheus into the writer and the server; the HTTP face serves its text."""
    metrics = Prometheus(writer=writer, store=store, max_queue=config.max_queue,
                         max_labels=config.max_metrics_labels)
    metrics.server, metrics.executors = server, executors
    writer.metrics = server.metrics = metrics
    return metrics
