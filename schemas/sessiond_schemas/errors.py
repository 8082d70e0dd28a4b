"""The contract's error codes, as one exception class per code shared by daemon and client."""

from __future__ import annotations

from typing import Any, ClassVar

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
SESSION_NOT_FOUND = -32001
VERSION_CONFLICT = -32002
INVALID_TRANSITION = -32003
SESSION_EXISTS = -32004
TOO_LARGE = -32005
PERMISSION_DENIED = -32006
IMPORT_FAILED = -32007
OVERLOADED = -32008
CHECKPOINT_NOT_FOUND = -32009
SHUTTING_DOWN = -32010
AMBIGUOUS_ID = -32011
STORAGE_ERROR = -32012
OTHER_HOST = -32013
HISTORY_GONE = -32015  # issue 48: retention trimmed it (410 over HTTP)


class SessiondError(Exception):
    """Base of every error the daemon answers with; `code` and `data` follow the contract."""

    code: ClassVar[int] = INTERNAL_ERROR

    def __init__(self, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data or {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, data={self.data!r})"


# The seed's (cleveragents) base name for session errors.
SessionServiceError = SessiondError


class ParseError(SessiondError):
    code = PARSE_ERROR


class InvalidRequestError(SessiondError):
    code = INVALID_REQUEST


class MethodNotFoundError(SessiondError):
    code = METHOD_NOT_FOUND


class InvalidParamsError(SessiondError):
    code = INVALID_PARAMS


class InternalError(SessiondError):
    code = INTERNAL_ERROR


class SessionNotFoundError(SessiondError):
    code = SESSION_NOT_FOUND


class VersionConflictError(SessiondError):
    code = VERSION_CONFLICT


class InvalidTransitionError(SessiondError):
    code = INVALID_TRANSITION


class SessionExistsError(SessiondError):
    code = SESSION_EXISTS


class TooLargeError(SessiondError):
    code = TOO_LARGE


class PermissionDeniedError(SessiondError):
    code = PERMISSION_DENIED


class SessionImportError(SessiondError):
    code = IMPORT_FAILED


class OverloadedError(SessiondError):
    code = OVERLOADED


class CheckpointNotFoundError(SessiondError):
    code = CHECKPOINT_NOT_FOUND


class ShuttingDownError(SessiondError):
    code = SHUTTING_DOWN


class AmbiguousIdError(SessiondError):
    code = AMBIGUOUS_ID


class StorageError(SessiondError):
    code = STORAGE_ERROR


class OtherHostError(SessiondError):
    """The session's executor belongs to another host's daemon (fleet mode); `data.host`
    names it: inject or kill it through that host."""

    code = OTHER_HOST


class HistoryGoneError(SessiondError):
    """The history asked for was trimmed by retention behind a compaction: `data` has
    `session_id`, `starts_at` (the first version kept) and `anchor` (the hash the kept
    chain goes on from). 410 over HTTP."""

    code = HISTORY_GONE


class SessionExportError(SessiondError, OSError):
    """The clients' `export_session_to(id, out)` could not write the export document to
    `out` (disk full, a closed pipe): raised client-side, never sent by a daemon (whose
    export errors have their codes: -32001, -32602 for a stale cursor, -32012). An OSError
    too, so code that caught the write error still catches it. The seed's name."""

    code = INTERNAL_ERROR


ERRORS_BY_CODE: dict[int, type[SessiondError]] = {
    cls.code: cls
    for cls in (
        ParseError,
        InvalidRequestError,
        MethodNotFoundError,
        InvalidParamsError,
        InternalError,
        SessionNotFoundError,
        VersionConflictError,
        InvalidTransitionError,
        SessionExistsError,
        TooLargeError,
        PermissionDeniedError,
        SessionImportError,
        OverloadedError,
        CheckpointNotFoundError,
        ShuttingDownError,
        AmbiguousIdError,
        StorageError,
        OtherHostError,
        HistoryGoneError,
    )
}


def error_from_wire(code: int, message: str, data: Any) -> SessiondError:
    """Rebuild the exception a daemon's error object stands for."""
    cls = ERRORS_BY_CODE.get(code, SessiondError)
    err = cls(message, data if isinstance(data, dict) else {})
    if cls is SessiondError:
        err.code = code  # type: ignore[misc]
    return err
