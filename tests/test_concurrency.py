"""Many writers at once: no lost or doubled message, optimistic concurrency, group commit."""

from __future__ import annotations

import anyio
import pytest
from conftest import Daemon

from sessiond import AsyncClient, VersionConflictError

pytestmark = pytest.mark.anyio


@pytest.mark.slow_on_postgresql
async def test_32_clients_append_to_one_session(daemon: Daemon) -> None:
    """32 clients appending at once give a gapless sequence, none lost, none doubled."""
    clients, per_client = 32, 25
    async with AsyncClient(daemon.socket) as c:
        await c.create_session("crowd")

    async def writer(n: int) -> None:
        async with AsyncClient(daemon.socket) as c:
            for i in range(per_client):
                await c.append_message("crowd", "user", f"{n}:{i}")

    async with anyio.create_task_group() as tg:
        for n in range(clients):
            tg.start_soon(writer, n)
    rows = daemon.sql("SELECT m.sequence, e.version, e.data FROM messages m"
                      " JOIN events e ON e.position = m.position WHERE m.session_id = 'crowd'"
                      " ORDER BY m.sequence")
    assert [r[0] for r in rows] == list(range(clients * per_client))
    versions = [v for (v,) in daemon.sql("SELECT version FROM events WHERE session_id = 'crowd'"
                                         " ORDER BY version")]
    assert versions == list(range(1, clients * per_client + 2))
    import json
    contents = sorted(json.loads(r[2])["content"] for r in rows)
    assert contents == sorted(f"{n}:{i}" for n in range(clients) for i in range(per_client))
    # Each client's own messages stay in the order it sent them.
    for n in range(clients):
        contents = [json.loads(r[2])["content"] for r in rows]
        mine = [c for c in contents if c.startswith(f"{n}:")]
        assert mine == [f"{n}:{i}" for i in range(per_client)]


async def test_stale_expected_version_loses(daemon: Daemon) -> None:
    """Two writers that read the same version: one wins, the other gets -32002."""
    async with AsyncClient(daemon.socket) as a, AsyncClient(daemon.socket) as b:
        s = await a.create_session()
        seen = (await b.get_session(s.session_id)).version
        outcomes: list[str] = []

        async def attempt(c: AsyncClient, text: str) -> None:
            try:
                await c.append_message(s.session_id, "user", text, expected_version=seen)
                outcomes.append("ok")
            except VersionConflictError as exc:
                assert exc.data == {"expected": seen, "actual": seen + 1}
                outcomes.append("conflict")

        async with anyio.create_task_group() as tg:
            tg.start_soon(attempt, a, "from a")
            tg.start_soon(attempt, b, "from b")
        assert sorted(outcomes) == ["conflict", "ok"]
        assert (await a.get_session(s.session_id)).message_count == 1


async def test_group_commit_batches_concurrent_appends(daemon: Daemon, client: AsyncClient) -> None:
    """N concurrent appends are committed in fewer than N transactions."""
    await client.create_session("batched")
    before = await client.stats()
    n = 200

    async def append(i: int) -> None:
        await client.append_message("batched", "user", f"m{i}")

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(append, i)
    after = await client.stats()
    assert after.write_commands - before.write_commands == n
    transactions = after.write_transactions - before.write_transactions
    assert 1 <= transactions < n
    assert (await client.get_session("batched")).message_count == n


async def test_idempotent_retries_under_concurrency(daemon: Daemon, client: AsyncClient) -> None:
    """The same idempotency key sent 20 times at once appends exactly one message."""
    await client.create_session("retry")
    results = []

    async def send() -> None:
        results.append(await client.append_message("retry", "user", "once",
                                                   idempotency_key="same"))

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(send)
    assert len({(r.message_id, r.sequence, r.version) for r in results}) == 1
    assert (await client.get_session("retry")).message_count == 1
