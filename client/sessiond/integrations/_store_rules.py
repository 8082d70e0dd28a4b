"""What a LangGraph store item matches: filters, namespace conditions, labels, words,
vectors; and how its value becomes JSON. Pure functions, as LangGraph's stores apply them."""

from __future__ import annotations

import enum
import math
import re
import uuid
from array import array
from datetime import date, datetime
from datetime import time as dt_time
from typing import Any

from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
)


def json_default(value: Any) -> Any:
    """What SqliteStore's orjson makes of values JSON has no type for: times as RFC 3339
    text, UUIDs as text, enums as their value; anything else is a TypeError."""
    if isinstance(value, (datetime, date, dt_time)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"a store value must be JSON: {type(value).__name__} is not")


def query_words(text: str) -> list[str]:
    """The words of a query or a value (`\\w+`, lower case), each once, in order."""
    return list(dict.fromkeys(w.lower() for w in re.findall(r"\w+", text)))


def check_labels(op: Op) -> None:
    """As langgraph's validate_op_namespace (newer releases only): a label is a non-empty
    string without periods or NUL, also in ops handed to batch directly."""
    labels: tuple[str, ...] = ()
    if isinstance(op, (GetOp, PutOp)):
        labels = tuple(op.namespace)
    elif isinstance(op, SearchOp):
        labels = tuple(op.namespace_prefix)
    elif isinstance(op, ListNamespacesOp):
        labels = tuple(label for c in op.match_conditions or () for label in c.path)
    for label in labels:
        if not isinstance(label, str) or not label or "." in label or "\0" in label:
            raise InvalidNamespaceError(
                f"Invalid namespace label {label!r}: labels are non-empty strings without"
                " periods ('.') or NUL bytes")


# --- filters, as InMemoryStore and the SQL stores apply them --------------------------


def _at(value: Any, key: str) -> Any:
    """The value's field `key`; a dotted key ("a.b") reaches into nested objects, as the
    SQL stores' JSON paths do, when the value has no field of that very name."""
    if not isinstance(value, dict):
        return None
    if key in value or "." not in key:
        return value.get(key)
    for part in key.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _compare(item_value: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        if any(k.startswith("$") for k in wanted):
            return all(_operator(item_value, op, v) for op, v in wanted.items())
        return isinstance(item_value, dict) and all(
            _compare(item_value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (isinstance(item_value, (list, tuple)) and len(item_value) == len(wanted)
                and all(_compare(a, b) for a, b in zip(item_value, wanted, strict=True)))
    return bool(item_value == wanted)


def _operator(value: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return bool(value == operand)
    if op == "$ne":
        return bool(value != operand)
    if op not in ("$gt", "$gte", "$lt", "$lte"):
        raise ValueError(f"Unsupported operator: {op}")
    if value is None:
        return False
    try:
        a, b = float(value), float(operand)
    except (TypeError, ValueError):
        a, b = value, operand  # strings compare as strings, as the SQL stores do
        if type(a) is not type(b):
            return False
    return bool({"$gt": a > b, "$gte": a >= b, "$lt": a < b, "$lte": a <= b}[op])


def matches(value: dict[str, Any], filter: dict[str, Any] | None) -> bool:
    """Whether an item's value passes a search filter ({field: value or {$op: value}})."""
    return not filter or all(_compare(_at(value, k), v) for k, v in filter.items())


def namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        pairs = zip(namespace, path, strict=False)
    elif condition.match_type == "suffix":
        pairs = zip(reversed(namespace), reversed(path), strict=False)
    else:
        raise ValueError(f"Unsupported match type: {condition.match_type}")
    return all(p in ("*", n) for n, p in pairs)


def cosine(a: list[float], b: array[float]) -> float:
    dot = math.fsum(x * y for x, y in zip(a, b, strict=False))
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return dot / norms if norms else 0.0
