"""`sessionctl top`: a live full-screen view of the host, from one subscription and daemon.stats.

One thread follows every event (after reading back the last BACKLOG of them, so
the minute and hour windows are filled at once); the main thread asks
daemon.stats once a second, reads keys and draws with rich. It never polls
sessions: it asks session.get once for a session whose creation it did not see.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import socket
import sys
import termios
import threading
import time
import tty
from collections import deque
from collections.abc import Iterator
from typing import Any

from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import Event

from ._follow import RESUBSCRIBE_PAUSE, Follower
from ._render import summarize
from ._sync import Client
from ._top_model import SORT_TITLES, SORTS, Model
from ._wire import connect_blocking

BACKLOG = 20_000  # events read back at start
STATS_EVERY_S = 1.0
FRAME_EVERY_S = 0.5
LOOKUPS_PER_FRAME = 20
TIMELINE_KEEP = 200


def add_arguments(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--once", action="store_true",
                    help="print one frame and exit (with --json: its figures as JSON)")
    sp.add_argument("--sort", choices=SORTS, default="events", help="busiest sessions by")
    sp.add_argument("--filter", help="only sessions whose actor or namespace contains this")
    sp.add_argument("--limit", type=int, default=10, help="busiest sessions shown (default 10)")


def run(client: Client, args: argparse.Namespace) -> None:
    """Run top: one frame with --once, else the live view until `q`."""
    if args.once:
        model = Model()
        stats = client.stats()
        for event in _backlog(client, stats.last_position):
            model.add(event)
        now = max(time.time(), model.latest)
        _resolve(client, model, now, limit=1000)
        figures = model.figures(stats, now, sort=args.sort, match=args.filter,
                                limit=args.limit)
        if args.json:
            print(json.dumps(figures))
        else:
            from rich.console import Console
            Console().print(frame(figures))
        return
    if args.json:
        print("sessionctl: top --json needs --once", file=sys.stderr)
        sys.exit(2)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("sessionctl: top draws on a terminal and reads its keys; without one, use"
              " `sessionctl top --once` (or `--json top --once`)", file=sys.stderr)
        sys.exit(2)
    Top(client, args).loop()


def _backlog(client: Client, last: int) -> Iterator[Event]:
    after = max(0, last - BACKLOG)
    while after < last:
        page = client.read_events(from_position=after, limit=10_000)
        yield from (e for e in page.events if e.position <= last)
        if page.next is None or not page.events:
            return
        after = page.next


def _resolve(client: Client, model: Model, now: float, limit: int) -> None:
    for sid in model.unresolved(now, limit):
        try:
            s = client.get_session(sid)
        except SessiondError:  # deleted since
            model.learn(sid, None, None, None)
        else:
            model.learn(sid, s.actor_name, s.namespace, s.status)


# --- drawing ---------------------------------------------------------------------------


def _short(text: str | None, width: int) -> str:
    text = text or "-"
    return text if len(text) <= width else text[: width - 1] + "…"


def _known(value: float | None, spec: str) -> str:
    """A figure, or ? when the daemon is too old to report it."""
    return "?" if value is None else format(value, spec)


def _uptime(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""


ACTORS_SHOWN = 8  # at most, on a screen tall enough
# Lines of a frame that are not table rows: the four head lines, three blank lines, each
# table's title and header, the footer (and the note, when there is one).
FIXED_LINES = 4 + 3 + 2 + 2 + 1


def fit(f: dict[str, Any], height: int | None, *, note: bool = False) -> tuple[int, int]:
    """How many busiest sessions and actors a screen of `height` lines shows: rows are
    dropped, the head lines and the footer never (a third of the rows go to actors)."""
    busiest, actors = len(f["busiest"]), min(len(f["actors"]), ACTORS_SHOWN)
    if height is None:
        return busiest, actors
    rows = max(0, height - FIXED_LINES - (1 if note else 0))
    to_actors = min(actors, max(1 if rows > 1 else 0, rows // 3))
    shown_busiest = min(busiest, rows - to_actors)
    return shown_busiest, min(actors, rows - shown_busiest)


def executors_line(f: dict[str, Any]) -> str:
    """The executors: how many this daemon runs, then the running ones it knows of from
    the events, each with its pid and, when another host's daemon runs it, that host."""
    line = f"executors running here {_known(f['executors_running'], 'd')}"
    shown = []
    for e in f["executors"][:4]:
        where = f" on {e['host']}" if e.get("host") else ""
        who = f" {_short(e['actor'], 14)}" if e.get("actor") else ""
        shown.append(f"{e['session_id'][:12]} (pid {e['pid']}{where}{who})")
    return line + ("; in the events: " + "  ".join(shown) if shown else "")


