"""How many times the daemon encodes one message's data (bench/README.md, "Encodes per
append"): a real daemon in this process on a temporary socket and database (both stores),
a real client, and every JSON encoder the daemon's modules hold wrapped to count the
encodes that serialize the message's content (the object encoded holds the content
string; bytes already encoded, msgspec.Raw, copied into a larger document are not
serialized again). One message.append, with a live subscriber, costs at most 3: the
data's JSON as stored (the bounds scan, the stored column, events.read and the
subscribers' line use those bytes), its canonical JSON (the hash), and the view row (its
last_message). The request is decoded once, and nothing decodes the data again."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest

from sessiond import AsyncClient
from sessiond_schemas.events import new_id

pytestmark = pytest.mark.anyio


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"snapshot_every": 1000}  # no snapshot among these appends (one per 1000)


# What PostgreSQL's one-call commit costs today: the data as stored, its canonical JSON,
# the view row, and the read models' rows as JSON (the full-text row holds the content).
ONE_CALL = sorted(["sessiond_schemas.events._plain", "sessiond_schemas.events._canonical",
                   "sessiond_daemon.stores.postgres.store._json",
                   "sessiond_daemon.stores.postgres.store._json"])


class Tally:
    """The encodes of an object holding `mark` (the decodes of bytes holding it), by where
    the codec was found."""

    def __init__(self, mark: bytes) -> None:
        self.mark = mark
        self.encodes: list[str] = []
        self.decodes: list[str] = []

    def serializes(self, obj: Any) -> bool:
        """Whether encoding `obj` serializes the mark: a string holding it is reachable
        through its Structs, dicts and lists (not inside msgspec.Raw: bytes copied)."""
        needle = self.mark.decode()
        stack, seen = [obj], set()
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                if needle in item:
                    return True
            elif id(item) in seen or isinstance(item, (bytes, msgspec.Raw)):
                continue
            elif isinstance(item, msgspec.Struct):
                seen.add(id(item))
                stack.extend(getattr(item, f) for f in item.__struct_fields__)
            elif isinstance(item, dict):
                seen.add(id(item))
                stack.extend(item)
                stack.extend(item.values())
            elif isinstance(item, (list, tuple)):
                seen.add(id(item))
                stack.extend(item)
        return False

    def clear(self) -> None:
        self.encodes.clear()
        self.decodes.clear()


class CountingEncoder:
    def __init__(self, inner: msgspec.json.Encoder, where: str, tally: Tally) -> None:
        self.inner, self.where, self.tally = inner, where, tally

    def encode(self, obj: Any) -> bytes:
        if self.tally.serializes(obj):
            self.tally.encodes.append(self.where)
        return self.inner.encode(obj)

    def encode_into(self, obj: Any, buffer: bytearray, offset: int = 0) -> None:
        if self.tally.serializes(obj):
            self.tally.encodes.append(self.where)
        self.inner.encode_into(obj, buffer, offset)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class CountingDecoder:
    def __init__(self, inner: msgspec.json.Decoder[Any], where: str, tally: Tally) -> None:
        self.inner, self.where, self.tally = inner, where, tally

    def decode(self, buf: Any) -> Any:
        if self.tally.mark in memoryview(buf).tobytes():
            self.tally.decodes.append(self.where)
        return self.inner.decode(buf)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _ours(depth: int = 2) -> bool:
    """Whether the caller's caller is the daemon's code (the client's calls are not)."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    return str(name).startswith(("sessiond_daemon", "sessiond_schemas"))


@pytest.fixture
def tally(monkeypatch: pytest.MonkeyPatch) -> Iterator[Tally]:
    """Every JSON encoder and decoder held by a module of the daemon (and the schemas it
    uses), and msgspec's module-level functions when the daemon calls them, counted."""
    counted = Tally(b"")
    for name, module in list(sys.modules.items()):
        if not name.startswith(("sessiond_daemon", "sessiond_schemas")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            where = f"{name}.{attr}"
            if isinstance(value, dict) and value and all(
                    isinstance(v, msgspec.json.Decoder) for v in value.values()):
                for key, decoder in value.items():  # a table of decoders (by event type)
                    monkeypatch.setitem(value, key, CountingDecoder(decoder, f"{where}[{key}]",
                                                                    counted))
            elif isinstance(value, msgspec.json.Encoder):
                monkeypatch.setattr(module, attr, CountingEncoder(value, where, counted))
            elif isinstance(value, msgspec.json.Decoder):
                monkeypatch.setattr(module, attr, CountingDecoder(value, where, counted))
            elif (getattr(value, "__self__", None).__class__ is msgspec.json.Encoder
                  and getattr(value, "__name__", "") == "encode"):
                monkeypatch.setattr(module, attr, CountingEncoder(value.__self__, where,
                                                                  counted).encode)
    plain_encode, plain_decode = msgspec.json.encode, msgspec.json.decode

    def encode(obj: Any, **kw: Any) -> bytes:
        if _ours() and counted.serializes(obj):
            counted.encodes.append("msgspec.json.encode")
        return plain_encode(obj, **kw)

    def decode(buf: Any, **kw: Any) -> Any:
        if _ours() and counted.mark in memoryview(buf.encode() if isinstance(buf, str)
                                                  else buf).tobytes():
            counted.decodes.append("msgspec.json.decode")
        return plain_decode(buf, **kw)

    monkeypatch.setattr(msgspec.json, "encode", encode)
    monkeypatch.setattr(msgspec.json, "decode", decode)
    yield counted


async def test_one_message_append_encodes_its_data_at_most_three_times(
        client: AsyncClient, tally: Tally, store_kind: str,
        request: pytest.FixtureRequest) -> None:
    if store_kind == "postgresql":
        # Known, not this change's: PostgreSQL's one-call commit (postgres/onecall.py)
        # passes the read models' rows as one JSON document, and the full-text index's
        # row holds the content: a 4th encode. Strict: it fails once that is fixed.
        request.applymarker(pytest.mark.xfail(
            strict=True, raises=AssertionError,
            reason="postgres one-call commit encodes the search row's text"))
    await client.create_session("count")
    # From version 2 on: the first append is delivered even if it lands before the
    # subscription is registered (read back from the store); it is not counted. The
    # counted ones come after it, live.
    async with client.subscribe(session_id="count", from_version=2) as sub:
        seen: list[Any] = []

        async def listen() -> None:
            async for event in sub:
                seen.append(event)
                if event.type == "message.appended":
                    return

        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            await client.append_message("count", "user", "not counted")
        for _ in range(3):
            content = f"count-{new_id()} " + "words " * 30  # ~200 B, as B1 appends
            tally.mark = content.split(maxsplit=1)[0].encode()
            tally.clear()
            seen.clear()
            async with anyio.create_task_group() as tg:
                tg.start_soon(listen)
                await client.append_message("count", "user", content)
            print("encodes", tally.encodes, "decodes", tally.decodes)  # pytest -s shows them
            if store_kind == "postgresql" and sorted(tally.encodes) != ONE_CALL:
                pytest.fail(f"not the one-call commit's known 4th encode: {tally.encodes}")
            assert len(tally.encodes) <= 3, tally.encodes
            assert len(tally.decodes) <= 1, tally.decodes  # the request, once
            assert [e.data.content for e in seen if e.type == "message.appended"] == [content]
    # What is stored is what the subscriber was sent, and reads back typed.
    [stored] = (await client.read_events("count", types=["message.appended"],
                                         limit=1, from_version=5)).events
    assert stored.data.content == content and stored.fields()["content"] == content
