"""progress.list: the graph steps the bounded view (protocol 1.2) no longer keeps, paged;
forks sharing their source's; migration 5 building the same rows from stored events."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest
from conftest import daemon_config, running_daemon
from test_executors import FAKES, finished

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


def step(node: str, edge: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"node_id": node, "latency_ms": 1}
    if edge is not None:
        data["edge"] = edge
    return {"type": "progress.recorded", "data": data}


async def nodes(c: AsyncClient, sid: str, **page: Any) -> list[str]:
    return [s.node_id for s in (await c.list_progress(sid, **page)).steps]


@pytest.mark.slow_on_postgresql
async def test_pages_walk_every_step_in_order(client: AsyncClient) -> None:
    """Pages of progress.list chain by `next` through every step; session_state_dict puts
    the path and edges back whole; the view holds only counts."""
    s = await client.create_session()
    sid = s.session_id
    await client.append_events(sid, [step(f"n{i % 7}", f"e{i}") for i in range(2500)])
    seen, after, pages = [], 0, 0
    while True:
        page = await client.list_progress(sid, after_version=after, limit=1000)
        seen += page.steps
        pages += 1
        assert page.total == 2500
        if page.next is None:
            break
        after = page.next
    assert pages == 3 and [x.node_id for x in seen] == [f"n{i % 7}" for i in range(2500)]
    whole = await client.session_state_dict(sid)
    assert whole["progress"]["path"] == [f"n{i % 7}" for i in range(2500)]
    assert whole["metrics"]["edges_traversed"] == [f"e{i}" for i in range(2500)]
    state = await client.get_session(sid)
    assert state.progress.steps_executed == 2500
    assert sum(state.progress.node_visit_counts.values()) == 2500
    # The path as it was at a version: the steps recorded up to it.
    then = await client.session_state_dict(sid, at_version=s.version + 10)
    assert then["progress"]["path"] == [f"n{i % 7}" for i in range(10)]


async def test_a_fork_shares_its_sources_steps(client: AsyncClient) -> None:
    """A fork's steps are its source's up to the fork point, then its own; the source's
    are left as they are; a fork of a fork takes each link's share."""
    s = await client.create_session()
    sid = s.session_id
    r = await client.append_events(sid, [step("a"), step("b")])
    await client.append_events(sid, [step("c")])
    fork = await client.fork(sid, at_version=r.version)
    await client.append_events(fork.session_id, [step("d")])
    assert await nodes(client, sid) == ["a", "b", "c"]
    assert await nodes(client, fork.session_id) == ["a", "b", "d"]
    grand = await client.fork(fork.session_id)
    await client.append_events(grand.session_id, [step("e")])
    assert await nodes(client, grand.session_id) == ["a", "b", "d", "e"]
    assert await nodes(client, grand.session_id, at_version=r.version) == ["a", "b"]
    whole = await client.session_state_dict(grand.session_id)
    assert whole["progress"]["path"] == ["a", "b", "d", "e"]


async def test_migration_5_builds_the_indexes_from_the_events(short_dir: str) -> None:
    """A database at schema 4 (no progress_steps, no runner_events) with steps, forks and
    an executor's turn gets both built by migration 5: the same rows the commit keeps."""
    config = daemon_config(short_dir)
    tables = ("progress_steps", "runner_events")
    async with running_daemon(config), AsyncClient(config.socket) as c:
        s = await c.create_session()
        sid = s.session_id
        r = await c.append_events(sid, [step("a", "x"), step("b")])
        await c.append_events(sid, [step("c")])
        fork = await c.fork(sid, at_version=r.version)
        await c.append_events(fork.session_id, [step("d")])
        grand = await c.fork(fork.session_id)
        await c.append_events(grand.session_id, [step("e")])
        await c.spawn([str(FAKES / "codex"), "exec", "--json", "x"], adapter="codex",
                      task="x", session_id="codex-m")
        await finished(c, "codex-m")
        before = {k: await nodes(c, k) for k in (sid, fork.session_id, grand.session_id)}
    con = sqlite3.connect(config.db)
    try:
        rows = {t: con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() for t in tables}
        for t in tables:
            con.execute(f"DROP TABLE {t}")
        con.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")
        con.commit()
    finally:
        con.close()
    # The turn's events, and of its output only the line naming the thread.
    assert [r[3] for r in rows["runner_events"]] == [
        "process.started", "process.output", "process.exited"]
    assert len(rows["progress_steps"]) == 3 + 3 + 4
    async with running_daemon(config), AsyncClient(config.socket) as c:
        assert (await c.stats()).schema_version >= 5
        for key, path in before.items():
            assert await nodes(c, key) == path
        assert (await c.verify()).ok
    con = sqlite3.connect(config.db)
    try:
        for t in tables:
            assert con.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall() == rows[t], t
    finally:
        con.close()
