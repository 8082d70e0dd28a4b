"""The fold is law: for any command sequence, stored views equal a fresh fold of the events."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import pytest
from conftest import Daemon, eventually
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessiond import AsyncClient, SessiondError
from sessiond_daemon.core.projection import fold
from sessiond_schemas import rpc
from sessiond_schemas.events import ALLOWED_TRANSITIONS, STATUSES, Event
from sessiond_schemas.export import link_ok
from sessiond_schemas.state import SessionState

pytestmark = pytest.mark.anyio

names = st.text(alphabet="abcdefgh", min_size=1, max_size=4)
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), names)
json_value = st.recursive(json_leaf, lambda inner: st.dictionaries(names, inner, max_size=3),
                          max_leaves=6)
patches = st.dictionaries(names, json_value, max_size=4)
texts = st.text(min_size=1, max_size=20).filter(lambda t: t.strip() != "")

commands = st.one_of(
    st.tuples(st.just("message"), st.sampled_from(["user", "assistant", "system"]), texts),
    st.tuples(st.just("messages"), st.lists(texts, min_size=1, max_size=4)),
    st.tuples(st.just("tokens"), st.integers(0, 1000), st.integers(0, 1000),
              st.floats(0, 10, allow_nan=False)),
    st.tuples(st.just("progress"), names, st.integers(0, 3), st.booleans(),
              st.one_of(st.none(), names)),
    st.tuples(st.just("checkpoint"), st.one_of(st.none(), names), json_value),
    st.tuples(st.just("memory"), patches),
    st.tuples(st.just("transition"), st.sampled_from(STATUSES), st.one_of(st.none(), names)),
    st.tuples(st.just("resume")),
    st.tuples(st.just("pop")),
    st.tuples(st.just("graph"), names),
    st.tuples(st.just("graph_prune")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("ttl"), st.one_of(st.none(), st.integers(1, 10**6))),
    st.tuples(st.just("expire")),
    st.tuples(st.just("compact"), st.integers(-1, 6), texts),
    st.tuples(st.just("events"), st.lists(st.sampled_from(
        ["plan", "problem", "decision", "result", "metadata", "started", "output", "exited",
         "detached", "state", "app_state", "chunk", "chunk_bytes"]),
        min_size=1, max_size=3), names),
)


# The commands, with retention's trims (a third of the time: a trim needs a compaction
# and a snapshot behind it). Not for forks' tests: a source with forks is not trimmed,
# and a trimmed fork's history no longer starts with its session.forked.
trimming = st.one_of(commands, st.tuples(st.just("compact"), st.integers(-1, 6), texts),
                     st.tuples(st.just("trim")))


class SweepClock:
    """The daemon's expiry clock here: never due, until `expire` says every TTL has passed."""

    def __init__(self) -> None:
        self.at = "0"  # before every time

    def __call__(self) -> str:
        return self.at


CLOCK = SweepClock()


@pytest.fixture
def daemon_clock() -> SweepClock:
    return CLOCK


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"expire_every_s": 0.01}


async def expire(c: AsyncClient, sid: str) -> None:
    """session.expired through the daemon's own sweep: a TTL, then time past it."""
    await c.set_ttl(sid, 1)
    if (await c.get_session(sid)).status not in ("pending", "active", "paused"):
        return
    CLOCK.at = "9999-12-31T23:59:59.999999Z"
    try:
        await eventually(lambda: _status(c, sid, "expired"), f"{sid} to expire")
    finally:
        CLOCK.at = "0"


async def _status(c: AsyncClient, sid: str, status: str) -> bool:
    return (await c.get_session(sid)).status == status


