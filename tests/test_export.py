"""Export and import: round trips, and every kind of damaged document refused whole."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import sys
from typing import Any

import anyio
import msgspec
import pytest
from conftest import Daemon, daemon_config, running_daemon
from hypothesis import given
from hypothesis import strategies as st

from sessiond import (
    AsyncClient,
    Client,
    SessionExistsError,
    SessionExportError,
    SessionImportError,
    SessionNotFoundError,
)
from sessiond_schemas.events import Event, EventMeta, TokensRecorded, event_from_builtins
from sessiond_schemas.export import canonical, chain_hash, checksum

pytestmark = pytest.mark.anyio


async def rich_session(c: AsyncClient, sid: str = "trip") -> None:
    await c.create_session(sid, task="round trip", actor_name="ns/bot", metadata={"k": 1})
    await c.append_messages(sid, [{"role": "user", "content": "hi"},
                                  {"role": "assistant", "content": "hello", "metadata": {"m": 2}}])
    await c.record_tokens(sid, input_tokens=10, output_tokens=3, estimated_cost=0.25)
    await c.record_progress(sid, "plan", edge="start->plan", retries=1)
    await c.save_checkpoint(sid, {"cursor": [1, 2, 3]}, node_id="plan", memory={"a": 1})
    await c.update_memory(sid, {"x": {"y": True}})
    await c.link_plan(sid, "p1")
    await c.transition(sid, "paused", reason="lunch")


def resealed(doc: dict[str, Any]) -> dict[str, Any]:
    """The document with a checksum that matches its (changed) content."""
    doc = copy.deepcopy(doc)
    doc["checksum"] = checksum(doc)
    return doc


async def test_round_trip_into_a_fresh_daemon(daemon: Daemon, client: AsyncClient,
                                              short_dir: str) -> None:
    """export -> import elsewhere (a SQLite daemon, whichever store exported) -> export:
    same events, same view; checksums differ only by exported_at. Checkpoints come along."""
    await rich_session(client)
    first = await client.export_session("trip")
    assert first["format"] == "sessiond.export" and first["checksum"] == checksum(first)
    other = os.path.join(short_dir, "other")
    os.mkdir(other)
    async with running_daemon(daemon_config(other)) as d2, AsyncClient(d2.socket) as c2:
        state = await c2.import_session(first)
        assert state == await client.get_session("trip")
        second = await c2.export_session("trip")
        assert (await c2.get_checkpoint("trip")).payload == {"cursor": [1, 2, 3]}
        assert (await c2.verify()).ok
        await c2.append_message("trip", "user", "goes on after import")
    assert second["events"] == first["events"] and second["session"] == first["session"]
    assert second["checksum"] != first["checksum"]
    second["exported_at"] = first["exported_at"]
    assert checksum(second) == first["checksum"]


async def test_an_export_that_cannot_be_written_raises_session_export_error(
        daemon: Daemon, client: AsyncClient) -> None:
    """Writing the document to a full disk (/dev/full) raises SessionExportError naming
    the session (an OSError too); the same from the blocking client."""
    await client.create_session("ex")
    await client.append_messages("ex", [{"role": "user", "content": f"m{i}"} for i in range(3)])
    with open("/dev/full", "w", buffering=1) as full, \
            pytest.raises(SessionExportError) as err:
        await client.export_session_to("ex", full)
    assert isinstance(err.value, OSError) and err.value.data["session_id"] == "ex"
    assert "No space left" in err.value.message and "/dev/full" in err.value.message

    def blocking() -> None:
        with Client(daemon.socket) as c, open("/dev/full", "w", buffering=1) as full, \
                pytest.raises(OSError) as again:
            c.export_session_to("ex", full)
        assert isinstance(again.value, SessionExportError)
    await anyio.to_thread.run_sync(blocking)


async def test_damaged_documents_are_refused_whole(daemon: Daemon, client: AsyncClient) -> None:
    """Flipped byte, missing or reordered event, unknown version, invalid JSON, forged data."""
    await rich_session(client, "src")
    doc = await client.export_session("src")
    await client.delete_session("src")
    flipped = json.dumps(doc).replace('"hello"', '"hellp"')
    missing = copy.deepcopy(doc)
    del missing["events"][3]
    reordered = copy.deepcopy(doc)
    reordered["events"][2], reordered["events"][3] = reordered["events"][3], reordered["events"][2]
    future = dict(doc, format_version=2)
    forged = copy.deepcopy(doc)
    forged["events"][1]["data"]["content"] = "forged"
    wrong_view = copy.deepcopy(doc)
    wrong_view["session"]["message_count"] = 7
    cases = [
        (flipped, "checksum mismatch"),
        (resealed(missing), "version 4 is missing or out of order"),
        (resealed(reordered), "version 3 is missing or out of order"),
        (resealed(future), "unknown format_version 2"),
        ("{not json", "invalid JSON"),
        (resealed(forged), "hash chain broken at version 2"),
        (resealed(wrong_view), "view does not match its events"),
        ([1, 2], "not an export document"),
    ]
    for document, reason in cases:
        with pytest.raises(SessionImportError) as err:
            await client.import_session(document)
        assert err.value.code == -32007 and reason in err.value.data["reason"], reason
        with pytest.raises(SessionNotFoundError):
            await client.get_session("src")  # nothing of it was stored
    assert daemon.sql("SELECT COUNT(*) FROM events") == [(0,)]
    assert (await client.import_session(doc)).session_id == "src"  # the intact one goes in


async def test_on_conflict(daemon: Daemon, client: AsyncClient) -> None:
    """error: -32004; skip: the session as it is; replace: the document's history, whole."""
    await rich_session(client, "c")
    doc = await client.export_session("c")
    await client.append_message("c", "user", "newer than the export")
    with pytest.raises(SessionExistsError):
        await client.import_session(doc)
    kept = await client.import_session(doc, on_conflict="skip")
    assert kept.message_count == 3
    replaced = await client.import_session(doc, on_conflict="replace")
    assert replaced.message_count == 2 and replaced.version == len(doc["events"])
    assert (await client.verify()).ok


