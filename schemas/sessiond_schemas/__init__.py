"""Wire types shared by the sessiond daemon and its client: events, SessionState, RPC, errors."""

from .errors import *  # noqa: F403
from .events import (
    ALLOWED_TRANSITIONS,
    DATA_TYPES,
    EVENT_TYPES,
    STATUSES,
    TERMINAL_STATUSES,
    Event,
    EventMeta,
    decode_data,
    new_id,
    now,
)
from .rpc import METHODS
from .state import (
    Message,
    Metrics,
    Progress,
    Result,
    SessionState,
    SessionSummary,
    Timestamps,
    TokenUsage,
)

__all__ = [
    "ALLOWED_TRANSITIONS", "DATA_TYPES", "EVENT_TYPES", "METHODS", "STATUSES",
    "TERMINAL_STATUSES", "Event", "EventMeta", "Message", "Metrics", "Progress", "Result",
    "SessionState", "SessionSummary", "Timestamps", "TokenUsage", "decode_data", "new_id", "now",
]
