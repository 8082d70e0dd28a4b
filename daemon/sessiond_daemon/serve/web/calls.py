"""The HTTP face's way into the daemon: the method table, with the socket's checks.

Every stream operation is one or more calls of the contract's methods, decoded with their
params type, checked against the caller's grants (core/access.py) and recorded with the
caller's uid, exactly as a socket request is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from sessiond_daemon.core import access, text
from sessiond_daemon.core.access import Grants
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.features.service import invalid_params
from sessiond_daemon.serve.methods import MethodTable
from sessiond_schemas.errors import (
    InternalError,
    InvalidParamsError,
    SessiondError,
    ShuttingDownError,
)
from sessiond_schemas.events import EventMeta, new_id

log = structlog.get_logger("sessiond.http")
_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request acts as: a uid (ours, a Unix peer's, or auth.PEER_UID) and a pid."""

    uid: int
    pid: int | None = None


# The face's own bookkeeping of a stream (its settings, a soft delete's mark, a TTL's
# renewal), written as the daemon once the caller's request was granted: a peer may not
# write them itself (access.STREAM_SETTINGS), and a read of a peer must not fail on them.
DAEMON = Caller(os.getuid())


class Calls:
    def __init__(self, table: MethodTable, grants: Callable[[], Grants],
                 draining: Callable[[], bool] = lambda: False,
                 page_bytes: Callable[[], int] = lambda: 4 << 20) -> None:
        self.table = table
        self.grants = grants  # read at each call: a reload changes them
        self.draining = draining  # the daemon is stopping: refuse, as the socket does
        self.page_bytes = page_bytes  # max_page_bytes, read at each call

    async def call(self, method: str, params: dict[str, Any], caller: Caller) -> Any:
        """Run `method` as `caller` would over the socket; return its result as builtins."""
        m = self.table[method]
        if self.draining():
            raise ShuttingDownError("the daemon is shutting down")
        try:
            p = msgspec.convert(params, m.params)
        except msgspec.ValidationError as exc:
            raise invalid_params(exc, context=f"invalid params for {method}") from exc
        except RecursionError as exc:
            raise InvalidParamsError(f"invalid params for {method}: nested too deeply",
                                     {"detail": "nested too deeply", "path": "$"}) from exc
        text.refuse_nul(params)  # the rule for text on both stores, as on the socket
        grants = self.grants()
        grants.check(method, caller.uid, m.grant(p) if m.grant else None)
        access.caller.set((grants, caller.uid))  # for grants that depend on stored data
        page_budget.set(self.page_bytes())  # the socket's max_page_bytes, as reloaded
        assert m.handler is not None, f"{method} is served by a connection"
        try:
            result = await m.handler(p, EventMeta(peer_uid=caller.uid, peer_pid=caller.pid))
        except SessiondError:
            raise
        except Exception as exc:
            error_id = new_id()
            log.exception("http.internal_error", error_id=error_id, method=method)
            raise InternalError("internal error", {"error_id": error_id}) from exc
        # Through JSON, not to_builtins: an event's data is its stored bytes (msgspec.Raw),
        # which only the JSON encoder writes as they are.
        return msgspec.json.decode(result if isinstance(result, msgspec.Raw)
                                   else _json.encode(result))
