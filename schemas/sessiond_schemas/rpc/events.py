"""Raw event methods: events.append, read, subscribe, unsubscribe, and what a
subscription sends."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from ..bounds import NonNegInt, PosInt
from ..events import Event, EventType
from .base import Params, WriteParams


class EventInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: EventType
    data: dict[str, Any] = {}


class EventsAppendParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    events: Annotated[list[EventInput], msgspec.Meta(min_length=1, max_length=10_000)]


class EventsReadParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None
    from_version: PosInt | None = None
    from_position: NonNegInt | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1000
    types: list[EventType] | None = None


class EventsSubscribeParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None
    from_position: NonNegInt | None = None
    from_version: PosInt | None = None
    types: list[EventType] | None = None


class EventsUnsubscribeParams(Params, kw_only=True, forbid_unknown_fields=True):
    subscription: str


class EventsReadResult(msgspec.Struct, kw_only=True):
    events: list[Event]
    next: int | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


class SubscribeResult(msgspec.Struct, kw_only=True):
    subscription: str
    position: int  # events after this position follow


class UnsubscribeResult(msgspec.Struct, kw_only=True):
    ok: bool


class SubscriptionEvent(msgspec.Struct, kw_only=True):
    subscription: str
    event: Event


class SubscriptionCaughtUp(msgspec.Struct, kw_only=True):
    subscription: str
    position: int


class SubscriptionDropped(msgspec.Struct, kw_only=True):
    subscription: str
    reason: str
    last_position: int
