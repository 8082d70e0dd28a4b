"""Event types: the envelope every stored event has, and one data Struct per `type`."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias, cast

import msgspec

from .bounds import INT64_MAX, Int64, NonNegFloat, NonNegInt, Pid, PosInt
from .state import SessionFields, TtlSeconds

Status = Literal["pending", "active", "paused", "completed", "failed", "cancelled", "killed",
                 "expired"]
Role = Literal["user", "assistant", "system", "tool"]
SessionId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
ActorName = Annotated[str, msgspec.Meta(pattern=r"^[^/\s]+/[^/\s]+$")]
Ulid = Annotated[str, msgspec.Meta(pattern=r"^[0-7][0-9A-HJKMNP-TV-Z]{25}$")]

STATUSES: Final[tuple[str, ...]] = (
    "pending", "active", "paused", "completed", "failed", "cancelled", "killed", "expired",
)
TERMINAL_STATUSES: Final = frozenset({"completed", "failed", "cancelled", "killed", "expired"})
# Where session.transition (and a session.status_changed) may go. `expired` is in no
# list: only the daemon enters it, with session.expired, from a status in EXPIRABLE once
# the session's idle TTL has passed; it is left, like completed, only to active.
EXPIRABLE: Final = frozenset({"pending", "active", "paused"})
ALLOWED_TRANSITIONS: Final[dict[str, tuple[str, ...]]] = {
    "pending": ("active", "cancelled", "failed", "killed"),
    "active": ("paused", "completed", "failed", "cancelled", "killed"),
    "paused": ("active", "completed", "failed", "cancelled", "killed"),
    "completed": ("active",),
    "failed": ("active",),
    "cancelled": (),
    "killed": (),
    "expired": ("active",),
}

CURRENT_SCHEMA_VERSION: Final = 1


# The last second's "YYYY-MM-DDTHH:MM:SS", formatted once a second: now() costs a third
# of what datetime's formatting took, on every event (bench/README, "Less Python per
# append"). One tuple, replaced whole: a thread never reads one second's text with
# another second.
_second: list[tuple[int | None, str]] = [(None, "")]


def now() -> str:
    """Return the current UTC time as the contract's RFC 3339 string with microseconds."""
    return rfc3339(time.time_ns())


