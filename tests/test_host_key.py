"""The keyed chain (docs/security.md, "The host key"; docs/protocol.md, "Hash versions"):
new events are sealed with the host's key; an export edited and chained again by the
public algorithm does not verify as written here and `import --strict` refuses it; an
unedited one does; a release's unkeyed export still verifies, for integrity."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from conftest import Daemon, daemon_config, running_daemon

from sessiond import AsyncClient, SessionImportError
from sessiond_schemas import export
from sessiond_schemas.events import event_from_builtins

RELEASES = Path(__file__).resolve().parent / "fixtures" / "releases"
pytestmark = pytest.mark.anyio


async def written(client: AsyncClient, sid: str = "k1") -> dict[str, Any]:
    await client.call("session.create", session_id=sid, task="keyed")
    for i in range(3):
        await client.append_message(sid, "user", f"message {i}")
    return await client.export_session(sid)


def rechained(doc: dict[str, Any], *, keep_seals: bool) -> dict[str, Any]:
    """`doc` with its second message changed and the chain made again by the public
    algorithm: version 2 links with the old seals kept (an attacker has no key), or
    version 1 hashes; the checksum made again."""
    doc = copy.deepcopy(doc)
    doc["events"][2]["data"]["content"] = "what the attacker wants it to say"
    prev = ""
    for raw in doc["events"]:
        event = event_from_builtins({**raw, "hash": ""})
        if keep_seals:
            digest = export.data_digest(export.canonical_data(event))
            link = export._link(prev, event, digest)
            old = export.split_v2(raw["hash"])
            assert old is not None
            raw["hash"] = f"{export.V2}{digest}:{link}:{old[2]}"
        else:
            raw["hash"] = export.chain_hash(prev, event)
        prev = raw["hash"]
    doc["checksum"] = export.checksum(doc)
    return doc


class TestKeyedChain:
    async def test_new_events_are_sealed_and_an_unedited_export_is_ours(
            self, daemon: Daemon, client: AsyncClient) -> None:
        doc = await written(client)
        assert all(export.split_v2(e["hash"]) for e in doc["events"])
        result = await client.verify(document=doc)
        assert result.ok and result.sealed_events == len(doc["events"])
        assert result.unkeyed_events == 0 and result.foreign_events == 0
        state = await client.import_session(doc, on_conflict="replace", strict=True)
        assert state.version == len(doc["events"])
        whole = await client.verify()
        assert whole.ok and whole.sealed_events == len(doc["events"])

    @pytest.mark.parametrize("keep_seals", [True, False], ids=["v2-old-seals", "v1"])
    async def test_an_edited_and_rechained_export_is_not_ours(
            self, daemon: Daemon, client: AsyncClient, keep_seals: bool) -> None:
        forged = rechained(await written(client), keep_seals=keep_seals)
        # Its integrity holds by the public algorithm: that is what a re-chain buys...
        result = await client.verify(document=forged)
        assert result.ok and (result.foreign_events or result.unkeyed_events)
        # ...but it is not this host's: at least the edited event is not sealed by it.
        assert result.sealed_events is not None
        assert result.sealed_events < len(forged["events"]) - 1
        with pytest.raises(SessionImportError, match="not written by this host or fleet"):
            await client.import_session(forged, on_conflict="replace", strict=True)
        assert (await client.get_session("k1")).version == len(forged["events"])
        stored = (await client.read_events("k1", from_version=3)).events[0]
        assert stored.fields()["content"] == "message 1"  # nothing was written

    async def test_another_hosts_key_is_foreign(self, short_dir: str, db_url: str,
                                                daemon: Daemon, client: AsyncClient) -> None:
        doc = await written(client)
        other = daemon_config(short_dir, db=str(Path(short_dir) / "other.db"),
                              socket=str(Path(short_dir) / "o.sock"))
        async with running_daemon(other) as d, AsyncClient(d.socket) as c:
            result = await c.verify(document=doc)
            assert result.ok and result.foreign_events == len(doc["events"])
            with pytest.raises(SessionImportError, match="not written by this host"):
                await c.import_session(doc, strict=True)
            await c.import_session(doc)  # without --strict: integrity is enough

    async def test_a_release_export_still_verifies(self, client: AsyncClient) -> None:
        for path in sorted((RELEASES / "0.1.0" / "exports").glob("*.json")):
            doc = json.loads(path.read_text())
            result = await client.verify(document=doc)
            assert result.ok and result.unkeyed_events == len(doc["events"]), path.name
            with pytest.raises(SessionImportError, match="unkeyed version"):
                await client.import_session(doc, strict=True)


@pytest.mark.sqlite_only("each sessionctl call is a process of its own")
async def test_sessionctl_verify_and_import_strict(daemon: Daemon, client: AsyncClient,
                                                   short_dir: str) -> None:
    doc = await written(client)
    ours, forged = Path(short_dir) / "ours.json", Path(short_dir) / "forged.json"
    ours.write_text(json.dumps(doc))
    forged.write_text(json.dumps(rechained(doc, keep_seals=True)))

    async def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        # A process of its own, awaited: the daemon answering it runs in this loop.
        done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                        daemon.socket, *args], check=False)
        return subprocess.CompletedProcess(args, done.returncode, done.stdout.decode(),
                                           done.stderr.decode())

    assert "all written here" in (await ctl("verify", str(ours))).stdout
    out = (await ctl("verify", str(forged))).stdout
    # the edited event and every one after it (their links moved, their seals did not)
    assert "sealed by another key: 2" in out and "all written here" not in out
    offline = await ctl("verify", "--integrity-only", str(forged))
    assert "checksum and chain hold" in offline.stdout
    tampered = json.loads(forged.read_text())
    tampered["events"][1]["data"]["content"] = "changed after the re-chain"
    tampered["checksum"] = export.checksum(tampered)
    forged.write_text(json.dumps(tampered))
    bad = await ctl("verify", "--integrity-only", str(forged))
    assert bad.returncode == 1 and "hash chain broken at version 2" in bad.stderr
    refused = await ctl("import", "--strict", "--on-conflict", "replace", str(Path(short_dir)
                                                                         / "ours.json"))
    assert refused.returncode == 0, refused.stderr
    forged.write_text(json.dumps(rechained(doc, keep_seals=False)))
    refused = await ctl("import", "--strict", "--on-conflict", "replace", str(forged))
    assert refused.returncode == 1 and "not written by this host" in refused.stdout \
        + refused.stderr
    assert msgspec.json.decode(json.dumps(doc).encode())  # the document itself is fine
