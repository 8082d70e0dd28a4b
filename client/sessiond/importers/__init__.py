"""Importers for the seeds' own stores and the agent CLIs' transcripts: each turns foreign
data into ordinary events.

A store importer (hive, cleveragents, zwarm) builds an export document (with
`session: null`: the daemon folds the view from the events) keeping the source's times,
and `session.import` checks and stores it like any other; what it cannot read is a
`Found` with a `Problem` naming the file, the JSON path and the reason. The transcript
importers (claude-code, codex: `transcripts.TranscriptImporter`) talk to the daemon
themselves, since they append to sessions as their transcripts grow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from . import cleveragents, hive, zwarm
from ._builder import DocumentBuilder, Found, Problem

# format -> (path, strict) -> one Found per session (or per file that failed)
FORMATS: dict[str, Callable[[str, bool], Iterator[Found]]] = {
    "hive": hive.documents,
    "cleveragents": cleveragents.documents,
    "zwarm": zwarm.documents,
}
TRANSCRIPTS = ("claude-code", "codex")

__all__ = ["FORMATS", "TRANSCRIPTS", "DocumentBuilder", "Found", "Problem"]
