"""Typed event data keeps every hash: what an event's hash covers is the canonical JSON of
its data as stored (Event.data_json, kept as stored), and what the daemon stores and
hashes for data it builds as a Struct is byte for byte what the dict encoding before it
stored and hashed (`msgspec.to_builtins`, then the encoders). Checked over every event of
the release fixtures (tests/fixtures/releases/: their databases and export documents),
and as a hypothesis property over every data Struct of the table (DATA_TYPES)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import msgspec.inspect as mi
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sessiond_daemon.stores.rows import EVENT_COLUMNS, event_from_row
from sessiond_schemas.events import (
    DATA_TYPES,
    Data,
    Event,
    Record,
    SessionForked,
    Unread,
    canonical_json,
    decode_raw,
    encode_data,
    event_from_builtins,
)
from sessiond_schemas.export import canonical, chain_hash

RELEASES = Path(__file__).resolve().parent / "fixtures" / "releases"
DATABASES = sorted(RELEASES.glob("*/sessiond.db"))
EXPORTS = sorted(RELEASES.glob("*/exports/*.json"))
_plain = msgspec.json.Encoder()


def stored_events(db: Path) -> list[Event]:
    con = sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True)
    try:
        rows = con.execute(f"SELECT {EVENT_COLUMNS} FROM events ORDER BY position").fetchall()
    finally:
        con.close()
    return [event_from_row(r) for r in rows]


def exported_events(doc: Path) -> list[Event]:
    return [event_from_builtins(e) for e in json.loads(doc.read_text())["events"]]


def test_the_fixtures_are_there() -> None:
    assert DATABASES and EXPORTS  # a glob that finds nothing would check nothing


@pytest.mark.parametrize("source", [*DATABASES, *EXPORTS], ids=lambda p: p.name)
def test_every_fixture_event_keeps_its_hash_and_types(source: Path) -> None:
    """Each stored (and exported) event: its chain verifies over its data as stored, and
    its data types as its type's Struct (none is Unread), as the store boundary and a
    client decode it alike. The typed data need not encode back to the stored bytes
    (defaults a release left out, ints where floats are typed, an importer's extra
    fields): that is why they are kept, and what the hash covers."""
    events = stored_events(source) if source.suffix == ".db" else exported_events(source)
    assert events
    chains: dict[str, str] = {}
    for e in events:
        if e.type == "session.forked" and e.session_id not in chains:
            chains[e.session_id] = e.fields()["from"]["hash"]
        chains[e.session_id] = chain_hash(chains.get(e.session_id, ""), e)
        assert chains[e.session_id] == e.hash, (source.name, e.session_id, e.version)
        assert not isinstance(e.data, Unread), (e.type, e.data)
        assert e.data == decode_raw(e.type, e.data_json, e.schema_version)


# --- the property: a Struct encodes as its builtins did --------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8)


def _of(t: mi.Type) -> st.SearchStrategy[Any]:
    """Values of a msgspec type (within its constraints), as the Struct would hold them."""
    if isinstance(t, mi.UnionType):
        return st.one_of([_of(x) for x in t.types])
    if isinstance(t, mi.NoneType):
        return st.none()
    if isinstance(t, mi.BoolType):
        return st.booleans()
    if isinstance(t, mi.IntType):
        return st.integers(t.ge if t.ge is not None else -(2**63),
                           t.le if t.le is not None else 2**63 - 1)
    if isinstance(t, mi.FloatType):  # a float, as a decoded param holds it
        return st.floats(t.ge, t.le, allow_nan=False, allow_infinity=False)
    if isinstance(t, mi.StrType):
        if t.pattern is not None:
            return st.from_regex(t.pattern, fullmatch=True)
        return st.text(min_size=t.min_length or 0, max_size=12).filter(lambda s: s.strip())
    if isinstance(t, mi.BytesType):
        return st.binary(max_size=8)
    if isinstance(t, mi.LiteralType):
        return st.sampled_from(t.values)
    if isinstance(t, mi.ListType):
        low = t.min_length or 0
        high = max(low, 3) if t.max_length is None else min(max(low, 3), t.max_length)
        return st.lists(_of(t.item_type), min_size=low, max_size=high)
    if isinstance(t, mi.TupleType):
        return st.tuples(*(_of(x) for x in t.item_types))
    if isinstance(t, mi.DictType):
        if isinstance(t.value_type, mi.AnyType):
            return st.dictionaries(st.text(max_size=5), _JSON, max_size=3)
        return st.dictionaries(_of(t.key_type), _of(t.value_type), max_size=2)
    if isinstance(t, mi.StructType):
        return _struct(t.cls)
    if isinstance(t, mi.AnyType):
        return _JSON
    raise AssertionError(f"no strategy for {t}")


def _struct(cls: type[msgspec.Struct]) -> st.SearchStrategy[Any]:
    if cls is Record:
        return st.builds(Record, body=st.dictionaries(st.text(max_size=5), _JSON, max_size=3))
    info = mi.type_info(cls)
    assert isinstance(info, mi.StructType)
    fields = {f.name: (_of(f.type) if f.required else _of(f.type) | st.just(f.default))
              for f in info.fields if f.default_factory is mi.NODEFAULT or f.required}
    defaults = {f.name: st.just(f.default_factory()) | _of(f.type)
                for f in info.fields if f.default_factory is not mi.NODEFAULT}

    def build(values: dict[str, Any]) -> Any:
        try:
            return cls(**values)
        except (ValueError, TypeError):  # __post_init__'s checks
            return None

    return st.fixed_dictionaries({**fields, **defaults}).map(build).filter(
        lambda v: v is not None)


def _builtins(data: Any) -> Any:
    """The data as the writer before typed data handed it to the encoders."""
    return data.body if isinstance(data, Record) else msgspec.to_builtins(data)


@pytest.mark.parametrize("event_type", sorted(DATA_TYPES))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_struct_stores_and_hashes_what_its_builtins_did(event_type: str,
                                                          data: st.DataObject) -> None:
    """For any value of the type's Struct: the bytes stored (encode_data) and hashed
    (canonical_json) are those the dict encoding stored and hashed, and they read back
    as the same Struct."""
    value = data.draw(_struct(DATA_TYPES[event_type]))
    as_dict = _builtins(value)
    assert encode_data(value) == _plain.encode(as_dict)
    assert canonical_json(value) == canonical(as_dict)
    back = decode_raw(event_type, encode_data(value))
    assert not isinstance(back, Unread), back
    assert canonical_json(back) == canonical_json(value)


def _data_classes() -> list[type[Data]]:
    """Data and every Struct under it (Record, Unread, the parts such as ForkSource)."""
    found: list[type[Data]] = []
    todo: list[type[Data]] = [Data]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo += kind.__subclasses__()
    return found


@pytest.mark.parametrize("kind", _data_classes(), ids=lambda k: k.__name__)
def test_event_data_is_read_by_attribute_only(kind: type[Data]) -> None:
    """Issue 25: no string-keyed reads of event data. Data and its Structs have no read
    by JSON name (`d["from"]`, `d.get(...)`, `"x" in d`), so mypy --strict refuses one in
    the daemon and a call at run time raises; Record's and Unread's `.body` is the dict."""
    for name in ("__getitem__", "get", "__contains__", "keys", "items"):
        assert not hasattr(kind, name), f"{kind.__name__}.{name} reads data by JSON name"


def test_a_read_by_json_name_raises() -> None:
    forked = decode_raw("session.forked", msgspec.json.encode(
        {"from": {"session_id": "a", "version": 1, "hash": "h"}, "state": {}}))
    assert isinstance(forked, SessionForked) and forked.from_.version == 1
    with pytest.raises(TypeError):
        forked["from"]  # type: ignore[index]
    record = decode_raw("problem.recorded", b'{"x": 1}')
    assert isinstance(record, Record) and record.body == {"x": 1}
    with pytest.raises(TypeError):
        record["x"]  # type: ignore[index]
