"""`sessionctl`: the command-line client; human tables by default, `--json` for scripts."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError, SessionNotFoundError
from sessiond_schemas.events import STATUSES

from ._render import (
    print_kv,
    render_checkpoints,
    render_events,
    render_list,
    render_messages,
    render_state,
    summarize,
)
from ._sync import Client
from ._wire import ConnectionLostError

Handler = Callable[[Client, argparse.Namespace], Any]
_COMMANDS: dict[str, tuple[Handler, Callable[[Any], None] | None]] = {}


def command(name: str, render: Callable[[Any], None] | None = None) -> Callable[[Handler], Handler]:
    """Register a sessionctl command; `render` prints its result for people."""
    def register(fn: Handler) -> Handler:
        _COMMANDS[name] = (fn, render)
        return fn
    return register


# --- helpers -----------------------------------------------------------------------------


class CliError(Exception):
    """A failure sessionctl reports itself, in one line: `code` names its kind (the `code`
    of the --json error), `exit_code` is the process's exit status."""

    def __init__(self, message: str, code: str, exit_code: int = 1,
                 data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.exit_code, self.data = message, code, exit_code, data or {}


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (and in JSON under --json)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("sessionctl").strip()  # the command, if any
        raise CliError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)",
                       "usage", 2)


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is past the largest number sessiond stores (a finite"
                         " 64-bit float)")
    return value


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loads(text: str) -> Any:
    """Strict JSON: NaN, Infinity and numbers that overflow to infinity are errors (the
    encoder would send them as null, which a merge patch takes for "delete")."""
    return json.loads(text, parse_float=_finite, parse_constant=_not_a_number)


def _parse_json(text: str, what: str) -> Any:
    try:
        return _loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}", "bad_json", 2,
                       {"line": exc.lineno, "column": exc.colno}) from exc
    except ValueError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}", "bad_json", 2) from exc


def _json_arg(text: str) -> Any:
    try:
        return _loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc


def _file_problem(path: str, exc: OSError | UnicodeDecodeError) -> CliError:
    """A local file that cannot be read or written, said as what it is."""
    if isinstance(exc, UnicodeDecodeError):
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory, not a file"
    elif isinstance(exc, FileNotFoundError):
        parent = os.path.dirname(os.path.abspath(path))
        reason = ("no such file" if os.path.isdir(parent)
                  else f"no such directory: {parent}")
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = exc.strerror or str(exc)
    return CliError(f"{path}: {reason}", "file_error", 1, {"path": path})


def _read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise _file_problem(path, exc) from exc


