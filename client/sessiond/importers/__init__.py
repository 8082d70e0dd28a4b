"""Importers for the seeds' own stores: each turns foreign data into ordinary events.

An importer builds an export document (with `session: null`: the daemon folds the
view from the events) keeping the source's times, and `session.import` checks and
stores it like any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import cleveragents, hive, zwarm
from ._builder import DocumentBuilder

# format -> (path -> [(source file, export document, warnings)])
FORMATS: dict[str, Callable[[str], Iterator[tuple[str, dict[str, Any], list[str]]]]] = {
    "hive": hive.documents,
    "cleveragents": cleveragents.documents,
    "zwarm": zwarm.documents,
}

__all__ = ["FORMATS", "DocumentBuilder"]
