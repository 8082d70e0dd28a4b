"""Driver errors as the contract's: -32012, saying whether the write may be retried."""

from __future__ import annotations

from typing import Final

import asyncpg

from sessiond_schemas.errors import StorageError

# Connection failures: the batch may be retried (under its idempotency keys). A connection
# the server dropped mid-statement can leave asyncpg's protocol state behind
# (InternalClientError "another operation is in progress"): that connection is done too.
RETRYABLE: Final = (OSError, TimeoutError, asyncpg.PostgresConnectionError,
                    asyncpg.InterfaceError, asyncpg.CannotConnectNowError,
                    asyncpg.AdminShutdownError, asyncpg.InternalClientError)


def _timed_out(exc: BaseException) -> bool:
    """A statement the server cancelled at statement_timeout: rolled back, nothing kept."""
    return isinstance(exc, asyncpg.QueryCanceledError)


def _fenced(exc: BaseException) -> bool:
    """A write a newer release's fence refused (postgres/schema.py `fence`)."""
    return (isinstance(exc, asyncpg.CannotConnectNowError)
            and str(getattr(exc, "detail", "") or "").startswith("sessiond fence"))


def storage_error(exc: BaseException, *, read: bool = False) -> StorageError:
    """A driver error as the contract's -32012. A lost connection may have lost the reply
    to a COMMIT the server made: the error says so, and that a retry under the same
    idempotency key is safe (the versions checked in the database catch the rest). A
    failed read says it was a read (the same words as the SQLite store's)."""
    if read:
        retryable = isinstance(exc, RETRYABLE) or _timed_out(exc)
        why = ("the database did not finish the read within its statement_timeout"
               " (setting db_statement_timeout_s; retry it)" if _timed_out(exc) else
               "the database connection failed (retry it)" if retryable else "")
        data = {"detail": str(exc), "retryable": retryable, "read": True}
        if _timed_out(exc):
            data["setting"] = "db_statement_timeout_s"
        return StorageError(f"storage error while reading: {why + ': ' if why else ''}{exc}"
                            " (a read: nothing was changed)", data)
    if _timed_out(exc):
        return StorageError(
            f"storage error: the database did not finish the statement within its"
            f" statement_timeout (setting db_statement_timeout_s; {exc}); nothing was"
            " written and nothing acknowledged: retry it (with an idempotency key a retry"
            " never appends twice)",
            {"detail": str(exc), "retryable": True, "setting": "db_statement_timeout_s"})
    if _fenced(exc):
        return StorageError(
            f"storage error: {exc}; nothing was written: retry it once this host runs the"
            " release that migrated the database",
            {"detail": str(exc), "retryable": True, "fenced": True})
    retryable = isinstance(exc, RETRYABLE)
    message = (f"storage error: the database connection failed ({exc}); the write was not"
               " acknowledged: retry it (with an idempotency key a retry never appends"
               " twice)" if retryable else f"storage error: {exc}; nothing was written")
    return StorageError(message, {"detail": str(exc), "retryable": retryable})
