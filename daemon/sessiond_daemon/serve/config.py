"""Daemon settings: embedded defaults, then a TOML file, then environment, then flags."""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from sessiond_daemon.core.access import Grant
from sessiond_daemon.core.redact import check_patterns
from sessiond_daemon.stores import registry
from sessiond_schemas.paths import default_socket
from sessiond_schemas.state import TtlSeconds


class ConfigError(Exception):
    """The configuration cannot be used; the message says which setting and why."""


# Bounds of the settings: a value outside is refused at start (exit 78) and by a
# reload (the running config stays). Sizes and counts that something is divided by,
# waited on or queued against must be at least 1; floats must be finite.
_INT64 = 2**63 - 1
Count = Annotated[int, msgspec.Meta(ge=1, le=_INT64)]  # at least one
CountOrZero = Annotated[int, msgspec.Meta(ge=0, le=_INT64)]  # 0 has a stated meaning
Seconds = Annotated[float, msgspec.Meta(ge=0, le=1e9)]  # finite, never negative
Id = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 2)]  # a uid or gid (2^32-1 is "none")
# A host's name as its sessions record it: printable, at most 255 characters.
HostName = Annotated[str, msgspec.Meta(min_length=1, max_length=255,
                                       pattern=r"^[^\x00-\x1f\x7f]+$")]


