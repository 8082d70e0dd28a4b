"""Entry point of the `sessiond` executable: parse flags, configure logs, run until a signal."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import anyio
import structlog

from sessiond_daemon import host
from sessiond_daemon.cpu import PIN
from sessiond_daemon.serve import lifecycle, logs, systemd
from sessiond_daemon.serve.config import Config, ConfigError, load
from sessiond_daemon.serve.deadline import MARGIN_S, StopDeadline
from sessiond_daemon.serve.metrics import check_config as check_metrics
from sessiond_daemon.serve.web.face import check_config as check_http
from sessiond_daemon.stores.schema import SchemaRefused
from sessiond_schemas.errors import StorageError

EX_CONFIG = 78
EX_TEMPFAIL = 75


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="sessiond", description="Run the sessiond daemon. `sessiond migrate FROM TO`"
        " copies a database into another (docs/fleet.md).")
    p.add_argument("--config", help="TOML config file (also $SESSIOND_CONFIG)")
    p.add_argument("--socket", help="Unix socket path (also $SESSIOND_SOCKET)")
    p.add_argument("--db", help="SQLite database path, or postgresql://user@host:port/dbname"
                   " (fleet mode, docs/fleet.md; the password from db_password_file or"
                   " systemd credentials, never here); also $SESSIOND_DB")
    p.add_argument("--host-name", dest="host_name",
                   help="this host's name, recorded with the executors it starts (default:"
                        " the machine's hostname; fleet mode, docs/fleet.md)")
    p.add_argument("--socket-mode", help="octal mode of the socket, e.g. 0660 (default 0600)")
    p.add_argument("--durability", choices=["full", "normal"],
                   help="full: fsync every commit (default); normal: faster, a power loss may "
                        "lose the last commits (never corrupts)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", choices=["auto", "json", "console"])
    for name in Config.__struct_fields__:
        if name.startswith("max_") or name in ("view_cache_size", "snapshot_every"):
            p.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    for name in Config.__struct_fields__:
        if name.startswith("http_") and name.endswith("_s"):
            p.add_argument("--" + name.replace("_", "-"), type=float, dest=name)
    p.add_argument("--drain-timeout-s", type=float, dest="drain_timeout_s")
    p.add_argument("--request-timeout-s", type=float, dest="request_timeout_s",
                   help="seconds a request line begun on the socket may take to end")
    p.add_argument("--cleanup-older-than-days", type=float, dest="cleanup_older_than_days",
                   help="delete ended sessions idle this long, every --cleanup-every-s (0: never)")
    p.add_argument("--cleanup-every-s", type=float, dest="cleanup_every_s")
    p.add_argument("--kill-grace-s", type=float, dest="kill_grace_s",
                   help="seconds session.kill waits after SIGTERM before SIGKILL")
    p.add_argument("--cpu-affinity", type=_cpu_setting, dest="cpu_affinity",
                   help="auto (default): the daemon's threads on one CPU, moved as the load"
                        " asks; a CPU number: on that one; off: wherever the scheduler puts"
                        " each")
    p.add_argument("--allowed-uids", type=_int_list,
                   help="comma-separated uids let in besides ours")
    p.add_argument("--allowed-gids", type=_int_list, help="comma-separated gids let in")
    p.add_argument("--http-listen", action="append", dest="http_listen",
                   help="serve the HTTP face (Durable Streams, /metrics; docs/http.md) on a"
                        " loopback host:port or a socket path; repeatable (default: off)")
    p.add_argument("--http-allow-remote", action="store_const", const=True,
                   dest="http_allow_remote",
                   help="let --http-listen bind addresses that are not loopback")
    p.add_argument("--metrics-listen", help="serve Prometheus metrics alone, unauthenticated,"
                   " on host:port or a socket path (needs sessiond[metrics]; default: off)")
    p.add_argument("--migrate-only", action="store_true",
                   help="bring the database up to this release's schema (backing it up"
                        " first), then exit without serving")
    return p.parse_args(argv)


def loop_options(env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """anyio's asyncio backend options: uvloop on Linux when it is installed, unless
    `SESSIOND_LOOP=asyncio` asks for the standard loop (for A/B measurements)."""
    choice = env.get("SESSIOND_LOOP", "").strip().lower() or "uvloop"
    if choice not in ("uvloop", "asyncio"):
        raise ConfigError(f"SESSIOND_LOOP must be asyncio or uvloop, not {choice!r}")
    if choice == "asyncio" or not sys.platform.startswith("linux"):
        return {}
    if importlib.util.find_spec("uvloop") is None:
        return {}  # the pure-asyncio fallback
    return {"use_uvloop": True}


def _cpu_setting(text: str) -> str | int:
    return int(text) if text.strip().isdigit() else text


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


async def _serve(daemon: lifecycle.Daemon, args: argparse.Namespace) -> None:
    shutdown = anyio.Event()
    log = structlog.get_logger("sessiond")
    # Whatever the loop is doing when SIGTERM comes, the process ends in time (deadline.py).
    stop_deadline = StopDeadline(lambda: daemon.config.drain_timeout_s
                                 + daemon.config.kill_grace_s + MARGIN_S)
    async with anyio.create_task_group() as tg:
        async def on_signals(signals: AsyncIterator[signal.Signals]) -> None:
            async for signum in signals:
                if signum == signal.SIGHUP:
                    _reload(daemon, args)
                    continue
                if shutdown.is_set():
                    log.warning("daemon.forced_exit")
                    os._exit(1)  # a second signal: stop waiting for the drain
                log.info("daemon.signal", signal=signum.name)
                stop_deadline.arm()
                shutdown.set()

        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT,
                                        signal.SIGHUP) as signals:
            stop_deadline.chain(signal.SIGTERM, signal.SIGINT)
            tg.start_soon(on_signals, signals)
            await daemon.run(shutdown)
            tg.cancel_scope.cancel()


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("config", "migrate_only")}


def _reload(daemon: lifecycle.Daemon, args: argparse.Namespace) -> None:
    """SIGHUP: read the config file again (flags still win) and apply what can change live."""
    notifier = daemon.notifier
    notifier.notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
    try:
        config = load(args.config, _overrides(args))
    except ConfigError as exc:
        structlog.get_logger("sessiond").error("config.reload_failed", detail=str(exc))
    else:
        daemon.reload(config)
    notifier.notify("READY=1")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["migrate"]:  # `sessiond migrate FROM TO`: a copy, not a daemon
        from sessiond_daemon.serve.migrate import main as migrate

        sys.exit(migrate(argv[1:]))
    args = parse_args(argv)
    try:
        config = load(args.config, _overrides(args))
        check_metrics(config)
        check_http(config)
        options = loop_options()
    except ConfigError as refused:
        print(f"sessiond: {refused}", file=sys.stderr)
        sys.exit(EX_CONFIG)
    logs.configure(config.log_level, config.log_format)
    if not args.migrate_only:
        try:
            PIN.start(config.cpu_affinity)  # before any thread of the daemon's starts
        except ValueError as refused:
            print(f"sessiond: {refused}", file=sys.stderr)
            sys.exit(EX_CONFIG)
    log = structlog.get_logger("sessiond")
    log.debug("daemon.loop", loop="uvloop" if options else "asyncio")
    # Read (and clear) systemd's variables before anything could start a child process.
    notifier = systemd.Notifier.from_environment()
    try:
        inherited = systemd.inherited_listener()
    except (systemd.ActivationError, OSError) as unusable:
        log.error("daemon.activation_failed", detail=str(unusable))
        sys.exit(EX_CONFIG)
    daemon = lifecycle.Daemon(config, notifier=notifier, inherited=inherited)
    try:
        if args.migrate_only:
            anyio.run(lifecycle.migrate_only, config, backend="asyncio",
                      backend_options=options)
        else:
            anyio.run(_serve, daemon, args, backend="asyncio", backend_options=options)
    except BaseException as group:  # task groups wrap what they raise
        failure = _sole(group)
        if isinstance(failure, SchemaRefused):
            log.error("daemon.schema_refused", detail=str(failure))
            print(f"sessiond: {failure}", file=sys.stderr)
            sys.exit(EX_CONFIG)  # the same every time: restarting cannot help
        if isinstance(failure, (lifecycle.AlreadyRunning, host.DatabaseInUse)):
            log.error("daemon.already_running", detail=str(failure))
            sys.exit(EX_TEMPFAIL)
        if isinstance(failure, host.UnsafePathError):
            log.error("daemon.unsafe_path", detail=str(failure))
            sys.exit(EX_CONFIG)
        if isinstance(failure, StorageError):
            log.error("daemon.storage_failed", detail=failure.message)
            sys.exit(1)
        if isinstance(failure, OSError):
            log.error("daemon.start_failed", detail=str(failure))
            sys.exit(1)
        if isinstance(failure, KeyboardInterrupt):
            sys.exit(130)
        raise


def _sole(exc: BaseException) -> BaseException:
    """Unwrap exception groups that hold a single exception."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    main()