def rfc3339(ns: int) -> str:
    """`ns` nanoseconds since the epoch as now() writes it: the string datetime writes
    (`datetime.fromtimestamp(s, UTC).isoformat(timespec="microseconds")`, "Z" for its
    offset), microseconds rounded down."""
    seconds, micros = divmod(ns // 1000, 1_000_000)
    second = _second[0]
    if second[0] != seconds:
        t = time.gmtime(seconds)
        # A leap second (a "right/" zone counts them) is :59, as datetime makes it.
        second = (seconds, f"{t.tm_year:04d}-{t.tm_mon:02d}-{t.tm_mday:02d}T{t.tm_hour:02d}"
                           f":{t.tm_min:02d}:{min(t.tm_sec, 59):02d}")
        _second[0] = second
    return f"{second[1]}.{micros:06d}Z"


def parse_time(value: str) -> datetime:
    """Parse an RFC 3339 / ISO 8601 time; naive times are taken as UTC."""
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# Every pair of Crockford base32 characters (the ULID alphabet), by the 10 bits they encode.
_CROCKFORD: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS: Final = [a + b for a in _CROCKFORD for b in _CROCKFORD]
_SHIFTS: Final = tuple(range(120, -1, -10))  # 128 bits: 13 pairs, the first 2 bits zero


def new_id() -> str:
    """Make a new ULID string (message, checkpoint, event and default session ids): 48
    bits of Unix time in milliseconds, then 80 random bits, in Crockford base32 (26
    characters, sortable by time). The same strings as python-ulid's `str(ULID())`, in
    about a quarter of its time (bench/README: "CPU per append")."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10))
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])



class EventMeta(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Who caused an event, and the request context it came with."""

    peer_uid: Int64 | None = None
    peer_pid: Int64 | None = None
    idempotency_key: str | None = None
    correlation_id: str | None = None


# --- data of each event type --------------------------------------------------
# Unknown fields are ignored here (the stored data keeps them: Event.data_json, and
# Event.fields() reads them); the fold and the services read these Structs.


class Data(msgspec.Struct, kw_only=True):
    """The base of every event data Struct. Read its fields as attributes (narrow
    `Event.data` to its Struct first); there is no read by JSON name (`Record.body` and
    `Unread.body` are the objects as stored). `Event.fields()` is the data as stored."""


class SessionCreated(SessionFields, Data, kw_only=True):
    """The first event of a session: SessionFields (in their order), then these."""

    actor_name: ActorName | None = None  # validated here (a view keeps what it was given)
    checkpoint_enabled: bool = False
    input_data: dict[str, Any] = msgspec.field(default_factory=dict)
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    status: Literal["pending", "active"] = "active"


class TtlSet(Data, kw_only=True):
    """The session's idle TTL changes (session.set_ttl; null: none)."""

    ttl_s: TtlSeconds | None


class SessionExpired(Data, kw_only=True):
    """The daemon ended a session idle for its TTL: `ttl_s` and the time of the last event
    before this one (`idle_since`), so the history says why."""

    ttl_s: TtlSeconds
    idle_since: str


class StatusChanged(Data, kw_only=True, omit_defaults=True):
    from_: Status = msgspec.field(name="from")
    to: Status
    reason: str | None = None
    error: str | None = None
    paused_at: str | None = None
    resume_from: str | None = None


class MessageFields(Data, kw_only=True):
    """What a caller gives for one message (the daemon adds id and sequence)."""

    role: Role
    content: str
    tool_call_id: str | None = None
    metadata: dict[str, Any] = {}

    def __post_init__(self) -> None:
        if not self.content.strip():
            raise ValueError("`content` must not be blank")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("`tool_call_id` is required when role is `tool`")


class MessageAppended(MessageFields, kw_only=True, omit_defaults=True):
    message_id: str
    sequence: NonNegInt


class TokensRecorded(Data, kw_only=True, omit_defaults=True):
    input_tokens: NonNegInt = 0
    output_tokens: NonNegInt = 0
    estimated_cost: NonNegFloat = 0.0
    model: str | None = None


class ProgressRecorded(Data, kw_only=True):
    node_id: Annotated[str, msgspec.Meta(min_length=1)]
    edge: str | None = None
    latency_ms: NonNegInt = 0
    tokens: NonNegInt = 0
    retries: NonNegInt = 0
    failed: bool = False


class CheckpointSaved(Data, kw_only=True):
    checkpoint_id: str
    node_id: str | None = None
    resume_from: str | None = None
    memory: dict[str, Any] = {}
    size: NonNegInt


class MemoryUpdated(Data, kw_only=True):
    patch: dict[str, Any]


class MetadataUpdated(Data, kw_only=True):
    patch: dict[str, Any]


class ResultRecorded(Data, kw_only=True):
    success: bool | None = None
    output: dict[str, Any] = {}
    error: str | None = None


class Record(Data, kw_only=True):
    """A problem or a decision: any object (`body`), kept whole in the view. Its JSON is
    the body itself (`encode_data`, `canonical_json`, `decode_raw`), not {"body": ...}."""

    body: dict[str, Any]


class Unread(Data, kw_only=True):
    """Stored data that does not read as its type's Struct (a damaged store, an import
    of a type this daemon does not know): `body` as stored (None when it is not JSON) and
    `error`, why. The event still reads, its hash still checks (Event.data_json); the
    fold refuses it, and verify and the writer's damaged-history check say why."""

    body: Any
    error: str


class PlanLinked(Data, kw_only=True):
    plan_id: Annotated[str, msgspec.Meta(min_length=1)]


class StreamChunk(Data, kw_only=True, omit_defaults=True):
    """Bytes appended to a generic stream (the HTTP face, docs/http.md): `text` when the
    stream's content type is textual (text/*, JSON, XML, ...), else `base64`; one of the
    two, never both. A JSON stream's chunk is one JSON message. `seq` is the writer's
    Stream-Seq header, when it gave one (later ones must sort after it)."""

    text: str | None = None
    # Whole quads, padded: what every decoder reads back (a chunk that does not decode
    # would leave its stream unreadable).
    base64: Annotated[str, msgspec.Meta(
        pattern=r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")] | None = None
    seq: str | None = None

    def __post_init__(self) -> None:
        if (self.text is None) == (self.base64 is None):
            raise ValueError("`text` or `base64`: a chunk carries exactly one of the two")


class MessagesTruncated(Data, kw_only=True):
    """Messages from `from_sequence` on leave the conversation (sessiond extension:
    message.pop, message.clear). The events stay; `last_message` is the one now last."""

    from_sequence: NonNegInt
    reason: str | None = None
    last_message: dict[str, Any] | None = None


class Typed(Data, kw_only=True):
    """A value in its producer's own serialization (LangGraph's serde): a type tag and bytes."""

    type: str
    data: bytes  # base64 in JSON


class GraphCheckpoint(Data, kw_only=True):
    """A LangGraph checkpoint (sessiond extension). `blobs` holds only the channel values
    that changed in this step; the others are found in earlier graph.checkpoint events."""

    thread_id: str
    ns: str = ""
    checkpoint_id: Annotated[str, msgspec.Meta(min_length=1)]
    parent_id: str | None = None
    checkpoint: Typed  # the checkpoint without its channel values
    metadata: dict[str, Any] = {}  # as JSON, for filtering
    metadata_typed: Typed | None = None  # as the producer serialized it, for a faithful read
    channel_versions: dict[str, str] = {}
    blobs: dict[str, Typed] = {}  # channel -> its value at channel_versions[channel]

    def __post_init__(self) -> None:
        for channel in self.blobs:
            if channel not in self.channel_versions:
                raise ValueError(f"`blobs` holds channel {channel!r}, which has no entry in"
                                 " `channel_versions`")


class GraphWrite(Data, kw_only=True):
    idx: Int64
    channel: str
    value: Typed


class GraphWrites(Data, kw_only=True):
    """Pending writes of a task against a checkpoint (sessiond extension)."""

    thread_id: str
    ns: str = ""
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    writes: list[GraphWrite]


class GraphPruned(Data, kw_only=True):
    """Checkpoints (and their writes) leave the graph's index; the events stay."""

    checkpoints: list[tuple[str, str]]  # (ns, checkpoint_id)
    reason: str


class StateUpdated(Data, kw_only=True):
    """Keys set in a state (sessiond extension, for Google ADK's scoped state). `session`
    sets keys of this session's `memory`; `app` and `user` set keys of the state shared by
    every session of `app_name` (and `user_id`), which state.get reads. A key is set to the
    value given, null included: unlike memory.updated, nothing is deleted."""

    scope: Literal["session", "app", "user"]
    app_name: str | None = None
    user_id: str | None = None
    delta: dict[str, Any]

    def __post_init__(self) -> None:
        if self.scope != "session" and not self.app_name:
            raise ValueError(f"{self.scope} state needs app_name")
        if self.scope == "user" and not self.user_id:
            raise ValueError("user state needs user_id")


class ProcessStarted(Data, kw_only=True):
    pid: Pid
    argv: list[str]
    cwd: str | None = None
    turn: NonNegInt


class ProcessOutput(Data, kw_only=True):
    turn: NonNegInt
    stream: Literal["stdout", "stderr"] = "stdout"
    line: str


class ProcessExited(Data, kw_only=True):
    pid: Pid
    turn: NonNegInt
    exit_code: Int64 | None = None
    signal: Int64 | None = None
    lines: NonNegInt | None = None  # output lines the turn wrote (stdout and stderr)
    truncated_lines: NonNegInt | None = None  # of them, cut at max_line_bytes


class ProcessDetached(Data, kw_only=True, omit_defaults=True):
    """A daemon start found a turn it no longer supervises (sessiond extension); or, with
    `imported`, the mark an import of a history with an open turn ends it with (its
    process was another host's: nothing is supervised, and the view is left as it was)."""

    pid: Pid
    turn: NonNegInt
    alive: bool  # the process still runs (its output is no longer captured)
    reason: str
    imported: bool = False  # left out when false (as every daemon-written detach has it)


class ForkSource(Data, kw_only=True):
    """Where a fork's history comes from: a session, a version of it, and its hash there."""

    session_id: str
    version: NonNegInt
    hash: str


class SessionForked(Data, kw_only=True):
    """The first event of a fork (sessiond extension, session.fork): its versions go on from
    `from.version`, its hash chain from `from.hash`, and `state` is the source's view at
    that version, which the fold starts from (so a fork folds without its source)."""

    from_: ForkSource = msgspec.field(name="from")
    state: dict[str, Any]


# Who made a compaction: sessiond's API (session.compact), its CLI, a user, an SDK's
# compaction (the drop-ins), an agent CLI's (the importers), as a short name.
CompactedBy = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9_.:-]{0,63}$")]
# A compaction's summary: one or more messages (an SDK's compacted items, a CLI's summary).
MAX_SUMMARY_MESSAGES: Final = 1000


class SummaryMessage(MessageFields, kw_only=True, omit_defaults=True):
    """One message of a compaction's summary: a message's fields, no id or sequence (it
    is not in the conversation's index; the context read serves it first)."""


class SessionCompacted(Data, kw_only=True, omit_defaults=True):
    """A compaction (sessiond extension, session.compact): `summary` stands for the
    conversation's messages up to `through_sequence` (-1: none) and the history up to
    `through_version`; the context is the summary, then the messages after it. Nothing is
    cut: the history before it stays readable, searchable, forkable and verifiable."""

    summary: Annotated[list[SummaryMessage], msgspec.Meta(min_length=1,
                                                          max_length=MAX_SUMMARY_MESSAGES)]
    through_sequence: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]
    through_version: NonNegInt
    by: CompactedBy = "api"
    reason: str | None = None


class HistoryTrimmed(Data, kw_only=True):
    """Retention trimmed the session's history behind a compaction (sessiond extension,
    session.trim): its events up to `through_version` (and the messages up to
    `through_sequence`) are gone; `anchor` is the hash of the event at `through_version`,
    from which the chain of the events kept still verifies, and the view at that
    version stays as a snapshot, from which the fold goes on."""

    through_version: PosInt
    through_sequence: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]
    anchor: str
    by: CompactedBy = "retention"


