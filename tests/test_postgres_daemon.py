"""Real daemons on one PostgreSQL database: what one host writes, another reads, and a
retry through another host under the same idempotency key appends nothing. (The fleet
test with kill -9 and cross-host subscriptions comes with the integration.)"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pg
import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import VersionConflictError

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


async def test_two_daemons_share_one_database(pg_url: str, short_dir: str) -> None:
    configs = [daemon_config(os.path.join(short_dir, name), db=pg_url)
               for name in ("a", "b")]
    for config in configs:
        os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
    async with (running_daemon(configs[0]) as a, running_daemon(configs[1]) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        s = await on_a.create_session()
        first = await on_a.append_message(s.session_id, "user", "from a",
                                          idempotency_key="k1")
        # Host B never saw the session: it reads it, and its writer decides against
        # the database, not a cache.
        second = await on_b.append_message(s.session_id, "user", "from b")
        assert second.version == first.version + 1
        # A retry of a's write through b: the first result, nothing appended.
        again = await on_b.append_message(s.session_id, "user", "from a",
                                          idempotency_key="k1")
        assert again == first
        # a's cached view is stale now: the database's version decides.
        with pytest.raises(VersionConflictError):
            await on_a.append_message(s.session_id, "user", "late",
                                      expected_version=first.version)
        third = await on_a.append_message(s.session_id, "user", "from a again")
        assert third.version == second.version + 1
        page = await on_b.list_messages(s.session_id)
        assert [m.content for m in page.messages] == ["from a", "from b", "from a again"]
        events = await on_b.read_events(s.session_id)
        positions = [e.position for e in events.events]
        assert positions == list(range(1, len(positions) + 1))
        assert (await on_a.get_session(s.session_id)).version == third.version
        # Full-text search over the shared index: what b wrote, a finds.
        [found] = (await on_a.search("from b")).sessions
        assert found.session_id == s.session_id and found.matches == 1
    assert not os.path.exists("postgresql:")  # no SQLite file made of the URL
