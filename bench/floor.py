"""The floor under issue 31's W1 and W2: sessiond's own per-append work and SQL, served
with nothing else. `python -m bench.floor --socket S --db D [--sql view|log]
[--decide lines|thread]`.

A measuring device, not a design: `bench.peers --floor` runs it beside the daemon, in the
same rounds, on a database the daemon made (the writers' sessions in it). It serves
`daemon.ping` and `message.append` to sessiond's own `Client` over a Unix socket:

- an asyncio `Protocol` on uvloop cuts the lines where they are received; each append is
  decided right there (`--decide lines`), with the helpers sessiond's writer uses
  (`new_id`, `now`, the two encodes, the bounds scan, `typed_event`, `chain_hash`,
  `projection.apply`), on the view it holds in memory, and stored with the meta the
  daemon stores (the peer's uid and pid);
- one thread commits whatever is queued in one transaction (BEGIN IMMEDIATE, the store's
  own `_write` of the events, the read models and, with `--sql view`, the view rows;
  COMMIT at synchronous=FULL, the daemon's default), then hands the batch back to the
  loop in one call, which writes each answer. Acknowledged means on disk, as in sessiond;
- its threads run on one CPU, the one it started on, as the daemon's do by default
  (`cpu_affinity = "auto"`).

The order differs from sessiond's writer. Here the appends that come while a batch
commits are decided at once, so deciding overlaps committing (issue 31 §4's pipelining).
sessiond's writer decides a batch, waits for its commit, then decides the next one.
`--decide thread` keeps that serial order: the committing thread decides what it took,
then commits it (issue 31 §2's "the writer's whole decide-and-commit on that thread").

What it leaves out is everything else sessiond does per append: grants, the request's
validation past its decode, the reply budget, back-pressure, keys, version checks, the
writer's queue and batch machinery, its cache, bells and subscriptions, metrics, the
search index's catch-up, a snapshot every 1,000 versions, the check of the database
file after each COMMIT, failure handling (a failed commit leaves its views decided).
`--sql log` also leaves the view row out of the commit (the issue's "events and messages
only" variant): the view is then not stored at all. Positions start past the newest
stored event: right on the fresh databases `bench.peers` gives it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import socket
import sqlite3
import struct
import threading
import time
from typing import Any

import msgspec
import uvloop

from sessiond_daemon import cpu
from sessiond_daemon.core import projection
from sessiond_daemon.core.histories import out_of_bounds
from sessiond_daemon.stores.interface import Batch, Entry
from sessiond_daemon.stores.sqlite import search
from sessiond_daemon.stores.sqlite.store import SqliteStore
from sessiond_schemas import rpc
from sessiond_schemas.events import (
    EventMeta,
    MessageAppended,
    canonical_json,
    encode_data,
    moved,
    new_id,
    now,
    typed_event,
)
from sessiond_schemas.export import chain_hash
from sessiond_schemas.state import SessionState

MAX_BATCH = 512
_request = msgspec.json.Decoder(rpc.Request)
_append = msgspec.json.Decoder(rpc.MessageAppendParams)
_state = msgspec.json.Decoder(SessionState)
_json = msgspec.json.Encoder()


class Committer:
    """The write connection's thread: a group commit of whatever is queued. With `floor`
    given, the appends are queued undecided (transport, head, params, meta) and decided here,
    on this thread, before the commit (issue 31 §2's "the writer's whole decide-and-commit
    on that thread")."""

    def __init__(self, path: str, with_views: bool, loop: asyncio.AbstractEventLoop,
                 floor: Floor | None = None) -> None:
        self.con = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.con.execute("PRAGMA busy_timeout = 5000")
        self.con.execute("PRAGMA synchronous = FULL")
        self.con.execute("PRAGMA journal_mode = WAL")
        search.register(self.con)
        self.with_views, self.loop, self.floor = with_views, loop, floor
        self.queue: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        q = self.queue
        while True:
            items = [q.get()]
            while len(items) < MAX_BATCH:
                try:
                    items.append(q.get_nowait())
                except queue.Empty:
                    break
            if self.floor is not None:
                items = [(transport, head + result + b"}\n", event, entry)
                         for transport, head, params, meta in items
                         for result, event, entry in (self.floor.append(params, meta),)]
            batch = Batch(events=[item[2] for item in items])
            if self.with_views:
                batch.views = {item[3].state.session_id: item[3] for item in items}
            self.con.execute("BEGIN IMMEDIATE")
            SqliteStore._write(self.con, batch)
            self.con.execute("COMMIT")
            self.loop.call_soon_threadsafe(_answer, items)


def _answer(items: list[tuple[Any, ...]]) -> None:
    for transport, reply, _, _ in items:
        if not transport.is_closing():
            transport.write(reply)


class Floor:
    """What the floor holds: each session's view and chain head, the next position."""

    def __init__(self, path: str) -> None:
        con = sqlite3.connect(path)
        try:
            self.views = {sid: Entry(_state.decode(state), last_hash, last_position)
                          for sid, state, last_hash, last_position in con.execute(
                              "SELECT session_id, state, last_hash, last_position FROM sessions")}
            self.position = int(con.execute(
                "SELECT coalesce(max(position), 0) FROM events").fetchone()[0]) + 1
        finally:
            con.close()
        self.started = time.monotonic()

    def append(self, params: msgspec.Raw, meta: EventMeta) -> tuple[bytes, Any, Entry]:
        """Decide one append on the view held: (the result's JSON, the event, the entry)."""
        p = _append.decode(params)
        entry = self.views[p.session_id]
        state = entry.state
        data = MessageAppended(message_id=new_id(), sequence=state.message_count, role=p.role,
                               content=p.content, tool_call_id=p.tool_call_id,
                               metadata=p.metadata)
        data_json, hash_json = encode_data(data), canonical_json(data)
        if out_of_bounds(data_json, "$") is not None:
            raise ValueError("number out of bounds")
        event = typed_event(position=self.position, session_id=p.session_id,
                            version=state.version + 1, event_id=new_id(),
                            type="message.appended", recorded_at=now(), data=data,
                            data_json=data_json, meta=meta)
        last_hash = chain_hash(entry.last_hash, event, hash_json)
        event = moved(event, hash=last_hash)
        entry = Entry(projection.apply(state, event), last_hash, self.position)
        self.views[p.session_id] = entry
        self.position += 1
        result = _json.encode({"session_id": p.session_id, "version": entry.state.version,
                               "position": event.position, "message_id": data.message_id,
                               "sequence": data.sequence})
        return result, event, entry


class Link(asyncio.Protocol):
    def __init__(self, floor: Floor, committer: Committer, on_thread: bool) -> None:
        self.floor, self.committer, self.on_thread = floor, committer, on_thread
        self.buffered = b""
        self.transport: Any = None  # uvloop's, not an asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("socket")
        pid, uid, _ = struct.unpack("3i", peer.getsockopt(
            socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        self.meta = EventMeta(peer_uid=uid, peer_pid=pid)

    def data_received(self, data: bytes) -> None:
        lines = (self.buffered + data).split(b"\n")
        self.buffered = lines.pop()
        for line in lines:
            req = _request.decode(line)
            head = b'{"jsonrpc":"2.0","id":' + _json.encode(req.id) + b',"result":'
            if req.method == "message.append" and self.on_thread:
                self.committer.queue.put((self.transport, head, req.params, self.meta))
            elif req.method == "message.append":
                assert isinstance(req.params, msgspec.Raw)
                result, event, entry = self.floor.append(req.params, self.meta)
                self.committer.queue.put((self.transport, head + result + b"}\n", event,
                                          entry))
            elif req.method == "daemon.ping":
                self.transport.write(head + _json.encode(rpc.PingResult(
                    pong=True, version="floor", uptime_s=time.monotonic() - self.floor.started,
                    protocol=rpc.PROTOCOL_VERSION)) + b"}\n")
            else:
                raise ValueError(f"the floor serves no {req.method}")


async def serve(socket_path: str, db: str, with_views: bool, on_thread: bool) -> None:
    loop = asyncio.get_running_loop()
    floor = Floor(db)
    committer = Committer(db, with_views, loop, floor if on_thread else None)
    server = await loop.create_unix_server(lambda: Link(floor, committer, on_thread),
                                           socket_path)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--db", required=True, help="a database sessiond made")
    ap.add_argument("--sql", choices=["view", "log"], default="view",
                    help="view: the daemon's commit (events, read models, view rows);"
                         " log: without the view rows")
    ap.add_argument("--decide", choices=["lines", "thread"], default="lines",
                    help="lines: each append decided where its line is read, while the"
                         " batch before it commits; thread: on the committing thread, then"
                         " committed (sessiond's writer's serial order)")
    a = ap.parse_args()
    if os.path.exists(a.socket):
        os.unlink(a.socket)
    os.sched_setaffinity(0, {cpu.current_cpu()})  # before any thread: they inherit it
    uvloop.run(serve(a.socket, a.db, a.sql == "view", a.decide == "thread"))


if __name__ == "__main__":
    main()
