"""The event types are written in one table (sessiond_schemas.events.DATA_TYPES); every
other list of them is derived from it or held to it here: EventType, the fold's branches,
what events.append takes, and docs/protocol.md's table of event types."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import msgspec
import pytest

from sessiond_daemon.core.projection import _BRANCHES, _UNREAD
from sessiond_daemon.features.service import _INSTEAD, APPEND_INPUTS, RUNNER_ONLY
from sessiond_schemas import rpc
from sessiond_schemas.events import DATA_TYPES, EVENT_TYPES, EventType, Record, SessionForked

DOCS = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def documented() -> dict[str, tuple[list[str], bool]]:
    """docs/protocol.md's table: type -> (its data fields, `*` kept; events.append takes it)."""
    text = DOCS.read_text()
    table = text[text.index("<!-- event-types -->"):text.index("<!-- /event-types -->")]
    rows: dict[str, tuple[list[str], bool]] = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        found = re.fullmatch(r"`([a-z_.]+)`", cells[0])
        if found is None:
            continue
        assert found.group(1) not in rows, f"{found.group(1)} is listed twice"
        fields = re.findall(r"`(\w+)`(\*?)", cells[1])
        rows[found.group(1)] = ([name + star for name, star in fields], cells[2] == "yes")
    return rows


def test_event_type_literal_is_the_table() -> None:
    """What events.append and the type filters accept is exactly the table's types."""
    assert typing.get_args(EventType) == EVENT_TYPES == tuple(DATA_TYPES)
    for struct in (rpc.EventInput, rpc.EventsReadParams, rpc.EventsSubscribeParams):
        [kind] = [f.type for f in msgspec.structs.fields(struct) if f.name in ("type", "types")]
        assert EventType in (kind, *typing.get_args(kind),
                             *(a for k in typing.get_args(kind) for a in typing.get_args(k)))
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"type": "no.such_type"}, rpc.EventInput)
    for event_type in DATA_TYPES:
        assert msgspec.convert({"type": event_type}, rpc.EventInput).type == event_type


def test_every_type_has_its_fold_branch_typed_by_its_struct() -> None:
    """Each type in the table has a branch, and each branch a type; the branch takes the
    type's own data Struct (the fold decodes once, for it), or None for a type whose data
    the fold does not read (then it is not decoded at all)."""
    assert set(_BRANCHES) == set(DATA_TYPES)
    assert set(DATA_TYPES) >= _UNREAD
    for event_type, branch in _BRANCHES.items():
        hint = typing.get_type_hints(branch)["d"]
        expected = type(None) if event_type in _UNREAD else DATA_TYPES[event_type]
        assert hint is expected, (event_type, hint)


def test_events_append_covers_the_table() -> None:
    """events.append knows every type: a shape to validate, or the method to use instead."""
    assert set(APPEND_INPUTS) == set(DATA_TYPES)
    refused = {t for t, shape in APPEND_INPUTS.items() if shape is None}
    assert refused == set(_INSTEAD)
    assert set(DATA_TYPES) >= RUNNER_ONLY


def test_docs_list_every_type_with_its_fields() -> None:
    """docs/protocol.md lists each type once, with its data's fields (required ones marked)
    and whether events.append takes it; and no type the daemon does not have."""
    docs = documented()
    assert set(docs) == set(DATA_TYPES)
    for event_type, (fields, appendable) in docs.items():
        kind = DATA_TYPES[event_type]
        # A Record's JSON is its body, any object: no fields of its own.
        expected = [] if kind is Record else [f.encode_name + ("*" if f.required else "")
                                              for f in msgspec.structs.fields(kind)]
        assert fields == expected, event_type
        takes = event_type not in RUNNER_ONLY and APPEND_INPUTS[event_type] is not None
        assert appendable == takes, event_type


def test_a_fork_is_first_only() -> None:
    """session.forked, like session.created, starts a history and is refused after it."""
    assert DATA_TYPES["session.forked"] is SessionForked
    assert _BRANCHES["session.forked"] is _BRANCHES["session.created"]
