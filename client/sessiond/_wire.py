"""Reading the daemon's replies and checking who answers: shared by every client, free
of any event loop."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import MethodNotFoundError, SessiondError, error_from_wire


class ConnectionLostError(SessiondError):
    """The connection to the daemon closed before the answer came."""


_response_decoder = msgspec.json.Decoder(rpc.Response)
_batch_decoder = msgspec.json.Decoder(list[rpc.Response])


def decode_replies(line: bytes | bytearray) -> list[rpc.Response]:
    """The answers one line of the daemon's carries (a batch's answers come as an array)."""
    if line[:1] == b"[":
        return _batch_decoder.decode(line)
    return [_response_decoder.decode(line)]


def raise_for(reply: rpc.Response) -> msgspec.Raw:
    """Return a reply's raw result, or raise the error it carries."""
    if isinstance(reply.error, rpc.ErrorObject):
        err = reply.error
        raise error_from_wire(err.code, err.message, err.data if isinstance(err.data, dict) else {})
    if not isinstance(reply.result, msgspec.Raw):
        raise ConnectionLostError("the daemon sent a reply with neither result nor error")
    return reply.result


class DaemonUnavailableError(ConnectionLostError, OSError):
    """No daemon answers at the socket path (missing, refused, or not allowed).

    Also an OSError, so code that caught the bare connect error still catches it.
    """


class UntrustedDaemonError(SessiondError):
    """The process answering on the socket runs as a uid this client does not trust."""


TRUSTED_UIDS_ENV = "SESSIOND_TRUSTED_UIDS"
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def trusted_uids(env: Mapping[str, str] = os.environ) -> frozenset[int]:
    """Uids whose daemon this client talks to: its own, root, and $SESSIOND_TRUSTED_UIDS
    (comma-separated), say the `sessiond` user of a system-wide daemon."""
    uids = {os.geteuid(), 0}
    for part in env.get(TRUSTED_UIDS_ENV, "").split(","):
        if part.strip():
            try:
                uids.add(int(part))
            except ValueError:
                raise UntrustedDaemonError(
                    f"${TRUSTED_UIDS_ENV} must list uids separated by commas, got {part!r}",
                    {"env": TRUSTED_UIDS_ENV}) from None
    return frozenset(uids)


def unavailable(path: str, exc: OSError) -> DaemonUnavailableError:
    """The error for a connect that failed: what was wrong, and where."""
    reason = exc.strerror or str(exc)
    err = DaemonUnavailableError(
        f"no sessiond at {path}: {reason} (is it running? start it with `sessiond`,"
        " or set SESSIOND_SOCKET)", {"socket": path, "detail": reason})
    err.errno = exc.errno
    return err


def check_peer(sock: Any, path: str) -> None:
    """Refuse a socket answered by a process of a uid we do not trust (SO_PEERCRED)."""
    pid, uid, _gid = _PEERCRED.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    trusted = trusted_uids()
    if uid not in trusted:
        raise UntrustedDaemonError(
            f"the process answering on {path} (pid {pid}) runs as uid {uid}, which this"
            f" client does not trust (trusted: {', '.join(map(str, sorted(trusted)))}); it may"
            f" be another user's impostor. If that daemon is meant (a system-wide sessiond),"
            f" add its uid to ${TRUSTED_UIDS_ENV}",
            {"socket": path, "peer_uid": uid, "peer_pid": pid})


def connect_blocking(path: str, timeout: float | None = None) -> socket.socket:
    """Connect to the daemon's socket and check who answers; sessiond errors only."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except OSError as exc:
            raise unavailable(path, exc) from exc
        check_peer(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


def client_version() -> str:
    """This client's release (read only when an error needs it)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sessiond")
    except PackageNotFoundError:
        return "0+unknown"


def _protocol(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split("."))
    except ValueError:
        return (0,)


def skew_error(method: str, path: str, exc: MethodNotFoundError,
               daemon: rpc.PingResult | None) -> MethodNotFoundError:
    """A -32601 told as version skew: which method, and both sides' versions.

    `daemon` is the daemon's ping, asked after the refusal (None if that failed too);
    daemons before protocol 1.1 send neither their protocol nor their methods with it.
    """
    ours = f"sessiond {client_version()} (protocol {rpc.PROTOCOL_VERSION})"
    theirs = (f"sessiond {daemon.version} (protocol {daemon.protocol})" if daemon
              else "a release that did not answer daemon.ping")
    skew = _protocol(daemon.protocol) if daemon else (0,)
    if method not in rpc.METHODS:
        advice = "this client does not know that method either: check its name"
    elif skew < _protocol(rpc.PROTOCOL_VERSION):
        advice = "the daemon is older than this client: upgrade the daemon"
    elif skew > _protocol(rpc.PROTOCOL_VERSION):
        advice = "the daemon is newer than this client: upgrade the client"
    else:
        advice = "both speak the same protocol, yet the daemon does not serve it"
    return MethodNotFoundError(
        f"the daemon at {path} has no method {method!r}: it runs {theirs}, and this client"
        f" is {ours}; {advice}",
        {**exc.data, "method": method, "client_version": client_version(),
         "client_protocol": rpc.PROTOCOL_VERSION,
         "daemon_version": daemon.version if daemon else None,
         "daemon_protocol": daemon.protocol if daemon else None})