def _write_file(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise _file_problem(path, exc) from exc


def _read_stdin() -> str:
    if sys.stdin.isatty():  # a person at a terminal may not know we are waiting for them
        print("sessionctl: reading standard input; end it with Ctrl-D", file=sys.stderr)
    try:
        return sys.stdin.read()
    except UnicodeDecodeError as exc:
        raise _file_problem("standard input", exc) from exc


def _read_text(arg: str | None) -> str:
    """An argument, or standard input when it is '-' or missing."""
    if arg is None or arg == "-":
        return _read_stdin()
    return arg


def _read_json_items(source: str | None) -> list[Any]:
    """A JSON array, or JSON lines, from a file or standard input."""
    name = "standard input" if source in (None, "-") else source
    text = _read_stdin() if source in (None, "-") else _read_file(str(source))
    text = text.strip()
    if text.startswith("["):
        items: list[Any] = _parse_json(text, name)  # a "[" that parses is an array
        return items
    return [_parse_json(line, f"{name} line {n}")
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def _sid(client: Client, given: str) -> str:
    """Accept a whole id or a unique prefix of one."""
    if len(given) < 4:
        return given
    return str(client.resolve(given))


def _write_opts(a: argparse.Namespace) -> dict[str, Any]:
    return {"expected_version": a.expected_version, "idempotency_key": a.idempotency_key}


# --- commands ----------------------------------------------------------------------------


@command("ping", print_kv)
def _ping(c: Client, a: argparse.Namespace) -> Any:
    return c.ping()


@command("stats", print_kv)
def _stats(c: Client, a: argparse.Namespace) -> Any:
    return c.stats()


def render_verify(r: Any) -> None:
    for p in r.problems:
        print(f"{p.session_id or '(database)'}: {p.problem}")
    print(f"{'ok' if r.ok else 'PROBLEMS'}: {r.checked_sessions} sessions checked,"
          f" {len(r.problems)} problems")


@command("verify", render_verify)
def _verify(c: Client, a: argparse.Namespace) -> Any:
    result = c.verify()
    if not result.ok:  # print, then exit non-zero
        (print(msgspec.json.encode(result).decode()) if a.json else render_verify(result))
        sys.exit(1)
    return result


@command("backup", print_kv)
def _backup(c: Client, a: argparse.Namespace) -> Any:
    return c.backup(os.path.abspath(a.path))


def _days(text: str) -> float:
    """7d, 12h, 30m, or a number of days."""
    units = {"d": 1.0, "h": 1 / 24, "m": 1 / 1440}
    try:
        if text[-1:] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a duration like 7d, 12h or 30m: {text}") from exc


@command("cleanup")
def _cleanup(c: Client, a: argparse.Namespace) -> Any:
    result = c.cleanup(older_than_days=a.older_than, statuses=a.status or None,
                       dry_run=True if a.dry_run else None)
    if a.json:
        return result
    verb = "would delete" if a.dry_run else "deleted"
    print(f"{verb} {result.deleted} sessions" + "".join(f"\n  {s}" for s in result.session_ids))
    return _STREAMED


@command("export")
def _export(c: Client, a: argparse.Namespace) -> Any:
    document = c.export_session(_sid(c, a.id))
    text = json.dumps(document, ensure_ascii=False, indent=1) + "\n"
    if a.output:
        _write_file(a.output, text)
    else:
        sys.stdout.write(text)
    return _STREAMED


def _document_session(document: Any) -> str | None:
    """The session id an export document (object or JSON text) is for, if it says."""
    try:
        doc = json.loads(document) if isinstance(document, str) else document
        session = doc.get("session")
        if isinstance(session, dict) and isinstance(session.get("session_id"), str):
            return str(session["session_id"])
        first = doc["events"][0]["session_id"]
        return first if isinstance(first, str) else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # the daemon judges the document and says what is wrong


@command("import")
def _import(c: Client, a: argparse.Namespace) -> Any:
    imported: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []

    def exists(sid: str | None) -> bool:
        if sid is None:
            return False
        try:
            c.get_session(sid)
        except SessionNotFoundError:
            return False
        return True

    def send(path: str, document: Any, warnings: list[str]) -> None:
        try:
            sid = _document_session(document) if a.on_conflict == "skip" else None
            if exists(sid):  # skip: the daemon would return the stored session untouched
                skipped.append({"file": path, "session_id": sid,
                                "reason": "a session with this id exists"})
                return
            state = c.import_session(document, on_conflict=a.on_conflict)
            imported.append({"file": path, "session_id": state.session_id,
                             "version": state.version, "warnings": warnings})
        except SessiondError as exc:
            failed.append({"file": path, "error": exc.message})

    def one(path: str) -> None:
        try:
            if a.format:  # a seed's own store: each importer yields export documents
                from .importers import FORMATS
                for source, document, warnings in FORMATS[a.format](path):
                    send(source, document, warnings)
                return
            text = _read_file(path)  # sent as text: the daemon judges even invalid JSON
        except CliError as exc:
            failed.append({"file": path, "error": exc.message})
            return
        except (OSError, UnicodeDecodeError) as exc:
            failed.append({"file": path, "error": _file_problem(path, exc).message})
            return
        except (ValueError, KeyError) as exc:
            failed.append({"file": path, "error": f"cannot read it: {exc}"})
            return
        send(path, text, [])

    if a.json or len(a.files) == 1:
        for path in a.files:
            one(path)
    else:
        from rich.progress import track
        for path in track(a.files, description="importing"):
            one(path)
    if not (imported or skipped or failed):
        what = f"{a.format} sessions" if a.format else "export documents"
        raise CliError(f"nothing to import: no {what} found in {', '.join(a.files)}",
                       "nothing_found", 1, {"files": a.files})
    if a.json:
        print(json.dumps({"imported": imported, "skipped": skipped, "failed": failed}))
    else:
        for item in imported:
            print(f"imported {item['session_id']} (v{item['version']}) from {item['file']}")
            for warning in item["warnings"]:
                print(f"  note: {warning}", file=sys.stderr)
        for item in skipped:
            print(f"skipped {item['session_id']} from {item['file']}: {item['reason']}")
        for item in failed:
            print(f"FAILED {item['file']}: {item['error']}", file=sys.stderr)
    if failed:
        sys.exit(1)
    return _STREAMED


@command("create", render_state)
def _create(c: Client, a: argparse.Namespace) -> Any:
    fields = {
        "namespace": a.namespace, "actor_name": a.actor, "goal_id": a.goal, "agent_id": a.agent,
        "task": a.task, "model": a.model, "adapter": a.adapter, "source": a.source,
        "working_dir": a.working_dir, "automation_level": a.automation_level,
        "metadata": a.metadata, "input_data": a.input, "entry_point": a.entry_point,
        "checkpoint_enabled": True if a.checkpoint_enabled else None,
        "status": "pending" if a.pending else None,
    }
    return c.create_session(a.id, **fields, idempotency_key=a.idempotency_key)


@command("show", render_state)
def _show(c: Client, a: argparse.Namespace) -> Any:
    return c.get_session(_sid(c, a.id), at_version=a.at_version)


@command("resolve", lambda r: print(r["session_id"]))
def _resolve(c: Client, a: argparse.Namespace) -> Any:
    return {"session_id": c.resolve(a.prefix)}


@command("list", render_list)
def _list(c: Client, a: argparse.Namespace) -> Any:
    return c.list_sessions(namespace=a.namespace, status=a.status or None, actor_name=a.actor,
                           source=a.source, created_after=a.since, created_before=a.until,
                           limit=a.limit, cursor=a.cursor)


@command("transition", render_state)
def _transition(c: Client, a: argparse.Namespace) -> Any:
    return c.transition(_sid(c, a.id), a.to, reason=a.reason, error=a.error,
                        paused_at=a.paused_at, resume_from=a.resume_from, **_write_opts(a))


@command("resume", print_kv)
def _resume(c: Client, a: argparse.Namespace) -> Any:
    r = c.resume(_sid(c, a.id), a.checkpoint, **_write_opts(a))
    return r if a.json else r.resume


def _confirm(question: str) -> bool:
    """Ask on the terminal; anything but y or yes (or end of input) is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


@command("delete", lambda r: print(f"deleted {r['session_id']}"))
def _delete(c: Client, a: argparse.Namespace) -> Any:
    sid = _sid(c, a.id)
    if not a.yes and sys.stdin.isatty():
        state = c.get_session(sid)
        if not _confirm(f"delete session {sid} ({state.status}, {state.message_count} messages)"
                        " and everything stored for it?"):
            raise CliError(f"not deleted: {sid}", "not_confirmed", 1, {"session_id": sid})
    return {"deleted": c.delete_session(sid, **_write_opts(a)), "session_id": sid}


@command("append", print_kv)
def _append(c: Client, a: argparse.Namespace) -> Any:
    return c.append_message(_sid(c, a.id), a.role, _read_text(a.content),
                            tool_call_id=a.tool_call_id, metadata=a.metadata, **_write_opts(a))


@command("append-many", print_kv)
def _append_many(c: Client, a: argparse.Namespace) -> Any:
    return c.append_messages(_sid(c, a.id), _read_json_items(a.file), **_write_opts(a))


@command("messages", render_messages)
def _messages(c: Client, a: argparse.Namespace) -> Any:
    return c.list_messages(_sid(c, a.id), limit=a.limit, offset=a.offset,
                           after_sequence=a.after, order="desc" if a.desc else None)


@command("tokens", print_kv)
def _tokens(c: Client, a: argparse.Namespace) -> Any:
    return c.record_tokens(_sid(c, a.id), input_tokens=a.input, output_tokens=a.output,
                           estimated_cost=a.cost, model=a.model, **_write_opts(a))


@command("progress", print_kv)
def _progress(c: Client, a: argparse.Namespace) -> Any:
    return c.record_progress(_sid(c, a.id), a.node, edge=a.edge, latency_ms=a.latency_ms,
                             tokens=a.tokens, retries=a.retries,
                             failed=True if a.failed else None, **_write_opts(a))


@command("memory", print_kv)
def _memory(c: Client, a: argparse.Namespace) -> Any:
    return c.update_memory(_sid(c, a.id), a.patch, **_write_opts(a))


@command("checkpoint-save", print_kv)
def _checkpoint_save(c: Client, a: argparse.Namespace) -> Any:
    payload = (_parse_json(_read_text(a.payload), "payload")
               if a.payload is not None else None)
    return c.save_checkpoint(_sid(c, a.id), payload, checkpoint_id=a.checkpoint_id,
                             node_id=a.node, resume_from=a.resume_from, memory=a.memory,
                             **_write_opts(a))


@command("checkpoint-get", print_kv)
def _checkpoint_get(c: Client, a: argparse.Namespace) -> Any:
    return c.get_checkpoint(_sid(c, a.id), a.checkpoint_id)


@command("checkpoints", render_checkpoints)
def _checkpoints(c: Client, a: argparse.Namespace) -> Any:
    sid, found, after = _sid(c, a.id), [], 0
    while True:  # pages end at the daemon's byte budget; this lists them all
        page: rpc.CheckpointListResult = c.call(
            "checkpoint.list", rpc.CheckpointListResult, session_id=sid, after_version=after)
        found += page.checkpoints
        if page.next is None:
            return found
        after = page.next


@command("events-append", print_kv)
def _events_append(c: Client, a: argparse.Namespace) -> Any:
    return c.append_events(_sid(c, a.id), _read_json_items(a.file), **_write_opts(a))


@command("events", render_events)
def _events(c: Client, a: argparse.Namespace) -> Any:
    return c.read_events(_sid(c, a.id) if a.id else None, from_version=a.from_version,
                         from_position=a.from_position, limit=a.limit, types=a.type or None)


@command("spawn", render_state)
def _spawn(c: Client, a: argparse.Namespace) -> Any:
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        raise SystemExit("sessionctl spawn: give the command after --, e.g. -- codex exec --json TASK")
    bad = [kv for kv in a.env or [] if "=" not in kv or kv.startswith("=")]
    if bad:
        raise CliError(f"--env wants KEY=VALUE, not {bad[0]!r}", "usage", 2)
    env = dict(kv.split("=", 1) for kv in a.env or [])
    state = c.spawn(argv, cwd=os.path.abspath(a.cwd or os.getcwd()), env=env or None,
                    adapter=a.adapter, task=a.task, model=a.model, session_id=a.id,
                    source=a.source)
    if state.status == "failed":  # the program did not start: show the session, then fail
        (print(msgspec.json.encode(state).decode()) if a.json else render_state(state))
        raise CliError(f"{argv[0]} did not start: {state.error or 'unknown reason'}"
                       f" (session {state.session_id})", "spawn_failed", 1,
                       {"session_id": state.session_id})
    return state


@command("inject", render_state)
def _inject(c: Client, a: argparse.Namespace) -> Any:
    return c.inject(_sid(c, a.id), _read_text(a.message))


@command("kill", render_state)
def _kill(c: Client, a: argparse.Namespace) -> Any:
    return c.kill(_sid(c, a.id))


@command("output", lambda r: print("\n".join(r.lines)))
def _output(c: Client, a: argparse.Namespace) -> Any:
    sid = _sid(c, a.id)
    result = c.output(sid, turn=a.turn, stream=a.stream)
    while result.next is not None:  # a page cut by bytes: read the rest of the turn
        more: rpc.OutputResult = c.call("session.output", rpc.OutputResult, session_id=sid,
                                        turn=result.turn, stream=a.stream,
                                        after_position=result.next)
        result = msgspec.structs.replace(more, lines=result.lines + more.lines)
    return result


def _render_steps(steps: Any) -> None:
    for s in steps:
        print(f"[{s.turn}] {s.type:<12} {s.summary}")


@command("trajectory", _render_steps)
def _trajectory(c: Client, a: argparse.Namespace) -> Any:
    return c.trajectory(_sid(c, a.id), full=a.full, max_output_len=a.max_output_len)


_STREAMED = object()  # a command that printed as it went


@command("watch")
def _watch(c: Client, a: argparse.Namespace) -> Any:
    sid = _sid(c, a.id) if a.id else None
    start = 0 if a.from_start else a.from_position
    try:
        for event in c.subscribe(sid, from_position=start, types=a.type or None):
            if a.json:
                line = msgspec.json.encode(event).decode()
            else:
                line = (f"{event.recorded_at[11:23]}  {event.session_id[:16]:<16} "
                        f"v{event.version:<5} {event.type:<22} {summarize(event)}")
            print(line, flush=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a watch; that is not an error
    return _STREAMED


@command("top")
def _top(c: Client, a: argparse.Namespace) -> Any:
    from . import top
    top.run(c, a)
    return _STREAMED


# --- search and fork ---------------------------------------------------------------------

_MARK = ("\x02", "\x03")  # sessionctl's own marks, turned into highlighting when shown


def _when(text: str | None) -> str | None:
    """7d, 12h, 30m ago as an RFC 3339 time; an RFC 3339 time as it is."""
    if text is None:
        return None
    from datetime import UTC, datetime, timedelta
    try:
        datetime.fromisoformat(text)
        return text
    except ValueError:
        at = datetime.now(UTC) - timedelta(days=_days(text))
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def render_search(r: Any) -> None:
    from rich.markup import escape
    console = _render_console()
    if not r.sessions:
        console.print("no session matches")
    for s in r.sessions:
        console.print(f"[bold]{s.session_id}[/bold]  {s.status}  {s.actor_name or '-'}  "
                      f"{escape((s.task or '')[:80])}  ({s.matches} matching)", highlight=False)
        for h in s.hits:
            text = escape(h.snippet.replace("\n", " ")).replace(
                _MARK[0], "[bold yellow]").replace(_MARK[1], "[/bold yellow]")
            where = (f"#{h.sequence} {h.role}" if h.sequence is not None else h.type)
            gone = "" if h.current is not False else " (taken out)"
            console.print(f"    {where}{gone}: {text}", highlight=False)
    if not r.complete:
        console.print("(only the newest 5,000 matches were ranked: add words or filters"
                      " to reach older sessions)", highlight=False)
    if r.next_cursor:
        console.print(f"more: --cursor {r.next_cursor}", highlight=False)


def _render_console() -> Any:
    from rich.console import Console
    return Console()


@command("search", render_search)
def _search(c: Client, a: argparse.Namespace) -> Any:
    return c.search(a.query, status=a.status or None, namespace=a.namespace,
                    actor_name=a.actor, since=a.since, until=a.until,
                    limit=a.limit, hits=a.hits, cursor=a.cursor,
                    mark=None if a.json else list(_MARK))


@command("fork", lambda s: print(s.session_id))
def _fork(c: Client, a: argparse.Namespace) -> Any:
    return c.fork(_sid(c, a.id), at_version=a.at, new_session_id=a.new_id,
                  idempotency_key=a.idempotency_key)


@command("forks")
def _forks(c: Client, a: argparse.Namespace) -> Any:
    return c.forks(_sid(c, a.id), limit=a.limit, cursor=a.cursor)


@command("reindex", print_kv)
def _reindex(c: Client, a: argparse.Namespace) -> Any:
    return c.reindex()


class _Shown(msgspec.Struct):
    """show's result for people: the state, and where it sits in its fork tree."""

    state: Any
    ancestors: list[Any]  # ForkLink, nearest first
    forks: Any  # ForksResult


def render_show(r: Any) -> None:
    if not isinstance(r, _Shown):
        render_state(r)
        return
    render_state(r.state)
    if not r.ancestors and not r.forks.count:
        return
    console = _render_console()
    console.print(f"[bold]{'fork tree':>16}[/bold]", highlight=False)
    depth = 0
    for link in reversed(r.ancestors):
        console.print(f"{'':>18}{'  ' * depth}{link.session_id} @ v{link.version}",
                      highlight=False)
        depth += 1
    console.print(f"{'':>18}{'  ' * depth}{r.state.session_id}  (this session)",
                  highlight=False)
    for f in r.forks.forks:
        console.print(f"{'':>18}{'  ' * (depth + 1)}{f.session_id}  forked at v{f.version}",
                      highlight=False)
    rest = r.forks.count - len(r.forks.forks)
    if rest > 0:
        console.print(f"{'':>18}{'  ' * (depth + 1)}... and {rest} more"
                      f" (sessionctl forks {r.state.session_id})", highlight=False)


@command("show", render_show)
def _show_with_tree(c: Client, a: argparse.Namespace) -> Any:
    state = _show(c, a)
    if a.json:
        return state
    ancestors, link = [], state.forked_from
    while link is not None and len(ancestors) < 20:
        ancestors.append(link)
        link = c.get_session(link.session_id).forked_from
    return _Shown(state, ancestors, c.forks(state.session_id, limit=20))


def add_search_fork_commands(cmd: Callable[..., argparse.ArgumentParser]) -> None:
    sp = cmd("search", "find sessions by their text (FTS5 query: words, \"phrases\", prefix*,"
             " AND OR NOT)", sid=False)
    sp.add_argument("query")
    sp.add_argument("--status", action="append", choices=STATUSES)
    sp.add_argument("--namespace")
    sp.add_argument("--actor")
    sp.add_argument("--since", type=_when,
                    help="matches since: 7d, 12h, 30m ago, or an RFC 3339 time")
    sp.add_argument("--until", type=_when,
                    help="matches before: 7d, 12h, 30m ago, or an RFC 3339 time")
    sp.add_argument("--limit", type=int, help="sessions per page (default 20)")
    sp.add_argument("--hits", type=int, help="snippets per session (default 3)")
    sp.add_argument("--cursor")
    sp = cmd("fork", "make a new session whose history is this one's up to a version;"
             " print its id")
    sp.add_argument("--at", type=int, help="the version to fork at (default: the latest)")
    sp.add_argument("--new-id", help="the fork's session id (default: a new ULID)")
    sp.add_argument("--idempotency-key", help="a repeat with this key makes no second fork")
    sp = cmd("forks", "list a session's forks")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--cursor")
    cmd("reindex", "rebuild the search index and fork links from the events (writes wait)",
        sid=False)


# --- argument parsing --------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sessionctl", description="Talk to a sessiond daemon.")
    p.add_argument("--socket", help="daemon socket (default: $SESSIOND_SOCKET or the runtime dir)")
    p.add_argument("--json", action="store_true", help="print the JSON result")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help: str, *, write: bool = False, sid: bool = True) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the JSON result")
        if sid:
            sp.add_argument("id", help="session id or a unique prefix (>= 4 characters)")
        if write:
            sp.add_argument("--expected-version", type=int, help="refuse unless at this version")
            sp.add_argument("--idempotency-key", help="a repeat with this key appends nothing")
        return sp

    cmd("ping", "check that the daemon answers", sid=False)
    cmd("verify", "check the database, hash chains and views; exit 1 on problems", sid=False)
    sp = cmd("export", "write a session's export document (JSON with a checksum)")
    sp.add_argument("-o", "--output", help="file to write (default: stdout)")
    sp = cmd("import", "import export documents, or a seed's store with --format;"
             " exit 1 if any fails", sid=False)
    sp.add_argument("files", nargs="+", metavar="PATH")
    sp.add_argument("--format", choices=["hive", "cleveragents", "zwarm"],
                    help="hive: a storage root, its sessions/ or one session folder;"
                         " cleveragents: an as_export_dict() file; zwarm: a project, .zwarm/"
                         " or one session folder")
    sp.add_argument("--on-conflict", choices=["error", "skip", "replace"])
    sp = cmd("backup", "copy the database online to a new file", sid=False)
    sp.add_argument("path")
    sp = cmd("cleanup", "delete ended sessions idle for a while", sid=False)
    sp.add_argument("--older-than", type=_days, default=7.0, help="7d, 12h, 30m (default 7d)")
    sp.add_argument("--status", action="append", choices=STATUSES,
                    help="statuses to clean (default: completed failed cancelled killed)")
    sp.add_argument("--dry-run", action="store_true", help="only list what would go")
    cmd("stats", "show the daemon's counters", sid=False)
    sp = cmd("create", "create a session", sid=False)
    sp.add_argument("--id", help="session id (default: a new ULID)")
    sp.add_argument("--idempotency-key")
    for flag in ("task", "namespace", "actor", "goal", "agent", "model", "adapter", "source",
                 "working-dir", "automation-level", "entry-point"):
        sp.add_argument("--" + flag)
    sp.add_argument("--metadata", type=_json_arg, help="JSON object")
    sp.add_argument("--input", type=_json_arg, help="input_data, a JSON object")
    sp.add_argument("--checkpoint-enabled", action="store_true")
    sp.add_argument("--pending", action="store_true", help="create in status pending")
    sp = cmd("show", "show a session's state")
    sp.add_argument("--at-version", type=int, help="the state as it was at this version")
    sp = cmd("resolve", "print the whole id a prefix stands for", sid=False)
    sp.add_argument("prefix")
    sp = cmd("list", "list sessions, newest first", sid=False)
    sp.add_argument("--namespace")
    sp.add_argument("--status", action="append", choices=STATUSES)
    sp.add_argument("--actor")
    sp.add_argument("--source")
    sp.add_argument("--since", help="created after this RFC 3339 time")
    sp.add_argument("--until", help="created before this RFC 3339 time")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--cursor")
    sp = cmd("transition", "move a session to another status", write=True)
    sp.add_argument("to", choices=STATUSES)
    for flag in ("reason", "error", "paused-at", "resume-from"):
        sp.add_argument("--" + flag)
    sp = cmd("resume", "move a session back to active and print what to resume with", write=True)
    sp.add_argument("--checkpoint", help="resume from this checkpoint")
    sp = cmd("delete", "delete a session and everything stored for it (asks first on a"
             " terminal)", write=True)
    sp.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    sp = cmd("append", "append a message (content from the argument or stdin)", write=True)
    sp.add_argument("role", choices=["user", "assistant", "system", "tool"])
    sp.add_argument("content", nargs="?", help="message text; '-' or nothing reads stdin")
    sp.add_argument("--tool-call-id")
    sp.add_argument("--metadata", type=_json_arg)
    sp = cmd("append-many", "append messages atomically from a JSON array or JSON lines",
             write=True)
    sp.add_argument("file", nargs="?", help="file with [{role, content, ...}]; default stdin")
    sp = cmd("messages", "list a session's messages")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--offset", type=int)
    sp.add_argument("--after", type=int, help="only messages after this sequence")
    sp.add_argument("--desc", action="store_true", help="newest first")
    sp = cmd("tokens", "record token usage", write=True)
    sp.add_argument("--input", type=int)
    sp.add_argument("--output", type=int)
    sp.add_argument("--cost", type=float)
    sp.add_argument("--model")
    sp = cmd("progress", "record a graph step", write=True)
    sp.add_argument("node")
    sp.add_argument("--edge")
    sp.add_argument("--latency-ms", type=int)
    sp.add_argument("--tokens", type=int)
    sp.add_argument("--retries", type=int)
    sp.add_argument("--failed", action="store_true")
    sp = cmd("memory", "apply a JSON merge patch to the session's memory", write=True)
    sp.add_argument("patch", type=_json_arg)
    sp = cmd("checkpoint-save", "save a checkpoint (payload JSON from the argument or stdin)",
             write=True)
    sp.add_argument("payload", nargs="?", help="payload JSON; '-' reads stdin")
    sp.add_argument("--checkpoint-id")
    sp.add_argument("--node")
    sp.add_argument("--resume-from")
    sp.add_argument("--memory", type=_json_arg)
    sp = cmd("checkpoint-get", "print a checkpoint and its payload (latest by default)")
    sp.add_argument("checkpoint_id", nargs="?")
    cmd("checkpoints", "list a session's checkpoints")
    sp = cmd("events-append", "append typed events [{type, data}] atomically", write=True)
    sp.add_argument("file", nargs="?", help="JSON array or JSON lines; default stdin")
    sp = cmd("watch", "follow events live, like tail -f (Ctrl-C to stop)", sid=False)
    sp.add_argument("id", nargs="?", help="session id or prefix; all sessions when left out")
    start = sp.add_mutually_exclusive_group()
    start.add_argument("--from", dest="from_position", type=int, metavar="POSITION",
                       help="start after this global position (default: from now)")
    start.add_argument("--from-start", action="store_true", help="start with the first event")
    sp.add_argument("--type", action="append", help="only events of this type (repeatable)")
    sp = cmd("top", "a live view of sessions, spend and daemon health (q quits)", sid=False)
    from . import top
    top.add_arguments(sp)
    sp = cmd("spawn", "run an agent CLI as a supervised session: spawn [opts] -- CMD ARGS...",
             sid=False)
    sp.add_argument("--adapter", choices=["jsonl", "codex", "claude"],
                    help="how to read its output (default jsonl)")
    sp.add_argument("--cwd", help="working directory (default: here)")
    sp.add_argument("--env", action="append", metavar="KEY=VALUE", help="extra environment")
    sp.add_argument("--task", help="the first user message, written to its stdin")
    sp.add_argument("--model")
    sp.add_argument("--source")
    sp.add_argument("--id", help="session id (default: a new ULID)")
    sp.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")
    sp = cmd("inject", "run a follow-up turn of an executor session")
    sp.add_argument("message", nargs="?", help="the message; '-' or nothing reads stdin")
    cmd("kill", "end an executor session's processes (SIGTERM, then SIGKILL)")
    sp = cmd("output", "print an executor turn's raw output lines")
    sp.add_argument("--turn", type=int, help="which turn (default: the latest)")
    sp.add_argument("--stream", choices=["stdout", "stderr"], help="one stream only")
    sp = cmd("trajectory", "list an executor session's steps")
    sp.add_argument("--full", action="store_true", help="do not truncate long text")
    sp.add_argument("--max-output-len", type=int, help="truncate text past this (default 200)")
    sp = cmd("events", "read stored events of one session or of all", sid=False)
    sp.add_argument("id", nargs="?", help="session id or prefix; all sessions when left out")
    sp.add_argument("--from-version", type=int)
    sp.add_argument("--from-position", type=int, help="events after this global position")
    sp.add_argument("--limit", type=int)
    sp.add_argument("--type", action="append")
    add_search_fork_commands(cmd)
    return p


def _fail(message: str, code: int | str, exit_code: int, data: dict[str, Any] | None,
          as_json: bool) -> NoReturn:
    """Print one error line on stderr (a JSON object under --json) and exit."""
    if as_json:
        print(json.dumps({"error": {"code": code, "message": message, "data": data or {}}}),
              file=sys.stderr)
    else:
        print(f"sessionctl: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except CliError as exc:
        _fail(exc.message, exc.code, exc.exit_code, exc.data, as_json)
    handler, render = _COMMANDS[args.command]
    client = Client(args.socket)
    try:
        client.connect()
    except SessiondError as exc:  # no daemon (its message says where and what to do),
        # or not one we may talk to
        _fail(exc.message, "unreachable", 2, {"socket": client.socket_path}, args.json)
    except OSError as exc:
        _fail(f"cannot reach sessiond at {client.socket_path}: {exc}", "unreachable", 2,
              {"socket": client.socket_path}, args.json)
    try:
        result = handler(client, args)
    except BrokenPipeError:  # our reader (say, `head`) has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return
    except KeyboardInterrupt:  # Ctrl-C: the user's choice, not a failure to explain
        print(file=sys.stderr)
        sys.exit(130)
    except CliError as exc:
        _fail(exc.message, exc.code, exc.exit_code, exc.data, args.json)
    except (ConnectionLostError, ConnectionError) as exc:  # the daemon went away
        _fail(f"lost the connection to sessiond at {client.socket_path}: {exc}",
              "unreachable", 2, {"socket": client.socket_path}, args.json)
    except SessiondError as exc:
        _fail(exc.message, exc.code, 1, exc.data, args.json)
    except OSError as exc:  # a local file or terminal, not the daemon
        _fail(f"{exc.filename or 'sessionctl'}: {exc.strerror or exc}", "file_error", 1,
              {"path": exc.filename} if exc.filename else None, args.json)
    finally:
        client.close()
    if result is _STREAMED:
        return
    if args.json or render is None:
        sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
    else:
        render(result)


if __name__ == "__main__":
    main()