@pytest.mark.slow_on_postgresql
async def test_cli_export_and_import(daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """`sessionctl export -o` and `sessionctl import` of several files, with a JSON summary."""
    paths = []
    for sid in ("e1", "e2", "e3"):
        await rich_session(client, sid)
        path = os.path.join(short_dir, f"{sid}.json")
        await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket,
                                 "export", sid, "-o", path])
        paths.append(path)
        await client.delete_session(sid)
    with open(paths[2], "a") as f:
        f.write("garbage")
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "import", *paths,
         "--json"], check=False)
    summary = json.loads(result.stdout)
    assert result.returncode == 1
    assert [i["session_id"] for i in summary["imported"]] == ["e1", "e2"]
    failed = summary["failed"][0]
    assert failed["file"] == paths[2] and "invalid JSON" in failed["error"]


async def test_old_schema_events_import_and_read_as_stored(daemon: Daemon,
                                                          client: AsyncClient) -> None:
    """A version-0 event is stored as written (its hash holds) and folded upcast."""
    from sessiond_daemon.core.projection import fold

    await client.create_session("old")
    await client.record_tokens("old", input_tokens=1)
    doc = await client.export_session("old")
    await client.delete_session("old")
    doc["events"][1]["schema_version"] = 0
    doc["events"][1]["data"] = {"total_input_tokens": 40, "total_output_tokens": 2}
    prev = ""
    for raw in doc["events"]:
        prev = raw["hash"] = chain_hash(prev, event_from_builtins(raw))
    events = [event_from_builtins(e) for e in doc["events"]]
    doc["session"] = msgspec.to_builtins(fold(None, events))
    state = await client.import_session(resealed(doc))
    assert (state.token_usage.input_tokens, state.token_usage.output_tokens) == (40, 2)
    [stored] = (await client.read_events("old", types=["tokens.recorded"])).events
    assert stored.schema_version == 0 and stored.fields() == {"total_input_tokens": 40,
                                                               "total_output_tokens": 2}
    # typed, it reads upcast (the client decodes it as the daemon does)
    assert stored.data == TokensRecorded(input_tokens=40, output_tokens=2)
    assert (await client.verify()).ok


@given(data=st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3), max_leaves=8)),
       prev=st.sampled_from(["", "ab" * 32]))
def test_chain_hash_is_the_documented_canonical_json(data: dict[str, Any], prev: str) -> None:
    """chain_hash builds the body from the data's canonical JSON (encoded once, by the
    writer) and the rest: the bytes hashed are those docs/protocol.md names, exactly."""
    event = Event(position=7, session_id="s", version=3, event_id="01J", type="plan.linked",
                  schema_version=1, recorded_at="2026-12-01T00:00:00.000000Z",
                  data_json=msgspec.Raw(canonical(data)),
                  meta=EventMeta(peer_uid=1000, idempotency_key="k"), hash="")
    body = json.dumps({k: msgspec.to_builtins(v) for k, v in {
        "session_id": "s", "version": 3, "event_id": "01J", "type": "plan.linked",
        "schema_version": 1, "recorded_at": "2026-12-01T00:00:00.000000Z", "data": data,
        "meta": event.meta}.items()}, sort_keys=True, separators=(",", ":"),
        ensure_ascii=False).encode()
    expected = hashlib.sha256(prev.encode() + body).hexdigest()
    assert chain_hash(prev, event) == expected
    assert chain_hash(prev, event, canonical(data)) == expected
