"""Sessions that end by themselves: idle TTLs (session.create's ttl_s, session.set_ttl, the
namespace defaults), the daemon's expiry sweep on both stores and in fleet mode, and
retention removing what expired."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pg
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon

from sessiond import AsyncClient
from sessiond_daemon.core.commands import default_ttl
from sessiond_daemon.features import expiry
from sessiond_schemas.errors import InvalidParamsError, InvalidTransitionError
from sessiond_schemas.events import Event, parse_time
from sessiond_schemas.state import MAX_TTL_S

pytestmark = pytest.mark.anyio


class Clock:
    """The expiry sweep's clock, set by the test; counts how often the daemon asked it."""

    def __init__(self, at: str = "0") -> None:
        self.at = at
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        return self.at


async def expired_events(c: AsyncClient, sid: str) -> list[Event]:
    return (await c.read_events(sid, types=["session.expired"])).events


async def status_of(c: AsyncClient, sid: str) -> str:
    return (await c.get_session(sid)).status


class TestTtlInTheView:
    async def test_create_set_and_clear(self, client: AsyncClient) -> None:
        """ttl_s at create and through session.set_ttl; expires_at is the last event's time
        + ttl_s; null without a TTL; set_ttl is an event (so activity) with its own type."""
        s = await client.create_session(ttl_s=60)
        assert s.ttl_s == 60
        assert s.expires_at is not None
        assert parse_time(s.expires_at) - parse_time(s.timestamps.updated_at) == timedelta(
            seconds=60)
        changed = await client.set_ttl(s.session_id, 3600)
        assert (changed.ttl_s, changed.version) == (3600, 2)
        assert changed.expires_at is not None
        assert parse_time(changed.expires_at) - parse_time(
            changed.timestamps.updated_at) == timedelta(seconds=3600)
        cleared = await client.set_ttl(s.session_id, None)
        assert (cleared.ttl_s, cleared.expires_at) == (None, None)
        [e1, e2] = (await client.read_events(s.session_id, types=["session.ttl_set"])).events
        assert (e1.fields(), e2.fields()) == ({"ttl_s": 3600}, {"ttl_s": None})
        plain = await client.create_session()
        assert (plain.ttl_s, plain.expires_at) == (None, None)

    async def test_bounds_and_who_may_write_what(self, client: AsyncClient) -> None:
        """ttl_s is 1 s … ten years; session.expired and session.ttl_set are written only by
        the daemon's own paths; no transition leads to expired."""
        for bad in (0, -1, MAX_TTL_S + 1):
            with pytest.raises(InvalidParamsError) as err:
                await client.create_session(ttl_s=bad)
            assert err.value.data["path"] == "$.ttl_s"
        s = await client.create_session(ttl_s=MAX_TTL_S)
        with pytest.raises(InvalidParamsError):
            await client.set_ttl(s.session_id, 0)
        for kind, data in (("session.expired", {"ttl_s": 1, "idle_since": "2026-01-01"}),
                           ("session.ttl_set", {"ttl_s": 5})):
            with pytest.raises(InvalidParamsError, match=r"session\.set_ttl"):
                await client.append_events(s.session_id, [{"type": kind, "data": data}])
        with pytest.raises(InvalidTransitionError):
            await client.transition(s.session_id, "expired")
        assert (await client.get_session(s.session_id)).version == 1

    async def test_an_ended_session_has_no_expiry(self, client: AsyncClient) -> None:
        s = await client.create_session(ttl_s=5)
        done = await client.transition(s.session_id, "completed")
        assert (done.ttl_s, done.expires_at) == (5, None)
        again = await client.transition(s.session_id, "active")
        assert again.expires_at is not None

    def test_namespace_defaults_longest_prefix_wins(self) -> None:
        defaults = {"team": 10, "adk:*": 20, "adk:support:*": 30}
        assert [default_ttl(defaults, ns) for ns in (
            "team", "team2", "adk:x:u", "adk:support:u", "other")] == [10, None, 20, 30, None]


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"default_ttl_s": {"sdk": 7, "adk:*": 9}, "expire_every_s": 0.01}


class TestNamespaceDefault:
    async def test_a_new_session_takes_its_namespace_default(self, client: AsyncClient) -> None:
        """The config's default_ttl_s by namespace; the call's own ttl_s comes first."""
        assert (await client.create_session(namespace="sdk")).ttl_s == 7
        assert (await client.create_session(namespace="adk:app:u")).ttl_s == 9
        assert (await client.create_session(namespace="sdk", ttl_s=100)).ttl_s == 100
        assert (await client.create_session(namespace="local")).ttl_s is None


