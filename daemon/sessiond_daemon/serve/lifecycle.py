"""The daemon's whole life: open db, writer, serve, wait, drain, close; reload on request."""

from __future__ import annotations

import errno
import os
import resource
import socket
import stat
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog
from anyio.abc import SocketListener, TaskGroup, TaskStatus

from sessiond_daemon import host
from sessiond_daemon.core.access import Grants
from sessiond_daemon.core.commands import Commands, Limits
from sessiond_daemon.core.redact import Redactor, Setting
from sessiond_daemon.core.writer import Writer
from sessiond_daemon.cpu import PIN
from sessiond_daemon.features.context import Context
from sessiond_daemon.features.executors.methods import Executors
from sessiond_daemon.features.executors.methods import Settings as ExecutorSettings
from sessiond_daemon.features.expiry import Expiry
from sessiond_daemon.features.forks import Forks
from sessiond_daemon.features.graphs import Graphs
from sessiond_daemon.features.maintenance import Maintenance
from sessiond_daemon.features.retention import Retention
from sessiond_daemon.features.search import Search
from sessiond_daemon.features.service import LiveFigures, Service
from sessiond_daemon.serve import hostkey, logs, mcp_entry, methods
from sessiond_daemon.serve.budget import default_budget
from sessiond_daemon.serve.config import RELOADABLE, Config, differences
from sessiond_daemon.serve.metrics import MetricsUnavailable, require_client
from sessiond_daemon.serve.metrics import install as install_metrics
from sessiond_daemon.serve.server import Server, ServerLimits
from sessiond_daemon.serve.systemd import Notifier, Watchdog
from sessiond_daemon.stores import registry
from sessiond_daemon.stores.interface import Store
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EventMeta, now
from sessiond_schemas.rpc import SessionCleanupParams

if TYPE_CHECKING:
    from sessiond_daemon.serve.web.face import Face

log = structlog.get_logger("sessiond.lifecycle")

STATUS_EVERY_S = 5.0  # how often STATUS= is refreshed without a watchdog
FD_RESERVE = 64  # descriptors besides connections: database, readers, executors' pipes


# Builds the daemon's store from its config (not opened yet). Tests pass their own, e.g. a
# store that fails on cue; the store registry chooses it by the --db URL.
StoreFactory = Callable[[Config], Store]


def store_options(config: Config) -> registry.Options:
    """What the daemon's config says about its store, besides the URL."""
    return registry.Options(durability=config.durability, max_bytes=config.max_db_bytes,
                            password_file=config.db_password_file,
                            host_name=config.host_name or socket.gethostname(),
                            statement_timeout_s=config.db_statement_timeout_s)


def default_store(config: Config) -> Store:
    """The store `config.db` names (stores/registry.py): a SQLite file, or a PostgreSQL
    database (fleet mode)."""
    assert config.db
    return registry.open_store(config.db, store_options(config))


class _Shared:
    """A store shared by design (a database server): no state directory, no file lock."""

    def acquire(self) -> None:
        pass

    def release(self) -> None:
        pass


def _database_lock(db: str) -> host.DatabaseLock | _Shared:
    """The lock that makes this daemon the database's only one (a store that needs a file
    lock), after making its directory ours; nothing for a shared one."""
    if not registry.kind_of(db).needs_file_lock:
        return _Shared()
    host.private_dir(os.path.dirname(os.path.abspath(db)), "state")
    return host.DatabaseLock(db)


class AlreadyRunning(Exception):
    """Another live daemon answers on the socket path."""


