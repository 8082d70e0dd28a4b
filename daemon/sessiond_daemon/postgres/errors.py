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


def storage_error(exc: BaseException) -> StorageError:
    """A driver error as the contract's -32012. A lost connection may have lost the reply
    to a COMMIT the server made: the error says so, and that a retry under the same
    idempotency key is safe (the versions checked in the database catch the rest)."""
    if _timed_out(exc):
        return StorageError(
            f"storage error: the database did not finish the statement within its"
            f" statement_timeout (setting db_statement_timeout_s; {exc}); nothing was"
            " written and nothing acknowledged: retry it (with an idempotency key a retry"
            " never appends twice)",
            {"detail": str(exc), "retryable": True, "setting": "db_statement_timeout_s"})
    retryable = isinstance(exc, RETRYABLE)
    message = (f"storage error: the database connection failed ({exc}); the write was not"
               " acknowledged: retry it (with an idempotency key a retry never appends"
               " twice)" if retryable else f"storage error: {exc}; nothing was written")
    return StorageError(message, {"detail": str(exc), "retryable": retryable})