class Redaction(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a namespace's events are redacted (docs/security.md, "Redaction")."""

    enabled: bool = True
    # Extra rules: kind (lowercase, digits, '-') -> a Python regular expression; a group
    # named `s` is the part replaced, else the whole match.
    patterns: dict[str, str] = {}

    def __post_init__(self) -> None:
        problem = check_patterns(self.patterns)
        if problem is not None:
            raise ValueError(problem)


class Config(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    socket: str | None = None
    # A SQLite file path (the default), or postgresql://user@host:port/dbname (fleet mode,
    # docs/fleet.md); a URL holding a password is refused.
    db: str | None = None
    # The PostgreSQL password's file; unset: systemd's credential sessiond-db-password
    # ($CREDENTIALS_DIRECTORY), else none. Never on the command line.
    db_password_file: str | None = None
    # This host's name, recorded with the executors it starts (fleet mode: a session's
    # process is supervised by the host that started it); unset: the machine's hostname.
    host_name: HostName | None = None
    socket_mode: Annotated[int, msgspec.Meta(ge=0, le=0o777)] = 0o600
    durability: Literal["full", "normal"] = "full"
    max_db_bytes: CountOrZero = 0  # 0: no cap; counts the WAL too
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "json", "console"] = "auto"
    max_request_bytes: Count = 128 << 20
    max_connections: Count = 1024
    max_inflight: Count = 256
    max_subscriptions: CountOrZero = 64  # 0: no subscriptions
    max_subscription_buffer: Count = 1 << 20
    max_queue: Count = 4096
    max_batch: Count = 512
    view_cache_size: Count = 4096
    snapshot_every: Count = 1000
    max_message_bytes: Count = 16 << 20
    max_event_bytes: Count = 32 << 20
    max_checkpoint_bytes: Count = 96 << 20
    # Forks of forks: how many links a chain may have (session.fork and session.import
    # refuse one more, -32602); its bound is the walk limit every read of a chain stops at.
    max_fork_depth: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 1000
    allowed_uids: list[Id] = []
    allowed_gids: list[Id] = []
    # Methods those other users may call beyond the default session-data set
    # (docs/security.md): method names, "session.import:replace", or "*" for all.
    peer_methods: list[Grant] = []
    drain_timeout_s: Seconds = 10.0
    cleanup_older_than_days: Seconds = 0  # 0: no periodic retention
    cleanup_every_s: Annotated[float, msgspec.Meta(gt=0, le=1e9)] = 3600
    # Idle TTL of new sessions per namespace (a name, or a prefix ending in "*": the
    # longest match wins), in seconds; a session.create's own ttl_s comes first.
    default_ttl_s: dict[str, TtlSeconds] = {}
    # Retention past a compaction (issue 48), opt-in per namespace (a name, or a prefix
    # ending in "*"): session.trim takes out history behind the last compaction older than
    # this many days. Empty: session.trim needs its own older_than_days.
    trim_after_days: dict[str, Annotated[float, msgspec.Meta(ge=0, le=100_000)]] = {}
    # How often the daemon looks for sessions whose idle TTL has passed (and ends them).
    expire_every_s: Annotated[float, msgspec.Meta(gt=0, le=1e9)] = 30
    # Executors (session.spawn): processes at once, longest output line kept whole,
    # output lines per second per process before it is throttled, SIGTERM-to-SIGKILL wait.
    max_processes: CountOrZero = 16  # 0: session.spawn refused
    max_line_bytes: Count = 256 << 10
    max_output_lines_per_s: Count = 2000
    kill_grace_s: Seconds = 5.0
    # Memory a connection may cost: requests in one batch line, reply bytes queued for a
    # client that does not read (past it the daemon stops reading that client), and the
    # bytes a paged read puts in one page (a single larger item still comes alone).
    max_batch_requests: Count = 64
    max_reply_buffer: Count = 16 << 20
    max_page_bytes: Count = 4 << 20
    # A request line begun on the socket must end within this many seconds of its first
    # byte, or the connection is closed (a stalled sender holds its bytes; 0: no deadline).
    request_timeout_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0
    # The HTTP face (docs/http.md): Durable Streams and /metrics on each host:port or
    # socket path listed (loopback only unless http_allow_remote); none: off.
    http_listen: list[str] = []
    http_allow_remote: bool = False
    http_cors_origins: list[str] = []  # origins a browser may call from; "*": any
    # Host names (a request's Host header, its port aside) every HTTP listener answers
    # besides loopback's and its own address: the names a proxy in front passes on.
    http_allowed_hosts: list[Annotated[str, msgspec.Meta(min_length=1, max_length=255)]] = []
    http_long_poll_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    http_sse_close_s: Annotated[float, msgspec.Meta(gt=0, le=86400)] = 60.0
    http_send_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    http_idle_timeout_s: Annotated[float, msgspec.Meta(ge=1, le=3600)] = 5.0
    http_max_connections: Count = 256  # open at once; more are dropped as they connect
    # A request's head must come whole within http_head_timeout_s of the connection (or of
    # the last response), and its body within http_body_timeout_s of its head, each timed
    # without waiting for another byte; past either the connection is dropped.
    http_head_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    http_body_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 30.0
    # Connections one peer (a uid on a Unix socket, an address on TCP) may hold open on a
    # listener; peers other than the owner hold together at most three quarters of
    # http_max_connections (of 32 on metrics_listen), the rest is the owner's room.
    http_max_connections_per_peer: Count = 32
    # The cost a session.search query may take (docs/reliability.md, "Budgets"): query
    # terms, prefix terms (`deplo*`), SQLite VM steps, and its time; past one the query is
    # refused (-32602) or stopped (-32012), naming the setting.
    search_max_terms: Count = 64
    search_max_prefixes: Count = 8
    # the indexed events the words of a query's prefix terms are in, summed over the words,
    # as the store estimates them from its index before the query runs: past it, -32602
    search_max_prefix_matches: Count = 100_000
    search_max_steps: Count = 500_000_000
    search_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=1e9)] = 10.0
    # PostgreSQL (fleet mode): every statement of the writer and of the readers ends
    # after this long (statement_timeout; a timed-out commit is a retryable -32012).
    # 0: no timeout.
    db_statement_timeout_s: Seconds = 30.0
    # Reply bytes held (built and unsent) across every connection; past three quarters
    # of it the connections holding the most are not read, past it the one holding the
    # most is closed (docs/reliability.md). Unset: an eighth of MemTotal, at most 512 MiB.
    max_reply_buffer_total: Count | None = None
    # Prometheus alone, unauthenticated, on host:port or a socket path (docs/metrics.md);
    # None: off (with http_listen, /metrics is also served there, to the owner's token).
    metrics_listen: str | None = None
    max_metrics_labels: Count = 20  # actors / namespaces labelled; the rest are "(other)"
    # Redaction of credentials before anything is stored (docs/security.md): per namespace
    # (a name, a prefix ending in "*", or "*" for all; the longest match wins), on unless
    # a setting turns it off; `redact_digest` adds a keyed digest to each mark.
    redact: dict[str, Redaction] = {}
    redact_digest: bool = True
    # The host key (docs/security.md, "The host key"): unset, `<db>.key` beside a SQLite
    # database; in fleet mode a file every host of the fleet shares.
    key_file: str | None = None
    # Where the daemon's threads run (sessiond_daemon/cpu.py): "auto", one CPU that follows
    # the load; a CPU number, that one; "off", wherever the scheduler puts each thread.
    cpu_affinity: Literal["auto", "off"] | Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = "auto"


