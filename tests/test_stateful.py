"""The acceptance test of issues 13 and 24: a stateful hypothesis run against a real daemon.

Every method of rpc.METHODS and events.append of every event type, with numbers
at and past their bounds and hostile strings, over the real socket; imports of
documents built from those values; restarts between steps, and rows no daemon
would write put into the file while it is stopped. After every step the
daemon answers ping, after every restart it has started, at the end
daemon.verify is ok and SIGTERM ends a daemon process started on what is left,
and every refusal carries a contract code (never -32603) and names its field.
Issue 24 added fork documents with claimed counts and self or cyclic sources,
fork chains past max_fork_depth, odd and NUL session ids in imports, and
900-character search queries.

SESSIOND_STATEFUL_EXAMPLES sets how many runs (default 15; CI may raise it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from typing import Any

import anyio
import msgspec
import pytest
from conftest import PATIENCE_S, daemon_config, wait_for_daemon
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from sessiond_daemon.serve import lifecycle
from sessiond_schemas import rpc
from sessiond_schemas.events import DATA_TYPES, EVENT_TYPES, event_from_builtins
from sessiond_schemas.export import FORMAT, FORMAT_VERSION, chain_hash, checksum

EXAMPLES = int(os.environ.get("SESSIOND_STATEFUL_EXAMPLES", "15"))

NUMBERS: list[Any] = [0, -1, 2**31, 2**53, 2**63 - 1, 2**63, 2**64, 1e308, -0.0, 1]
MIB = "<1 MiB of x>"  # stands for the string; `call` puts the mebibyte in (short reprs)
_MIB_JSON, _MIB_TEXT = json.dumps(MIB), json.dumps("x" * (1 << 20))
LONE_SURROGATE = "\ud800"  # json.dumps writes it as the escape "\ud800"
# The 1 MiB string and the lone surrogate (which makes the whole line a parse error) are
# one draw in many, so a run stays small and most requests reach the methods.
STRINGS: list[str] = ["", "a\x00b", "\x00", "ok", "s1", "node"] * 3 + [LONE_SURROGATE, MIB]
SESSIONS = ["s1", "s2", "s3"]
# Session ids no daemon makes, for imports (issue 24): refused as -32602 naming the path.
ODD_IDS = ["", "../../etc/passwd", "a\x00b", "x" * 300, "a b"]
# The machine's daemon bounds fork chains low, so the deep-chain rule meets the bound.
MAX_FORK_DEPTH = 24
CONTRACT_CODES = {-32700, -32600, -32601, -32602, -32603, -32001, -32002, -32003, -32004,
                  -32005, -32006, -32007, -32008, -32009, -32010, -32011, -32012}

numbers = st.sampled_from(NUMBERS)
strings = st.sampled_from(STRINGS)
json_values = st.one_of(numbers, strings, st.none(), st.booleans())
json_objects = st.dictionaries(st.sampled_from(["k", "", "n"]), json_values, max_size=2)


# --- params from the schemas ------------------------------------------------------------


def _for(info: Any, name: str = "") -> st.SearchStrategy[Any]:
    """Values for one field type: boundary numbers and strings where they may go."""
    mi = msgspec.inspect
    if isinstance(info, (mi.IntType, mi.FloatType)):
        return numbers
    if isinstance(info, mi.StrType):
        if name.endswith("session_id") or name == "prefix":
            return st.sampled_from(SESSIONS * 7 + STRINGS)  # mostly sessions that exist
        return strings
    if isinstance(info, mi.BoolType):
        return st.booleans()
    if isinstance(info, mi.LiteralType):
        return st.sampled_from(list(info.values))
    if isinstance(info, mi.NoneType):
        return st.none()
    if isinstance(info, mi.UnionType):
        return st.one_of(*[_for(t, name) for t in info.types])
    if isinstance(info, mi.ListType):
        return st.lists(_for(info.item_type, name), min_size=max(1, info.min_length or 0),
                        max_size=2)
    if isinstance(info, mi.DictType):
        return st.dictionaries(st.sampled_from(["k", ""]), _for(info.value_type, name),
                               max_size=2)
    if isinstance(info, mi.BytesType):
        return st.sampled_from(["eA==", ""])  # base64
    if isinstance(info, mi.StructType):
        if info.cls is rpc.EventInput:
            return event_inputs()
        return _struct(info)
    if isinstance(info, mi.TupleType):
        return st.tuples(*[_for(t, name) for t in info.item_types]).map(list)
    return json_values  # Any


def _struct(info: Any) -> st.SearchStrategy[dict[str, Any]]:
    """A params object: every required field, each optional one sometimes."""
    required = {f.encode_name: _for(f.type, f.name) for f in info.fields if f.required}
    optional = {f.encode_name: _for(f.type, f.name) for f in info.fields if not f.required}
    return st.fixed_dictionaries(required, optional=optional)


def params_for(method: str) -> st.SearchStrategy[dict[str, Any]]:
    return _struct(msgspec.inspect.type_info(rpc.METHODS[method][0]))


@st.composite
def event_inputs(draw: st.DrawFn) -> dict[str, Any]:
    event_type = draw(st.sampled_from(EVENT_TYPES))
    return {"type": event_type,
            "data": draw(_struct(msgspec.inspect.type_info(DATA_TYPES[event_type])))}


# Executors get harmless programs only: one that does not exist, and an empty Python.
HARMLESS_ARGV = [["/nonexistent/sessiond-test-program"], [sys.executable, "-S", "-c", "pass"]]
SPECIAL: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "session.spawn": st.fixed_dictionaries(
        {"argv": st.sampled_from(HARMLESS_ARGV)},
        optional={"session_id": st.sampled_from(SESSIONS * 7 + STRINGS), "task": strings,
                  "metadata": json_objects, "model": strings}),
    "session.inject": st.fixed_dictionaries(
        {"session_id": st.sampled_from(SESSIONS), "message": strings}),
    "session.kill": st.fixed_dictionaries({"session_id": st.sampled_from(SESSIONS * 7 + STRINGS)}),
}
METHODS = sorted(rpc.METHODS)

# The least each method needs to be valid on session s1; one number at a time is then
# put at or past its bound, so that no other field's refusal hides it.
MINIMAL: dict[str, dict[str, Any]] = {
    "session.create": {}, "session.list": {}, "events.read": {}, "events.subscribe": {},
    "graph.list": {}, "session.cleanup": {"dry_run": True},
    "session.states": {"namespace": "local"},
    "session.transition": {"session_id": "s1", "to": "paused"},
    "message.append": {"session_id": "s1", "role": "user", "content": "hi"},
    "message.append_many": {"session_id": "s1", "messages": [{"role": "user", "content": "hi"}]},
    "progress.record": {"session_id": "s1", "node_id": "n"},
    "memory.update": {"session_id": "s1", "patch": {}},
    "events.append": {"session_id": "s1", "events": [{"type": "decision.recorded", "data": {}}]},
    "session.spawn": {"argv": HARMLESS_ARGV[0]},
    "session.inject": {"session_id": "s1", "message": "hi"},
    "session.resolve": {"prefix": "s1s1"},
    "state.get": {"app_name": "a"},
    "daemon.backup": {"path": "/nonexistent-sessiond-dir/backup.db"},
    "session.import": {"document": "{}"},
    "events.unsubscribe": {"subscription": "x"},
    "graph.put": {"session_id": "g1", "thread_id": "t", "checkpoint_id": "c",
                  "checkpoint": {"type": "t", "data": "eA=="}},
    "graph.put_writes": {"session_id": "g1", "thread_id": "t", "checkpoint_id": "c",
                         "task_id": "k", "writes": [{"idx": 0, "channel": "c",
                                                     "value": {"type": "t", "data": "eA=="}}]},
    "graph.copy": {"source_session_id": "g1", "target_session_id": "g2",
                   "target_thread_id": "t"},
    "graph.delete_runs": {"run_ids": ["r"]},
    "graph.prune": {"session_ids": ["g2"]},
}


def _numeric(info: Any) -> bool:
    mi = msgspec.inspect
    if isinstance(info, mi.UnionType):
        return any(_numeric(t) for t in info.types)
    return isinstance(info, (mi.IntType, mi.FloatType))


def _textual(info: Any) -> bool:
    mi = msgspec.inspect
    if isinstance(info, mi.UnionType):
        return any(_textual(t) for t in info.types)
    return isinstance(info, mi.StrType)


STRING_FIELDS: list[tuple[str, str]] = sorted(
    (method, f.encode_name) for method, (params, _) in rpc.METHODS.items()
    for f in msgspec.inspect.type_info(params).fields  # type: ignore[attr-defined]
    if _textual(f.type))
NUMERIC_FIELDS: list[tuple[str, str]] = sorted(
    (method, f.encode_name) for method, (params, _) in rpc.METHODS.items()
    for f in msgspec.inspect.type_info(params).fields  # type: ignore[attr-defined]
    if _numeric(f.type))


def reseal(doc: dict[str, Any], sid: str, claimed: int | None = None) -> dict[str, Any]:
    """An exported document moved to session `sid`, its first event's `state.message_count`
    set to `claimed` (when given), sealed again: hash chain and checksum, as a forger would."""
    events = [dict(e) for e in doc["events"]]
    first = events[0]
    if claimed is not None and first["type"] == "session.forked":
        first["data"] = {**first["data"],
                         "state": {**first["data"]["state"], "message_count": claimed}}
    prev = first["data"]["from"]["hash"] if first["type"] == "session.forked" else ""
    for i, e in enumerate(events):
        e.update(session_id=sid, event_id=f"{sid[:64]}-forged-{i}", hash="")
        try:
            prev = chain_hash(prev, event_from_builtins(e))
        except (msgspec.ValidationError, UnicodeEncodeError):
            prev = "unhashable"
        e["hash"] = prev
    out = {**doc, "events": events, "session": None}
    out["checksum"] = checksum(out)
    return out


# --- a daemon in a thread of its own, restartable ---------------------------------------


class ThreadedDaemon:
    """A real in-process daemon on its own event loop in a thread, so that this
    synchronous state machine can talk to it over the socket and restart it."""

    def __init__(self, directory: str, db: str | None = None) -> None:
        self.config = daemon_config(directory, max_fork_depth=MAX_FORK_DEPTH,
                                    **({"db": db} if db else {}))
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    @property
    def socket(self) -> str:
        assert self.config.socket
        return self.config.socket

    def start(self) -> None:
        ready = threading.Event()
        self.error = None

        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.stop_event = asyncio.Event()
            try:
                self.lifecycle = lifecycle.Daemon(self.config)
                async with anyio.create_task_group() as tg:
                    shutdown = anyio.Event()
                    await tg.start(self.lifecycle.run, shutdown)
                    ready.set()
                    await self.stop_event.wait()
                    shutdown.set()
            except BaseException as exc:  # reported by start() or the ping invariant
                self.error = exc
            finally:
                ready.set()

        self.thread = threading.Thread(target=anyio.run, args=(main,),
                                       kwargs={"backend": "asyncio"}, daemon=True)
        self.thread.start()
        assert ready.wait(60), "the daemon did not start within a minute"
        assert self.error is None, f"the daemon did not start: {self.error!r}"

    def reload(self, **changes: Any) -> None:
        """What SIGHUP does: the daemon takes a new config's reloadable settings (run in
        its own loop; the changes are this config's with `changes`)."""
        new = msgspec.structs.replace(self.config, **changes)
        done = concurrent.futures.Future[None]()

        def apply() -> None:
            try:
                self.lifecycle.reload(new)
                done.set_result(None)
            except BaseException as exc:
                done.set_exception(exc)

        self.loop.call_soon_threadsafe(apply)
        done.result(PATIENCE_S)

    def stop(self) -> None:
        if self.thread is None:
            return
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(60)
        assert not self.thread.is_alive(), "the daemon did not stop"
        self.thread = None
        assert self.error is None, f"the daemon failed: {self.error!r}"