async def run_command(c: AsyncClient, sid: str, cmd: tuple[Any, ...]) -> None:
    kind = cmd[0]
    if kind == "ttl":
        await c.set_ttl(sid, cmd[1])
    elif kind == "expire":
        await expire(c, sid)
    elif kind == "trim":  # a compaction of all so far, then retention behind it
        count = (await c.get_session(sid)).message_count
        await c.compact(sid, [{"role": "system", "content": "all so far"}],
                        through_sequence=count - 1)
        await c.trim(sid, older_than_days=0)
    elif kind == "compact":  # a summary of up to cmd[1] + 1 messages (-1: of none)
        count = (await c.get_session(sid)).message_count
        await c.compact(sid, [{"role": "system", "content": cmd[2]}],
                        through_sequence=min(cmd[1], count - 1))
    elif kind == "message":
        await c.append_message(sid, cmd[1], cmd[2])
    elif kind == "messages":
        await c.append_messages(sid, [{"role": "user", "content": t} for t in cmd[1]])
    elif kind == "tokens":
        await c.record_tokens(sid, input_tokens=cmd[1], output_tokens=cmd[2], estimated_cost=cmd[3])
    elif kind == "progress":
        await c.record_progress(sid, cmd[1], retries=cmd[2], failed=cmd[3], edge=cmd[4])
    elif kind == "checkpoint":
        await c.save_checkpoint(sid, cmd[2], node_id=cmd[1])
    elif kind == "memory":
        await c.update_memory(sid, cmd[1])
    elif kind == "transition":
        await c.transition(sid, cmd[1], paused_at=cmd[2])
    elif kind == "resume":
        await c.resume(sid)
    elif kind == "pop":
        await c.pop_message(sid)
    elif kind == "clear":
        await c.clear_messages(sid)
    elif kind == "graph":
        typed = {"type": "json", "data": b"{}"}
        await c.call("graph.put", rpc.WriteResult, session_id=sid, thread_id=sid,
                     checkpoint_id=f"{next(counter):08}", checkpoint=typed,
                     channel_versions={"ch": cmd[1]}, blobs={"ch": typed})
        await c.call("graph.put_writes", rpc.WriteResult, session_id=sid, thread_id=sid,
                     checkpoint_id="x", task_id="t", writes=[{"idx": 0, "channel": "ch",
                                                              "value": typed}])
    elif kind == "graph_prune":  # graph.pruned when the thread has older checkpoints
        await c.call("graph.prune", rpc.GraphChangeResult, session_ids=[sid])
    else:
        datas = {"plan": ("plan.linked", {"plan_id": cmd[2]}),
                 "problem": ("problem.recorded", {"what": cmd[2]}),
                 "decision": ("decision.recorded", {"pick": cmd[2]}),
                 "result": ("result.recorded", {"success": True, "output": {"o": cmd[2]}}),
                 "metadata": ("metadata.updated", {"patch": {cmd[2]: 1}}),
                 "started": ("process.started", {"pid": 4242, "argv": [cmd[2]], "turn": 1}),
                 "output": ("process.output", {"turn": 1, "line": cmd[2]}),
                 "exited": ("process.exited", {"pid": 4242, "turn": 1, "exit_code": 3}),
                 "detached": ("process.detached", {"pid": 4242, "turn": 1, "alive": False,
                                                   "reason": cmd[2]}),
                 "state": ("state.updated", {"scope": "session", "delta": {cmd[2]: None}}),
                 "app_state": ("state.updated", {"scope": "app", "app_name": "p",
                                                 "delta": {cmd[2]: 1}}),
                 "chunk": ("stream.chunk", {"text": cmd[2], "seq": cmd[2]}),
                 "chunk_bytes": ("stream.chunk", {"base64": "AAEC/w=="})}
        await c.append_events(sid, [{"type": datas[k][0], "data": datas[k][1]} for k in cmd[1]])


async def all_events(c: AsyncClient, sid: str) -> list[Event]:
    """The session's stored events: from its first, or from where a trim left it."""
    events: list[Event] = []
    history = (await c.get_session(sid)).history
    version: int | None = history.version if history is not None else 1
    while version is not None:
        page = await c.read_events(sid, from_version=version, limit=50)
        events += page.events
        version = page.next
    return events


counter = iter(range(1_000_000))


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(initial=st.sampled_from(["pending", "active"]),
       script=st.lists(trimming, min_size=0, max_size=25))