# Settings SIGHUP applies to a running daemon; the rest take effect at the next start.
# Limits that size a connection's buffers apply to connections opened after the reload.
RELOADABLE = frozenset({
    "log_level", "log_format", "max_request_bytes", "max_connections", "max_inflight",
    "max_subscriptions", "max_subscription_buffer", "max_message_bytes", "max_event_bytes",
    "max_checkpoint_bytes", "max_fork_depth", "allowed_uids", "allowed_gids", "peer_methods",
    "drain_timeout_s", "max_batch_requests", "max_reply_buffer", "max_page_bytes",
    "http_cors_origins", "http_allowed_hosts", "http_send_timeout_s", "default_ttl_s",
    "search_max_terms", "search_max_prefixes", "search_max_prefix_matches", "search_max_steps",
    "search_timeout_s", "redact", "redact_digest",
    "max_reply_buffer_total",
    "request_timeout_s",
})


def differences(old: Config, new: Config) -> dict[str, tuple[Any, Any]]:
    """Settings whose value differs between two configs: name -> (old, new)."""
    return {name: (getattr(old, name), getattr(new, name))
            for name in Config.__struct_fields__ if getattr(old, name) != getattr(new, name)}


def default_db(env: Mapping[str, str] = os.environ) -> str:
    """The contract's database path when no flag names one."""
    if env.get("SESSIOND_DB"):
        return env["SESSIOND_DB"]
    if env.get("STATE_DIRECTORY"):
        return os.path.join(env["STATE_DIRECTORY"].split(":")[0], "sessiond.db")
    if env.get("XDG_STATE_HOME"):
        return os.path.join(env["XDG_STATE_HOME"], "sessiond", "sessiond.db")
    return str(Path.home() / ".local" / "state" / "sessiond" / "sessiond.db")


def default_config_file(env: Mapping[str, str] = os.environ) -> str | None:
    """The config file read when none is named, if it exists: systemd's
    $CONFIGURATION_DIRECTORY, else $XDG_CONFIG_HOME (~/.config), then sessiond/sessiond.toml."""
    if env.get("CONFIGURATION_DIRECTORY"):
        candidate = os.path.join(env["CONFIGURATION_DIRECTORY"].split(":")[0], "sessiond.toml")
    elif env.get("XDG_CONFIG_HOME") or env.get("HOME"):
        base = env.get("XDG_CONFIG_HOME") or os.path.join(env["HOME"], ".config")
        candidate = os.path.join(base, "sessiond", "sessiond.toml")
    else:
        return None
    return candidate if os.path.isfile(candidate) else None


def load(path: str | None, overrides: dict[str, Any],
         env: Mapping[str, str] = os.environ) -> Config:
    """Build the config: the file (if any), then flags; fill the default paths last."""
    values: dict[str, Any] = {}
    path = path or env.get("SESSIOND_CONFIG") or default_config_file(env)
    if path:
        try:
            with open(path, "rb") as f:
                values = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    values.update({k: v for k, v in overrides.items() if v is not None})
    if isinstance(values.get("socket_mode"), str):
        try:
            values["socket_mode"] = int(values["socket_mode"], 8)
        except ValueError as exc:
            raise ConfigError(
                f"socket_mode must be octal like 0660: {values['socket_mode']!r}") from exc
    try:
        config = msgspec.convert(values, Config)
    except msgspec.ValidationError as exc:
        hint = " (an octal mode: \"0660\" or 0o660)" if "$.socket_mode" in str(exc) else ""
        raise ConfigError(
            f"invalid configuration{' in ' + path if path else ''}: {exc}{hint}") from exc
    config.socket = config.socket or default_socket(env)
    config.db = config.db or default_db(env)
    config.host_name = config.host_name or socket.gethostname()
    try:  # a URL that cannot work, or a password that cannot be read: now, not at connect
        registry.check(config.db, registry.Options(password_file=config.db_password_file,
                                                   env=env))
    except registry.StoreUrlError as exc:
        raise ConfigError(str(exc)) from exc
    return config
