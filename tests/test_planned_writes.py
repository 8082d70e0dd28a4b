"""Writes planned from reads (message.pop, message.clear, append_many with replace_from):
the caller's `expected_version` is honoured, 0 included, and the internal retry when other
writes come between the read and the write is bounded (-32008, retryable), on both stores."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from conftest import Daemon, daemon_config, running_daemon
from faulty_store import FaultyStore, faulty

from sessiond import AsyncClient, OverloadedError, VersionConflictError
from sessiond_daemon.features.service import READ_TRIES

pytestmark = pytest.mark.anyio

MESSAGES = [{"role": "user", "content": f"m{i}"} for i in range(3)]


@pytest.fixture
async def faulty_daemon(short_dir: str, db_url: str) -> AsyncIterator[tuple[Daemon, FaultyStore]]:
    stores: list[FaultyStore] = []
    async with running_daemon(daemon_config(short_dir, db=db_url), faulty(stores)) as d:
        yield d, stores[0]


CALLS: dict[str, Any] = {
    "message.pop": lambda c, sid, **kw: c.pop_message(sid, **kw),
    "message.clear": lambda c, sid, **kw: c.clear_messages(sid, **kw),
    "message.append_many": lambda c, sid, **kw: c.append_messages(
        sid, [{"role": "user", "content": "new"}], replace_from=1, **kw),
}


@pytest.mark.parametrize("method", list(CALLS))
async def test_expected_version_0_is_honoured(client: AsyncClient, daemon: Daemon,
                                              method: str) -> None:
    """0 means "the session does not exist yet": on an existing session it is -32002 and
    nothing is written (it was read as "no expected version" and the write went ahead)."""
    await client.create_session("s")
    await client.append_messages("s", MESSAGES)
    with pytest.raises(VersionConflictError) as err:
        await CALLS[method](client, "s", expected_version=0)
    assert (err.value.data["expected"], err.value.data["actual"]) == (0, 4)
    state = await client.get_session("s")
    assert (state.version, state.message_count) == (4, 3)
    assert daemon.sql("SELECT COUNT(*) FROM events WHERE session_id = ?", "s") == [(4,)]
    # The right version still writes.
    await CALLS[method](client, "s", expected_version=4)
    assert (await client.get_session("s")).version > 4


@pytest.mark.parametrize("method", list(CALLS))
async def test_the_retry_of_a_write_planned_from_reads_is_bounded(
        faulty_daemon: tuple[Daemon, FaultyStore], method: str) -> None:
    """Another write comes between each read of the messages and the write planned from
    it (a hook on the store's message read appends one): the call ends after READ_TRIES
    tries with -32008, retryable, naming the session, instead of trying as long as the
    other writes come; nothing of it is written."""
    daemon, store = faulty_daemon
    async with AsyncClient(daemon.socket) as client, AsyncClient(daemon.socket) as other:
        await client.create_session("busy")
        await client.append_messages("busy", MESSAGES)
        interleaved = 0

        async def another_write() -> None:
            nonlocal interleaved
            if interleaved < 4 * READ_TRIES:  # then let the call through (old code: won)
                interleaved += 1
                await other.append_message("busy", "user", f"between {interleaved}")

        store.before_reads("list_messages", another_write)
        with pytest.raises(OverloadedError) as err:
            await CALLS[method](client, "busy")
        assert interleaved == READ_TRIES
        assert err.value.code == -32008 and err.value.data["session_id"] == "busy"
        assert err.value.data["retry_after_ms"] > 0 and "busy" in err.value.message
        store.heal()
        truncations = daemon.sql("SELECT COUNT(*) FROM events WHERE session_id = ? AND type"
                                 " = 'messages.truncated'", "busy")
        assert truncations == [(0,)]
        # Once the others stop, the same call goes through.
        await CALLS[method](client, "busy")
        assert daemon.sql("SELECT COUNT(*) FROM events WHERE session_id = ? AND type"
                          " = 'messages.truncated'", "busy") == [(1,)]
