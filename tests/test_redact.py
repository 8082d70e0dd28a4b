"""Redaction before anything is stored (docs/security.md, "Redaction"): the corpus of fake
credentials (tests/redact_corpus.py) on the rules alone, then through a real daemon on
every write path, on both stores: the raw database files, an export, search results and
subscriptions never hold them; look-alikes survive untouched."""

from __future__ import annotations

import base64
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pg
import pytest
from conftest import Daemon, eventually
from redact_corpus import LOOK_ALIKES, SECRETS, secret_text

from sessiond import AsyncClient
from sessiond.importers._builder import DocumentBuilder
from sessiond_daemon.core.redact import KINDS, Redactor, Setting
from sessiond_daemon.stores.postgres import dsn

KEY = b"k" * 32


def fragments(secret: str) -> list[str]:
    """Pieces of a secret long enough to be its own (none of them may survive)."""
    body = secret.replace("\n", "")
    pieces = [body[i:i + 12] for i in range(0, max(1, len(body) - 11), 6)]
    return [p for p in pieces if "-----" not in p]  # a PEM's armour is no secret


def leaked(blob: str | bytes) -> list[str]:
    """The corpus's secrets found (whole or by a piece) in `blob`."""
    text = blob.decode(errors="replace") if isinstance(blob, bytes) else blob
    text = text.replace("\\n", "\n")
    return [f"{kind}: {piece}" for kind, secret, _ in SECRETS
            for piece in fragments(secret) if piece in text][:3]


class TestRules:
    def test_every_credential_of_the_corpus_is_replaced(self) -> None:
        """Recall: every secret of the corpus is gone, the text around it kept."""
        redactor = Redactor(KEY)
        for index, (kind, secret, around) in enumerate(SECRETS):
            out = redactor.text(secret_text(index))
            assert not leaked(out.replace(secret, "")) and secret not in out, (kind, out)
            before, after = around.split("{}")
            assert out.startswith(before.split("=")[0][:8]), out
            assert "[redacted:" in out and out.endswith(after[-6:] if after else ""), out
        assert set(redactor.counts) <= KINDS

    def test_a_specific_rule_names_the_kind(self) -> None:
        redactor = Redactor(KEY)
        for index, (kind, _, _) in enumerate(SECRETS):
            if kind in ("secret-assignment", "pypi-token", "anthropic-key", "aws-access-key"):
                continue  # a NAME=value around them: named by whichever is more specific
            assert f"[redacted:{kind}:" in redactor.text(secret_text(index)), kind

    def test_look_alikes_survive(self) -> None:
        """False positives: none in the corpus of look-alikes."""
        redactor = Redactor(KEY)
        for text in LOOK_ALIKES:
            assert redactor.text(text) == text
        assert not redactor.counts

    def test_redacting_twice_changes_nothing(self) -> None:
        redactor = Redactor(KEY)
        for index in range(len(SECRETS)):
            once = redactor.text(secret_text(index))
            assert redactor.text(once) == once

    def test_digest_tells_secrets_apart_without_showing_them(self) -> None:
        redactor = Redactor(KEY)
        a, b = SECRETS[13][1], SECRETS[14][1]  # two GitHub tokens
        same = redactor.text(f"{a} and again {a}")
        assert same.count(redactor.mark("github-token", a)) == 2
        assert redactor.mark("github-token", a) != redactor.mark("github-token", b)
        assert Redactor(b"x" * 32).mark("github-token", a) != redactor.mark("github-token", a)
        assert Redactor(KEY, digest=False).text(a) == "[redacted:github-token]"

    def test_json_keys_that_say_secret(self) -> None:
        redactor = Redactor(KEY)
        data = {"tool_calls": [{"name": "login", "arguments": {
            "username": "alice", "password": "correct-horse-battery", "api_key": "abcdef123456",
            "max_tokens": 100000, "token_count": "1234567", "note": "the password field"}}]}
        out = redactor.redact_json("message.appended", "local", msgspec.json.encode(data))
        assert out is not None
        args = out["tool_calls"][0]["arguments"]
        assert args["password"].startswith("[redacted:secret-assignment:")
        assert args["api_key"].startswith("[redacted:secret-assignment:")
        assert args["username"] == "alice" and args["max_tokens"] == 100000
        assert args["token_count"] == "1234567" and args["note"] == "the password field"

    def test_opaque_payloads_are_never_touched(self) -> None:
        """A stream's base64 chunk and a graph's serialized values keep their bytes, even
        when they happen to spell a credential; a graph's JSON metadata is redacted."""
        redactor = Redactor(KEY)
        aws = SECRETS[0][1]
        chunk = {"base64": aws}  # 20 characters: valid base64, and an AWS key id
        assert redactor.redact_json("stream.chunk", "local", msgspec.json.encode(chunk)) is None
        blob = base64.b64encode(secret_text(0).encode()).decode()
        graph = {"thread_id": "t", "checkpoint_id": "c", "metadata": {"note": secret_text(13)},
                 "checkpoint": {"type": "msgpack", "data": aws},
                 "blobs": {"x": {"type": "json", "data": blob}}, "channel_versions": {"x": "1"}}
        out = redactor.redact_json("graph.checkpoint", "local", msgspec.json.encode(graph))
        assert out is not None and not leaked(out["metadata"]["note"])
        assert out["checkpoint"] == graph["checkpoint"] and out["blobs"] == graph["blobs"]

    def test_namespace_settings(self) -> None:
        redactor = Redactor(KEY, {"raw*": Setting(enabled=False),
                                  "acme": Setting(patterns={"acme-id": r"ACME-[0-9]{6}"})})
        text = msgspec.json.encode({"content": secret_text(13) + " ACME-123456"})
        assert redactor.redact_json("message.appended", "raw-logs", text) is None
        out = redactor.redact_json("message.appended", "acme", text)
        assert out is not None and "ACME-123456" not in out["content"]
        assert "[redacted:acme-id:" in out["content"]
        out = redactor.redact_json("message.appended", "other", text)
        assert out is not None and "ACME-123456" in out["content"] and not leaked(out["content"])

    def test_recall_and_false_positives_figures(self) -> None:
        """The figures the closing note reports (printed with -s)."""
        redactor = Redactor(KEY)
        found = sum(1 for i in range(len(SECRETS)) if not leaked(redactor.text(secret_text(i))))
        false = sum(1 for t in LOOK_ALIKES if redactor.text(t) != t)
        print(f"\nrecall {found}/{len(SECRETS)}; false positives {false}/{len(LOOK_ALIKES)}",
              file=sys.stderr)
        assert found == len(SECRETS) and false == 0


