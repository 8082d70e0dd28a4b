"""What `sessionctl top` shows, folded from the event stream and daemon.stats: no I/O here.

Windows are measured on the events' own `recorded_at` (the daemon's clock), so a
frame drawn from events read back at start says the same as one drawn live.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sessiond_schemas.events import Event

MINUTE = 60.0
HOUR = 3600.0
SORTS = ("events", "tokens", "cost", "recent")  # `s` cycles through these
SORT_TITLES = {"events": "events/s", "tokens": "tokens 1h", "cost": "cost 1h",
               "recent": "most recent"}


def _epoch(recorded_at: str) -> float:
    return datetime.fromisoformat(recorded_at.replace("Z", "+00:00")).timestamp()


@dataclass(slots=True)
class Known:
    """What top knows of one session: who it belongs to, its status, its last event."""

    actor: str | None = None
    namespace: str | None = None
    status: str | None = None
    version: int = 0
    last_at: float = 0.0
    resolved: bool = False  # actor and namespace are known (created seen, or looked up)


class Model:
    """Events folded into the windows top draws. Fed by one thread, read by another."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sessions: dict[str, Known] = {}
        self._minute: deque[tuple[float, str]] = deque()  # (time, session) per event
        self._spend: deque[tuple[float, str, int, float]] = deque()  # tokens, cost per hour
        # session -> (pid, the host whose daemon started it), from process.* events
        self.executors: dict[str, tuple[int, str | None]] = {}
        self.latest = 0.0  # the newest recorded_at seen: "now" for a frame of old events

    def add(self, event: Event) -> None:
        at = _epoch(event.recorded_at)
        with self.lock:
            self.latest = max(self.latest, at)
            known = self.sessions.get(event.session_id)
            if known is None:
                known = self.sessions[event.session_id] = Known()
            known.version = max(known.version, event.version)
            known.last_at = max(known.last_at, at)
            d = event.fields()
            if event.type == "session.created":
                known.actor, known.namespace = d.get("actor_name"), d.get("namespace", "local")
                known.status, known.resolved = d.get("status", "active"), True
            elif event.type == "session.status_changed":
                known.status = d.get("to")
            elif event.type == "tokens.recorded" and at >= self.latest - HOUR:
                tokens = int(d.get("input_tokens", 0)) + int(d.get("output_tokens", 0))
                self._spend.append((at, event.session_id, tokens,
                                    float(d.get("estimated_cost", 0.0))))
            elif event.type == "process.started":
                self.executors[event.session_id] = (int(d.get("pid", 0)), d.get("host"))
            elif event.type in ("process.exited", "process.detached"):
                self.executors.pop(event.session_id, None)
            if at >= self.latest - MINUTE:  # older: in no window a frame draws
                self._minute.append((at, event.session_id))

    def learn(self, session_id: str, actor: str | None, namespace: str | None,
              status: str | None) -> None:
        """What a session.get said of a session whose creation top did not see."""
        with self.lock:
            known = self.sessions.setdefault(session_id, Known())
            known.actor, known.namespace, known.resolved = actor, namespace, True
            known.status = known.status or status

    def unresolved(self, now: float, limit: int) -> list[str]:
        """Sessions active in the last hour whose actor is not known yet."""
        with self.lock:
            return [sid for sid, k in self.sessions.items()
                    if not k.resolved and k.last_at >= now - HOUR][:limit]

    def figures(self, stats: Any, now: float, *, sort: str = "events",
                match: str | None = None, limit: int = 10) -> dict[str, Any]:
        """Everything a frame shows, as plain data (this is what `--json --once` prints)."""
        with self.lock:
            # By the events' own time, whatever order they came in: an old-dated event
            # (an import of last month's usage) read after a new one is in no window.
            # Each frame keeps only what is in its window, so the deques stay bounded.
            self._minute = deque(x for x in self._minute if x[0] >= now - MINUTE)
            self._spend = deque(x for x in self._spend if x[0] >= now - HOUR)
            minute = Counter(sid for at, sid in self._minute)
            spend = list(self._spend)
            sessions = dict(self.sessions)
            executors = dict(self.executors)

        def who(sid: str) -> Known:
            return sessions.get(sid) or Known()

        def wanted(k: Known) -> bool:
            return not match or any(match.lower() in (v or "").lower()
                                    for v in (k.actor, k.namespace))

        hour_tokens: Counter[str] = Counter()
        hour_cost: dict[str, float] = {}
        actors: dict[str, dict[str, Any]] = {}
        for at, sid, tokens, cost in spend:
            hour_tokens[sid] += tokens
            hour_cost[sid] = hour_cost.get(sid, 0.0) + cost
            k = who(sid)
            if not wanted(k):
                continue
            name = k.actor or ("?" if not k.resolved else "-")
            row = actors.setdefault(name, {"actor": name, "tokens_1m": 0, "cost_1m": 0.0,
                                           "tokens_1h": 0, "cost_1h": 0.0})
            row["tokens_1h"] += tokens
            row["cost_1h"] += cost
            if at >= now - MINUTE:
                row["tokens_1m"] += tokens
                row["cost_1m"] += cost
        for row in actors.values():
            row["cost_1m"], row["cost_1h"] = round(row["cost_1m"], 6), round(row["cost_1h"], 6)

        active = set(minute) | set(hour_tokens)
        rows = []
        for sid in active:
            k = who(sid)
            if not wanted(k):
                continue
            rows.append({"session_id": sid, "actor": k.actor, "namespace": k.namespace,
                         "status": k.status, "version": k.version,
                         "events_1m": minute[sid],
                         "events_per_s": round(minute[sid] / MINUTE, 2),
                         "tokens_1h": hour_tokens[sid],
                         "cost_1h": round(hour_cost.get(sid, 0.0), 6),
                         "last_at": k.last_at})
        key = {"events": lambda r: (r["events_1m"], r["last_at"]),
               "tokens": lambda r: (r["tokens_1h"], r["events_1m"]),
               "cost": lambda r: (r["cost_1h"], r["events_1m"]),
               "recent": lambda r: (r["last_at"], r["events_1m"])}[sort]
        rows.sort(key=key, reverse=True)
        for r in rows:
            del r["last_at"]
        return {
            "daemon": {
                "sessions": stats.sessions, "events": stats.events,
                "last_position": stats.last_position, "uptime_s": stats.uptime_s,
                "queue": stats.write_queue_depth, "queue_capacity": stats.write_queue_capacity,
                "batch_size": stats.commit_batch_size,
                "commit_latency_ms": stats.commit_latency_ms,
                "commit_latency_max_ms": stats.commit_latency_max_ms,
                "connections": stats.connections, "subscriptions": stats.subscriptions,
                "appends_per_s": stats.appends_per_s, "db_bytes": stats.db_bytes,
            },
            "sessions_by_status": (None if stats.sessions_by_status is None  # an old daemon
                                   else dict(sorted(stats.sessions_by_status.items()))),
            # executors_running: this daemon's own; `executors`: every session whose
            # process.started has no exit yet, started by this daemon or (in a fleet)
            # another host's, whose `host` says which.
            "executors_running": stats.executors_running,
            "executors": [{"session_id": sid, "pid": pid, "host": host,
                           "actor": who(sid).actor}
                          for sid, (pid, host) in sorted(executors.items())],
            "busiest": rows[:limit],
            "actors": sorted(actors.values(), key=lambda r: (-r["tokens_1h"], r["actor"])),
            "sort": sort, "filter": match or None,
        }
