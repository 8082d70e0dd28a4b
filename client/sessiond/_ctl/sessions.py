"""sessionctl's session commands: create, show, list, transition and the writes; watch, top."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.events import STATUSES
from sessiond_schemas.state import ForkLink

from .._follow import follow
from .._render import (
    Listed,
    print_kv,
    render_checkpoints,
    render_context,
    render_list,
    render_messages,
    render_state,
    summarize,
)
from .._sync import Client
from .inputs import json_arg, parse_json, read_json_items, read_text, render_console, when
from .registry import STREAMED, CliError, arg, command, full_id, one_of, write_opts


@command("create", "create a session", sid=False, render=render_state, args=[
    arg("--id", help="session id (default: a new ULID)"),
    arg("--idempotency-key"),
    *(arg("--" + flag) for flag in ("task", "namespace", "actor", "goal", "agent", "model",
                                     "adapter", "source", "working-dir", "automation-level",
                                     "entry-point")),
    arg("--metadata", type=json_arg, help="JSON object"),
    arg("--input", type=json_arg, help="input_data, a JSON object"),
    arg("--checkpoint-enabled", action="store_true"),
    arg("--pending", action="store_true", help="create in status pending")])
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


def _show(c: Client, a: argparse.Namespace) -> Any:
    return c.get_session(full_id(c, a.id), at_version=a.at_version)


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
    console = render_console()
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


@command("show", "show a session's state", render=render_show,
         args=[arg("--at-version", type=int, help="the state as it was at this version")])
def _show_with_tree(c: Client, a: argparse.Namespace) -> Any:
    state = _show(c, a)
    if a.json:
        return state
    ancestors: list[ForkLink] = []
    link = state.forked_from
    while link is not None and len(ancestors) < 20:
        ancestors.append(link)
        link = c.get_session(link.session_id).forked_from
    return _Shown(state, ancestors, c.forks(state.session_id, limit=20))


@command("resolve", "print the whole id a prefix stands for", sid=False,
         render=lambda r: print(r["session_id"]), args=[arg("prefix")])
def _resolve(c: Client, a: argparse.Namespace) -> Any:
    return {"session_id": c.resolve(a.prefix)}


@command("list", "list sessions, newest first", sid=False, render=render_list, args=[
    arg("--namespace"),
    arg("--status", action="append", choices=STATUSES),
    arg("--actor"),
    arg("--source"),
    arg("--since", type=when, help="created since: 7d, 12h, 30m ago, or an RFC 3339 time"),
    arg("--until", type=when, help="created before: 7d, 12h, 30m ago, or an RFC 3339 time"),
    arg("--limit", type=int),
    arg("--cursor"),
    arg("--wide", action="store_true", help="whole ids and times (wider than 80 columns)")],
    wire={"created_after": "--since", "created_before": "--until", "actor_name": "--actor"})
def _list(c: Client, a: argparse.Namespace) -> Any:
    page = c.list_sessions(namespace=a.namespace, status=a.status or None, actor_name=a.actor,
                           source=a.source, created_after=a.since, created_before=a.until,
                           limit=a.limit, cursor=a.cursor)
    return page if a.json else Listed(page, a.wide)


@command("transition", "move a session to another status", write=True,
         render=render_state, args=[
             arg("to", choices=STATUSES),
             *(arg("--" + flag) for flag in ("reason", "error", "paused-at", "resume-from"))])
def _transition(c: Client, a: argparse.Namespace) -> Any:
    return c.transition(full_id(c, a.id), a.to, reason=a.reason, error=a.error,
                        paused_at=a.paused_at, resume_from=a.resume_from, **write_opts(a))


def _ttl_seconds(text: str) -> int | None:
    if text in ("none", "off"):
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds, or none: {text!r}") from None


@command("ttl", "set a session's idle TTL (the daemon ends it that long after its last"
         " event; status expired)", write=True, render=render_state, args=[
             arg("seconds", type=_ttl_seconds, help="1 … 315360000 seconds, or none")])
def _ttl(c: Client, a: argparse.Namespace) -> Any:
    return c.set_ttl(full_id(c, a.id), a.seconds, **write_opts(a))


@command("resume", "move a session back to active and print what to resume with",
         write=True, render=print_kv,
         args=[arg("--checkpoint", help="resume from this checkpoint")])
def _resume(c: Client, a: argparse.Namespace) -> Any:
    r = c.resume(full_id(c, a.id), a.checkpoint, **write_opts(a))
    return r if a.json else r.resume


def _confirm(question: str) -> bool:
    """Ask on the terminal; anything but y or yes (or end of input) is no."""
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()
    return answer.strip().lower() in ("y", "yes")


@command("delete", "delete a session and everything stored for it (asks first on a"
         " terminal)", write=True, render=lambda r: print(f"deleted {r['session_id']}"),
         args=[arg("-y", "--yes", action="store_true", help="do not ask for confirmation")])
def _delete(c: Client, a: argparse.Namespace) -> Any:
    sid = full_id(c, a.id)
    if not a.yes and sys.stdin.isatty():
        state = c.get_session(sid)
        if not _confirm(f"delete session {sid} ({state.status}, {state.message_count} messages)"
                        " and everything stored for it?"):
            raise CliError(f"not deleted: {sid}", "not_confirmed", 1, {"session_id": sid})
    return {"deleted": c.delete_session(sid, **write_opts(a)), "session_id": sid}


@command("append", "append a message (content from the argument or stdin)", write=True,
         render=print_kv, args=[
             arg("role", choices=["user", "assistant", "system", "tool"]),
             arg("content", nargs="?", help="message text; '-' or nothing reads stdin"),
             arg("--tool-call-id"),
             arg("--metadata", type=json_arg)])
def _append(c: Client, a: argparse.Namespace) -> Any:
    return c.append_message(full_id(c, a.id), a.role, read_text(a.content),
                            tool_call_id=a.tool_call_id, metadata=a.metadata, **write_opts(a))


@command("append-many", "append messages atomically from a JSON array or JSON lines",
         write=True, render=print_kv, args=[
             arg("file", nargs="?", help="file with [{role, content, ...}]; default stdin")])
def _append_many(c: Client, a: argparse.Namespace) -> Any:
    return c.append_messages(full_id(c, a.id), read_json_items(a.file), **write_opts(a))


@command("messages", "list a session's messages", render=render_messages, args=[
    arg("--limit", type=int),
    arg("--offset", type=int),
    arg("--after", type=int, help="only messages after this sequence"),
    arg("--desc", action="store_true", help="newest first")],
    wire={"after_sequence": "--after"})
def _messages(c: Client, a: argparse.Namespace) -> Any:
    return c.list_messages(full_id(c, a.id), limit=a.limit, offset=a.offset,
                           after_sequence=a.after, order="desc" if a.desc else None)


@command("context", "what the model sees now: the last compaction's summary and the"
         " messages after it", render=render_context, args=[
             arg("--limit", type=int),
             arg("--after", type=int, help="the page after this sequence (the last `more`)")],
         wire={"after_sequence": "--after"})
def _context(c: Client, a: argparse.Namespace) -> Any:
    return c.context(full_id(c, a.id), limit=a.limit, after_sequence=a.after)


@command("compact", "record a compaction: summary messages (a JSON array or JSON lines)"
         " that stand for the messages so far; nothing is cut", write=True,
         render=render_state, args=[
             arg("file", nargs="?", help="file with [{role, content, ...}]; default stdin"),
             arg("--through", type=int, help="the last message the summary stands for"
                 " (default: the last one; -1: none)"),
             arg("--by", default="cli", help="who made it (default cli)"),
             arg("--reason")],
         wire={"through_sequence": "--through"})
def _compact(c: Client, a: argparse.Namespace) -> Any:
    return c.compact(full_id(c, a.id), read_json_items(a.file), through_sequence=a.through,
                     by=a.by, reason=a.reason, **write_opts(a))


@command("trim", "retention: take the history behind the last compaction, older than N"
         " days, out of the store (it verifies from the anchor the trim records)",
         write=True, render=print_kv, args=[
             arg("--older-than-days", type=float,
                 help="default: the namespace's trim_after_days (config)"),
             arg("--dry-run", action="store_true", help="say what would be trimmed")])
def _trim(c: Client, a: argparse.Namespace) -> Any:
    return c.trim(full_id(c, a.id), older_than_days=a.older_than_days,
                  dry_run=True if a.dry_run else None, **write_opts(a))


@command("tokens", "record token usage", write=True, render=print_kv, args=[
    arg("--input", type=int),
    arg("--output", type=int),
    arg("--cost", type=float),
    arg("--model")],
    wire={"input_tokens": "--input", "output_tokens": "--output", "estimated_cost": "--cost"})
def _tokens(c: Client, a: argparse.Namespace) -> Any:
    return c.record_tokens(full_id(c, a.id), input_tokens=a.input, output_tokens=a.output,
                           estimated_cost=a.cost, model=a.model, **write_opts(a))


@command("progress", "record a graph step", write=True, render=print_kv, args=[
    arg("node"),
    arg("--edge"),
    arg("--latency-ms", type=int),
    arg("--tokens", type=int),
    arg("--retries", type=int),
    arg("--failed", action="store_true")], wire={"node_id": "node"})
def _progress(c: Client, a: argparse.Namespace) -> Any:
    return c.record_progress(full_id(c, a.id), a.node, edge=a.edge, latency_ms=a.latency_ms,
                             tokens=a.tokens, retries=a.retries,
                             failed=True if a.failed else None, **write_opts(a))


@command("memory", "apply a JSON merge patch to the session's memory", write=True,
         render=print_kv, args=[arg("patch", type=json_arg)])
def _memory(c: Client, a: argparse.Namespace) -> Any:
    return c.update_memory(full_id(c, a.id), a.patch, **write_opts(a))


@command("checkpoint-save", "save a checkpoint (payload JSON from the argument or stdin)",
         write=True, render=print_kv, args=[
             arg("payload", nargs="?", help="payload JSON; '-' reads stdin"),
             arg("--checkpoint-id"),
             arg("--node"),
             arg("--resume-from"),
             arg("--memory", type=json_arg)])
def _checkpoint_save(c: Client, a: argparse.Namespace) -> Any:
    payload = (parse_json(read_text(a.payload), "payload")
               if a.payload is not None else None)
    return c.save_checkpoint(full_id(c, a.id), payload, checkpoint_id=a.checkpoint_id,
                             node_id=a.node, resume_from=a.resume_from, memory=a.memory,
                             **write_opts(a))


@command("checkpoint-get", "print a checkpoint and its payload (latest by default)",
         render=print_kv, args=[arg("checkpoint_id", nargs="?")])
def _checkpoint_get(c: Client, a: argparse.Namespace) -> Any:
    return c.get_checkpoint(full_id(c, a.id), a.checkpoint_id)


@command("checkpoints", "list a session's checkpoints", render=render_checkpoints)
def _checkpoints(c: Client, a: argparse.Namespace) -> Any:
    sid, found, after = full_id(c, a.id), [], 0
    while True:  # pages end at the daemon's byte budget; this lists them all
        page: rpc.CheckpointListResult = c.call(
            "checkpoint.list", rpc.CheckpointListResult, session_id=sid, after_version=after)
        found += page.checkpoints
        if page.next is None:
            return found
        after = page.next


@command("events-append", "append typed events [{type, data}] atomically", write=True,
         render=print_kv,
         args=[arg("file", nargs="?", help="JSON array or JSON lines; default stdin")])
def _events_append(c: Client, a: argparse.Namespace) -> Any:
    return c.append_events(full_id(c, a.id), read_json_items(a.file), **write_opts(a))


@command("watch", "follow events live, like tail -f (Ctrl-C to stop)", sid=False, args=[
    arg("id", nargs="?", help="session id or prefix; all sessions when left out"),
    one_of(arg("--from", dest="from_position", type=int, metavar="POSITION",
               help="start after this global position (default: from now)"),
           arg("--from-start", action="store_true", help="start with the first event")),
    arg("--type", action="append", help="only events of this type (repeatable)")])
def _watch(c: Client, a: argparse.Namespace) -> Any:
    sid = full_id(c, a.id) if a.id else None
    start = 0 if a.from_start else a.from_position
    was_lost = False
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None

    def say(state: str, position: int | None) -> None:
        """What happens to the connection goes to stderr, so stdout stays the events."""
        nonlocal was_lost
        if state == "lost":
            was_lost = True
            note = f"lost the daemon at {c.socket_path}; reconnecting (Ctrl-C to stop)"
        elif state == "reconnected":
            note = "reconnected; catching up"
        elif state == "caught_up" and was_lost:
            was_lost = False
            note = f"caught up at position {position}; following live"
        else:
            return
        line = json.dumps({"watch": state, "position": position}) if a.json else \
            f"sessionctl: {note}"
        print(line, file=sys.stderr, flush=True)

    try:
        for event in follow(c.socket_path, session_id=sid, from_position=start,
                            types=a.type or None, on_state=say):
            if a.json:
                line = msgspec.json.encode(event).decode()
            else:
                line = (f"{event.recorded_at[11:23]}  {event.session_id[:16]:<16} "
                        f"v{event.version:<5} {event.type:<22} {summarize(event)}")
                if width and len(line) > width:  # a line an event on a terminal
                    line = line[:width - 1] + "…"
            print(line, flush=True)
    except KeyboardInterrupt:
        pass  # Ctrl-C ends a watch; that is not an error
    return STREAMED


def _top_arguments(sp: argparse.ArgumentParser) -> None:
    from .. import top
    top.add_arguments(sp)


@command("top", "a live view of sessions, spend and daemon health (q quits)", sid=False,
         args=[_top_arguments])
def _top(c: Client, a: argparse.Namespace) -> Any:
    from .. import top
    top.run(c, a)
    return STREAMED