# THE table of event types: each type, and the Struct its data decodes to. The rest is
# derived from it or checked against it (tests/test_event_types.py): EVENT_TYPES and
# EventType here, the fold's branches (projection._BRANCHES), what events.append takes
# (service.APPEND_INPUTS), and docs/protocol.md's table of event types.
DATA_TYPES: Final[dict[str, type[Data]]] = {
    "session.created": SessionCreated,
    "session.status_changed": StatusChanged,
    "message.appended": MessageAppended,
    "tokens.recorded": TokensRecorded,
    "progress.recorded": ProgressRecorded,
    "checkpoint.saved": CheckpointSaved,
    "memory.updated": MemoryUpdated,
    "metadata.updated": MetadataUpdated,
    "result.recorded": ResultRecorded,
    "problem.recorded": Record,
    "decision.recorded": Record,
    "plan.linked": PlanLinked,
    "process.started": ProcessStarted,
    "process.output": ProcessOutput,
    "process.exited": ProcessExited,
    "process.detached": ProcessDetached,
    "messages.truncated": MessagesTruncated,
    "graph.checkpoint": GraphCheckpoint,
    "graph.writes": GraphWrites,
    "graph.pruned": GraphPruned,
    "state.updated": StateUpdated,
    "session.forked": SessionForked,
    "stream.chunk": StreamChunk,
    "session.ttl_set": TtlSet,
    "session.expired": SessionExpired,
    "session.compacted": SessionCompacted,
    "session.trimmed": HistoryTrimmed,
}
EVENT_TYPES: Final[tuple[str, ...]] = tuple(DATA_TYPES)
if TYPE_CHECKING:  # a Literal cannot be derived for mypy; at run time it is the table's keys
    EventType = str
