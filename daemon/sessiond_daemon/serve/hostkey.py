"""The host key: 32 random bytes made at first start, kept 0600 beside the database (a
fleet's hosts share one file: `key_file`). It keys the digests of redaction marks, so
two mentions of one secret can be told apart without the secret being guessable."""

from __future__ import annotations

import os
import secrets
import stat

import structlog

from sessiond_daemon.host import UnsafePathError
from sessiond_schemas.paths import write_private

log = structlog.get_logger("sessiond.hostkey")

KEY_BYTES = 32


class KeyFileError(UnsafePathError):
    """The key file is not ours alone, or not a key (exit 78, as an unsafe path)."""


def key_path(db: str, key_file: str | None) -> str | None:
    """Where the key is: `key_file` when set, else beside a SQLite database (`<db>.key`);
    None in fleet mode without `key_file` (a key for this run alone: `host_key`)."""
    if key_file:
        return key_file
    return None if "://" in db else db + ".key"


def host_key(db: str, key_file: str | None) -> bytes:
    """The host's (or fleet's) key. Fleet mode without `key_file` gets a key of this run
    alone, and says so: the fleet's hosts should share one file (docs/security.md)."""
    path = key_path(db, key_file)
    if path is None:
        log.warning("hostkey.ephemeral", reason="fleet mode without key_file: a key for"
                    " this run alone (redaction digests differ between runs and hosts)")
        return secrets.token_bytes(KEY_BYTES)
    return load_or_create(path)


def load_or_create(path: str) -> bytes:
    """The key at `path`, made (0600) when there is none; refused when another user or
    the group or others may read it, or when it is not a key."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        key = secrets.token_bytes(KEY_BYTES)
        write_private(path, key.hex().encode() + b"\n")
        log.info("hostkey.created", path=path)
        return key
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise KeyFileError(f"{path}: the host key must be a file of this user, mode 0600")
        text = os.read(fd, 4 * KEY_BYTES).decode(errors="replace").strip()
    finally:
        os.close(fd)
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) != KEY_BYTES:
        raise KeyFileError(f"{path}: not a host key ({2 * KEY_BYTES} hex digits)")
    return key