def frame(f: dict[str, Any], *, selected: int | None = None, prompt: str | None = None,
          note: str | None = None, height: int | None = None) -> Any:
    """One screen of top, from `Model.figures`: fits 80 columns and, given the terminal's
    `height`, that many lines (table rows are dropped to fit; the footer stays)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    d = f["daemon"]
    n_busiest, n_actors = fit(f, height, note=note is not None)
    lines = [
        Text.assemble(("sessiond top", "bold"), f"  up {_uptime(d['uptime_s'])}  "
                      f"{d['connections']} conns  {d['subscriptions']} subs  "
                      f"sort: {SORT_TITLES[f['sort']]}  filter: {f['filter'] or '-'}"),
        *([Text(note, style="bold red")] if note else []),
        Text(f"health  queue {d['queue']}/{_known(d['queue_capacity'], 'd')}  "
             f"batch {_known(d['batch_size'], 'g')}  "
             f"commit {_known(d['commit_latency_ms'], '.2f')} ms"
             f" (max {_known(d['commit_latency_max_ms'], '.2f')})  "
             f"{d['appends_per_s']:g} ev/s  db {_bytes(d['db_bytes'])}"),
        Text("sessions " + str(d["sessions"]) + ": " + (
            "?" if f["sessions_by_status"] is None else "  ".join(
                f"{k} {v}" for k, v in f["sessions_by_status"].items()) or "none")),
        Text(executors_line(f)),
    ]
    busiest = Table(title="busiest sessions (events in the last minute)", title_justify="left",
                    box=None, header_style="bold", padding=(0, 1), expand=False)
    for name, width, justify in (("session", 14, "left"), ("actor", 12, "left"),
                                 ("ns", 8, "left"), ("status", 9, "left"),
                                 ("ev/1m", 6, "right"), ("ev/s", 5, "right"),
                                 ("tok/1h", 8, "right"), ("cost/1h", 8, "right")):
        busiest.add_column(name, max_width=width, no_wrap=True, overflow="ellipsis",
                           justify=justify)  # type: ignore[arg-type]
    for i, r in enumerate(f["busiest"][:n_busiest]):
        busiest.add_row(r["session_id"][:14], _short(r["actor"], 12), _short(r["namespace"], 8),
                        r["status"] or "-", str(r["events_1m"]), f"{r['events_per_s']:.2f}",
                        str(r["tokens_1h"]), f"{r['cost_1h']:.4f}",
                        style="reverse" if i == selected else None)
    actors = Table(title="spend by actor", title_justify="left", box=None,
                   header_style="bold", padding=(0, 1))
    for name, justify in (("actor", "left"), ("tok/1m", "right"), ("cost/1m", "right"),
                          ("tok/1h", "right"), ("cost/1h", "right")):
        actors.add_column(name, no_wrap=True, overflow="ellipsis",
                          max_width=24 if name == "actor" else 10,
                          justify=justify)  # type: ignore[arg-type]
    for r in f["actors"][:n_actors]:
        actors.add_row(r["actor"], str(r["tokens_1m"]), f"{r['cost_1m']:.4f}",
                       str(r["tokens_1h"]), f"{r['cost_1h']:.4f}")
    footer = Text(prompt if prompt is not None else
                  "q quit  s sort  / filter  ↑↓ select  Enter timeline", style="dim")
    for line in (*lines, footer):  # one screen line each, whatever the width
        line.no_wrap, line.overflow = True, "ellipsis"
    return Group(*lines, Text(""), busiest, Text(""), actors, Text(""), footer)


def timeline_frame(session: dict[str, Any] | None, sid: str, events: list[Event],
                   height: int, error: str | None = None) -> Any:
    from rich.console import Group
    from rich.text import Text

    who = f"  actor {session.get('actor') or '-'}  ns {session.get('namespace') or '-'}" \
        if session else ""
    lines = [Text.assemble(("timeline ", "bold"), sid, who)]
    for e in events[-max(1, height - 3):]:
        lines.append(Text(f"{e.recorded_at[11:19]} v{e.version:<5} {e.type:<22} "
                          f"{summarize(e)}", no_wrap=True, overflow="ellipsis"))
    if error:
        lines.append(Text(error, style="red"))
    lines.append(Text("Esc back  q quit", style="dim"))
    return Group(*lines)


# --- the live view ---------------------------------------------------------------------


class _Follower(threading.Thread):
    """Feeds a model, or a timeline, from a subscription on its own connection; resubscribes
    after a drop or a daemon restart; `stop` closes the connection at once."""

    def __init__(self, socket_path: str, sink: Any, *, session_id: str | None = None,
                 from_position: int | None = None, from_version: int | None = None) -> None:
        super().__init__(daemon=True)
        self.socket_path, self.sink = socket_path, sink
        self.follower = Follower(session_id, from_position, from_version, None)
        self.stopped = False
        self.error: str | None = None
        self._sock: socket.socket | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)

    def run(self) -> None:
        f = self.follower
        while not self.stopped and f.ended is None:
            try:
                self._sock = sock = connect_blocking(self.socket_path)
            except OSError:  # DaemonUnavailableError: the daemon restarts, try again
                time.sleep(STATS_EVERY_S)
                continue
            except SessiondError as exc:  # an impostor on the socket
                self.error = exc.message
                return
            try:
                sock.sendall(f.subscribe_line())
                lines = sock.makefile("rb")
                while not self.stopped:
                    line = lines.readline()
                    outcome = f.on_line(line) if line else False
                    if outcome is False:
                        break
                    if isinstance(outcome, Event):
                        self.sink(outcome)
            except (OSError, ValueError):
                pass  # the connection went away: resubscribe
            except SessiondError as exc:  # the session is gone, say
                self.error = exc.message
                return
            finally:
                sock.close()
            time.sleep(RESUBSCRIBE_PAUSE)


class Top:
    """The live view: keys in, frames out; the model is fed by a _Follower thread."""

    def __init__(self, client: Client, args: argparse.Namespace) -> None:
        self.client, self.args = client, args
        self.model = Model()
        self.sort, self.match, self.limit = args.sort, args.filter, args.limit
        self.selected = 0
        self.prompt: str | None = None  # the filter being typed
        self.timeline: tuple[str, deque[Event], _Follower] | None = None
        self.stats = client.stats()
        self.figures: dict[str, Any] = {}
        self.note: str | None = None  # why the figures are not fresh
        self.quit = False

    def loop(self) -> None:
        from rich.console import Console
        from rich.live import Live

        start = max(0, self.stats.last_position - BACKLOG)
        follower = _Follower(self.client.socket_path, self.model.add, from_position=start)
        follower.start()
        console = Console()
        next_stats = 0.0
        with _cbreak() as keys, Live(console=console, screen=True, auto_refresh=False,
                                     transient=True) as live:
            while not self.quit:
                now_m = time.monotonic()
                if now_m >= next_stats:
                    try:  # the last figures stay on screen while the daemon is away
                        self.stats = self.client.stats()
                        _resolve(self.client, self.model, time.time(), LOOKUPS_PER_FRAME)
                        self.note = None
                    except SessiondError as exc:
                        self.note = f"daemon unreachable: {exc.message}"
                    next_stats = now_m + STATS_EVERY_S
                live.update(self._draw(console.size.height), refresh=True)  # the real height
                for key in keys(FRAME_EVERY_S):
                    self._key(key)
        follower.stop()

    def _draw(self, height: int) -> Any:
        if self.timeline is not None:
            sid, events, follower = self.timeline
            known = self.model.sessions.get(sid)
            info = {"actor": known.actor, "namespace": known.namespace} if known else None
            return timeline_frame(info, sid, list(events), height, follower.error)
        self.figures = self.model.figures(self.stats, time.time(), sort=self.sort,
                                          match=self.match, limit=self.limit)
        shown, _ = fit(self.figures, height, note=self.note is not None)
        self.figures["busiest"] = self.figures["busiest"][:shown]  # Enter opens what is seen
        self.selected = min(self.selected, max(0, shown - 1))
        prompt = None if self.prompt is None else f"filter (actor or namespace): {self.prompt}▏"
        return frame(self.figures, selected=self.selected, prompt=prompt, note=self.note,
                     height=height)

    def _key(self, key: str) -> None:
        if self.prompt is not None:  # typing a filter
            if key in ("\r", "\n"):
                self.match, self.prompt = self.prompt or None, None
            elif key == "\x1b":
                self.prompt = None
            elif key in ("\x7f", "\b"):
                self.prompt = self.prompt[:-1]
            elif key.isprintable():
                self.prompt += key
            return
        if key == "q":
            self.quit = True
        elif self.timeline is not None:
            if key in ("\x1b", "\x7f", "\b", "\x1b[D", "b"):
                self.timeline[2].stop()
                self.timeline = None
        elif key == "s":
            self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        elif key == "/":
            self.prompt = ""
        elif key in ("\x1b[A", "k"):
            self.selected = max(0, self.selected - 1)
        elif key in ("\x1b[B", "j"):
            self.selected += 1
        elif key in ("\r", "\n"):
            rows = self.figures.get("busiest", [])
            if rows:
                self._open(rows[min(self.selected, len(rows) - 1)])

    def _open(self, row: dict[str, Any]) -> None:
        sid = row["session_id"]
        events: deque[Event] = deque(maxlen=TIMELINE_KEEP)
        start = max(1, row["version"] - TIMELINE_KEEP + 1)
        follower = _Follower(self.client.socket_path, events.append, session_id=sid,
                             from_version=start)
        follower.start()
        self.timeline = (sid, events, follower)


@contextlib.contextmanager
def _cbreak() -> Iterator[Any]:
    """Keys as they are typed; yields `keys(timeout)`, the keys typed within `timeout`."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd) if os.isatty(fd) else None
    if saved is not None:
        tty.setcbreak(fd)

    def keys(timeout: float) -> list[str]:
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return []
        data = os.read(fd, 64).decode(errors="replace")
        if not data:  # stdin closed: nothing more will be typed
            time.sleep(timeout)
            return []
        out, i = [], 0
        while i < len(data):
            if data[i] == "\x1b" and data[i + 1:i + 2] == "[" and i + 2 < len(data):
                out.append(data[i:i + 3])
                i += 3
            else:
                out.append(data[i])
                i += 1
        return out

    try:
        yield keys
    finally:
        if saved is not None:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)
