"""JSON-RPC 2.0 envelopes, the bases of every params Struct, and the shared write options."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal, TypeVar, cast

import msgspec
from msgspec import UNSET, UnsetType

from ..bounds import NonNegInt

RequestId = int | str | None
Version = NonNegInt
IdempotencyKey = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Limit1000 = Annotated[int, msgspec.Meta(ge=1, le=1000)]
ItemId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
NoNul = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$")]


class Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    jsonrpc: Literal["2.0"]
    method: str
    params: msgspec.Raw | UnsetType = UNSET
    id: RequestId | UnsetType = UNSET


class ErrorObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: int
    message: str
    data: dict[str, Any] | UnsetType = UNSET


class Success(msgspec.Struct, kw_only=True):
    jsonrpc: str
    id: RequestId
    result: Any


class Failure(msgspec.Struct, kw_only=True):
    jsonrpc: str
    id: RequestId
    error: ErrorObject


class Notification(msgspec.Struct, kw_only=True):
    jsonrpc: str
    method: str
    params: Any


class Response(msgspec.Struct, kw_only=True):
    """What a client decodes: either `result` or `error` is set."""

    jsonrpc: str = "2.0"
    id: RequestId | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET


class Params(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every method's params: unknown fields are refused."""


class NoParams(Params, kw_only=True, forbid_unknown_fields=True):
    pass


class WriteOptions(Params, kw_only=True, forbid_unknown_fields=True):
    """What every write takes besides its data: the session, the version it must be at, and
    a key that makes a retry answer with the first result (written once, inherited by every
    write's params)."""

    session_id: str
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class WriteParams(WriteOptions, kw_only=True, forbid_unknown_fields=True):
    """Base of a write's params when its data is not an event's data Struct (for those,
    `with_write_options`); alone, the params of message.pop and message.clear."""


S = TypeVar("S", bound=msgspec.Struct)


def with_write_options(data: type[S], name: str, module: str,
                       **replace: tuple[Any, Any]) -> type[S]:
    """`data`'s fields followed by WriteOptions' (in that order, as JSON names them), with
    unknown fields refused: the params of a write whose data is an event's data Struct.

    msgspec cannot inherit two Structs that both have fields, so the class is built here;
    `replace` gives a field another (type, default), as session.create's optional id."""
    fields: list[tuple[str, Any, Any]] = []
    for f in msgspec.structs.fields(WriteOptions):
        kind, default = replace.get(f.name, (f.type, f.default))
        fields.append((f.name, kind, default))
    fields += [(n, k, d) for n, (k, d) in replace.items()
               if n not in WriteOptions.__struct_fields__]
    built = msgspec.defstruct(
        name, [(n, k) if d is msgspec.NODEFAULT else (n, k, d) for n, k, d in fields],
        bases=(data,), module=module, kw_only=True, forbid_unknown_fields=True)
    built.__doc__ = f"{data.__name__}'s fields, then WriteOptions'."
    return cast("type[S]", built)


PROTOCOL_VERSION: Final = "1.3"
"""major.minor of this API: a minor release adds methods and optional fields; a major one
may remove or change them. 1.0 was sessiond 0.1.0, whose ping had neither field below."""


class WriteResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int