class TestExpiry:
    @pytest.mark.slow_on_postgresql
    async def test_ttl_1s_expires_once_and_retention_removes_it(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """TTL 1 s, the real clock: the session expires once, no sooner than 1 s after its
        last event; one with a long TTL and one without stay active; session.cleanup at 0
        days then removes the expired one only."""
        short = await client.create_session(ttl_s=1, namespace="local")
        await client.append_message(short.session_id, "user", "hello")
        long = await client.create_session(ttl_s=3600, namespace="local")
        plain = await client.create_session(namespace="local")
        await eventually(lambda: _is(client, short.session_id, "expired"), "the expiry")
        view = await client.get_session(short.session_id)
        [event] = await expired_events(client, short.session_id)
        assert event.version == view.version == 3
        assert event.data.ttl_s == 1
        last = (await client.read_events(short.session_id, from_version=2, limit=1)).events[0]
        assert event.data.idle_since == last.recorded_at
        assert parse_time(event.recorded_at) - parse_time(last.recorded_at) >= timedelta(
            seconds=1)  # never before the TTL had passed since the last event
        assert view.timestamps.completed_at == event.recorded_at
        assert view.expires_at is None
        for sid in (long.session_id, plain.session_id):
            assert await status_of(client, sid) == "active"
        # Later sweeps (one has run once a newer session expired) leave it as it is.
        marker = await client.create_session(ttl_s=1, namespace="local")
        await eventually(lambda: _is(client, marker.session_id, "expired"), "a later expiry")
        assert len(await expired_events(client, short.session_id)) == 1
        # Retention reaches it: the default statuses include expired.
        dry = await client.cleanup(older_than_days=0, dry_run=True)
        assert sorted(dry.session_ids) == sorted([short.session_id, marker.session_id])
        removed = await client.cleanup(older_than_days=0)
        assert sorted(removed.session_ids) == sorted([short.session_id, marker.session_id])
        listed = {s.session_id for s in (await client.list_sessions(namespace="local")).sessions}
        assert listed == {long.session_id, plain.session_id}

    @pytest.mark.slow_on_postgresql
    async def test_revived_session_can_expire_again(self, client: AsyncClient) -> None:
        s = await client.create_session(ttl_s=1, namespace="local")
        await eventually(lambda: _is(client, s.session_id, "expired"), "the expiry")
        await client.resume(s.session_id)  # expired -> active, as from completed
        await eventually(lambda: _is(client, s.session_id, "expired"), "the second expiry")
        assert len(await expired_events(client, s.session_id)) == 2


async def _is(c: AsyncClient, sid: str, status: str) -> bool:
    return await status_of(c, sid) == status


class TestDrivenClock:
    """The sweep's clock driven by the test: no wall-clock waits at all."""

    async def test_never_early_then_exactly_when_due(self, short_dir: str, db_url: str) -> None:
        """At one microsecond before expires_at, sweep after sweep leaves the session
        active; an append then moves expires_at on; at expires_at it expires."""
        clock = Clock()
        config = daemon_config(short_dir, db=db_url, expire_every_s=0.01)
        async with running_daemon(config, clock=clock) as d, AsyncClient(d.socket) as c:
            s = await c.create_session(ttl_s=30)
            assert s.expires_at is not None
            clock.at = _minus_1us(s.expires_at)
            seen = clock.calls
            await eventually(lambda: clock.calls > seen + 5, "several sweeps")
            assert await status_of(c, s.session_id) == "active"
            touched = await c.append_message(s.session_id, "user", "still here")
            view = await c.get_session(s.session_id)
            assert view.expires_at is not None and view.expires_at > s.expires_at
            clock.at = s.expires_at  # the old expiry: no longer due
            seen = clock.calls
            await eventually(lambda: clock.calls > seen + 5, "several sweeps")
            assert await status_of(c, s.session_id) == "active"
            clock.at = view.expires_at
            await eventually(lambda: _is(c, s.session_id, "expired"), "the expiry")
            [event] = await expired_events(c, s.session_id)
            assert event.version == touched.version + 1

    async def test_the_sweep_pages_through_many_due_sessions(
            self, short_dir: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """More due sessions than a page: every one expires, once (pages of 7 here)."""
        monkeypatch.setattr(expiry, "PAGE", 7)
        clock = Clock()
        config = daemon_config(short_dir, db=db_url, expire_every_s=0.01)
        async with running_daemon(config, clock=clock) as d, AsyncClient(d.socket) as c:
            ids = [(await c.create_session(ttl_s=5)).session_id for _ in range(30)]
            keep = await c.create_session(ttl_s=MAX_TTL_S)
            clock.at = (parse_time(keep.timestamps.updated_at) + timedelta(days=365)).strftime(
                "%Y-%m-%dT%H:%M:%S.%fZ")  # past the 5 s TTLs, long before ten years
            for sid in ids:
                await eventually(lambda sid=sid: _is(c, sid, "expired"), f"{sid} to expire")
            for sid in ids:
                assert len(await expired_events(c, sid)) == 1
            assert await status_of(c, keep.session_id) == "active"
            rows = d.sql("SELECT COUNT(*) FROM sessions WHERE expires_at IS NOT NULL")
            assert rows == [(1,)]  # only the one still running is in the expiry index


def _minus_1us(at: str) -> str:
    return (parse_time(at) - timedelta(microseconds=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_due_is_at_expires_at_never_before() -> None:
    from sessiond_schemas.state import SessionState, Timestamps

    t = "2026-01-01T00:00:00.000000Z"
    state = SessionState(session_id="s", version=1, status="active", ttl_s=1,
                         timestamps=Timestamps(created_at=t, updated_at=t),
                         expires_at="2026-01-01T00:00:01.000000Z")
    assert not expiry.due(state, "2026-01-01T00:00:00.999999Z")
    assert expiry.due(state, "2026-01-01T00:00:01.000000Z")
    for status in ("completed", "expired", "failed"):
        state.status = status
        assert not expiry.due(state, "2100-01-01T00:00:00.000000Z")
    assert not expiry.due(None, "2100-01-01T00:00:00.000000Z")


class TestFleet:
    @pytest.fixture
    def pg_url(self) -> Iterator[str]:
        yield from pg.database()

    async def test_two_daemons_expire_each_session_once(self, pg_url: str,
                                                        short_dir: str) -> None:
        """Two daemons on one PostgreSQL database, both sweeping the same due sessions at
        the same moment: each session has exactly one session.expired; retention through
        either removes them."""
        clocks = [Clock(), Clock()]
        configs = [daemon_config(os.path.join(short_dir, name), db=pg_url, expire_every_s=0.01)
                   for name in "ab"]
        for config in configs:
            os.makedirs(os.path.dirname(config.socket or ""), exist_ok=True)
        async with (running_daemon(configs[0], clock=clocks[0]) as a,
                    running_daemon(configs[1], clock=clocks[1]) as b,
                    AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
            ids = [(await (on_a if i % 2 else on_b).create_session(ttl_s=5)).session_id
                   for i in range(40)]
            for clock in clocks:
                clock.at = "3000-01-01T00:00:00.000000Z"
            for sid in ids:
                await eventually(lambda sid=sid: _is(on_a, sid, "expired"), f"{sid} to expire")
            seen = [clock.calls for clock in clocks]
            await eventually(lambda: all(c.calls > s + 5 for c, s in zip(clocks, seen,
                                                                        strict=True)),
                             "both daemons to sweep again")
            for sid in ids:
                assert len(await expired_events(on_b, sid)) == 1, sid
            removed = await on_b.cleanup(older_than_days=0)
            assert sorted(removed.session_ids) == sorted(ids)
            assert (await on_a.list_sessions()).sessions == []


@pytest.mark.sqlite_only("the query plan is SQLite's")
async def test_the_sweep_reads_the_expiry_index_only(daemon: Daemon) -> None:
    """The sweep's page is a range of the partial index sessions_by_expiry (a covering
    index): its cost is the due sessions, not the sessions table."""
    from sessiond_daemon.stores.models.views import EXPIRING_SQL

    plan = daemon.sql("EXPLAIN QUERY PLAN " + EXPIRING_SQL, "2030", "", "", 500)
    assert [row[3] for row in plan] == [
        "SEARCH sessions USING COVERING INDEX sessions_by_expiry"
        " ((expires_at,session_id)>(?,?) AND expires_at<?)"]
