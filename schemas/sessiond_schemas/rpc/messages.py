"""Message methods: message.append, append_many, list, pop, clear."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from ..bounds import INT64_MAX, NonNegInt
from ..events import MessageFields
from ..state import Message
from .base import Limit1000, Params, WriteOptions, WriteParams, WriteResult, with_write_options

if TYPE_CHECKING:  # what mypy sees; at run time the same Struct is built below
    class MessageAppendParams(MessageFields, WriteOptions): ...
else:
    MessageAppendParams = with_write_options(MessageFields, "MessageAppendParams", __name__)


class MessageAppendManyParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[MessageFields], msgspec.Meta(min_length=1, max_length=10_000)]
    # The messages from this sequence on leave the conversation and these take their
    # place, in the same write (a compaction's atomic suffix replacement).
    replace_from: NonNegInt | None = None


class MessageListParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    limit: Limit1000 = 100
    offset: NonNegInt = 0
    after_sequence: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    order: Literal["asc", "desc"] = "asc"


class MessageAppendResult(WriteResult, kw_only=True):
    message_id: str
    sequence: int


class MessagePopResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int | None  # None: there was nothing to pop, nothing was written
    message: Message | None


class MessageClearResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int | None  # None: there was nothing to clear, nothing was written
    removed: int


class MessageAppendManyResult(WriteResult, kw_only=True):
    message_ids: list[str]
    first_sequence: int


class MessageListResult(msgspec.Struct, kw_only=True):
    messages: list[Message]
    total: int
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`
