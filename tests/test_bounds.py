"""Numbers at and past their bounds, through the real socket: refused by field, never stored."""

from __future__ import annotations

import json
import re
import socket
from typing import Any

import anyio
import msgspec
import pytest
from conftest import Daemon
from hypothesis import given
from hypothesis import strategies as st

from sessiond import AsyncClient, SessiondError
from sessiond_schemas import rpc
from sessiond_schemas.bounds import INT64_MAX, has_long_digits, json_out_of_bounds
from sessiond_schemas.events import DATA_TYPES, event_from_builtins
from sessiond_schemas.export import chain_hash, checksum

pytestmark = pytest.mark.anyio


def reseal(doc: dict[str, Any]) -> dict[str, Any]:
    """Number the events 1..n again, rebuild their hash chain and the checksum (the view
    is left to the daemon's fold)."""
    prev = ""
    for version, e in enumerate(doc["events"], start=1):
        e["version"] = version
        prev = e["hash"] = chain_hash(prev, event_from_builtins({**e, "hash": ""}))
    doc["session"] = None
    doc["checksum"] = checksum(doc)
    return doc


async def refused(client: AsyncClient, method: str, **params: Any) -> SessiondError:
    with pytest.raises(SessiondError) as err:
        await client.call(method, Any, **params)
    return err.value


async def assert_untouched(client: AsyncClient, sid: str, version: int) -> None:
    assert (await client.get_session(sid)).version == version
    assert (await client.call("daemon.verify", Any))["ok"] is True


class TestSchemaBounds:
    def test_floats_must_be_finite(self) -> None:
        """inf and NaN fail the float bounds (msgspec has no 'finite'; NaN fails every
        comparison); -0.0 and the largest double pass."""
        for bad in (float("inf"), float("-inf"), float("nan")):
            with pytest.raises(msgspec.ValidationError, match="estimated_cost"):
                msgspec.convert({"session_id": "s", "estimated_cost": bad}, rpc.TokensRecordParams)
        for good in (-0.0, 0.0, 1.7976931348623157e308):
            p = msgspec.convert({"session_id": "s", "estimated_cost": good}, rpc.TokensRecordParams)
            assert p.estimated_cost == good
        with pytest.raises(msgspec.ValidationError, match="out of range"):
            msgspec.json.decode(b'{"session_id":"s","estimated_cost":1e309}',
                                type=rpc.TokensRecordParams)

    def test_every_integer_and_float_of_params_and_data_is_bounded(self) -> None:
        """No params struct or event data Struct has an int or float field without both
        bounds: a new field without them fails here."""
        def unbounded(t: Any, path: str, seen: set[Any]) -> list[str]:
            info = t
            found: list[str] = []
            if isinstance(info, msgspec.inspect.StructType):
                if info.cls in seen:
                    return []
                seen.add(info.cls)
                for f in info.fields:
                    found += unbounded(f.type, f"{path}.{f.name}", seen)
            elif isinstance(info, msgspec.inspect.IntType):
                lo, hi = info.ge if info.ge is not None else info.gt, info.le
                if lo is None or hi is None or hi > INT64_MAX:
                    found.append(path)
            elif isinstance(info, msgspec.inspect.FloatType):
                if info.ge is None or info.le is None:
                    found.append(path)
            elif isinstance(info, msgspec.inspect.UnionType):
                for member in info.types:
                    found += unbounded(member, path, seen)
            elif isinstance(info, (msgspec.inspect.ListType, msgspec.inspect.DictType)):
                found += unbounded(getattr(info, "item_type", None)
                                   or info.value_type, path + "[]", seen)  # type: ignore[union-attr]
            return found

        types = [p for p, _ in rpc.METHODS.values()] + list(DATA_TYPES.values())
        problems = []
        for t in types:
            problems += unbounded(msgspec.inspect.type_info(t), t.__name__, set())
        assert problems == []

    def test_free_form_json(self) -> None:
        assert json_out_of_bounds({"a": [1, {"b": 2**63 - 1}], "c": "9" * 40}) is None
        assert json_out_of_bounds({"a": [1, {"b": 2**63}]}) == ("$.a[1].b", 2**63)
        assert json_out_of_bounds({"a": -(2**63) - 1}, "$.x") == ("$.x.a", -(2**63) - 1)


