"""The daemon's own methods: daemon.ping, stats, verify, backup, reindex."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from .base import Params


class VerifyParams(Params, kw_only=True, forbid_unknown_fields=True):
    # An export document (object or JSON text) to check instead of the database: its
    # checksum and hash chain, and whose its events are (sealed with this daemon's key).
    document: Any = None


class BackupParams(Params, kw_only=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\x00]+$")]


class PingResult(msgspec.Struct, kw_only=True):
    pong: bool
    version: str  # the daemon's release
    uptime_s: float
    protocol: str = "1.0"  # PROTOCOL_VERSION of the daemon (absent before 1.1)
    methods: list[str] = []  # every method the daemon serves (absent before 1.1)


class StatsResult(msgspec.Struct, kw_only=True):
    sessions: int
    events: int
    last_position: int
    db_bytes: int
    connections: int
    subscriptions: int
    write_queue_depth: int
    appends_per_s: float
    uptime_s: float
    write_transactions: int
    write_commands: int
    # From protocol 1.1 (None from an older daemon: unknown, not zero): the database's
    # schema version, and health figures for `sessionctl top`: the last minute's commits,
    # the queue's capacity, running executors, and sessions by status.
    schema_version: int | None = None
    write_queue_capacity: int | None = None
    commit_batch_size: float | None = None
    commit_latency_ms: float | None = None
    commit_latency_max_ms: float | None = None
    executors_running: int | None = None
    sessions_by_status: dict[str, int] | None = None
    # The daemon's reply budget (max_reply_buffer_total; None from an older daemon): reply
    # bytes built and unsent across connections now, the budget, the connections not read
    # now because of it, and those it closed since the start.
    reply_bytes_held: int | None = None
    reply_bytes_budget: int | None = None
    connections_paused: int | None = None
    connections_closed_by_budget: int | None = None
    # A shared store's (PostgreSQL's) commit totals since the daemon started: commits,
    # one_call (those committed in one statement),
    # events, round_trips (statements sent, BEGIN and COMMIT included), locked_round_trips
    # (from the statement that moves the counter row to COMMIT) and locked_s (from the
    # server taking that row's lock to COMMIT's answer), locked_in_statement_s (of that,
    # the one-call statement's part before the flush),
    # commit_s, moved (batches decided again). None on SQLite and from older daemons.
    store_commits: dict[str, float] | None = None
    # Credentials redacted since the daemon started (docs/security.md): events that had
    # one, and replacements by kind (None from an older daemon).
    redacted_events: int | None = None
    redacted: dict[str, int] | None = None


class VerifyProblem(msgspec.Struct, kw_only=True):
    session_id: str | None
    problem: str


class VerifyResult(msgspec.Struct, kw_only=True):
    ok: bool
    checked_sessions: int
    problems: list[VerifyProblem]
    # Whose the events are (docs/security.md, "The host key"): events whose hash this
    # host's (or fleet's) key sealed, events of an unkeyed hash version (written by earlier
    # releases, or imported as their documents had them), events sealed by another key.
    # None from older daemons.
    sealed_events: int | None = None
    unkeyed_events: int | None = None
    foreign_events: int | None = None


class BackupResult(msgspec.Struct, kw_only=True):
    path: str
    bytes: int
    position: int


class ReindexResult(msgspec.Struct, kw_only=True):
    indexed: int  # events in the search index after the rebuild
    forks: int