def call(path: str, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """One request on a connection of its own (subscriptions end with it); the reply."""
    line = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params},
                      ensure_ascii=True).replace(_MIB_JSON, _MIB_TEXT) + "\n"
    sock = socket.socket(socket.AF_UNIX)
    sock.settimeout(60)
    sock.connect(path)
    with sock, sock.makefile("rb") as f:
        sock.sendall(line.encode())
        while True:
            raw = f.readline()
            assert raw, f"the daemon closed the connection on {method}"
            reply: dict[str, Any] = json.loads(raw)
            if "method" not in reply:  # not a subscription notification
                return reply


def check_reply(method: str, params: dict[str, Any], reply: dict[str, Any]) -> None:
    """A result, or a refusal with a contract code (not a bug) that names its field."""
    if "result" in reply:
        return
    error = reply["error"]
    code, data = error["code"], error.get("data") or {}
    assert code in CONTRACT_CODES, (method, error)
    assert code != -32603, (method, params if len(json.dumps(params)) < 2000 else "…", error)
    assert error["message"], (method, error)
    if code == -32602:
        path = data.get("path")
        assert isinstance(path, str) and path.startswith("$"), (method, error)
        head = path[2:].split(".")[0].split("[")[0]
        fields = {f.encode_name for f in msgspec.structs.fields(rpc.METHODS[method][0])}
        assert path == "$" or head in params or head in fields, (method, error)
    elif code != -32010:
        assert data, (method, error)  # the field, id, limit or reason it is about


