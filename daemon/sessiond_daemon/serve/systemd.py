"""systemd glue without libsystemd: sd_notify datagrams and socket activation (LISTEN_FDS)."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, MutableMapping

import structlog

log = structlog.get_logger("sessiond.systemd")

SD_LISTEN_FDS_START = 3
FD_NAME = "sessiond"  # FileDescriptorName= in our socket units


class ActivationError(Exception):
    """systemd passed descriptors the daemon cannot serve on."""


class Notifier:
    """Sends sd_notify messages to systemd; does nothing when not started by systemd.

    The address comes from $NOTIFY_SOCKET: a path, or an abstract name starting with `@`.
    The variables are removed from the environment once read, so processes the daemon
    starts do not talk to systemd in its name.
    """

    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address: str | None = None
        if address and address.startswith(("/", "@")):
            self.address = "\0" + address[1:] if address.startswith("@") else address
        elif address:
            log.warning("systemd.notify_socket_ignored", address=address,
                        reason="neither an absolute path nor an abstract name")
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None

    @classmethod
    def from_environment(cls, env: MutableMapping[str, str] = os.environ) -> Notifier:
        address = env.pop("NOTIFY_SOCKET", None)
        usec, pid = env.pop("WATCHDOG_USEC", None), env.pop("WATCHDOG_PID", None)
        watchdog_usec = None
        if usec and (not pid or pid == str(os.getpid())):
            try:
                watchdog_usec = int(usec) if int(usec) > 0 else None
            except ValueError:
                log.warning("systemd.watchdog_usec_ignored", value=usec)
        return cls(address, watchdog_usec)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between WATCHDOG=1 pings: half of systemd's timeout, as
        sd_watchdog_enabled(3) advises."""
        return self.watchdog_usec / 2e6 if self.watchdog_usec else None

    def notify(self, *assignments: str) -> bool:
        """Send `KEY=value` lines in one datagram; return whether systemd got them."""
        if self.address is None:
            return False
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        try:
            self._sock.sendto("\n".join(assignments).encode(), self.address)
        except OSError as exc:  # systemd went away or the socket is full: not our failure
            log.debug("systemd.notify_failed", error=str(exc))
            return False
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class Watchdog:
    """When to send WATCHDOG=1: every `interval` seconds while the writer moves, and none
    while it has been stuck on one batch for systemd's whole timeout (twice the interval),
    so that systemd restarts a daemon that can no longer write.

    `clock` is monotonic seconds; tests pass their own to drive time.
    """

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self.stuck = False
        self._next_ping = -math.inf

    def beat(self, stalled: float) -> bool:
        """Take the writer's current stall (seconds on one batch); return whether to ping now."""
        self.stuck = stalled >= 2 * self.interval
        now = self.clock()
        if self.stuck or now < self._next_ping:
            return False
        self._next_ping = now + self.interval
        return True


def inherited_listener(env: MutableMapping[str, str] = os.environ) -> socket.socket | None:
    """Return the listening Unix socket systemd passed us, or None if it passed none.

    Follows sd_listen_fds(3): the descriptors start at 3 and are ours only if
    $LISTEN_PID is our pid. With several, the one named `sessiond` in $LISTEN_FDNAMES is
    taken, else the first; the others are closed. The variables are removed once read.
    """
    pid, count = env.pop("LISTEN_PID", None), env.pop("LISTEN_FDS", None)
    names = env.pop("LISTEN_FDNAMES", "").split(":")
    if not count or pid != str(os.getpid()):
        return None
    try:
        fds = list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)))
    except ValueError:
        raise ActivationError(f"LISTEN_FDS is not a number: {count!r}") from None
    if not fds:
        return None
    chosen = fds[names.index(FD_NAME)] if FD_NAME in names[:len(fds)] else fds[0]
    for fd in fds:
        if fd != chosen:
            log.warning("systemd.extra_fd_closed", fd=fd)
            os.close(fd)
    refusal = ActivationError(f"descriptor {chosen} from systemd is not a listening Unix "
                              "stream socket (use ListenStream= with a path)")
    try:
        os.set_inheritable(chosen, False)
        sock = socket.socket(fileno=chosen)
    except OSError:  # not a socket at all
        raise refusal from None
    listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM or not listening:
        sock.close()
        raise refusal
    return sock