else:
    EventType = Literal[EVENT_TYPES]  # what events.append and the type filters accept


def _tokens_v0(data: dict[str, Any]) -> dict[str, Any]:
    # Version 0 used Hive's metric names (seed 000): total_input/output_tokens.
    renamed = {"total_input_tokens": "input_tokens", "total_output_tokens": "output_tokens"}
    return {renamed.get(k, k): v for k, v in data.items()}


# (type, schema_version) -> the data in the next version's shape. Changing an event
# type is adding a function here, never migrating stored rows: events stay as they
# were written (their hashes cover that), and are brought up to date when read.
UPCASTERS: Final[dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]]] = {
    ("tokens.recorded", 0): _tokens_v0,
}


def upcast(event_type: str, schema_version: int, data: dict[str, Any]) -> dict[str, Any]:
    """Bring stored event data up to the current schema version."""
    for version in range(schema_version, CURRENT_SCHEMA_VERSION):
        step = UPCASTERS.get((event_type, version))
        if step is not None:
            data = step(data)
    return data


# What Event.data is: one of the table's Structs, or Unread (data that does not decode).
EventData: TypeAlias = (
    SessionCreated | StatusChanged | MessageAppended | TokensRecorded | ProgressRecorded
    | CheckpointSaved | MemoryUpdated | MetadataUpdated | ResultRecorded | Record | PlanLinked
    | ProcessStarted | ProcessOutput | ProcessExited | ProcessDetached | MessagesTruncated
    | GraphCheckpoint | GraphWrites | GraphPruned | StateUpdated | SessionForked | StreamChunk
    | TtlSet | SessionExpired | SessionCompacted | HistoryTrimmed | Unread
)

_plain = msgspec.json.Encoder()
_canonical = msgspec.json.Encoder(order="sorted")
_any = msgspec.json.Decoder()
_DECODERS: Final = {t: msgspec.json.Decoder(kind) for t, kind in DATA_TYPES.items()
                    if kind is not Record}


