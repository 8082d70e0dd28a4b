"""Who an HTTP request comes from: a Unix peer's uid, or the holder of a bearer token.

The tokens are files in the runtime directory (0600, next to the socket), made at start
and read again whenever they change, so `sessionctl http-token --rotate` (which replaces
the file) takes effect at the next request. The owner's token is checked in constant time
(hmac.compare_digest) and grants what the daemon's own uid may call; the peer token
grants what any other allowed user may call (core/access.py); a reload that lets some
peer in no more replaces it (face.py).
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable
from dataclasses import dataclass

from sessiond_daemon.core.access import PEER_UID  # the uid of the peer token's requests
from sessiond_schemas.paths import http_token_path, write_http_token


@dataclass(slots=True)
class _TokenFile:
    path: str
    on_change: Callable[[], None]
    stamp: tuple[int, int, int] = (0, 0, 0)
    token: bytes = b""

    def current(self) -> bytes:
        """The token in the file now (re-read only when the file changed)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size) if st else (0, 0, 0)
        if stamp != self.stamp:
            old = self.token
            if st is None:
                self.token = b""
            else:
                with open(self.path, "rb") as f:
                    self.token = f.read(4096).strip()
            self.stamp = stamp
            if old and self.token != old:
                self.on_change()  # rotated: what the old token opened ends
        return self.token


class Tokens:
    """The owner's token and the peer token of one daemon."""

    def __init__(self, socket_path: str, on_change: Callable[[], None] = lambda: None) -> None:
        self.owner = _TokenFile(http_token_path(socket_path), on_change)
        self.peer = _TokenFile(http_token_path(socket_path, peer=True), on_change)

    def refresh(self) -> None:
        """Read the files again if they changed (a rotation calls on_change)."""
        self.owner.current()
        self.peer.current()

    def create(self) -> None:
        """Make both tokens at start (a new daemon, new tokens)."""
        write_http_token(self.owner.path)
        write_http_token(self.peer.path)

    def rotate_peer(self) -> None:
        """Replace the peer token (a peer's access was revoked: it knew the old one); the
        next request reads the new file, and what the old token opened ends."""
        write_http_token(self.peer.path)
        self.peer.current()

    def uid_of(self, presented: str) -> int | None:
        """The uid a request with this token acts as: ours, PEER_UID, or None (refused)."""
        given = presented.encode()
        owner_ok = _same(given, self.owner.current())
        peer_ok = _same(given, self.peer.current())  # both compared: no early answer
        if owner_ok:
            return os.getuid()
        return PEER_UID if peer_ok else None


def _same(given: bytes, expected: bytes) -> bool:
    return bool(expected) and hmac.compare_digest(given, expected)
