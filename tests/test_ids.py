"""new_id writes ULIDs by hand (a quarter of python-ulid's time, on every append): they must
be the strings python-ulid would write, carry the time they were made, and sort by it.
now() formats a second once: its strings must be datetime's, whatever the time."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st
from ulid import ULID

from sessiond_schemas import events
from sessiond_schemas.events import new_id, now, rfc3339


def test_new_ids_are_ulids_of_now() -> None:
    before = time.time_ns() // 1_000_000
    made = new_id()
    after = time.time_ns() // 1_000_000
    parsed = ULID.from_str(made)
    assert str(parsed) == made and len(made) == 26
    assert before <= parsed.milliseconds <= after


@given(st.integers(0, (1 << 48) - 1), st.binary(min_size=10, max_size=10))
def test_the_encoding_is_python_ulids(ms: int, randomness: bytes) -> None:
    """For any time and randomness, the same 26 characters as python-ulid."""
    real_time_ns, real_urandom = events.time.time_ns, events.os.urandom
    events.time.time_ns = lambda: ms * 1_000_000  # type: ignore[assignment]
    events.os.urandom = lambda n: randomness  # type: ignore[assignment]
    try:
        made = new_id()
    finally:
        events.time.time_ns, events.os.urandom = real_time_ns, real_urandom
    assert made == str(ULID.from_bytes(ms.to_bytes(6, "big") + randomness))


def test_later_ids_sort_later() -> None:
    first = new_id()
    while time.time_ns() // 1_000_000 <= ULID.from_str(first).milliseconds:
        pass  # the next millisecond
    assert new_id() > first


@given(st.lists(st.integers(-62_135_596_800_000_000, 253_402_300_799_999_999), min_size=1,
                max_size=5))
def test_now_is_datetimes_rfc3339_of_the_clock(times_us: list[int]) -> None:
    """Any microsecond from year 1 to 9999, in any order (the second remembered, or not):
    the string datetime writes for it."""
    for us in times_us:
        expected = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).isoformat(
            timespec="microseconds")[:-6] + "Z"
        assert rfc3339(us * 1000 + 999) == expected


def test_now_is_the_clocks() -> None:
    before = datetime.now(UTC)
    made = datetime.fromisoformat(now())
    assert before <= made <= datetime.now(UTC)
