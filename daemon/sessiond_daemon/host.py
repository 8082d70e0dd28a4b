"""Safety on a shared host: private directories and files, one daemon per database, and
listeners that outlive running out of descriptors."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Awaitable, Callable

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream

log = structlog.get_logger("sessiond.host")

ACCEPT_BACKOFF_S = 0.1
# accept() failures that pass: out of descriptors or memory, or a client that gave up.
TRANSIENT_ACCEPT = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                              errno.ECONNABORTED, errno.EPROTO, errno.EPERM})


class UnsafePathError(Exception):
    """A directory the daemon would use is controlled by another user (exit 78)."""


class DatabaseInUse(Exception):
    """Another daemon holds the database's lock (exit 75)."""


def make_private_dirs(path: str) -> None:
    """Create `path` and any missing parents, each 0700 whatever the umask."""
    missing = []
    current = os.path.abspath(path)
    while not os.path.exists(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            continue  # someone made it meanwhile: check_private_dir judges it
        os.chmod(directory, 0o700)


def create_private_file(path: str) -> None:
    """Create `path` empty with mode 0600 if it does not exist; never touch an existing one."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def check_private_dir(path: str, what: str) -> None:
    """Refuse a directory that another user owns or that group or others can write.

    Such a user could put their own socket or database in our place. The directory
    may be root's (root is trusted anyway) and may be readable by others, so that a
    socket shared on purpose (socket_mode 0660 with allowed_gids) stays reachable.
    """
    uid = os.geteuid()
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (uid, 0):
        raise UnsafePathError(
            f"the {what} directory {path} is a symlink of uid {link.st_uid}, who could point it"
            f" elsewhere at any time. Fix: remove it if it is not yours, or choose another"
            f" directory")
    st = os.stat(path)  # through our own symlinks: what counts is the directory reached
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafePathError(f"the {what} directory {path} is not a directory")
    if st.st_uid not in (uid, 0):
        raise UnsafePathError(
            f"the {what} directory {path} belongs to uid {st.st_uid}, not to this daemon's"
            f" uid {uid}: another user could answer in sessiond's place. Fix: remove it if it"
            f" is not yours, or choose another directory (--socket/--db, or XDG_RUNTIME_DIR)")
    if st.st_mode & 0o022:
        raise UnsafePathError(
            f"the {what} directory {path} is writable by group or others"
            f" (mode {stat.S_IMODE(st.st_mode):04o}): another user could replace what sessiond"
            f" keeps there. Fix: chmod go-w {path} (0700, or 0750/0755 to share the socket"
            f" with a group), or choose another directory")


def private_dir(path: str, what: str) -> None:
    """Create `path` (0700) if missing, then check that it is ours alone to write."""
    make_private_dirs(path)
    check_private_dir(path, what)


class DatabaseLock:
    """An exclusive flock on `<db>.lock`, held for the daemon's life, with its pid inside.

    The file is never removed: removing it would let a third daemon lock a new file
    while a second still waits on the old one.
    """

    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path = db_path + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise DatabaseInUse naming the pid that holds it."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            if exc.errno == errno.EROFS:
                return  # nobody can write there: opening the database says so
            raise OSError(exc.errno, f"cannot create the lock file {self.path}: {exc.strerror}"
                          " (it sits beside the database)") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise DatabaseInUse(
                f"database {self.db_path} is in use by another sessiond (pid {holder}, lock"
                f" {self.path}); one database is served by one daemon. Stop that one, or"
                f" give this one another --db") from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Let go of the lock (closing the file does it)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


async def accept_forever(listener: SocketListener,
                         handle: Callable[[SocketStream], Awaitable[None]], *,
                         what: str, slots: anyio.Semaphore | None = None) -> None:
    """Accept connections and run `handle` on each in a task of its own, until cancelled.

    Running out of descriptors (or memory) never ends it: the client waits in the
    kernel's accept queue while this backs off, with one log line per episode. With
    `slots`, at most that many connections are served at once; the rest wait to be
    accepted, so a flood of connections costs no descriptors.
    """
    async def run(stream: SocketStream) -> None:
        try:
            await handle(stream)
        finally:
            if slots is not None:
                slots.release()

    failures = 0
    async with anyio.create_task_group() as tg:
        while True:
            if slots is not None:
                await slots.acquire()
            try:
                stream = await listener.accept()
            except (OSError, anyio.BrokenResourceError) as exc:
                if slots is not None:
                    slots.release()
                # anyio reports a failed accept() as BrokenResourceError from the OSError.
                cause = exc if isinstance(exc, OSError) else exc.__cause__
                if not isinstance(cause, OSError) or cause.errno not in TRANSIENT_ACCEPT:
                    raise
                if failures == 0:
                    log.warning(f"{what}.accept_failing", error=str(cause),
                                hint="out of file descriptors? raise LimitNOFILE= "
                                     "or lower max_connections")
                failures += 1
                await anyio.sleep(ACCEPT_BACKOFF_S)
                continue
            if failures:
                log.warning(f"{what}.accept_resumed", failed_attempts=failures)
                failures = 0
            tg.start_soon(run, stream)
