"""The SQLite store: the embedded default (one file, one daemon)."""

from .store import SqliteStore

__all__ = ["SqliteStore"]
