"""Row builders shared by the stores: an event from its stored columns, and the pages of
message.list and session.list from their rows (with session.list's cursor)."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from contextvars import ContextVar
from typing import Any, Final, Protocol

import msgspec

from sessiond_daemon.stores.interface import Page, repage
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import (
    Event,
    EventMeta,
    MessageAppended,
    Unread,
    decode_raw,
)
from sessiond_schemas.state import (
    Message,
    SessionSummary,
    TokenUsage,
)

# The columns of a stored event that event_from_row reads, in its order (every store
# keeps these columns under these names).
EVENT_COLUMNS: Final = (
    "position, session_id, version, event_id, type, schema_version, recorded_at, data, meta, hash")
_meta_decoder = msgspec.json.Decoder(EventMeta)


def event_from_row(r: Sequence[Any]) -> Event:
    """An event from a row of EVENT_COLUMNS (data and meta as JSON text or bytes). Its data
    is typed here, once (the Struct of its type, or Unread when it does not fit it), and
    its bytes kept as stored: what is served and hashed. Raises msgspec.DecodeError when
    the data is not a JSON object at all (a row written behind the daemon's back)."""
    data = decode_raw(r[4], r[7], r[5])
    if isinstance(data, Unread) and not isinstance(data.body, dict):
        raise msgspec.DecodeError(f"stored data is not a JSON object: {data.error}")
    event = Event(
        position=r[0], session_id=r[1], version=r[2], event_id=r[3], type=r[4],
        schema_version=r[5], recorded_at=r[6], data_json=msgspec.Raw(r[7]),
        meta=_meta_decoder.decode(r[8]), hash=r[9],
    )
    event.__dict__["data"] = data
    return event


_message_decoder = msgspec.json.Decoder(MessageAppended)


def messages_page(rows: Page[Any]) -> Page[Message]:
    """message.list's page from rows of (a message.appended event's data, its time)."""
    messages: Page[Message] = repage(rows, [])
    for data, recorded_at in rows:
        m = _message_decoder.decode(data)
        messages.append(Message(
            message_id=m.message_id, sequence=m.sequence, role=m.role, content=m.content,
            timestamp=recorded_at, tool_call_id=m.tool_call_id, metadata=m.metadata,
        ))
    return messages


def sessions_page(rows: Page[Any], limit: int) -> tuple[Page[SessionSummary], str | None]:
    """session.list's page and next cursor from up to `limit` + 1 rows of
    `list_sessions_sql`'s columns (the extra row says whether there is more)."""
    page = repage(rows, [
        SessionSummary(
            session_id=r[0], status=r[1], namespace=r[2], actor_name=r[3], task=r[4],
            created_at=r[5], updated_at=r[6], message_count=r[7],
            token_usage=TokenUsage(input_tokens=r[8], output_tokens=r[9],
                                   estimated_cost=r[10]),
        )
        for r in rows[:limit]
    ])
    more = len(rows) > limit or rows.cut
    page.cut = rows.cut and len(rows) < limit  # not when only the look-ahead row was cut
    next_cursor = encode_list_cursor(page[-1].created_at, page[-1].session_id) if more else None
    return page, next_cursor


def add_pending_writes(found: dict[str, list[dict[str, Any]]], rows: Sequence[Any]) -> None:
    """graph_pending's writes from rows of (checkpoint_id, item, position, the
    graph.writes event's data), each event decoded once however many items it holds. The
    rows come by (checkpoint, task_id, idx); each checkpoint's writes leave in LangGraph's
    `writes_sort_key` order, (task_path, task_id, idx), the order a super-step applies
    them in (the sort is stable, so idx order stays)."""
    decoded: dict[int, Any] = {}
    touched: set[str] = set()
    for checkpoint_id, item, position, data in rows:
        if position not in decoded:
            decoded[position] = msgspec.json.decode(data)
        w = decoded[position]
        touched.add(checkpoint_id)
        found.setdefault(checkpoint_id, []).append({
            "task_id": w["task_id"], "task_path": w.get("task_path", ""),
            "channel": w["writes"][item]["channel"], "value": w["writes"][item]["value"]})
    for checkpoint_id in touched:
        found[checkpoint_id].sort(key=lambda w: (w["task_path"], w["task_id"]))


def encode_list_cursor(created_at: str, session_id: str) -> str:
    """session.list's cursor: where the last page ended, (created_at, session_id)."""
    return base64.urlsafe_b64encode(msgspec.json.encode([created_at, session_id])).decode()


def decode_list_cursor(cursor: str) -> tuple[str, str]:
    try:
        created_at, session_id = msgspec.json.decode(
            base64.urlsafe_b64decode(cursor.encode()), type=tuple[str, str]
        )
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError(
            "`cursor` is not a cursor this daemon returned",
            {"detail": str(exc), "path": "$.cursor"}) from exc
    return created_at, session_id


class PageReserve(Protocol):
    """What a paged read tells the serving layer (serve/budget.py: Reservation)."""

    def fetching(self) -> AbstractAsyncContextManager[Any]:
        """Held while a paged query runs (stores call `paging()`): the rows read and not
        yet counted are bounded daemon-wide."""
        ...

    def take(self, size: int) -> None:
        """Count a row of `size` bytes, before the answer is built from it; raises when
        there is no room for it."""
        ...


# The serving layer sets it per request, to reserve each row's bytes in the daemon's
# memory budget as a paged read takes it (None: nothing is counted).
page_reserve: ContextVar[PageReserve | None] = ContextVar("page_reserve", default=None)


def _row_bytes(row: Any) -> int:
    """About what a row weighs in an answer: its text and blob columns."""
    return sum(len(v) for v in row if isinstance(v, (str, bytes))) + 16


async def fill_page(fetch: Callable[[int], Awaitable[Iterable[Any]]],
                    max_bytes: int) -> Page[Any]:
    """The rows of a paged query, fetched `fetch(n)` at a time, stopping before the row
    that would pass `max_bytes`. The first row always comes, however large. How many to
    fetch next is guessed from the largest row seen, and at most doubles what came: a
    small first row (a session.created) followed by large ones never pulls `limit` large
    rows into memory at once."""
    page: Page[Any] = Page()
    used, chunk, largest = 0, 1, 1
    reserve = page_reserve.get()
    while rows := list(await fetch(chunk)):
        for row in rows:
            size = _row_bytes(row)
            if page and used + size > max_bytes:
                page.cut = True
                return page
            if reserve is not None:
                reserve.take(size)
            page.append(row)
            used += size
            largest = max(largest, size)
        chunk = max(1, min(1024, len(page), (max_bytes - used) // largest + 1))
    return page


def paging() -> AbstractAsyncContextManager[Any]:
    """What a store holds around a paged query, from its execution (which may load its
    first row already: SQLite's does) to its last fetch (fill_page): the serving layer's
    gate, so that rows read and not yet counted are few daemon-wide."""
    reserve = page_reserve.get()
    return reserve.fetching() if reserve is not None else nullcontext()
