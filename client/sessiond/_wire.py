"""Reading the daemon's replies: shared by both clients, free of any event loop."""

from __future__ import annotations

import msgspec
from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError, error_from_wire


class ConnectionLostError(SessiondError):
    """The connection to the daemon closed before the answer came."""


def raise_for(reply: rpc.Response) -> msgspec.Raw:
    """Return a reply's raw result, or raise the error it carries."""
    if isinstance(reply.error, rpc.ErrorObject):
        err = reply.error
        raise error_from_wire(err.code, err.message, err.data if isinstance(err.data, dict) else {})
    if not isinstance(reply.result, msgspec.Raw):
        raise ConnectionLostError("the daemon sent a reply with neither result nor error")
    return reply.result