class TestNumbersOverTheSocket:
    async def test_past_int64_is_refused_by_field(self, client: AsyncClient) -> None:
        """2^63 and 2^64 are -32602 naming the field; 2^63-1 is taken; nothing half-stored."""
        await client.create_session("n")
        for value in (2**63, 2**64, -1):
            err = await refused(client, "tokens.record", session_id="n", input_tokens=value)
            assert err.code == -32602 and err.data["path"] == "$.input_tokens"
        await assert_untouched(client, "n", 1)
        r: Any = await client.call("tokens.record", Any, session_id="n", input_tokens=2**63 - 1)
        assert r["token_usage"]["input_tokens"] == 2**63 - 1

    async def test_a_sum_that_would_overflow_is_refused(self, client: AsyncClient) -> None:
        """2^63-1, then 1 more: -32602 naming input_tokens, nothing written, and the session
        takes other writes (it is not poisoned)."""
        await client.create_session("sum")
        await client.call("tokens.record", Any, session_id="sum", input_tokens=2**63 - 1)
        err = await refused(client, "tokens.record", session_id="sum", input_tokens=1)
        assert err.code == -32602 and err.data["path"] == "$.input_tokens"
        assert "token_usage.input_tokens" in err.message
        err = await refused(client, "events.append", session_id="sum", events=[
            {"type": "decision.recorded", "data": {}},
            {"type": "tokens.recorded", "data": {"output_tokens": 2**63 - 1}},
            {"type": "tokens.recorded", "data": {"input_tokens": 5}}])
        # progress.total_tokens (input + output) is already at the bound
        assert err.code == -32602 and err.data["path"] == "$.events[1].data.output_tokens"
        assert "progress.total_tokens" in err.message
        err = await refused(client, "progress.record", session_id="sum", node_id="a", tokens=1)
        assert err.code == -32602 and err.data["path"] == "$.tokens"  # progress.total_tokens
        await assert_untouched(client, "sum", 2)
        r: Any = await client.call("tokens.record", Any, session_id="sum", estimated_cost=0.5)
        assert r["token_usage"]["estimated_cost"] == 0.5 and r["version"] == 3

    async def test_costs_stay_finite(self, client: AsyncClient) -> None:
        """1e308 twice would be inf (stored as null): the second is refused by field."""
        await client.create_session("cost")
        await client.call("tokens.record", Any, session_id="cost", estimated_cost=1e308)
        err = await refused(client, "tokens.record", session_id="cost", estimated_cost=1e308)
        assert err.code == -32602 and err.data["path"] == "$.estimated_cost"
        r: Any = await client.call("tokens.record", Any, session_id="cost", estimated_cost=-0.0)
        assert r["token_usage"]["estimated_cost"] == 1e308
        await assert_untouched(client, "cost", 3)
        assert (await client.get_session("cost")).token_usage.estimated_cost == 1e308

    async def test_sums_across_sessions_never_break_stats(self, client: AsyncClient) -> None:
        """Each session may hold int64's largest count and cost; their sums across sessions
        (daemon.stats, the metrics' gauges) are past int64 and float, and still served."""
        for sid in ("big-1", "big-2"):
            await client.create_session(sid, actor_name="act/x", namespace="ovf")
            await client.call("tokens.record", Any, session_id=sid, input_tokens=2**63 - 1,
                              estimated_cost=1e308)
        stats = await client.stats()
        assert stats.sessions_by_status == {"active": 2}

    async def test_progress_totals(self, client: AsyncClient) -> None:
        await client.create_session("p")
        await client.call("progress.record", Any, session_id="p", node_id="a",
                          latency_ms=2**63 - 1, retries=2**63 - 1)
        for field in ("latency_ms", "retries"):
            err = await refused(client, "progress.record", session_id="p", node_id="a",
                                **{field: 1})
            assert err.code == -32602 and err.data["path"] == f"$.{field}"
        await assert_untouched(client, "p", 2)

    async def test_read_params_are_bounded(self, client: AsyncClient) -> None:
        """offset, from_position, at_version, limits: 2^63 is -32602 naming them."""
        await client.create_session("r")
        for method, field, extra in [
            ("message.list", "offset", {"session_id": "r"}),
            ("message.list", "after_sequence", {"session_id": "r"}),
            ("events.read", "from_position", {}),
            ("events.read", "from_version", {"session_id": "r"}),
            ("session.get", "at_version", {"session_id": "r"}),
            ("session.output", "turn", {"session_id": "r"}),
            ("graph.list", "limit", {}),
            ("session.create", "expected_version", {}),
            ("session.trajectory", "max_output_len", {"session_id": "r"}),
        ]:
            err = await refused(client, method, **extra, **{field: 2**63})
            assert err.code == -32602 and err.data["path"] == f"$.{field}", (method, err)
        err = await refused(client, "session.cleanup", older_than_days=1e308)
        assert err.code == -32602 and err.data["path"] == "$.older_than_days"
        for at_the_bound in ({"offset": 2**63 - 1}, {"after_sequence": 2**63 - 1},
                             {"after_sequence": 2**63 - 1, "offset": 2**63 - 1},
                             {"offset": 2**63 - 1, "order": "desc"}):
            page: Any = await client.call("message.list", Any, session_id="r", **at_the_bound)
            assert page["messages"] == []

    async def test_free_form_numbers(self, client: AsyncClient) -> None:
        """Integers past int64 inside metadata, memory, payloads and event data are refused
        with the path to them."""
        await client.create_session("f")
        cases: list[tuple[str, dict[str, Any], str]] = [
            ("message.append", {"role": "user", "content": "x", "metadata": {"k": [1, 2**64]}},
             "$.metadata.k[1]"),
            ("memory.update", {"patch": {"a": {"b": -(2**63) - 1}}}, "$.patch.a.b"),
            ("checkpoint.save", {"payload": {"big": 2**64}}, "$.payload.big"),
            ("checkpoint.save", {"memory": {"big": 2**64}}, "$.memory.big"),
            ("events.append", {"events": [{"type": "problem.recorded", "data": {"n": 2**63}}]},
             "$.events[0].data.n"),
            ("message.append_many", {"messages": [
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b", "metadata": {"n": 2**70}}]},
             "$.messages[1].metadata.n"),
        ]
        for method, params, path in cases:
            err = await refused(client, method, session_id="f", **params)
            assert err.code == -32602 and err.data["path"] == path, (method, err)
        err = await refused(client, "session.create", session_id="g", metadata={"n": 2**64})
        assert err.code == -32602 and err.data["path"] == "$.metadata.n"
        await assert_untouched(client, "f", 1)

    async def test_imported_numbers(self, client: AsyncClient) -> None:
        """A document whose totals would overflow, or whose data holds a number past int64,
        is -32007 naming the field; nothing is stored."""
        await client.create_session("imp")
        await client.call("tokens.record", Any, session_id="imp", input_tokens=2**63 - 1)
        await client.call("events.append", Any, session_id="imp",
                          events=[{"type": "decision.recorded", "data": {"n": 1}}])
        doc: Any = await client.call("session.export", Any, session_id="imp")
        await client.call("session.delete", Any, session_id="imp")

        def resealed(change: Any) -> dict[str, Any]:
            d = json.loads(json.dumps(doc))
            change(d)
            return reseal(d)

        def overflow(d: dict[str, Any]) -> None:
            d["events"].insert(2, {**d["events"][1], "event_id": "01J0000000000000000000000X"})

        def big_free(d: dict[str, Any]) -> None:
            d["events"][2]["data"]["n"] = 2**64

        for change, word in ((overflow, "input_tokens"), (big_free, "n")):
            err = await refused(client, "session.import", document=resealed(change))
            assert err.code == -32007 and word in err.data["reason"], err
        with pytest.raises(SessiondError) as nf:
            await client.get_session("imp")
        assert nf.value.code == -32001

    async def test_invalid_utf8_inside_params_is_a_parse_error(self, daemon: Daemon) -> None:
        """Bytes that are not UTF-8 inside params: -32700, and the connection goes on."""
        def run() -> list[Any]:  # a blocking client, in a thread: the daemon is in this loop
            sock = socket.socket(socket.AF_UNIX)
            sock.settimeout(20)
            sock.connect(daemon.socket)
            with sock, sock.makefile("rb") as f:
                sock.sendall(b'{"jsonrpc":"2.0","id":7,"method":"session.get",'
                             b'"params":{"session_id":"\xff\xfe"}}\n'
                             b'{"jsonrpc":"2.0","id":8,"method":"daemon.ping"}\n')
                return sorted((json.loads(f.readline()) for _ in range(2)),
                              key=lambda r: r["id"])

        bad, ping = await anyio.to_thread.run_sync(run)
        assert bad["error"]["code"] == -32700 and "UTF-8" in bad["error"]["message"], bad
        assert ping["result"]["pong"] is True


@given(st.binary(max_size=80) | st.text(alphabet="0123456789x-.é", max_size=80).map(str.encode))
def test_long_digit_prefilter_finds_every_run_of_19(text: bytes) -> None:
    """The prefilter (translate and find) says what the regex it replaced said."""
    assert has_long_digits(text) == (re.search(rb"[0-9]{19}", text) is not None)
