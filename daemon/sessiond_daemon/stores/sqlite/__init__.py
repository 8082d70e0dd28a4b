"""The SQLite store: the embedded default (one file, one daemon)."""

from sessiond_daemon.stores.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
