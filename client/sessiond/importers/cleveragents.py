"""cleveragents' `Session.as_export_dict()` documents (seed 002) as events."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

from ._builder import DocumentBuilder, Found, Problem, TDict, load_json, problem_of, root_object

UNVERIFIED = ("checksum could not be verified: cleveragents' export format does not say what"
              " it covers, and it is not the SHA-256 of the document's sorted JSON")


def _checksum_note(doc: dict[str, Any]) -> list[str]:
    """Verify the document's checksum where it can be recomputed; say so plainly if not."""
    given = doc.get("checksum")
    if not given:
        return ["no checksum in the document"]
    body = {k: v for k, v in doc.items() if k != "checksum"}
    for text in (json.dumps(body, sort_keys=True, separators=(",", ":"), default=str),
                 json.dumps(body, sort_keys=True, default=str)):
        digest = hashlib.sha256(text.encode()).hexdigest()
        if given in (digest, f"sha256:{digest}"):
            return []
    return [UNVERIFIED]


def _files(path: str) -> list[str]:
    """One file, or every *.json file of a folder."""
    if os.path.isdir(path):
        return sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".json"))
    return [path]


def documents(path: str, strict: bool = False) -> Iterator[Found]:
    if not os.path.lexists(path):
        yield Found(path, problem=Problem("no such file or directory"))
        return
    for file in _files(path):
        try:
            loaded = load_json(file)
            doc = root_object(loaded, "an as_export_dict() document")
            notes = _checksum_note(doc)
            if strict and notes:
                raise Problem(f"--strict: {notes[0]}", "$.checksum")
            yield Found(file, _convert(doc), notes)
        except Exception as exc:  # every failure is this file's result
            yield Found(file, problem=problem_of(exc))


def _convert(doc: TDict) -> dict[str, Any]:
    sid = doc.text("session_id", required=True)
    b = DocumentBuilder(sid, "cleveragents")
    created = doc.time("created_at", required=True)
    b.add("session.created", {
        "namespace": doc.text("namespace") or "local", "actor_name": doc.get("actor_name"),
        "automation_level": doc.get("automation_level"), "metadata": doc.obj("metadata"),
    }, created)
    messages: list[TDict] = []
    for m in doc.seq("messages"):
        if not isinstance(m, TDict):
            raise Problem("expected an object", f"$.messages[{len(messages)}]")
        m.number("sequence")
        messages.append(m)
    for m in sorted(messages, key=lambda m: m.number("sequence")):
        data = {"message_id": m.text("message_id", required=True),
                "sequence": m.number("sequence"), "role": m.text("role", required=True),
                "content": m.text("content", required=True), "metadata": m.obj("metadata")}
        if m.get("tool_call_id"):
            data["tool_call_id"] = m.text("tool_call_id")
        b.add("message.appended", data, m.time("timestamp") or created)
    updated = doc.time("updated_at") or created
    for plan_id in doc.seq("linked_plan_ids"):
        b.add("plan.linked", {"plan_id": plan_id}, updated)
    usage = doc.obj("token_usage")
    # Recorded last, at updated_at, so the view's updated_at is the source's.
    b.add("tokens.recorded", {"input_tokens": usage.number("input_tokens"),
                              "output_tokens": usage.number("output_tokens"),
                              "estimated_cost": usage.number("estimated_cost")}, updated)
    return b.document()