# --- through a real daemon ----------------------------------------------------------


def raw_store(daemon: Daemon) -> bytes:
    """Every byte the store holds: the SQLite file and its WAL as they are on disk, or
    every row of every table of the PostgreSQL database as text."""
    if dsn.is_postgres(daemon.db):
        tables = pg.query(daemon.db, "SELECT tablename FROM pg_tables"
                          " WHERE schemaname = current_schema()")
        rows: list[str] = []
        for (table,) in tables:
            rows += [r[0] for r in pg.query(daemon.db, f'SELECT t::text FROM "{table}" t')]
        return "\n".join(rows).encode()
    out = b""
    for suffix in ("", "-wal"):
        path = Path(daemon.db + suffix)
        if path.exists():
            out += path.read_bytes()
    return out


async def write_everything(client: AsyncClient, sid: str) -> None:
    """The corpus through the socket's write methods: session metadata, message content,
    tool calls in message metadata, tool results, custom events, memory and metadata."""
    await client.call("session.create", session_id=sid, task="deploy with " + secret_text(2),
                      metadata={"env": secret_text(0)}, input_data={"cfg": secret_text(28)})
    for index in range(len(SECRETS)):
        await client.append_message(sid, "user", secret_text(index))
    await client.append_message(sid, "assistant", "calling the tool", metadata={
        "tool_calls": [{"id": "call_1", "name": "shell",
                        "arguments": {"cmd": secret_text(29), "password": "hunter2hunter2"}}]})
    await client.append_message(sid, "tool", secret_text(3), tool_call_id="call_1")
    await client.append_events(sid, [
        {"type": "memory.updated", "data": {"patch": {"token": secret_text(13)}}},
        {"type": "metadata.updated", "data": {"patch": {"db": secret_text(27)}}},
        {"type": "result.recorded", "data": {"reason": secret_text(21),
                                             "last_message": {"content": secret_text(7)}}},
    ])
    for text in LOOK_ALIKES:
        await client.append_message(sid, "user", text)