# --- the machine -------------------------------------------------------------------------


class DaemonMachine(RuleBasedStateMachine):
    """Random steps against one daemon; its database lives for one example."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="sd-st-")
        self.daemon = ThreadedDaemon(self.directory)
        self.backups = 0

    @initialize(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """Start, then send every method of the contract once (the rules add more)."""
        self.daemon.start()
        for sid in SESSIONS[:2]:
            self.send("session.create", {"session_id": sid})
        for method in METHODS:
            self.any_method(method, data)
            self.answers_ping()

    def send(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        reply = call(self.daemon.socket, method, params)
        check_reply(method, params, reply)
        return reply

    @rule(method=st.sampled_from(METHODS), data=st.data())
    def any_method(self, method: str, data: st.DataObject) -> None:
        """Every method of the contract, its params drawn from its schema."""
        if method == "daemon.backup":
            self.backups += 1
            params = {"path": data.draw(st.sampled_from([
                os.path.join(self.directory, f"backup-{self.backups}.db"),
                os.path.join(self.directory, "a\x00b.db"), "", "relative.db", MIB]))}
        else:
            params = data.draw(SPECIAL[method] if method in SPECIAL else params_for(method))
        self.send(method, params)

    @rule(field=st.sampled_from(NUMERIC_FIELDS), number=numbers)
    def one_number_at_the_bound(self, field: tuple[str, str], number: Any) -> None:
        """A valid request with one number at or past its bound."""
        method, name = field
        self.send("session.create", {"session_id": "s1"})  # taken or made: either will do
        params = dict(MINIMAL.get(method, {"session_id": "s1"}))
        params[name] = number
        self.send(method, params)

    @rule(event=event_inputs(), sid=st.sampled_from(SESSIONS), key=st.none() | strings)
    def append_event(self, event: dict[str, Any], sid: str, key: str | None) -> None:
        """events.append of every event type, data drawn from the type's schema."""
        params: dict[str, Any] = {"session_id": sid, "events": [event]}
        if key is not None:
            params["idempotency_key"] = key
        self.send("events.append", params)

    @rule(sid=st.sampled_from(SESSIONS), source=st.sampled_from(["self", "other", "cycle"]),
          claimed=st.sampled_from([None, 0, 3 * 10**7, 2**63 - 1]),
          conflict=st.sampled_from(["error", "replace"]))
    def import_fork_document(self, sid: str, source: str, claimed: int | None,
                             conflict: str) -> None:
        """A fork document sealed correctly, claiming a message count (None: the true one)
        and a source that is the session itself or that would close a cycle: refused or
        imported, never a loop, an allocation sized by the claim, or -32603."""
        reply = self.send("session.fork", {"session_id": sid})
        if "result" not in reply:
            return
        fork_id = reply["result"]["session_id"]
        if source == "cycle":  # a fork of the fork, imported as the source itself
            reply = self.send("session.fork", {"session_id": fork_id})
            if "result" not in reply:
                return
            doc = self.send("session.export", {"session_id": reply["result"]["session_id"]})
            new_id = sid
        else:
            doc = self.send("session.export", {"session_id": fork_id})
            if source == "self":  # the source alone again, then imported as a fork of itself
                self.send("session.delete", {"session_id": fork_id})
            new_id = sid if source == "self" else f"{fork_id}-copy"
        if "result" not in doc:
            return
        forged = reseal(doc["result"], new_id, claimed)
        self.send("session.import", {"document": forged, "on_conflict": conflict})

    @rule(depth=st.sampled_from([3, MAX_FORK_DEPTH + 2]))
    def deep_fork_chain(self, depth: int) -> None:
        """Forks of forks, past max_fork_depth: the last ones are -32602 naming the limit;
        time travel and a fork at the root's first version walk the chain."""
        self.send("session.create", {"session_id": "s1"})
        sid = "s1"
        for _ in range(depth):
            reply = self.send("session.fork", {"session_id": sid})
            if "result" not in reply:
                assert reply["error"]["code"] in (-32602, -32003), reply
                break
            sid = reply["result"]["session_id"]
        self.send("session.get", {"session_id": sid, "at_version": 1})
        self.send("session.fork", {"session_id": sid, "at_version": 1})

    @rule(words=st.sampled_from([1, 300]))
    def huge_search(self, words: int) -> None:
        """A 900-character query of short prefixes (`a* a* ...`): answered, whatever it
        costs (the cost budget is its own)."""
        self.send("session.search", {"query": " ".join(["a*"] * words), "limit": 100})

    @rule(sid=st.sampled_from(SESSIONS + ODD_IDS), tokens=numbers, cost=numbers,
          value=json_values,
          at=st.sampled_from(["2026-01-01T00:00:00.000000Z", ""]) | strings,
          conflict=st.sampled_from(["error", "skip", "replace"]))
    def import_document(self, sid: str, tokens: Any, cost: Any, value: Any, at: str,
                        conflict: str) -> None:
        """session.import of a document built from boundary values (sealed correctly, so
        only its contents can be refused)."""
        stamp = "2026-01-01T00:00:00.000000Z"
        raw = [("session.created", {}, stamp),
               ("tokens.recorded", {"input_tokens": tokens, "estimated_cost": cost}, stamp),
               ("tokens.recorded", {"input_tokens": tokens, "estimated_cost": cost}, at),
               ("problem.recorded", {"value": value}, stamp)]
        events, prev = [], ""
        for version, (event_type, data, recorded_at) in enumerate(raw, start=1):
            e = {"position": version, "session_id": sid, "version": version,
                 "event_id": f"{sid}-imported-{version}", "type": event_type,
                 "schema_version": 1, "recorded_at": recorded_at, "data": data,
                 "meta": {}, "hash": ""}
            try:
                prev = chain_hash(prev, event_from_builtins(e))
            except (msgspec.ValidationError, OverflowError, UnicodeEncodeError):
                prev = "unhashable"  # past a bound, or a lone surrogate (not UTF-8)
            e["hash"] = prev
            events.append(e)
        document: dict[str, Any] = {"format": FORMAT, "format_version": FORMAT_VERSION,
                                    "exported_at": stamp, "session": None, "events": events,
                                    "checkpoints": []}
        try:
            document["checksum"] = checksum(document)
        except UnicodeEncodeError:  # a lone surrogate: the request will not parse anyway
            document["checksum"] = "sha256:"
        self.send("session.import", {"document": document, "on_conflict": conflict})

    @rule(text=strings)
    def import_text(self, text: str) -> None:
        self.send("session.import", {"document": text})

    @rule(sid=st.sampled_from(SESSIONS), data=st.sampled_from([
        b'{"input_tokens": 9223372036854775808}', b"not json", b'{"input_tokens": "x"}']))
    def bad_row_then_restart(self, sid: str, data: bytes) -> None:
        """A row no daemon would write, put into the file while the daemon is stopped: it
        starts, serves, and reports the session until it is deleted."""
        self.send("session.create", {"session_id": sid})
        self.daemon.stop()
        con = sqlite3.connect(self.daemon.config.db or "")
        try:
            with con:
                (version,) = con.execute("SELECT version FROM sessions WHERE session_id = ?",
                                         (sid,)).fetchone()
                (last,) = con.execute("SELECT MAX(position) FROM events").fetchone()
                con.execute("INSERT INTO events VALUES (?, ?, ?, ?, 'tokens.recorded', 1,"
                            " '2026-01-01T00:00:00.000000Z', ?, '{}', 'x')",
                            (last + 1, sid, version + 1, f"bad-{last + 1}", data))
        finally:
            con.close()
        self.daemon.start()
        problems = self.send("daemon.verify", {})["result"]["problems"]
        assert sid in {p["session_id"] for p in problems}, problems
        refused = self.send("message.append", {"session_id": sid, "role": "user",
                                               "content": "x"})
        assert refused["error"]["code"] == -32012, refused
        for method in ("session.get", "events.read", "session.export", "message.list",
                       "session.trajectory", "checkpoint.list"):
            self.send(method, {"session_id": sid})  # served, or -32012: never a crash
        self.send("events.read", {})
        self.delete_with_forks(sid)

    def delete_with_forks(self, sid: str) -> None:
        """Delete a session, its forks first (a source with forks is not deleted: -32003)."""
        while forks := self.send("session.forks", {"session_id": sid})["result"]["forks"]:
            for fork in forks:
                self.delete_with_forks(fork["session_id"])
        assert self.send("session.delete", {"session_id": sid})["result"]["deleted"] is True

    @rule(uids=st.sampled_from([[], [65534], [65534, 4242]]),
          grants=st.sampled_from([[], ["session.delete"], ["*"]]))
    def revoke_or_grant(self, uids: list[int], grants: list[str]) -> None:
        """A reload between steps that lets peers in, or no more, and changes their
        grants (access revoked on open connections): the daemon goes on serving its
        owner, and the steps after it are checked as before."""
        self.daemon.reload(allowed_uids=uids, peer_methods=grants)

    @rule()
    def restart(self) -> None:
        """Stop (drain) and start again on the same database: it must start."""
        self.daemon.stop()
        self.daemon.start()

    @invariant()
    def answers_ping(self) -> None:
        if self.daemon.thread is None:
            return  # before initialize
        reply = call(self.daemon.socket, "daemon.ping", {})
        assert reply["result"]["pong"] is True

    def teardown(self) -> None:
        try:
            if self.daemon.thread is not None:
                verify = call(self.daemon.socket, "daemon.verify", {})
                assert verify["result"]["ok"] is True, verify["result"]["problems"]
        finally:
            self.daemon.stop()
        try:
            self.sigterm_ends_it()
        finally:
            self.cleanup()

    def sigterm_ends_it(self) -> None:
        """The final step: a daemon process on what the run left starts, answers ping,
        and SIGTERM ends it with exit 0 (the wait is a guard against a hang, not a timing)."""
        sock = os.path.join(self.directory, "term.sock")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db",
             self.daemon.config.db or "", "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_for_daemon(sock, proc)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=PATIENCE_S)
            assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def cleanup(self) -> None:
        for name in os.listdir(self.directory):
            os.unlink(os.path.join(self.directory, name))
        os.rmdir(self.directory)


DaemonMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
TestStateful = pytest.mark.fleet(DaemonMachine.TestCase)  # a long suite: the second run


# The least each event type's data needs; one number of it is then put at its bound.
MINIMAL_DATA: dict[str, dict[str, Any]] = {
    "message.appended": {"role": "user", "content": "hi", "message_id": "m", "sequence": 0},
    "progress.recorded": {"node_id": "n"},
    "process.started": {"pid": 1, "argv": ["x"], "turn": 1},
    "process.output": {"turn": 1, "line": "x"},
    "process.exited": {"pid": 1, "turn": 1},
    "process.detached": {"pid": 1, "turn": 1, "alive": False, "reason": "x"},
    "checkpoint.saved": {"checkpoint_id": "c", "size": 0},
    "messages.truncated": {"from_sequence": 0},
    "graph.writes": {"thread_id": "t", "checkpoint_id": "c", "task_id": "k",
                     "writes": [{"idx": 0, "channel": "c", "value": {"type": "t", "data": ""}}]},
}
DATA_STRINGS: list[tuple[str, str]] = sorted(
    (event_type, f.encode_name) for event_type, data_type in DATA_TYPES.items()
    for f in msgspec.inspect.type_info(data_type).fields  # type: ignore[attr-defined]
    if _textual(f.type))
