"""Shared fixtures: a real daemon on a temporary socket and database, and clients for it.

The daemon fixtures run on both stores: a test that asks for `daemon`, `client` or
`db_url` (or `store_kind` itself) runs once on a SQLite file (`[sqlite]`) and once on a
PostgreSQL database (`[postgresql]`, marked `postgresql`; tests/pg.py says where the
server is). `@pytest.mark.sqlite_only("why")` keeps a test (or module) on SQLite alone,
for what only a SQLite file has; `@pytest.mark.slow_on_postgresql` marks a long test's
PostgreSQL variant `fleet`: off the default run, in .ci/run's second one (`-m fleet`).
The longest suites are marked `fleet` whole, on both stores; the default run spreads the
rest over the CPUs (`-n auto`, pytest-xdist): it stays under 5 minutes.
"""

from __future__ import annotations

import functools
import inspect
import os
import pwd
import shutil
import sqlite3
import subprocess
import tempfile
import time
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import pg
import pytest
import structlog

from sessiond import AsyncClient, Client, DaemonUnavailableError
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.config import Config, load
from sessiond_daemon.stores.postgres import dsn

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # aiosqlite runs on asyncio only


@pytest.fixture
def short_dir() -> Iterator[str]:
    """A temporary directory with a short path (AF_UNIX paths stop at 108 bytes)."""
    with tempfile.TemporaryDirectory(prefix="sd-") as path:
        yield path


@dataclass
class Daemon:
    config: Config
    shutdown: anyio.Event

    @property
    def socket(self) -> str:
        assert self.config.socket
        return self.config.socket

    @property
    def db(self) -> str:
        assert self.config.db
        return self.config.db

    def sql(self, query: str, *args: Any) -> list[Any]:
        """Read the database directly, behind the daemon's back (a SQLite file, or the
        PostgreSQL database: `?` placeholders either way, rows as tuples)."""
        if dsn.is_postgres(self.db):
            return pg.query(self.db, query, *args)
        con = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        try:
            return con.execute(query, args).fetchall()
        finally:
            con.close()


def daemon_config(directory: str, **overrides: Any) -> Config:
    # Snapshots every 4 versions, so tests exercise folding from one.
    values = {"socket": os.path.join(directory, "s.sock"),
              "db": os.path.join(directory, "sessiond.db"), "log_level": "warning",
              "snapshot_every": 4}
    values.update(overrides)
    return load(None, values, env={})


@asynccontextmanager
async def running_daemon(config: Config, store_factory: lifecycle.StoreFactory
                         = lifecycle.default_store,
                         clock: Callable[[], str] | None = None) -> AsyncIterator[Daemon]:
    """Run a daemon on `config` for the block; it stops (and drains) when the block ends.
    `store_factory` builds its store (tests pass one that fails on cue); `clock`, the time
    its expiry sweep takes as now (tests drive it), by default the real one."""
    shutdown = anyio.Event()
    extra: dict[str, Any] = {} if clock is None else {"clock": clock}
    async with anyio.create_task_group() as tg:
        await tg.start(functools.partial(lifecycle.run, store_factory=store_factory, **extra),
                       config, shutdown)
        yield Daemon(config, shutdown)
        shutdown.set()


STORES = ("sqlite", "postgresql")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker a CPU this process may run on, 4 at most. Each worker runs its
    own daemons, and each daemon on PostgreSQL holds connections of its own (the server's
    max_connections is 100 by default)."""
    return max(1, min(4, len(os.sched_getaffinity(0))))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each test that needs a `store_kind` on both stores, but those marked
    sqlite_only."""
    if "store_kind" not in metafunc.fixturenames:
        return
    only = metafunc.definition.get_closest_marker("sqlite_only")
    if only is not None and not (only.args or only.kwargs.get("reason")):
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: sqlite_only needs a reason")
    params = [pytest.param("sqlite", id="sqlite")]
    if only is None:
        marks = [pytest.mark.postgresql]
        if metafunc.definition.get_closest_marker("slow_on_postgresql") is not None:
            marks.append(pytest.mark.fleet)
        params.append(pytest.param("postgresql", id="postgresql", marks=marks))
    metafunc.parametrize("store_kind", params, indirect=True)


@pytest.fixture
def store_kind(request: pytest.FixtureRequest) -> str:
    """Which store this run of the test uses: "sqlite" or "postgresql"."""
    return str(request.param)


@pytest.fixture(scope="module")
def pg_module_database() -> Iterator[str]:
    """One PostgreSQL database for the module's tests on that store (each empties it)."""
    yield from pg.database()


