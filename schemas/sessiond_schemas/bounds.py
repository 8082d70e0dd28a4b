"""Bounds on every number that reaches storage: signed 64-bit integers and finite floats.

msgspec has no "finite" constraint, so finite floats are the floats between
-max and +max: infinity fails the bound, and NaN fails every comparison. -0.0
passes (it equals 0.0). Free-form JSON (metadata, memory, payloads) is checked
by `json_out_of_bounds`.
"""

from __future__ import annotations

import math
import sys
from typing import Annotated, Any, Final

import msgspec

INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
FLOAT_MAX: Final = sys.float_info.max
PID_MAX: Final = 2**31 - 1  # pid_t is a signed 32-bit int
# A run of 19 digits is looked for in the text with every digit mapped to "0" and every
# other byte to " " (translate and `in` run at memory speed; a regex tries each position).
_DIGITS_AS_ZERO: Final = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
_LONG_RUN: Final = b"0" * 19  # 18 digits always fit in an int64
_encoder = msgspec.json.Encoder()

Int64 = Annotated[int, msgspec.Meta(ge=INT64_MIN, le=INT64_MAX)]
NonNegInt = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
PosInt = Annotated[int, msgspec.Meta(ge=1, le=INT64_MAX)]
Float64 = Annotated[float, msgspec.Meta(ge=-FLOAT_MAX, le=FLOAT_MAX)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0, le=FLOAT_MAX)]
# 0 is "not known" (an importer's history without one); a pid is history, never a target.
Pid = Annotated[int, msgspec.Meta(ge=0, le=PID_MAX)]


def in_bounds(value: Any) -> bool:
    """True for an int within int64 or a finite float (bool is neither checked nor refused)."""
    if isinstance(value, bool):
        return True
    if isinstance(value, int):
        return INT64_MIN <= value <= INT64_MAX
    if isinstance(value, float):
        return math.isfinite(value)
    return True


def json_out_of_bounds(value: Any, path: str = "$",
                       encoded: bytes | None = None) -> tuple[str, Any] | None:
    """The JSON path and value of the first number in `value` that is not an int64 or a
    finite float, or None when every number is within bounds.

    `value` is JSON as decoded (pass its encoding if at hand). The JSON decoder refuses
    floats past the double range, so only long integers need looking for: the encoded
    text is scanned for a run of 19 digits first, and walked only if it has one.
    """
    if encoded is None:
        encoded = _encoder.encode(value)
    if not has_long_digits(encoded) or _all_in_bounds(value):
        return None
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in reversed(item.items()))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(item))))
        elif not in_bounds(item):
            return at, item
    return None


def has_long_digits(encoded: bytes) -> bool:
    """True when the text holds a run of 19 or more ASCII digits (a number that may be past
    int64; shorter ones never are)."""
    return _LONG_RUN in encoded.translate(_DIGITS_AS_ZERO)


def _all_in_bounds(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (int, float)) and not in_bounds(item):
            return False
    return True


def bound_message(path: str, value: Any) -> str:
    """Say what is wrong with the number at `path`."""
    if isinstance(value, float):
        return f"{path[2:] or 'value'} must be a finite number, not {value!r}"
    return (f"{path[2:] or 'value'} must be a signed 64-bit integer"
            f" ({INT64_MIN} to {INT64_MAX}), not {value!r}")
