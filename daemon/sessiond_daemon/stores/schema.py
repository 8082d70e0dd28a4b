"""What both stores' schemas share: the tables that hold one session's rows, and how a
migration's statement names the migrating daemon's uid."""

from __future__ import annotations

import os
from typing import Final

from sessiond_daemon.stores.models.tables import SESSION_MODEL_TABLES

# A session's rows that are the log's own (the read models' are tables.py's).
LOG_TABLES: Final = ("events", "idempotency", "snapshots", "sessions")
# Every table holding a session's rows, in the order a delete removes them (the view last).
SESSION_TABLES: Final = (*LOG_TABLES[:-1], *SESSION_MODEL_TABLES, LOG_TABLES[-1])

OWNER_UID: Final = "{owner_uid}"  # in a migration's SQL: the migrating daemon's uid


class SchemaRefused(Exception):
    """The database's schema cannot be served as it is; nothing was changed (exit 78)."""


class SchemaTooNew(SchemaRefused):
    """The database was migrated by a newer sessiond: refused whole, nothing changed."""


def owner_sql(sql: str) -> str:
    """A migration's statement with OWNER_UID filled in (a number: nothing to quote)."""
    return sql.replace(OWNER_UID, str(os.getuid()))
