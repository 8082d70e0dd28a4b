"""The daemon's whole life in one function: open db, writer, serve, wait, drain, close."""

from __future__ import annotations

import errno
import os
import socket
import stat

import anyio
import structlog
from anyio.abc import SocketListener, TaskStatus
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EventMeta
from sessiond_schemas.rpc import SessionCleanupParams

from .config import Config
from .maintenance import Maintenance
from .server import Server, ServerLimits
from .service import Limits, Service
from .store import SqliteStore
from .writer import Writer

log = structlog.get_logger("sessiond.lifecycle")


class AlreadyRunning(Exception):
    """Another live daemon answers on the socket path."""


async def bind_socket(path: str, mode: int) -> SocketListener:
    """Listen on `path`: replace a stale socket file, refuse a live one or a non-socket."""
    if len(os.fsencode(path)) > 107:
        raise OSError(errno.ENAMETOOLONG, f"socket path is longer than 107 bytes: {path}")
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, mode=0o700, exist_ok=True)
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


async def run(config: Config, shutdown: anyio.Event, *,
              task_status: TaskStatus[str] = anyio.TASK_STATUS_IGNORED) -> None:
    """Run a daemon until `shutdown` is set; `task_status.started` gets the socket path."""
    assert config.socket and config.db
    # 1. The database: open, WAL, migrations.
    store = SqliteStore(config.db, config.durability, max_bytes=config.max_db_bytes)
    await store.open()
    try:
        writer = Writer(store, max_queue=config.max_queue, max_batch=config.max_batch,
                        cache_size=config.view_cache_size, snapshot_every=config.snapshot_every)
        async with anyio.create_task_group() as core:
            # 2. The writer: the only task that writes.
            await core.start(writer.run)
            try:
                await _serve(config, store, writer, shutdown, task_status)
            finally:
                # 5. Flush: the writer commits what is queued, then returns.
                writer.close()
    finally:
        with anyio.CancelScope(shield=True):
            await store.close()
        log.info("daemon.stopped")


async def _serve(config: Config, store: SqliteStore, writer: Writer, shutdown: anyio.Event,
                 task_status: TaskStatus[str]) -> None:
    service = Service(store, writer, Limits(
        max_message_bytes=config.max_message_bytes,
        max_event_bytes=config.max_event_bytes,
        max_checkpoint_bytes=config.max_checkpoint_bytes))
    server = Server(
        service,
        ServerLimits(max_request_bytes=config.max_request_bytes,
                     max_connections=config.max_connections,
                     max_inflight=config.max_inflight,
                     max_subscriptions=config.max_subscriptions,
                     max_subscription_buffer=config.max_subscription_buffer),
        allowed_uids=frozenset(config.allowed_uids),
        allowed_gids=frozenset(config.allowed_gids))
    assert config.socket
    # 3. Serve.
    listener = await bind_socket(config.socket, config.socket_mode)
    bound = os.lstat(config.socket)
    try:
        async with anyio.create_task_group() as serving:
            await serving.start(server.serve, listener)
            if config.cleanup_older_than_days > 0:
                serving.start_soon(_retention, service, config)
            log.info("daemon.ready", socket=config.socket, db=config.db,
                     durability=config.durability, pid=os.getpid())
            task_status.started(config.socket)
            await shutdown.wait()
            # 4. Drain: refuse new requests, let in-flight ones finish.
            log.info("daemon.stopping", inflight=server.inflight)
            server.draining = True
            with anyio.move_on_after(config.drain_timeout_s):
                await server.wait_idle()
            serving.cancel_scope.cancel()
    finally:
        with anyio.CancelScope(shield=True):
            await listener.aclose()
            _unlink_socket(config.socket, bound)


async def _retention(service: Service, config: Config) -> None:
    """Delete ended sessions idle for cleanup_older_than_days, every cleanup_every_s."""
    params = SessionCleanupParams(older_than_days=config.cleanup_older_than_days)
    meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())
    maintenance = Maintenance(service)
    while True:
        try:
            await maintenance.session_cleanup(params, meta)
        except SessiondError as exc:  # say so, and try again next time
            log.warning("retention.failed", error=exc.message)
        await anyio.sleep(config.cleanup_every_s)


def _unlink_socket(path: str, bound: os.stat_result) -> None:
    """Remove our socket file, never one that another daemon has put at the path since."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (bound.st_dev, bound.st_ino):
        os.unlink(path)
