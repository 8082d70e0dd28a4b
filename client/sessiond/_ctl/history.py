"""sessionctl's commands over the record: events, search, fork, forks, reindex."""

from __future__ import annotations

import argparse
import math
from typing import Any

from sessiond_schemas import rpc
from sessiond_schemas.errors import SessionNotFoundError
from sessiond_schemas.events import STATUSES

from .._render import Events, print_kv, render_events
from .._sync import Client
from .inputs import render_console, when
from .registry import arg, command, full_id


@command("events", "read stored events of one session or of all", sid=False,
         render=render_events, args=[
             arg("id", nargs="?", help="session id or prefix; all sessions when left out"),
             arg("--from-version", type=int),
             arg("--from-position", type=int, help="events after this global position"),
             arg("--limit", type=int),
             arg("--type", action="append"),
             arg("--wide", action="store_true",
                 help="whole ids, times and data: each event's facts on a line, its data"
                      " (JSON) under it")],
         wire={"types": "--type"})
def _events(c: Client, a: argparse.Namespace) -> Any:
    if not a.id or a.from_position is not None:
        page = c.read_events(full_id(c, a.id) if a.id else None, from_version=a.from_version,
                             from_position=a.from_position, limit=a.limit,
                             types=a.type or None)
        return page if a.json else Events(page, a.wide)
    sid = full_id(c, a.id)
    page = session_events(c, sid, a.from_version or 1, a.limit or 1000, a.type or None)
    return page if a.json else Events(page, a.wide, sid)


def session_events(c: Client, sid: str, start: int, limit: int,
                   types: list[str] | None) -> rpc.EventsReadResult:
    """A page of a session's events from version `start`: a fork's versions up to its
    fork point are its source's events (read from the source, and so on up the chain,
    at most 20 sources), as `messages` and the HTTP read show them."""
    chain: list[tuple[str, float]] = [(sid, math.inf)]
    link = c.get_session(sid).forked_from
    while link is not None and len(chain) <= 20:
        chain.append((link.session_id, link.version))
        try:
            link = c.get_session(link.session_id).forked_from
        except SessionNotFoundError:  # a source gone: its events are not there to show
            break
    events: list[Any] = []
    low, nxt = 1, None
    for holder, high in reversed(chain):  # the oldest source's versions first
        at = max(start, low)
        low = int(high) + 1 if high != math.inf else low
        if at > high or len(events) >= limit:
            continue
        page = c.read_events(holder, from_version=at, limit=limit - len(events), types=types)
        events += [e for e in page.events if e.version <= high]
        if page.next is not None and page.next <= high:  # cut by the byte budget
            nxt = page.next
            break
        nxt = page.next if high == math.inf else None
    if len(events) >= limit and nxt is None and events[-1].version < \
            c.get_session(sid).version:
        nxt = events[-1].version + 1
    return rpc.EventsReadResult(events=events, next=nxt)


_MARK = ("\x02", "\x03")  # sessionctl's own marks, turned into highlighting when shown


def render_search(r: Any) -> None:
    from rich.markup import escape
    console = render_console()
    if not r.sessions:
        console.print("no session matches")
    for s in r.sessions:
        console.print(f"[bold]{s.session_id}[/bold]  {s.status}  {s.actor_name or '-'}  "
                      f"({s.matches} matching)  {escape((s.task or '').replace(chr(10), ' '))}",
                      highlight=False, no_wrap=True, overflow="ellipsis")
        for h in s.hits:
            text = escape(h.snippet.replace("\n", " ")).replace(
                _MARK[0], "[bold yellow]").replace(_MARK[1], "[/bold yellow]")
            where = (f"#{h.sequence} {h.role}" if h.sequence is not None else h.type)
            gone = "" if h.current is not False else " (taken out)"
            console.print(f"    {where}{gone}: {text}", highlight=False, no_wrap=True,
                          overflow="ellipsis")
    if not r.complete:
        console.print("(only the newest 5,000 matches were ranked: add words or filters"
                      " to reach older sessions)", highlight=False)
    if r.next_cursor:
        console.print(f"more: --cursor {r.next_cursor}", highlight=False)


@command("search", "find sessions by their text (FTS5 query: words, \"phrases\", prefix*,"
         " AND OR NOT)", sid=False, render=render_search, args=[
             arg("query"),
             arg("--status", action="append", choices=STATUSES),
             arg("--namespace"),
             arg("--actor"),
             arg("--since", type=when,
                 help="matches since: 7d, 12h, 30m ago, or an RFC 3339 time"),
             arg("--until", type=when,
                 help="matches before: 7d, 12h, 30m ago, or an RFC 3339 time"),
             arg("--limit", type=int, help="sessions per page (default 20)"),
             arg("--hits", type=int, help="snippets per session (default 3)"),
             arg("--cursor")], wire={"actor_name": "--actor"})
def _search(c: Client, a: argparse.Namespace) -> Any:
    return c.search(a.query, status=a.status or None, namespace=a.namespace,
                    actor_name=a.actor, since=a.since, until=a.until,
                    limit=a.limit, hits=a.hits, cursor=a.cursor,
                    mark=None if a.json else _MARK)


@command("fork", "make a new session whose history is this one's up to a version;"
         " print its id", render=lambda s: print(s.session_id), args=[
             arg("--at", type=int, help="the version to fork at (default: the latest)"),
             arg("--new-id", help="the fork's session id (default: a new ULID)"),
             arg("--idempotency-key", help="a repeat with this key makes no second fork")])
def _fork(c: Client, a: argparse.Namespace) -> Any:
    return c.fork(full_id(c, a.id), at_version=a.at, new_session_id=a.new_id,
                  idempotency_key=a.idempotency_key)


@command("forks", "list a session's forks", args=[arg("--limit", type=int), arg("--cursor")])
def _forks(c: Client, a: argparse.Namespace) -> Any:
    return c.forks(full_id(c, a.id), limit=a.limit, cursor=a.cursor)


@command("reindex", "rebuild the search index and fork links from the events (writes wait)",
         sid=False, render=print_kv)
def _reindex(c: Client, a: argparse.Namespace) -> Any:
    return c.reindex()
