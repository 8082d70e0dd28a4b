"""sessiond's client: `sessiond.Client` (blocking) and `sessiond.AsyncClient`, errors and types."""

from sessiond_schemas.errors import *  # noqa: F403
from sessiond_schemas.events import Event, EventMeta
from sessiond_schemas.rpc import (
    CheckpointGetResult,
    CheckpointInfo,
    EventsReadResult,
    MessageListResult,
    SessionListResult,
    SessionResumeResult,
    WriteResult,
)
from sessiond_schemas.state import (
    Message,
    Metrics,
    Progress,
    Result,
    SessionState,
    SessionSummary,
    Timestamps,
    TokenUsage,
)

from ._async import AsyncClient, ConnectionLostError
from ._sync import Client

__all__ = [
    "AsyncClient", "CheckpointGetResult", "CheckpointInfo", "Client", "ConnectionLostError",
    "Event", "EventMeta", "EventsReadResult", "Message", "MessageListResult", "Metrics",
    "Progress", "Result", "SessionListResult", "SessionResumeResult", "SessionState",
    "SessionSummary", "Timestamps", "TokenUsage", "WriteResult",
]
