"""One store registry: which store a `db` setting names, what it needs before it opens,
and the store itself.

Every place that chooses a store asks here: the daemon (serve/lifecycle.py), `sessiond
migrate` (serve/migrate.py), the config check (serve/config.py) and the tests. Nothing
outside this module and the store packages checks which engine it has: callers ask what
a store can do, `kind_of(url)` before it is opened (`needs_file_lock`), `store.capabilities` after
(`shared_log`, `full_text`, `integrity`, `backup`, `size`, ...). tests/test_layering.py
holds the rest of the daemon to that.

To add a store: one `Engine` in `ENGINES` (which URLs it claims, what it needs, how it is
made); its package implements `stores.interface.Store` and answers `capabilities`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sessiond_daemon.stores.interface import Store


class StoreUrlError(ValueError):
    """A `db` setting (or what it needs: a password) cannot be used; the message says why."""


@dataclass(frozen=True, slots=True)
class Options:
    """What a store is made with besides its URL (from the daemon's config, or migrate's
    flags); each store takes what applies to it."""

    durability: str = "full"  # "full": every commit on disk before it is acknowledged
    max_bytes: int = 0  # a file store's cap (max_db_bytes); 0: none
    password_file: str | None = None  # a server's password (else the systemd credential)
    host_name: str | None = None  # this daemon's name in a shared store (None: unknown)
    statement_timeout_s: float = 30.0  # a server's statement_timeout (0: none)
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)


@dataclass(frozen=True, slots=True)
class Engine:
    """One kind of store, as the registry knows it before anything is opened."""

    name: str  # for messages and logs only: never compared by callers
    claims: Callable[[str], bool]  # whether a `db` setting names this kind of store
    # One daemon per database, by a lock file beside it (serve/lifecycle.py, serve/migrate.py), in a
    # directory made private; a store shared by several daemons needs none.
    needs_file_lock: bool
    check: Callable[[str, Options], None]  # raises StoreUrlError: a URL that cannot work
    exists: Callable[[str], bool]  # whether there is a database to read (migrate's source)
    make: Callable[[str, Options], Store]  # the store, not opened yet


def _is_postgres(url: str) -> bool:
    from sessiond_daemon.stores.postgres import dsn

    return dsn.is_postgres(url)


def _check_postgres(url: str, options: Options) -> None:
    from sessiond_daemon.stores.postgres import dsn

    try:
        dsn.check_url(url)
        dsn.password(options.password_file, options.env)  # readable now, not at connect
    except dsn.DsnError as exc:
        raise StoreUrlError(str(exc)) from exc


def _make_postgres(url: str, options: Options) -> Store:
    from sessiond_daemon.stores.postgres import dsn
    from sessiond_daemon.stores.postgres.store import PostgresStore  # asyncpg: the `fleet` extra

    try:
        password = dsn.password(options.password_file, options.env)
    except dsn.DsnError as exc:
        raise StoreUrlError(str(exc)) from exc
    return PostgresStore(url, password=password, host_name=options.host_name,
                         statement_timeout_s=options.statement_timeout_s)


def _make_sqlite(url: str, options: Options) -> Store:
    from sessiond_daemon.stores.sqlite import SqliteStore

    return SqliteStore(url, options.durability, max_bytes=options.max_bytes)


POSTGRESQL = Engine(name="postgresql", claims=_is_postgres, needs_file_lock=False,
                    check=_check_postgres, exists=lambda url: True,  # asked at open
                    make=_make_postgres)
SQLITE = Engine(name="sqlite", claims=lambda url: True,  # any other setting is a path
                needs_file_lock=True, check=lambda url, options: None,
                exists=os.path.isfile, make=_make_sqlite)
# In the order asked: the first that claims a setting is its store.
ENGINES: tuple[Engine, ...] = (POSTGRESQL, SQLITE)


def kind_of(url: str) -> Engine:
    """The kind of store `url` names."""
    return next(engine for engine in ENGINES if engine.claims(url))


def check(url: str, options: Options | None = None) -> None:
    """Refuse now (StoreUrlError) a setting that could only fail when the store opens."""
    kind_of(url).check(url, options or Options())


def open_store(url: str, options: Options | None = None) -> Store:
    """The store `url` names, made with `options` (not opened yet: `await store.open()`)."""
    return kind_of(url).make(url, options or Options())


__all__ = ["ENGINES", "Engine", "Options", "StoreUrlError", "check", "kind_of", "open_store"]