async def bind_socket(path: str, mode: int) -> SocketListener:
    """Listen on `path`: replace a stale socket file, refuse a live one or a non-socket."""
    if len(os.fsencode(path)) > 107:
        raise OSError(errno.ENAMETOOLONG, f"socket path is longer than 107 bytes: {path}")
    host.private_dir(os.path.dirname(os.path.abspath(path)), "runtime")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(st.st_mode):
            raise OSError(errno.EEXIST, f"{path} exists and is not a socket; not touching it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # stale: nobody answers
            log.info("lifecycle.stale_socket_removed", path=path)
        else:
            raise AlreadyRunning(f"another sessiond is answering on {path}")
        finally:
            probe.close()
    return await anyio.create_unix_listener(path, mode=mode)


class Daemon:
    """One daemon's life: open the database, start the writer, serve, drain, close.

    `reload` applies a new config's reloadable settings while it serves (SIGHUP).
    """

    def __init__(self, config: Config, *, notifier: Notifier | None = None,
                 inherited: socket.socket | None = None,
                 store_factory: StoreFactory = default_store,
                 clock: Callable[[], str] = now) -> None:
        assert config.socket and config.db
        self.config = config
        self.clock = clock  # what the expiry sweep takes as now (tests drive it)
        self.store_factory = store_factory
        self.notifier = notifier or Notifier(None)
        self.inherited = inherited  # a listening socket from systemd, if activated
        self.server: Server | None = None
        self.service: Service | None = None
        self.commands: Commands | None = None
        self.methods: methods.MethodTable | None = None  # what the server serves
        self.writer: Writer | None = None
        self.http: Face | None = None  # the HTTP face, with http_listen or metrics_listen
        self.expiry: Expiry | None = None

    async def run(self, shutdown: anyio.Event, *,
                  task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until `shutdown` is set; `task_status.started` gets the socket path."""
        config = self.config
        assert config.db
        _raise_fd_limit(config.max_connections
                        + (config.http_max_connections if config.http_listen else 0))
        # 0. The host: directories only we can write, and the database to ourselves.
        lock = _database_lock(config.db)
        if self.inherited is None:
            assert config.socket
            host.private_dir(os.path.dirname(os.path.abspath(config.socket)), "runtime")
        lock.acquire()
        try:
            await self._run_locked(shutdown, task_status)
        finally:
            lock.release()

    async def _run_locked(self, shutdown: anyio.Event, task_status: TaskStatus[str]) -> None:
        config = self.config
        assert config.db
        # 1. The database: open, WAL, migrations.
        store = self.store_factory(config)
        await self._open(store)
        try:
            self.writer = Writer(store, max_queue=config.max_queue, max_batch=config.max_batch,
                                 cache_size=config.view_cache_size,
                                 snapshot_every=config.snapshot_every)
            key = hostkey.host_key(config.db, config.key_file)
            self.writer.key = key  # seals new events' hashes (version 2)
            self.writer.redactor = Redactor(key, redaction_settings(config),
                                            digest=config.redact_digest)
            async with anyio.create_task_group() as core:
                # 2. The writer: the only task that writes.
                await core.start(self.writer.run)
                following = anyio.CancelScope()
                self._follow_shared_log(core, following, store, self.writer)
                try:
                    await self._serve(store, self.writer, shutdown, task_status)
                finally:
                    # 5. Flush: the writer commits what is queued, then returns.
                    self.writer.close()
                    following.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await store.close()
            self.notifier.close()
            log.info("daemon.stopped")

    async def _open(self, store: Store) -> None:
        """Open the store; a PostgreSQL server that cannot be reached yet is waited for
        (STATUS= says so), with backoff, so that hosts may start before their database."""
        delay = 0.2
        while True:
            try:
                await store.open()
                return
            except SessiondError as exc:
                if not exc.data.get("retryable"):
                    raise
                log.warning("daemon.waiting_for_database", error=exc.message,
                            retry_in_s=delay)
                self.notifier.notify(f"STATUS=waiting for the database: {exc.message}"[:200])
            await anyio.sleep(delay)
            delay = min(5.0, delay * 2)

    def _follow_shared_log(self, core: TaskGroup, scope: anyio.CancelScope, store: Store,
                           writer: Writer) -> None:
        """A store other daemons write too (fleet mode: `capabilities.shared_log`): its
        follower rings the writer's bells with every host's events, so subscriptions see
        them all, in position order. Nothing for a store this daemon alone writes."""
        shared_log = store.capabilities.shared_log
        if shared_log is None:
            return

        lost = False  # "back" only after a loss: the first connection is not a return

        def database(connected: bool) -> None:
            nonlocal lost
            if not connected:
                lost = True
                log.warning("daemon.database_lost")
                self.notifier.notify("STATUS=waiting for the database (reconnecting)")
            elif lost and self.server is not None:
                lost = False
                log.info("daemon.database_back")
                self.notifier.notify(f"STATUS=serving, {self.server.connections} connections")

        # Followed only while this host's subscriptions or HTTP tails need it (follow.py).
        follower = shared_log.following(writer.deliver, cursor=writer.committed_position,
                                        at=lambda: writer.committed_position,
                                        deleted=writer.deleted_elsewhere,
                                        on_state=database,
                                        needed=lambda: writer.watchers > 0)
        writer.wake_follower = follower.hint
        writer.resume_follower = follower.resume
        writer.idle_follower = follower.idle

        async def follow() -> None:
            with scope:
                await follower.run()

        core.start_soon(follow)

    async def _serve(self, store: Store, writer: Writer, shutdown: anyio.Event,
                     task_status: TaskStatus[str]) -> None:
        config = self.config
        # The features, each given what it reads and writes through.
        self.commands = commands = Commands(store, writer, _service_limits(config))
        self.service = service = Service(commands, store, writer)
        maintenance = Maintenance(store, writer, commands, service.state_at)
        self.expiry = Expiry(store, commands, clock=self.clock)
        executors = Executors(commands, store, ExecutorSettings(
            max_processes=config.max_processes, max_line_bytes=config.max_line_bytes,
            max_output_lines_per_s=config.max_output_lines_per_s,
            kill_grace_s=config.kill_grace_s, host=config.host_name or socket.gethostname()))
        # The method table: every method of the contract and what serves it.
        context = Context(store, commands)
        self.retention = Retention(store, commands, context, dict(config.trim_after_days))
        self.methods = table = methods.table(
            service, maintenance, Graphs(store, commands),
            Search(store, commands), Forks(store, commands, service.state_at),
            executors, context, self.retention)
        methods.check(table)  # exactly the contract's methods, or no start
        self.server = server = Server(
            table, _server_limits(config), store=store, writer=writer,
            allowed_uids=frozenset(config.allowed_uids),
            allowed_gids=frozenset(config.allowed_gids), grants=Grants.of(config.peer_methods))
        service.on_stats(lambda: LiveFigures(
            connections=server.connections, subscriptions=server.subscriptions,
            executors_running=len(executors.running),
            reply_bytes_held=server.budget.real, reply_bytes_budget=server.budget.limit,
            connections_paused=server.budget.paused,
            connections_closed_by_budget=server.budget.closed))
        # 3. Serve: on systemd's socket if it passed one, else on our own.
        if self.inherited is not None:
            listener = await SocketListener.from_socket(self.inherited)
            socket_path = self.inherited.getsockname() or "(unnamed)"
            bound = None  # systemd's socket: the socket unit owns the path
        else:
            assert config.socket
            listener = await bind_socket(config.socket, config.socket_mode)
            socket_path, bound = config.socket, os.lstat(config.socket)
        mcp_bound: tuple[str, os.stat_result] | None = None
        try:
            executors.settings = replace(executors.settings, socket=socket_path)
            async with anyio.create_task_group() as serving:
                # Executors a previous daemon left are marked before anyone is served.
                await serving.start(executors.run)
                await serving.start(server.serve, listener)
                if config.http_listen or config.metrics_listen is not None:
                    await self._start_http(serving, config, writer, server, executors, store)
                # The MCP socket beside ours (docs/mcp.md), with the extra `mcp`.
                mcp_bound = await mcp_entry.start_socket(
                    serving, table, server, socket_path,
                    lambda path: bind_socket(path, config.socket_mode))
                if config.cleanup_older_than_days > 0:
                    serving.start_soon(_retention, maintenance, config)
                if config.trim_after_days:  # retention past a compaction (issue 48)
                    serving.start_soon(_trims, self.retention, config)
                serving.start_soon(self.expiry.run, config.expire_every_s)  # ends idle TTLs
                if PIN.follows_load:
                    serving.start_soon(_keep_cpu)
                log.info("daemon.ready", socket=socket_path, db=config.db,
                         durability=config.durability, pid=os.getpid(),
                         activated=self.inherited is not None)
                self.notifier.notify("READY=1", f"STATUS=serving on {socket_path}",
                                     f"MAINPID={os.getpid()}")
                if self.notifier.enabled:
                    serving.start_soon(self._heartbeat, writer, server)
                task_status.started(socket_path)
                await shutdown.wait()
                # 4. Drain: refuse new requests, let in-flight ones finish.
                log.info("daemon.stopping", inflight=server.inflight)
                self.notifier.notify("STOPPING=1", f"STATUS=draining {server.inflight} requests")
                server.draining = True
                if self.http is not None:
                    self.http.stop()
                with anyio.move_on_after(self.config.drain_timeout_s):
                    await server.wait_idle()
                # Executors end with the daemon; their turns are recorded as failed.
                await executors.stop()
                serving.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await listener.aclose()
                if bound is not None:
                    _unlink_socket(socket_path, bound)
                if mcp_bound is not None:
                    _unlink_socket(*mcp_bound)
                if self.http is not None:
                    self.http.close()

    async def _start_http(self, tg: TaskGroup, config: Config, writer: Writer, server: Server,
                          executors: Executors, store: Store) -> None:
        """The HTTP face (web/): Durable Streams and /metrics, on http_listen; /metrics
        alone on metrics_listen. Prometheus' hooks are installed when its client is."""
        from sessiond_daemon.serve.web.face import Face

        exposition = None
        try:
            require_client()
        except MetricsUnavailable:
            pass
        else:
            exposition = install_metrics(config, store, writer, server, executors).exposition
        assert self.methods is not None
        self.http = Face(config, self.methods, server, writer, exposition)
        await self.http.start(tg, lambda path: bind_socket(path, config.socket_mode))

    async def _heartbeat(self, writer: Writer, server: Server) -> None:
        """Tell systemd how we are: STATUS= lines, and WATCHDOG=1 only while healthy.

        This task runs on the event loop, so a ping proves the loop turns; it is
        withheld while the writer has been stuck on one batch longer than systemd's
        watchdog timeout, so that systemd restarts a daemon that can no longer write.
        """
        interval = self.notifier.watchdog_interval
        watchdog = Watchdog(interval) if interval is not None else None
        tick = min(interval or STATUS_EVERY_S, STATUS_EVERY_S)
        status = ""
        while True:
            stalled = writer.stalled_for()
            stuck = False
            if watchdog is not None:
                was_stuck = watchdog.stuck
                if watchdog.beat(stalled):
                    self.notifier.notify("WATCHDOG=1")
                stuck = watchdog.stuck
                if stuck and not was_stuck:
                    log.error("watchdog.writer_stuck", stalled_s=round(stalled, 1),
                              queue=writer.queue_depth)
            line = (f"STATUS={server.connections} connections, "
                    f"{writer.appends_per_s()} appends/s, queue {writer.queue_depth}"
                    + (f", writer stuck for {stalled:.0f} s" if stuck else ""))
            if line != status:
                self.notifier.notify(line)
                status = line
            await anyio.sleep(tick)

    def reload(self, new: Config) -> dict[str, tuple[Any, Any]]:
        """Apply `new`'s reloadable settings; return what changed. Others wait for a restart."""
        changed = differences(self.config, new)
        applied = {k: v for k, v in changed.items() if k in RELOADABLE}
        pending = sorted(k for k in changed if k not in RELOADABLE)
        if "log_level" in applied or "log_format" in applied:
            logs.configure(new.log_level, new.log_format)
        if self.server is not None:
            self.server.limits = _server_limits(new)
            self.server.budget.limit = self.server.limits.max_reply_buffer_total
            self.server.allowed_uids = frozenset(new.allowed_uids)
            self.server.allowed_gids = frozenset(new.allowed_gids)
            self.server.grants = Grants.of(new.peer_methods)
            self.server.recheck()  # connections of peers no longer let in are ended
        if self.http is not None:
            self.http.reload(new)
        if self.commands is not None:
            self.commands.limits = _service_limits(new)
        if self.writer is not None and self.writer.redactor is not None:
            self.writer.redactor.settings = redaction_settings(new)
            self.writer.redactor.digest = new.redact_digest
        # Keep the settings that need a restart as they are running.
        self.config = msgspec.structs.replace(
            self.config, **{k: getattr(new, k) for k in applied})
        log.info("config.reloaded", changed={k: list(v) for k, v in applied.items()},
                 needs_restart=pending)
        return applied


async def migrate_only(config: Config) -> list[int]:
    """`sessiond --migrate-only`: migrate the database (holding its lock), and return."""
    assert config.db
    lock = _database_lock(config.db)
    lock.acquire()
    try:
        store = default_store(config)
        await store.open()
        await store.close()
    finally:
        lock.release()
    log.info("daemon.migrate_only", db=config.db, schema_version=store.schema_version,
             applied=store.migrated)
    return store.migrated


async def run(config: Config, shutdown: anyio.Event, *,
              store_factory: StoreFactory = default_store, clock: Callable[[], str] = now,
              task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run a daemon on `config` until `shutdown` is set (no systemd, no reloads); `clock`
    is what its expiry sweep takes as the time now."""
    await Daemon(config, store_factory=store_factory, clock=clock).run(
        shutdown, task_status=task_status)


def _server_limits(config: Config) -> ServerLimits:
    return ServerLimits(max_request_bytes=config.max_request_bytes,
                        max_connections=config.max_connections,
                        max_inflight=config.max_inflight,
                        max_subscriptions=config.max_subscriptions,
                        max_subscription_buffer=config.max_subscription_buffer,
                        max_batch_requests=config.max_batch_requests,
                        max_reply_buffer=config.max_reply_buffer,
                        max_page_bytes=config.max_page_bytes,
                        request_timeout_s=config.request_timeout_s,
                        max_reply_buffer_total=config.max_reply_buffer_total
                        or default_budget())


def redaction_settings(config: Config) -> dict[str, Setting]:
    """The config's redaction, per namespace pattern, as the redactor takes it."""
    return {ns: Setting(r.enabled, dict(r.patterns)) for ns, r in config.redact.items()}


def _service_limits(config: Config) -> Limits:
    return Limits(max_message_bytes=config.max_message_bytes,
                  max_event_bytes=config.max_event_bytes,
                  max_checkpoint_bytes=config.max_checkpoint_bytes,
                  max_fork_depth=config.max_fork_depth,
                  default_ttl_s=dict(config.default_ttl_s),
                  search_max_terms=config.search_max_terms,
                  search_max_prefixes=config.search_max_prefixes,
                  search_max_prefix_matches=config.search_max_prefix_matches,
                  search_max_steps=config.search_max_steps,
                  search_timeout_s=config.search_timeout_s)


def _raise_fd_limit(max_connections: int) -> None:
    """Raise the soft descriptor limit toward what max_connections needs (never past hard).

    A hardened unit cannot raise the hard limit; LimitNOFILE= must. When even the hard
    limit is short, say so once: connections past it wait in the accept queue.
    """
    want = max_connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(hard, want)
        try:
            if target > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
        except OSError:  # a seccomp filter may forbid setrlimit: LimitNOFILE= decides
            pass
        if soft < want:
            log.warning("daemon.fd_limit_low", limit=soft, max_connections=max_connections,
                        needed=want, hint="raise LimitNOFILE= (systemd) or ulimit -n")


async def _keep_cpu() -> None:
    """`cpu_affinity = "auto"`: look at the CPUs' load every ~10 s (cpu.py)."""
    while True:
        await anyio.sleep(PIN.next_look_s())
        try:
            PIN.look()
        except OSError as exc:  # /proc unreadable, a CPU taken away: stay where we are
            log.warning("daemon.cpu_look_failed", error=str(exc))


async def _retention(maintenance: Maintenance, config: Config) -> None:
    """Delete ended sessions idle for cleanup_older_than_days, every cleanup_every_s."""
    params = SessionCleanupParams(older_than_days=config.cleanup_older_than_days)
    meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())
    while True:
        try:
            await maintenance.session_cleanup(params, meta)
        except SessiondError as exc:  # say so, and try again next time
            log.warning("retention.failed", error=exc.message)
        await anyio.sleep(config.cleanup_every_s)


async def _trims(retention: Retention, config: Config) -> None:
    """Trim the history behind compactions in the namespaces of trim_after_days, every
    cleanup_every_s."""
    meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())
    while True:
        try:
            trimmed = await retention.sweep(meta)
            if trimmed:
                log.info("retention.trimmed", sessions=trimmed)
        except SessiondError as exc:  # say so, and try again next time
            log.warning("retention.trim_failed", error=exc.message)
        await anyio.sleep(config.cleanup_every_s)


def _unlink_socket(path: str, bound: os.stat_result) -> None:
    """Remove our socket file, never one that another daemon has put at the path since."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):
        os.unlink(path)