def decode_data(event_type: str, data: Any,
                schema_version: int = CURRENT_SCHEMA_VERSION) -> EventData:
    """Type an event's data given as decoded JSON, upcast first (tolerant: unknown fields
    are ignored). Raises ValueError (msgspec.ValidationError is one) when it does not fit."""
    kind = DATA_TYPES.get(event_type)
    if kind is None:
        raise ValueError(f"unknown event type {event_type!r}")
    if not isinstance(data, dict):
        raise msgspec.ValidationError(f"Expected `object`, got `{type(data).__name__}`")
    if kind is Record:
        return Record(body=data)
    return cast("EventData", msgspec.convert(upcast(event_type, schema_version, data), kind))


def decode_raw(event_type: str, raw: bytes | msgspec.Raw,
               schema_version: int = CURRENT_SCHEMA_VERSION) -> EventData:
    """Type an event's data from its stored JSON, in one decode (upcast ones through a
    dict); data that does not decode reads as Unread, never raises."""
    try:
        decoder = _DECODERS.get(event_type)
        if decoder is not None and schema_version >= CURRENT_SCHEMA_VERSION:
            return cast("EventData", decoder.decode(raw))
        return decode_data(event_type, _any.decode(raw), schema_version)
    except (ValueError, TypeError) as exc:  # msgspec's DecodeError and ValidationError too
        try:
            body = _any.decode(raw)
        except msgspec.DecodeError:
            body = None
        return Unread(body=body, error=str(exc))


def encode_data(data: EventData) -> bytes:
    """The JSON of event data as it is stored and served: fields in their Struct's order,
    a free-form object's keys in the order they were given (a client's JSON keeps its
    order). A Record's and an Unread's JSON is their body."""
    return _plain.encode(data.body if isinstance(data, (Record, Unread)) else data)


def canonical_json(data: EventData) -> bytes:
    """The canonical JSON of event data (sorted keys, no spaces, UTF-8): what its hash
    covers (export.chain_hash). The same bytes as the data's builtins give (the property
    tests/test_typed_data.py holds)."""
    return _canonical.encode(data.body if isinstance(data, (Record, Unread)) else data)


class Event(msgspec.Struct, kw_only=True, frozen=True, dict=True):
    """One stored event, exactly as the contract's envelope shows it.

    `data_json` is the data's JSON as stored (its JSON name is `data`): served and sent
    to subscribers as it is, never encoded again; its keys in the order they were given
    (the hash covers its canonical form: `canonical_data`). `data` is that JSON typed,
    decoded once, when first read (the writer hands over the Struct it encoded)."""

    position: NonNegInt
    session_id: str
    version: PosInt
    event_id: str
    type: str
    schema_version: NonNegInt
    recorded_at: str
    data_json: msgspec.Raw = msgspec.field(name="data")
    meta: EventMeta
    hash: str

    @functools.cached_property
    def data(self) -> EventData:
        """The data as its type's Struct (upcast), or Unread."""
        return decode_raw(self.type, self.data_json, self.schema_version)

    def fields(self) -> dict[str, Any]:
        """The data as stored, as a dict: every field (unknown ones too), not upcast."""
        decoded = _any.decode(self.data_json)
        return decoded if isinstance(decoded, dict) else {}


def typed_event(*, position: int, session_id: str, version: int, event_id: str,
                type: str, recorded_at: str, data: EventData, meta: EventMeta,
                hash: str = "", data_json: bytes | None = None,
                schema_version: int = CURRENT_SCHEMA_VERSION) -> Event:
    """An event made from typed data: its JSON encoded here once (or `data_json`, that
    encoding already at hand), and `data` the Struct given (not decoded again)."""
    event = Event(position=position, session_id=session_id, version=version,
                  event_id=event_id, type=type, schema_version=schema_version,
                  recorded_at=recorded_at,
                  data_json=msgspec.Raw(encode_data(data) if data_json is None else data_json),
                  meta=meta, hash=hash)
    event.__dict__["data"] = data
    return event


_event_decoder = msgspec.json.Decoder(Event)


def event_from_builtins(value: Any) -> Event:
    """An event from its envelope as decoded JSON (a dict, `data` an object in it), as
    msgspec.convert would make it (keys kept in their order)."""
    return _event_decoder.decode(_plain.encode(value))


def moved(event: Event, **changes: Any) -> Event:
    """`msgspec.structs.replace` that keeps the typed data already decoded."""
    out = msgspec.structs.replace(event, **changes)
    if "data" in event.__dict__ and "data_json" not in changes:
        out.__dict__["data"] = event.__dict__["data"]
    return out


def canonical_data(event: Event) -> bytes:
    """The canonical JSON of the event's data, as its hash covers it: the stored bytes
    decoded and encoded again (rows an older daemon stored kept their keys' order)."""
    return _canonical.encode(_any.decode(event.data_json))
