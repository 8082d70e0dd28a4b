"""sessiond's client: `sessiond.Client` (blocking) and `sessiond.AsyncClient`, errors and types."""

from typing import TYPE_CHECKING, Any

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

from ._sync import Client
from ._wire import ConnectionLostError, DaemonUnavailableError, UntrustedDaemonError

if TYPE_CHECKING:
    from ._async import AsyncClient


def __getattr__(name: str) -> Any:
    # AsyncClient brings in anyio and asyncio; a blocking user (and sessionctl) never pays.
    if name == "AsyncClient":
        from ._async import AsyncClient

        return AsyncClient
    raise AttributeError(f"module 'sessiond' has no attribute {name!r}")

__all__ = [
    "AsyncClient",
    "CheckpointGetResult",
    "CheckpointInfo",
    "Client",
    "ConnectionLostError",
    "DaemonUnavailableError",
    "Event",
    "EventMeta",
    "EventsReadResult",
    "Message",
    "MessageListResult",
    "Metrics",
    "Progress",
    "Result",
    "SessionListResult",
    "SessionResumeResult",
    "SessionState",
    "SessionSummary",
    "Timestamps",
    "TokenUsage",
    "UntrustedDaemonError",
    "WriteResult",
]