DATA_NUMBERS: list[tuple[str, str]] = sorted(
    (event_type, f.encode_name) for event_type, data_type in DATA_TYPES.items()
    for f in msgspec.inspect.type_info(data_type).fields  # type: ignore[attr-defined]
    if _numeric(f.type))


@pytest.mark.slow_on_postgresql
def test_every_number_and_string_of_every_method_at_every_bound(db_url: str) -> None:
    """The sweep the state machine samples from, whole: each numeric and each string field
    of each method's params and of each event type's data, alone, at each boundary value;
    ping after each, verify at the end. On both stores."""
    sweep: list[tuple[str, str, Any]] = (
        [(m, f, v) for m, f in NUMERIC_FIELDS for v in NUMBERS]
        + [(m, f, v) for m, f in STRING_FIELDS for v in sorted(set(STRINGS))]
        + [("events.append", "events", [{"type": t, "data": {**MINIMAL_DATA.get(t, {}), f: v}}])
           for t, f in DATA_NUMBERS for v in NUMBERS]
        + [("events.append", "events", [{"type": t, "data": {**MINIMAL_DATA.get(t, {}), f: v}}])
           for t, f in DATA_STRINGS for v in sorted(set(STRINGS))])
    assert ("tokens.recorded", "input_tokens") in DATA_NUMBERS
    with tempfile.TemporaryDirectory(prefix="sd-sw-") as directory:
        daemon = ThreadedDaemon(directory, db_url)
        daemon.start()
        try:
            for method, name, value in sweep:
                call(daemon.socket, "session.create", {"session_id": "s1"})
                params = {**MINIMAL.get(method, {"session_id": "s1"}), name: value}
                check_reply(method, params, call(daemon.socket, method, params))
                assert call(daemon.socket, "daemon.ping", {})["result"]["pong"] is True
            verify = call(daemon.socket, "daemon.verify", {})
            assert verify["result"]["ok"] is True, verify["result"]["problems"]
        finally:
            daemon.stop()