@pytest.mark.anyio
class TestEveryPath:
    async def test_socket_writes_store_no_credential(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        received: list[bytes] = []

        async def follow(task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
            async with client.subscribe() as sub:  # every session, from now
                task_status.started()
                async for event in sub:
                    received.append(msgspec.json.encode(event))

        async with anyio.create_task_group() as tg:
            await tg.start(follow)
            await write_everything(client, "r1")
            total = (await client.get_session("r1")).version
            await eventually(lambda: len(received) >= total, "the subscriber has every event")
            tg.cancel_scope.cancel()
        assert not leaked(b"\n".join(received))
        export = await client.export_session("r1")
        assert not leaked(msgspec.json.encode(export))
        for text in LOOK_ALIKES:  # the look-alikes came back exactly as written
            assert text in msgspec.json.decode(msgspec.json.encode(export), type=Any).__repr__() \
                or text.replace("\n", "\\n") in msgspec.json.encode(export).decode()
        for kind, secret, _ in SECRETS:
            piece = fragments(secret)[0]
            hits = await client.search(f'"{piece}"')
            assert not hits.sessions, kind
        marks = await client.search("redacted")
        assert marks.sessions
        stats = await client.call("daemon.stats")
        assert stats["redacted_events"] >= len(SECRETS)
        assert set(stats["redacted"]) >= {"aws-access-key", "private-key", "jwt"}
        verify = await client.call("daemon.verify")
        assert verify["ok"], verify
        assert not leaked(raw_store(daemon))

    async def test_imported_transcripts_are_redacted(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        builder = DocumentBuilder("imp", "test")
        builder.add("session.created", {"namespace": "local", "task": secret_text(5)},
                    "2026-01-01T00:00:00Z")
        for index in range(len(SECRETS)):
            builder.add("message.appended", {"role": "user", "content": secret_text(index),
                                             "message_id": f"m{index}", "sequence": index},
                        "2026-01-01T00:00:01Z")
        await client.import_session(builder.document())
        assert not leaked(msgspec.json.encode(await client.export_session("imp")))
        verify = await client.call("daemon.verify")
        assert verify["ok"], verify
        assert not leaked(raw_store(daemon))

    async def test_executor_output_is_redacted(self, daemon: Daemon,
                                               client: AsyncClient) -> None:
        script = "; ".join(f"echo '{secret_text(i)}'" for i in (0, 13, 19, 28))
        state = await client.spawn(["sh", "-c", script], task="print", session_id="ex")
        sid = state.session_id

        async def exited() -> bool:
            events = (await client.call("events.read", session_id=sid))["events"]
            return any(e["type"] == "process.exited" for e in events)

        for _ in range(500):
            if await exited():
                break
            await anyio.sleep(0.02)
        events = (await client.call("events.read", session_id=sid))["events"]
        lines = [e["data"]["line"] for e in events if e["type"] == "process.output"]
        assert any("[redacted:aws-access-key:" in line for line in lines), lines
        assert not leaked(msgspec.json.encode(events))
        assert not leaked(raw_store(daemon))

    async def test_a_namespace_may_turn_it_off(self, short_dir: str, db_url: str) -> None:
        from conftest import daemon_config, running_daemon
        config = daemon_config(short_dir, db=db_url,
                               redact={"raw": {"enabled": False}})
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            await c.call("session.create", session_id="raw1", namespace="raw")
            await c.append_message("raw1", "user", secret_text(13))
            await c.call("session.create", session_id="on1", namespace="other")
            await c.append_message("on1", "user", secret_text(13))
            raw = msgspec.json.encode(await c.export_session("raw1"))
            assert SECRETS[13][1] in raw.decode()
            assert not leaked(msgspec.json.encode(await c.export_session("on1")))


def test_host_key_is_private_and_kept(tmp_path: Path) -> None:
    """Made at first start 0600 beside the database; the same key at the next."""
    from sessiond_daemon.serve import hostkey
    db = str(tmp_path / "sessiond.db")
    first = hostkey.host_key(db, None)
    path = db + ".key"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert hostkey.host_key(db, None) == first
    os.chmod(path, 0o644)
    with pytest.raises(hostkey.KeyFileError):
        hostkey.host_key(db, None)


def test_config_refuses_a_bad_pattern() -> None:
    from sessiond_daemon.serve.config import ConfigError, load
    with pytest.raises(ConfigError, match="does not compile"):
        load(None, {"redact": {"acme": {"patterns": {"acme-id": "ACME-("}}}}, env={})
    with pytest.raises(ConfigError, match="redaction kind"):
        load(None, {"redact": {"acme": {"patterns": {"Acme ID": "x"}}}}, env={})
    config = load(None, {"redact": {"acme*": {"patterns": {"acme-id": "ACME-[0-9]+"}},
                                    "raw": {"enabled": False}}}, env={})
    assert config.redact["raw"].enabled is False


def test_hostile_text_costs_one_pass() -> None:
    """Texts built to make a pattern scan again from each candidate (long runs, repeated
    prefixes, BEGIN lines without END) are redacted whole; the patterns are possessive or
    bounded where a failure would rescan (a quadratic one ran for a minute on these)."""
    redactor = Redactor(KEY)
    for text in ("sk-" * 70_000, "token=" * 40_000 + "(", "-----BEGIN PRIVATE KEY-----" * 8000,
                 "eyJabcdefghijkl" * 12_000 + ".", "http://" + "a" * 200_000 + ":b",
                 "secret: " + "a" * 200_000 + "(", "a-" * 100_000):
        out = redactor.text(text)
        assert redactor.text(out) == out


@pytest.mark.anyio
async def test_http_stream_appends_are_redacted(short_dir: str, db_url: str) -> None:
    """The HTTP face (Durable Streams, over its Unix listener): a text stream's chunks
    and a JSON stream's messages are redacted; a binary stream's bytes are opaque."""
    import httpx
    from conftest import daemon_config, running_daemon
    config = daemon_config(short_dir, db=db_url,
                           http_listen=[os.path.join(short_dir, "h.sock")])
    async with running_daemon(config) as d, httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=config.http_listen[0]),
            base_url="http://localhost", timeout=60) as http:
        text = {"content-type": "text/plain"}
        assert (await http.put("/v1/stream/t1", content=secret_text(0).encode(),
                               headers=text)).status_code == 201
        assert (await http.post("/v1/stream/t1", content=secret_text(13).encode(),
                                headers=text)).status_code == 204
        body = msgspec.json.encode([{"env": secret_text(27)}])
        assert (await http.put("/v1/stream/j1", content=body, headers={
            "content-type": "application/json"})).status_code == 201
        read = (await http.get("/v1/stream/t1", params={"offset": "-1"})).text
        assert "[redacted:aws-access-key:" in read and not leaked(read)
        assert not leaked((await http.get("/v1/stream/j1", params={"offset": "-1"})).text)
        aws = SECRETS[0][1].encode()  # bytes that spell a key, in a binary stream: kept
        assert (await http.put("/v1/stream/b1", content=aws, headers={
            "content-type": "application/octet-stream"})).status_code == 201
        got = await http.get("/v1/stream/b1", params={"offset": "-1"})
        assert got.content == aws
        assert not leaked(raw_store(d))  # the binary chunk is base64: no plain key in it


@pytest.mark.anyio
async def test_metrics_count_redactions_by_kind(short_dir: str, db_url: str) -> None:
    pytest.importorskip("prometheus_client")
    from conftest import daemon_config, running_daemon
    from test_metrics import free_port, samples, scrape, value
    port = free_port()
    config = daemon_config(short_dir, db=db_url, metrics_listen=f"127.0.0.1:{port}")
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        await c.call("session.create", session_id="m1")
        await c.append_message("m1", "user", f"{secret_text(13)} {secret_text(14)}")
        await c.append_message("m1", "user", secret_text(0))
        got = samples((await scrape(f"http://127.0.0.1:{port}/metrics"))[0])
        assert value(got, "sessiond_redacted_total", kind="github-token") == 2
        assert value(got, "sessiond_redacted_total", kind="aws-access-key") == 1
