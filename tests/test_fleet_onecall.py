"""The one-call commit (sessiond_commit, PostgreSQL migration 8) with two daemons on one
database: keyed writes (their stored results quote the positions the statement took, and a
repeat through the other host answers the same), graph writes, an import, a fork and a
delete, with the hosts taking turns so that each batch lands after the other's (the
writer's numbering is shifted in the statement). Results quote the stored positions, the
read models point at them, positions have no gaps, and `daemon.verify` passes on both."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pg
import pytest
from conftest import Daemon, daemon_config, running_daemon
from pg import Stores

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio

TYPED = {"type": "json", "data": "e30="}


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def _positions(daemon: Daemon, sid: str) -> dict[int, int]:
    return {int(v): int(p) for v, p in daemon.sql(
        "SELECT version, position FROM events WHERE session_id = ?", sid)}


async def test_keyed_graph_import_fork_and_delete_through_the_one_call(
        pg_url: str, short_dir: str) -> None:
    stores = Stores()
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url) for name in "ab"]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with (running_daemon(configs[0], stores) as a, running_daemon(configs[1], stores),
                AsyncClient(configs[0].socket or "") as on_a,
                AsyncClient(configs[1].socket or "") as on_b):
        sid = (await on_a.create_session()).session_id
        before = [stores.figures(0), stores.figures(1)]
        # Keyed appends, the hosts taking turns: each batch is numbered past the other's.
        results: list[dict[str, Any]] = []
        for i in range(6):
            host = on_a if i % 2 else on_b
            results.append(await host.call("message.append", session_id=sid, role="user",
                                           content=f"m{i}", idempotency_key=f"k{i}"))
        stored = _positions(a, sid)
        assert [(r["version"], r["position"]) for r in results] == [
            (r["version"], stored[r["version"]]) for r in results]
        # The stored results (filled in the statement) answer a repeat on either host.
        for i, first in enumerate(results):
            for host in (on_a, on_b):
                again = await host.call("message.append", session_id=sid, role="user",
                                        content=f"m{i}", idempotency_key=f"k{i}")
                assert again == first
        # Graph writes through b on a session a made; the indexes point at their events.
        await on_a.append_message(sid, "user", "a moves the head")
        await on_b.call("graph.put", session_id=sid, thread_id=sid, checkpoint_id="0001",
                        checkpoint=TYPED, channel_versions={"ch": "1"},
                        blobs={"ch": TYPED}, metadata={"run_id": "r1"})
        await on_a.append_message(sid, "user", "again")
        await on_b.call("graph.put_writes", session_id=sid, thread_id=sid,
                        checkpoint_id="0001", task_id="t",
                        writes=[{"idx": 0, "channel": "ch", "value": TYPED}])
        got = (await on_a.call("graph.get", session_id=sid))["tuple"]
        assert got["checkpoint"] is not None and len(got["pending_writes"]) == 1
        events = {e.position: e for e in (await on_a.read_events(sid)).events}
        for table in ("graph_checkpoints", "graph_writes", "graph_blobs", "messages"):
            for (position,) in a.sql(f"SELECT position FROM {table} WHERE session_id = ?",
                                     sid):
                assert position in events, (table, position)
        graph_types = {events[p].type for (p,) in a.sql(
            "SELECT position FROM graph_checkpoints WHERE session_id = ?", sid)}
        assert graph_types == {"graph.checkpoint"}
        one = [stores.figures(i)["one_call"] - before[i]["one_call"] for i in (0, 1)]
        assert one[0] >= 4 and one[1] >= 5  # every one of those commits, in one statement
        # A fork and a delete (preconditions: the multi-statement commit), then an
        # import (one call) of the deleted session's export, through the other host.
        fork = await on_a.fork(sid)
        mine = [m.content for m in (await on_b.list_messages(sid)).messages]
        assert [m.content for m in (await on_b.list_messages(fork.session_id)).messages] \
            == mine
        other = (await on_b.create_session()).session_id
        for i in range(3):
            await on_a.append_message(other, "user", f"o{i}")
        document = await on_b.export_session(other)
        await on_a.delete_session(other)
        ones = stores.figures(1)["one_call"]
        imported = await on_b.import_session(document)
        assert stores.figures(1)["one_call"] == ones + 1
        assert imported.version == 4
        assert [m.content for m in (await on_a.list_messages(other)).messages] == [
            "o0", "o1", "o2"]
        stored = _positions(a, other)
        for (seq, position) in a.sql("SELECT sequence, position FROM messages"
                                     " WHERE session_id = ?", other):
            assert position == stored[int(seq) + 2], (seq, position)
        # No gaps, every result's position stored, both hosts verify.
        everything = (await on_b.read_events(None, limit=1000)).events
        last = int(a.sql("SELECT position FROM log_head")[0][0])
        assert sorted(e.position for e in everything) == [
            p for (p,) in a.sql("SELECT position FROM events ORDER BY position")]
        assert everything[-1].position <= last
        for host in (on_a, on_b):
            verified = await host.call("daemon.verify")
            assert verified["ok"], verified["problems"]