@pytest.mark.slow_on_postgresql
async def test_stored_view_equals_fresh_fold(daemon: Daemon, client: AsyncClient,
                                             initial: str, script: list[tuple[Any, ...]]) -> None:
    """Random command sequences: view == fold(events), gapless versions, chain and time travel."""
    sid = f"prop-{next(counter)}"
    await client.create_session(sid, status=initial)
    for cmd in script:
        before = (await client.get_session(sid)).version
        try:
            await run_command(client, sid, cmd)
        except SessiondError:
            # A refused command (say, a forbidden transition) must change nothing.
            assert (await client.get_session(sid)).version == before

    events = await all_events(client, sid)
    history = (await client.get_session(sid)).history
    first = history.version if history is not None else 1
    assert [e.version for e in events] == list(range(first, first + len(events)))
    base = None  # a trimmed history folds on from the snapshot kept at its anchor
    if history is not None:
        [(snap,)] = daemon.sql("SELECT state FROM snapshots WHERE session_id = ? AND"
                               " version = ?", sid, first - 1)
        base = msgspec.json.decode(snap, type=SessionState)

    def fold_to(version: int) -> SessionState:
        return fold(base, [e for e in events if e.version <= version])

    fresh = fold(base, events)
    served = await client.get_session(sid)
    [(stored_json,)] = daemon.sql("SELECT state FROM sessions WHERE session_id = ?", sid)
    stored = msgspec.json.decode(stored_json, type=SessionState)
    assert msgspec.to_builtins(served) == msgspec.to_builtins(fresh)
    assert msgspec.to_builtins(stored) == msgspec.to_builtins(fresh)

    prev = history.anchor if history is not None else ""
    for e in events:
        assert link_ok(prev, e)
        prev = e.hash
    [(last_hash, message_count)] = daemon.sql(
        "SELECT last_hash, message_count FROM sessions WHERE session_id = ?", sid)
    assert last_hash == prev and message_count == fresh.message_count

    n = first + len(events) - 1
    for k in sorted({v for v in (first, first + 1, (first + n) // 2, n - 1, n) if first <= v <= n}):
        past = await client.get_session(sid, at_version=k)
        assert msgspec.to_builtins(past) == msgspec.to_builtins(fold_to(k))

    # Snapshots (every 4 versions in tests) are a cache of the fold too.
    for version, snap in daemon.sql(
            "SELECT version, state FROM snapshots WHERE session_id = ?", sid):
        snapshot = msgspec.json.decode(snap, type=SessionState)
        assert msgspec.to_builtins(snapshot) == msgspec.to_builtins(fold_to(version))
    if history is not None:  # the conversation before the trim is gone; what is kept:
        kept = (await client.list_messages(sid, limit=1000,
                                           after_sequence=history.through_sequence)).messages
        assert [m.sequence for m in kept] == list(range(history.through_sequence + 1,
                                                        fresh.message_count))
        assert (await client.verify()).ok
        return

    messages = (await client.list_messages(sid, limit=1000)).messages
    assert [m.sequence for m in messages] == list(range(fresh.message_count))
    # The conversation is what the message events say, after each truncation's cut.
    conversation: list[str] = []
    for kind, raw in daemon.sql(
            "SELECT type, data FROM events WHERE session_id = ? AND type IN"
            " ('message.appended', 'messages.truncated') ORDER BY version", sid):
        data = json.loads(raw)
        if kind == "message.appended":
            conversation.append(data["content"])
        else:
            del conversation[data["from_sequence"]:]
    assert [m.content for m in messages] == conversation
    # The context read: the messages after the last compaction still standing.
    context = await client.context(sid, limit=1000)
    start = fresh.context.through_sequence + 1 if fresh.context is not None else 0
    assert [m.content for m in context.messages] == conversation[start:]
    assert (context.compaction is None) == (fresh.context is None)


IDENTITY = ("session_id", "forked_from")  # what a fork's view has of its own (docs/protocol.md)


def shared(state: SessionState) -> dict[str, Any]:
    """A view without the fields that identify its session."""
    return {k: v for k, v in msgspec.to_builtins(state).items() if k not in IDENTITY}


async def conversation_of(daemon: Daemon, client: AsyncClient, sid: str) -> list[str]:
    """The conversation the message events say, through a fork's source up to its point."""
    state = await client.get_session(sid)
    events = await all_events(client, sid)
    conversation: list[str] = []
    if state.forked_from is not None:
        source = state.forked_from
        conversation = (await conversation_at(daemon, client, source.session_id, source.version))
    for e in events:
        if e.type == "message.appended":
            conversation.append(e.data.content)
        elif e.type == "messages.truncated":
            del conversation[e.data.from_sequence:]
    return conversation


async def conversation_at(daemon: Daemon, client: AsyncClient, sid: str,
                          version: int) -> list[str]:
    state = await client.get_session(sid)
    conversation: list[str] = []
    if state.forked_from is not None and state.forked_from.version < version:
        source = state.forked_from
        conversation = await conversation_at(daemon, client, source.session_id, source.version)
    elif state.forked_from is not None:
        return await conversation_at(daemon, client, state.forked_from.session_id, version)
    for e in await all_events(client, sid):
        if e.version > version:
            break
        if e.type == "message.appended":
            conversation.append(e.data.content)
        elif e.type == "messages.truncated":
            del conversation[e.data.from_sequence:]
    return conversation


@pytest.mark.slow_on_postgresql
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(before=st.lists(commands, min_size=1, max_size=12),
       after_source=st.lists(commands, max_size=6),
       after_fork=st.lists(commands, max_size=8),
       cut=st.floats(0, 1), cut2=st.floats(0, 1), twice=st.booleans())
@pytest.mark.fleet
async def test_forks_fold_and_travel_like_their_source(
        daemon: Daemon, client: AsyncClient, before: list[tuple[Any, ...]],
        after_source: list[tuple[Any, ...]], after_fork: list[tuple[Any, ...]],
        cut: float, cut2: float, twice: bool) -> None:
    """Fork at any version (and a fork of the fork): the fork's view == fold(its events),
    its chain goes on from the source's hash, its past at or below the fork point is the
    source's past, and its conversation is the source's up to the point, then its own."""
    source = f"prop-{next(counter)}"
    await client.create_session(source)
    for cmd in before:
        with contextlib.suppress(SessiondError):
            await run_command(client, source, cmd)
    n = (await client.get_session(source)).version
    at = max(1, round(cut * n))
    fork = (await client.fork(source, at_version=at)).session_id
    for cmd in after_source:  # the source moves on; the fork keeps what it had
        with contextlib.suppress(SessiondError):
            await run_command(client, source, cmd)
    for cmd in after_fork:
        with contextlib.suppress(SessiondError):
            await run_command(client, fork, cmd)
    chain = [(source, at, fork)]
    if twice:
        m = (await client.get_session(fork)).version
        at2 = max(1, round(cut2 * m))
        child = (await client.fork(fork, at_version=at2)).session_id
        chain.append((fork, at2, child))

    for parent, point, sid in chain:
        events = await all_events(client, sid)
        assert events[0].type == "session.forked"
        assert [e.version for e in events] == list(range(point + 1, point + 1 + len(events)))
        fresh = fold(None, events)
        served = await client.get_session(sid)
        [(stored_json,)] = daemon.sql("SELECT state FROM sessions WHERE session_id = ?", sid)
        assert msgspec.to_builtins(served) == msgspec.to_builtins(fresh)
        assert msgspec.to_builtins(
            msgspec.json.decode(stored_json, type=SessionState)) == msgspec.to_builtins(fresh)
        assert served.forked_from is not None
        assert (served.forked_from.session_id, served.forked_from.version) == (parent, point)

        # The chain starts from the source's hash at the fork point.
        [at_point] = [e for e in (await client.read_events(
            parent, from_version=min(point, (await client.get_session(parent)).version)
        )).events if e.version == point] or [None]
        start_hash = events[0].data.from_.hash
        if at_point is not None:
            assert at_point.hash == start_hash
        prev = start_hash
        for e in events:
            assert link_ok(prev, e)
            prev = e.hash

        # At or below the fork point, the fork's past is the source's past.
        for v in sorted({1, point // 2, point} - {0}):
            mine = await client.get_session(sid, at_version=v)
            theirs = await client.get_session(parent, at_version=v)
            assert shared(mine) == shared(theirs)
            assert mine.session_id == sid and mine.forked_from == served.forked_from
        # Above it, the fold of its own events.
        for k in sorted({1, len(events)}):
            past = await client.get_session(sid, at_version=point + k)
            assert msgspec.to_builtins(past) == msgspec.to_builtins(fold(None, events[:k]))

        messages = (await client.list_messages(sid, limit=1000)).messages
        assert [m.sequence for m in messages] == list(range(fresh.message_count))
        assert [m.content for m in messages] == await conversation_of(daemon, client, sid)

    forks = await client.forks(source)
    assert [f.session_id for f in forks.forks] == [fork] and forks.count == 1
    report = await client.verify()
    assert report.ok, report.problems


# process.* events are written only by the executor runner (clients get -32602), so the
# command scripts above cannot make them. Imported histories can: that is how they reach
# the fold from outside, and the import's own "history only" mark must fold too.
process_events = st.lists(st.one_of(
    st.tuples(st.just("process.started"), st.integers(1, 3)),
    st.tuples(st.just("process.output"), names),
    st.tuples(st.just("process.exited"), st.one_of(st.none(), st.integers(-9, 255))),
    st.tuples(st.just("process.detached"), st.booleans()),
    st.tuples(st.just("message.appended"), names),
    st.tuples(st.just("session.status_changed"), st.sampled_from(STATUSES)),
), max_size=12)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@pytest.mark.slow_on_postgresql
@given(script=process_events)
async def test_imported_process_histories_fold(daemon: Daemon, client: AsyncClient,
                                               script: list[tuple[str, Any]]) -> None:
    """An imported executor history: the stored view, snapshots and time travel equal a
    fresh fold of what was stored, the import's mark included."""
    from sessiond.importers._builder import DocumentBuilder

    sid = f"proc-{next(counter)}"
    b = DocumentBuilder(sid, "test")
    b.add("session.created", {"adapter": "jsonl", "status": "active"}, "2026-01-01T00:00:00Z")
    turn, status, messages = 0, "active", 0
    for i, (kind, arg) in enumerate(script, start=1):
        at = f"2026-01-01T00:00:{i:02d}Z"
        if kind == "process.started":
            turn += 1
            b.add(kind, {"pid": 4000 + turn, "argv": ["agent"], "turn": turn}, at)
        elif kind == "process.output" and turn:
            b.add(kind, {"turn": turn, "line": arg}, at)
        elif kind == "process.exited" and turn:
            b.add(kind, {"pid": 4000 + turn, "turn": turn, "exit_code": arg}, at)
        elif kind == "process.detached" and turn:
            b.add(kind, {"pid": 4000 + turn, "turn": turn, "alive": arg, "reason": "test"}, at)
        elif kind == "message.appended":
            b.add(kind, {"message_id": f"m{messages}", "sequence": messages,
                         "role": "assistant", "content": arg}, at)
            messages += 1
        elif kind == "session.status_changed" and arg in ALLOWED_TRANSITIONS[status]:
            b.add(kind, {"from": status, "to": arg}, at)
            status = arg
    state = await client.import_session(b.document())
    events = await all_events(client, sid)
    assert [e.version for e in events] == list(range(1, len(events) + 1))
    assert msgspec.to_builtins(state) == msgspec.to_builtins(fold(None, events))
    [(stored_json,)] = daemon.sql("SELECT state FROM sessions WHERE session_id = ?", sid)
    stored = msgspec.json.decode(stored_json, type=SessionState)
    assert msgspec.to_builtins(stored) == msgspec.to_builtins(fold(None, events))
    for k in sorted({1, len(events) // 2, len(events)} - {0}):
        past = await client.get_session(sid, at_version=k)
        assert msgspec.to_builtins(past) == msgspec.to_builtins(fold(None, events[:k]))