@pytest.fixture
def db_url(store_kind: str, short_dir: str, request: pytest.FixtureRequest) -> str:
    """The `db` setting of this test's daemon: a SQLite file in `short_dir`, or an empty
    PostgreSQL database (the module's, emptied for this test)."""
    if store_kind == "postgresql":
        url: str = request.getfixturevalue("pg_module_database")
        pg.empty(url)
        return url
    return os.path.join(short_dir, "sessiond.db")


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    """Override in a test module to start the daemon with other settings."""
    return {}


@pytest.fixture
def daemon_clock() -> Callable[[], str] | None:
    """Override in a test module to drive the daemon's expiry sweep with its own clock."""
    return None


@pytest.fixture
async def daemon(short_dir: str, db_url: str, daemon_overrides: dict[str, Any],
                 daemon_clock: Callable[[], str] | None) -> AsyncIterator[Daemon]:
    """A real daemon in this process, ready when the fixture yields, on this run's store."""
    config = daemon_config(short_dir, **{"db": db_url, **daemon_overrides})
    async with running_daemon(config, clock=daemon_clock) as d:
        yield d


@pytest.fixture
async def client(daemon: Daemon) -> AsyncIterator[AsyncClient]:
    async with AsyncClient(daemon.socket) as c:
        yield c


# How often a condition is polled (pacing, not a guess at how long anything takes), and how
# long before a wait fails: a guard against hanging, never a bound under test.
POLL_S = 0.02
PATIENCE_S = 60


def wait_until(ready: Callable[[], Any], what: str) -> Any:
    """Poll `ready` until it returns something true, and return that; fail (not flake),
    naming `what`, after a generous while."""
    deadline = time.monotonic() + PATIENCE_S
    while not (value := ready()):
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(POLL_S)
    return value


async def eventually(ready: Callable[[], Any], what: str,
                     patience: float = PATIENCE_S) -> Any:
    """`wait_until` for async tests: the event loop runs meanwhile, and `ready` may be a
    coroutine function (its result is awaited)."""
    deadline = anyio.current_time() + patience
    while True:
        value = ready()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if anyio.current_time() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await anyio.sleep(POLL_S)


def wait_for_daemon(sock: str, proc: subprocess.Popen[bytes]) -> None:
    """Wait until the daemon process `proc` answers ping on `sock` (failing if it exits)."""
    def answered() -> bool | None:
        assert proc.poll() is None, f"the daemon exited {proc.returncode}"
        try:
            with Client(sock, timeout=10) as client:
                client.ping()
            return True
        except DaemonUnavailableError:
            return None

    wait_until(answered, f"a daemon on {sock}")


def as_user(user: pwd.struct_passwd, job: Callable[[], bytes]) -> bytes:
    """Run `job` in a forked child that has become `user` (its groups dropped); return the
    bytes it returned. A real other uid, where the interpreter itself may be out of reach."""
    rfd, wfd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads: 3.12+
        pid = os.fork()
    if pid == 0:  # the child
        try:
            os.close(rfd)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            with os.fdopen(wfd, "wb") as out:
                out.write(job())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as answer:
        data = answer.read()
    os.waitpid(pid, 0)
    return data


# --- terminals: tmux drives a program on a screen of a set size ----------------------

TMUX_WAIT_S = 60  # generous: a wait ends as soon as the screen shows what it waits for


class Tmux:
    """A tmux server of the test's own: `run` its commands, read a window's `screen`,
    type `keys`, `wait` until the screen shows something."""

    def __init__(self, directory: str) -> None:
        self.base = ["tmux", "-S", os.path.join(directory, "tmux.sock")]

    async def run(self, *args: str) -> str:
        done = await anyio.run_process([*self.base, *args], check=True)
        return done.stdout.decode()

    async def screen(self, window: str = "top") -> str:
        return await self.run("capture-pane", "-p", "-t", window)

    async def keys(self, *keys: str, window: str = "top") -> None:
        await self.run("send-keys", "-t", window, *keys)

    async def wait(self, what: str, ok: Callable[[str], bool], window: str = "top") -> str:
        screen = ""
        with anyio.move_on_after(TMUX_WAIT_S):
            while True:
                screen = await self.screen(window)
                if ok(screen):
                    return screen
                await anyio.sleep(0.1)
        raise AssertionError(f"the screen never showed {what}:\n{screen}")


@pytest.fixture
async def tmux(short_dir: str) -> AsyncIterator[Tmux]:
    if shutil.which("tmux") is None:
        if os.environ.get("SESSIOND_REQUIRE_TMUX"):
            pytest.fail("tmux is missing and SESSIOND_REQUIRE_TMUX is set")
        pytest.skip("tmux is not installed")
    t = Tmux(short_dir)
    yield t
    with anyio.CancelScope(shield=True):
        await anyio.run_process([*t.base, "kill-server"], check=False)
