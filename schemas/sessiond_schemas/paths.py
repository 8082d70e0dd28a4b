"""Where the socket is by default: the contract's order of precedence (daemon and client);
the files beside it, and their one writer (`write_private`): the HTTP face's token files,
which the daemon (at each start) and `sessionctl http-token --rotate` write, and its
bound addresses."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Mapping

TOKEN_BYTES = 32  # an HTTP bearer token: 256 bits, as URL-safe base64 (43 characters)


def default_socket(env: Mapping[str, str] = os.environ) -> str:
    """Return the socket path used when no flag names one."""
    if env.get("SESSIOND_SOCKET"):
        return env["SESSIOND_SOCKET"]
    if env.get("RUNTIME_DIRECTORY"):
        return os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], "sessiond.sock")
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "sessiond", "sessiond.sock")
    return f"/tmp/sessiond-{os.getuid()}/sessiond.sock"


def beside_socket(socket_path: str, suffix: str) -> str:
    """A file of this socket's daemon, in the socket's directory and named after it: the
    socket's name without `.sock`, then `.suffix` (`sessiond.sock` -> `sessiond.http-token`,
    the name these files have always had). So two daemons whose sockets share a directory
    each have their own (`a.sock` -> `a.http-token`, `b.sock` -> `b.http-token`)."""
    path = os.path.abspath(socket_path)
    stem = os.path.basename(path).removesuffix(".sock") or "sessiond"
    return os.path.join(os.path.dirname(path), f"{stem}.{suffix}")


def older_names(path: str) -> list[str]:
    """`path` (a file `beside_socket`), then the name every socket's file had before they
    were named after their socket (`sessiond.http-token`, ...), if that is another: what a
    reader falls back to for a daemon of an earlier release on a socket of another name."""
    folder, name = os.path.split(path)
    old = os.path.join(folder, "sessiond." + name.rpartition(".")[2])
    return [path] if old == path else [path, old]


def http_token_path(socket_path: str, *, peer: bool = False) -> str:
    """The HTTP face's bearer token file (the peer token's with `peer`): beside the socket,
    named after it (`beside_socket`)."""
    return beside_socket(socket_path, "http-peer-token" if peer else "http-token")


def write_private(path: str, data: bytes) -> None:
    """Put `data` at `path`, 0600, synced and replaced atomically: a reader sees the old
    file or the new one, whole (the files beside the socket: tokens, bound addresses).
    The directory is synced after the move (where the filesystem can), so that once this
    returns a power loss does not bring the old file back (a rotated-away token)."""
    # A name no other write uses: one left by a crash never refuses a later one (O_EXCL;
    # a pid-named file would, at the next start with that pid: a container's pid 1).
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:  # a short write writes the rest
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own error is the one to raise
            os.unlink(tmp)
        raise
    directory = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    except OSError as exc:
        # Some filesystems sync no directory (as PostgreSQL's fsync_fname finds); the file
        # is in place by now, so that is no failure of the write.
        if exc.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(directory)


def write_http_token(path: str) -> str:
    """Write a new bearer token to `path` (`write_private`); return it."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    write_private(path, token.encode() + b"\n")
    return token


def http_listen_path(socket_path: str) -> str:
    """Where the daemon writes the HTTP face's bound addresses (a JSON list): beside the
    socket and named after it (`beside_socket`), so `sessionctl web` builds the URL of
    its own daemon's page."""
    return beside_socket(socket_path, "http-listen")


def mcp_socket_path(socket_path: str) -> str:
    """The MCP socket (docs/mcp.md), `beside_socket` (`sessiond.sock` ->
    `sessiond.mcp.sock`), so daemons sharing a directory keep their own; `sessionctl mcp`
    relays to it."""
    return beside_socket(socket_path, "mcp.sock")
