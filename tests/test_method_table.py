"""The method table (methods.py): it serves exactly the contract's methods, start-up refuses
one that does not, and daemon.stats reads the server's figures through its callback."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import msgspec
import pytest
from conftest import daemon_config

from sessiond import AsyncClient
from sessiond_daemon.serve import lifecycle, methods
from sessiond_daemon.serve.methods import Method, MethodTable, MethodTableError, Signature
from sessiond_schemas import rpc
from sessiond_schemas.events import EventMeta

pytestmark = pytest.mark.anyio


async def _ping(p: rpc.NoParams, meta: EventMeta) -> rpc.PingResult:
    raise AssertionError("never called")


async def _assembled(short_dir: str) -> tuple[MethodTable, dict[str, Any]]:
    """The table a real daemon assembles, and daemon.stats over two connections."""
    config = daemon_config(short_dir)
    shutdown = anyio.Event()
    d = lifecycle.Daemon(config)
    async with anyio.create_task_group() as tg:
        await tg.start(d.run, shutdown)
        table = d.methods
        assert table is not None
        async with AsyncClient(config.socket) as a, AsyncClient(config.socket) as b:
            await a.ping()
            stats = msgspec.to_builtins(await b.stats())
        shutdown.set()
    assert table is not None
    return table, stats


async def test_the_assembled_table_serves_exactly_the_contract(short_dir: str) -> None:
    table, stats = await _assembled(short_dir)
    assert sorted(table) == sorted(rpc.METHODS)
    for name, method in table.items():
        params, result = rpc.METHODS[name]
        assert method.params is params, name
        assert method.result is result or result is Any, name
        assert (method.handler is None) != (method.on_connection is None), name
    methods.check(table)  # what start-up runs
    # Only the methods with a removing form ask for a grant other than their name
    # (access.REMOVING_FORMS; graph.put's depends on what is stored: its handler asks).
    assert sorted(name for name, m in table.items() if m.grant is not None) == [
        "events.append", "memory.update", "session.import"]
    # The figures the server registered with the service: both clients, no executor.
    assert stats["connections"] == 2
    assert stats["subscriptions"] == 0
    assert stats["executors_running"] == 0
    assert set(stats) == set(rpc.StatsResult.__struct_fields__)


def _table() -> MethodTable:
    """A table that agrees with the contract (handlers that are never called)."""
    return {name: Method(params, result, handler=_ping) for name, (params, result)
            in rpc.METHODS.items()}


def test_check_passes_a_table_that_matches_the_contract() -> None:
    methods.check(_table())


def test_check_refuses_a_missing_method() -> None:
    table = _table()
    del table["session.get"]
    with pytest.raises(MethodTableError, match=r"missing \['session.get'\]"):
        methods.check(table)


def test_check_refuses_a_method_outside_the_contract() -> None:
    table = _table()
    table["session.frobnicate"] = Signature(rpc.NoParams, rpc.PingResult).served_by(_ping)
    with pytest.raises(MethodTableError, match=r"not in the contract \['session.frobnicate'\]"):
        methods.check(table)


def test_check_refuses_other_params_or_result() -> None:
    table = _table()
    table["daemon.ping"] = Signature(rpc.NoParams, rpc.StatsResult).served_by(_stats)
    table["daemon.backup"] = dataclasses.replace(table["daemon.backup"], params=rpc.NoParams)
    with pytest.raises(MethodTableError,
                       match=r"other params or result \['daemon.backup', 'daemon.ping'\]"):
        methods.check(table)


def test_check_refuses_a_method_without_exactly_one_handler() -> None:
    table = _table()
    table["events.read"] = dataclasses.replace(table["events.read"], handler=None)
    with pytest.raises(MethodTableError, match=r"not one handler \['events.read'\]"):
        methods.check(table)


async def _stats(p: rpc.NoParams, meta: EventMeta) -> rpc.StatsResult:
    raise AssertionError("never called")


def test_the_protocol_documents_exactly_the_contracts_methods() -> None:
    """docs/protocol.md, from its Methods section on, gives each method a table row
    (`| \\`name\\` |`) or a definition (`- **name**`), and names no method the contract lacks."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "protocol.md").read_text()
    methods_part = doc[doc.index("\n## Methods\n"):]
    documented = (set(re.findall(r"^\| `([a-z_]+\.[a-z_]+)` \|", methods_part, re.M))
                  | set(re.findall(r"^- \*\*([a-z_]+\.[a-z_]+)\*\*", methods_part, re.M)))
    assert sorted(set(rpc.METHODS) - documented) == []
    assert sorted(documented - set(rpc.METHODS)) == []
