"""Database URLs: which store a `db` setting names, and the password of a PostgreSQL one.

The password never travels on the command line (where `ps` shows it) nor in the URL:
it is read from the file `db_password_file` names, else from systemd's credential
`sessiond-db-password` (`LoadCredential=sessiond-db-password:/path` puts it in
$CREDENTIALS_DIRECTORY), else there is none (trust, peer or certificate auth, or
libpq's ~/.pgpass, which asyncpg reads too).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from urllib.parse import urlsplit

CREDENTIAL: str = "sessiond-db-password"
SCHEMES = ("postgresql://", "postgres://")


class DsnError(ValueError):
    """A PostgreSQL URL or its password cannot be used; the message says why."""


def is_postgres(db: str | None) -> bool:
    """Whether a `db` setting names a PostgreSQL database (else it is a SQLite path)."""
    return db is not None and db.startswith(SCHEMES)


def check_url(url: str) -> None:
    """Refuse a URL that carries a password or has no database name."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise DsnError(f"db: not a PostgreSQL URL: {exc}") from exc
    if parts.password is not None:
        raise DsnError(
            "db: the PostgreSQL URL holds a password; anyone who can list processes or"
            " read the config would see it. Put it in a file named by db_password_file,"
            f" or in the systemd credential {CREDENTIAL} (LoadCredential=), and drop it"
            " from the URL")
    if not parts.path.strip("/"):
        raise DsnError(f"db: the PostgreSQL URL names no database: {redact(url)}")


def redact(url: str) -> str:
    """The URL as logs may show it (a password, if any, replaced)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


def password(password_file: str | None, env: Mapping[str, str] = os.environ) -> str | None:
    """The password: from `password_file`, else the systemd credential, else None.
    One trailing newline is dropped (editors and `echo` add it)."""
    path = password_file
    if path is None and env.get("CREDENTIALS_DIRECTORY"):
        candidate = os.path.join(env["CREDENTIALS_DIRECTORY"], CREDENTIAL)
        path = candidate if os.path.exists(candidate) else None
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise DsnError(f"cannot read the database password from {path}: {exc}") from exc
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise DsnError(f"the database password file {path} is empty")
    return text
