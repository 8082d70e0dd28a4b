"""SQLite's index reads its text through one SQL function, called for an event's body and
then for its tags (the `search_source` view); the second call is answered from the
first's decode. Whatever the order of the calls and events, each answer is the event's
own text (`text_of` on its data), never another event's."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from sessiond_daemon.stores.models.search_text import INDEXED_TYPES, text_of
from sessiond_daemon.stores.sqlite import search

_DATA = st.sampled_from([
    {"content": "one", "metadata": {"k": "a"}},
    {"content": "two", "tool_call_id": "t1"},
    {"task": "a task", "actor_name": "me", "metadata": {"n": 1}},
    {"patch": {"x": "y"}},
    {"error": "boom"},
    {"state": {"task": "forked", "metadata": {"m": "z"}}},
])
_CALL = st.tuples(st.sampled_from([0, 1]), st.sampled_from(INDEXED_TYPES), _DATA,
                  st.booleans())


@given(st.lists(_CALL, max_size=40))
def test_each_call_answers_its_own_events_text(calls: list[tuple[int, str, Any, bool]]
                                               ) -> None:
    for column, event_type, data, as_text in calls:
        raw = json.dumps(data)
        stored: bytes | str = raw if as_text else raw.encode()
        assert search._sql_text(column, event_type, stored) == text_of(event_type, data)[column]


def test_data_that_is_not_json_has_no_text_and_is_not_remembered_as_another() -> None:
    assert search._sql_text(0, "message.appended", b'{"content": "kept"}') == "kept"
    assert search._sql_text(1, "message.appended", b"{not json") is None
    assert search._sql_text(0, "message.appended", b"{not json") is None
    assert search._sql_text(0, "message.appended", b'{"content": "kept"}') == "kept"


def test_a_large_event_is_not_held_after_its_texts() -> None:
    """Only an event of up to MEMO_MAX_BYTES is remembered: a larger one is decoded for
    each of its two calls, and nothing of it stays in memory."""
    small = b'{"content": "small"}'
    assert search._sql_text(0, "message.appended", small) == "small"
    large = b'{"content": "' + b"x" * search.MEMO_MAX_BYTES + b'"}'
    assert search._sql_text(0, "message.appended", large) == "x" * search.MEMO_MAX_BYTES
    assert search._sql_text(1, "message.appended", large) is None
    held = search._last[0]
    assert held is not None and held[1] == small
