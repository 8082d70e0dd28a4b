"""cleveragents' `Session.as_export_dict()` documents (seed 002) as events."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from ._builder import DocumentBuilder


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
    return ["checksum could not be verified: the seed does not say what it covers, and it is"
            " not the SHA-256 of the document's sorted JSON"]


def documents(path: str) -> Iterator[tuple[str, dict[str, Any], list[str]]]:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    b = DocumentBuilder(doc["session_id"], "cleveragents")
    created = doc.get("created_at")
    b.add("session.created", {
        "namespace": doc.get("namespace") or "local", "actor_name": doc.get("actor_name"),
        "automation_level": doc.get("automation_level"), "metadata": doc.get("metadata") or {},
    }, created)
    for m in sorted(doc.get("messages", []), key=lambda m: m["sequence"]):
        data = {"message_id": m["message_id"], "sequence": m["sequence"], "role": m["role"],
                "content": m["content"], "metadata": m.get("metadata") or {}}
        if m.get("tool_call_id"):
            data["tool_call_id"] = m["tool_call_id"]
        b.add("message.appended", data, m.get("timestamp") or created)
    updated = doc.get("updated_at") or created
    for plan_id in doc.get("linked_plan_ids", []):
        b.add("plan.linked", {"plan_id": plan_id}, updated)
    usage = doc.get("token_usage") or {}
    # Recorded last, at updated_at, so the view's updated_at is the source's.
    b.add("tokens.recorded", {"input_tokens": usage.get("input_tokens", 0),
                              "output_tokens": usage.get("output_tokens", 0),
                              "estimated_cost": usage.get("estimated_cost", 0.0)}, updated)
    yield path, b.document(), _checksum_note(doc)
