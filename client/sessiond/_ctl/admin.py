"""sessionctl's daemon and document commands: ping, verify, export, import, backup, cleanup,
stats."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import msgspec

from sessiond_schemas.errors import SessiondError, SessionNotFoundError
from sessiond_schemas.events import STATUSES, SessionForked

from .._render import print_kv, render_ping, render_stats
from .._sync import Client
from .inputs import days, file_problem, read_file
from .registry import STREAMED, CliError, arg, command, full_id


@command("ping", "check that the daemon answers", sid=False, render=render_ping)
def _ping(c: Client, a: argparse.Namespace) -> Any:
    return c.ping()


def render_verify(r: Any) -> None:
    for p in r.problems:
        print(f"{p.session_id or '(database)'}: {p.problem}")
    print(f"{'ok' if r.ok else 'PROBLEMS'}: {r.checked_sessions} sessions checked,"
          f" {len(r.problems)} problems")
    if r.sealed_events is not None:
        ours = not (r.unkeyed_events or r.foreign_events)
        print(f"events sealed by this host or fleet: {r.sealed_events}; unkeyed (earlier"
              f" releases, importers): {r.unkeyed_events}; sealed by another key:"
              f" {r.foreign_events}" + ("; all written here" if ours else ""))


@command("verify", "check the database, hash chains and views (or, with FILE, an export"
         " document, and whether this host or fleet wrote it); exit 1 on problems",
         sid=False, render=render_verify, args=[
             arg("file", nargs="?", metavar="FILE", help="an export document to check"),
             arg("--integrity-only", action="store_true",
                 help="with FILE: check its checksum and chain here, without the daemon"
                      " or its key (whose it is stays unknown)")])
def _verify(c: Client, a: argparse.Namespace) -> Any:
    if a.file and a.integrity_only:
        return _verify_offline(a.file)
    result = c.verify(document=read_file(a.file) if a.file else None)
    if not result.ok:  # print, then exit non-zero
        (print(msgspec.json.encode(result).decode()) if a.json else render_verify(result))
        sys.exit(1)
    return result


def _verify_offline(file: str) -> Any:
    """An export document's checksum and hash chain, by the public algorithms alone."""
    from sessiond_schemas import export
    raw = json.loads(read_file(file))
    if raw.get("checksum") != export.checksum(raw):
        raise CliError(f"{file}: checksum mismatch: the document was changed after export",
                       "verify_failed", 1)
    doc = msgspec.json.decode(msgspec.json.encode(raw), type=export.ExportDocument)
    first = doc.events[0].data if doc.events else None
    prev = first.from_.hash if isinstance(first, SessionForked) else ""
    for e in doc.events:
        if not export.link_ok(prev, e):
            raise CliError(f"{file}: hash chain broken at version {e.version}",
                           "verify_failed", 1)
        prev = e.hash
    print(f"ok: {file}: checksum and chain hold ({len(doc.events)} events; whose they are"
          " is for the daemon to say: sessionctl verify FILE)")
    return STREAMED


@command("export", "write a session's export document (JSON with a checksum)",
         args=[arg("-o", "--output", help="file to write (default: stdout)")])
def _export(c: Client, a: argparse.Namespace) -> Any:
    # Written as session.export's pages come: a session of any size, never whole in memory.
    sid = full_id(c, a.id)
    if not a.output:
        c.export_session_to(sid, sys.stdout)
        return STREAMED
    try:
        with open(a.output, "w", encoding="utf-8") as f:
            c.export_session_to(sid, f)
    except OSError as exc:
        raise file_problem(a.output, exc) from exc
    return STREAMED


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


def _failure(file: str, problem: Any) -> dict[str, Any]:
    """A failed file (or line of it): file, line, JSON path, reason, and the sentence."""
    item: dict[str, Any] = {"file": file, "path": problem.path, "reason": problem.reason,
                            "error": problem.describe()}
    if problem.line is not None:
        item["line"] = problem.line
    return item


@command("import", "import export documents, another agent framework's stored sessions"
         " (hive, cleveragents, zwarm) or an agent CLI's transcripts"
         " with --format; exit 1 if any file fails", sid=False, args=[
             arg("files", nargs="*", metavar="PATH",
                 help="with --format claude-code or codex, default: the CLI's own folder"
                      " (~/.claude/projects; $CODEX_HOME/sessions or ~/.codex/sessions)"),
             arg("--format", choices=["hive", "cleveragents", "zwarm", "claude-code", "codex"],
                 help="hive: a storage root, its sessions/ or one session folder;"
                      " cleveragents: an as_export_dict() file or a folder of them; zwarm: a"
                      " project, .zwarm/ or one session folder; claude-code: ~/.claude/projects"
                      " (or a project folder, or one .jsonl); codex: ~/.codex/sessions (or a"
                      " day's folder, or one rollout-*.jsonl)"),
             arg("--on-conflict", choices=["error", "skip", "replace"]),
             arg("--strict", action="store_true",
                 help="refuse an export document not written by this host or fleet (its"
                      " events sealed with the daemon's key); with --format cleveragents, a"
                      " document whose checksum cannot be verified"),
             arg("--follow", action="store_true",
                 help="claude-code, codex: keep tailing PATH and append new lines live"),
             arg("--interval", type=float, default=1.0, metavar="SECONDS",
                 help="with --follow: how often to look for new lines (default 1)")])
def _import(c: Client, a: argparse.Namespace) -> Any:
    from ..importers import FORMATS, TRANSCRIPTS
    imported: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    if a.follow and a.format not in TRANSCRIPTS:
        raise CliError("--follow needs --format claude-code or --format codex",
                       "usage", 2)
    if a.format in TRANSCRIPTS:
        return _import_transcripts(c, a)
    if not a.files:
        raise CliError("import needs a PATH (only claude-code and codex have a default)",
                       "usage", 2)

    def exists(sid: str | None) -> bool:
        if sid is None:
            return False
        try:
            c.get_session(sid)
        except SessionNotFoundError:
            return False
        return True

    def send(path: str, document: Any, warnings: list[str], strict: bool = False) -> None:
        try:
            sid = _document_session(document) if a.on_conflict == "skip" else None
            if exists(sid):  # skip: the daemon would return the stored session untouched
                skipped.append({"file": path, "session_id": sid,
                                "reason": "a session with this id exists"})
                return
            state = c.import_session(document, on_conflict=a.on_conflict,
                                     strict=True if strict else None)
            imported.append({"file": path, "session_id": state.session_id,
                             "version": state.version, "warnings": warnings})
        except SessiondError as exc:
            failed.append({"file": path, "path": (exc.data or {}).get("path", "$"),
                           "reason": exc.message, "error": exc.message})

    def one(path: str) -> None:
        if a.format:  # another framework's own store: each importer yields export documents
            for found in FORMATS[a.format](path, a.strict):
                if found.problem is not None:
                    failed.append(_failure(found.file, found.problem))
                elif found.document is not None:
                    send(found.file, found.document, found.warnings)
            return
        try:
            text = read_file(path)  # sent as text: the daemon judges even invalid JSON
        except CliError as exc:
            reason = exc.message.removeprefix(f"{path}: ")  # the file is said once
            failed.append({"file": path, "path": "$", "reason": reason, "error": reason})
            return
        send(path, text, [], a.strict)

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
    _report(a, imported, skipped, failed)
    if failed:
        sys.exit(1)
    return STREAMED


def _report(a: argparse.Namespace, imported: list[dict[str, Any]],
            skipped: list[dict[str, Any]], failed: list[dict[str, Any]]) -> None:
    if a.json:
        print(json.dumps({"imported": imported, "skipped": skipped, "failed": failed}),
              flush=True)
        return
    for item in imported:
        lines = f", {item['lines']} lines" if "lines" in item else ""
        print(f"imported {item['session_id']} (v{item['version']}{lines}) from {item['file']}")
        for warning in item["warnings"]:
            print(f"  note: {warning}", file=sys.stderr)
    for item in skipped:
        print(f"skipped {item['session_id']} from {item['file']}: {item['reason']}")
    for item in failed:
        print(f"FAILED {item['file']}: {item['error']}", file=sys.stderr)
    sys.stdout.flush()


def _import_transcripts(c: Client, a: argparse.Namespace) -> Any:
    """claude-code and codex: every transcript under the roots; with --follow, for ever."""
    import signal
    import time

    from ..importers.transcripts import TranscriptImporter

    importer = TranscriptImporter(c, a.format)
    if not a.files:  # where the CLI itself keeps them
        home = os.path.expanduser("~")
        a.files = [os.path.join(home, ".claude", "projects") if a.format == "claude-code"
                   else os.path.join(os.environ.get("CODEX_HOME") or
                                     os.path.join(home, ".codex"), "sessions")]

    def one_pass(final: bool) -> tuple[list[dict[str, Any]], ...]:
        imported: list[dict[str, Any]] = []
        skipped: list[dict[str, Any]] = []
        failed: list[dict[str, Any]] = []
        for root in a.files:
            if not os.path.exists(root):
                failed.append({"file": root, "path": "$", "reason": "no such file or directory",
                               "error": "no such file or directory"})
                continue
            listed, done = importer.files(root), 0
            while done < len(listed):
                file, inode = listed[done]
                result = importer.sync(file, final=final, inode=inode)
                if result.moved:  # a rotation under the listing: list again, oldest first
                    listed, done = importer.files(root), 0
                    continue
                done += 1
                for problem in result.failures:
                    failed.append(_failure(file, problem))
                if result.error is not None:
                    failed.append(_failure(file, result.error))
                elif result.appended:
                    imported.append(result.as_item())
                elif final and not result.failures:
                    skipped.append({"file": file, "session_id": result.session_id,
                                    "reason": "nothing new" if result.session_id in
                                    importer.known else "no messages in it"})
        return imported, skipped, failed

    if not a.follow:
        imported, skipped, failed = one_pass(final=True)
        if not (imported or skipped or failed):
            raise CliError(f"nothing to import: no {a.format} transcripts found in"
                           f" {', '.join(a.files)}", "nothing_found", 1, {"files": a.files})
        _report(a, imported, skipped, failed)
        if failed:
            sys.exit(1)
        return STREAMED

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    from .._wire import ConnectionLostError
    away: str | None = None  # why the daemon is not answering, while it is not
    try:
        while True:
            try:
                imported, _, failed = one_pass(final=False)
            except ConnectionLostError as exc:
                if away is None:  # said once; the lines wait in memory and in the files
                    print(f"waiting for the daemon: {exc}", file=sys.stderr, flush=True)
                away = str(exc)
                time.sleep(max(a.interval, 1.0))
                continue
            if away is not None:
                print("the daemon is back: going on", file=sys.stderr, flush=True)
                away = None
            if imported or failed:
                _report(a, imported, [], failed)
            time.sleep(a.interval)
    except KeyboardInterrupt:
        importer.close()
    return STREAMED


@command("backup", "copy the database online to a new file", sid=False,
         render=print_kv, args=[arg("path")])
def _backup(c: Client, a: argparse.Namespace) -> Any:
    return c.backup(os.path.abspath(a.path))


@command("cleanup", "delete ended sessions idle for a while", sid=False, args=[
    arg("--older-than", type=days, default=7.0, help="7d, 12h, 30m (default 7d)"),
    arg("--status", action="append", choices=STATUSES,
        help="statuses to clean (default: completed failed cancelled killed)"),
    arg("--dry-run", action="store_true", help="only list what would go")])
def _cleanup(c: Client, a: argparse.Namespace) -> Any:
    result = c.cleanup(older_than_days=a.older_than, statuses=a.status or None,
                       dry_run=True if a.dry_run else None)
    if a.json:
        return result
    verb = "would delete" if a.dry_run else "deleted"
    print(f"{verb} {result.deleted} sessions" + "".join(f"\n  {s}" for s in result.session_ids))
    return STREAMED


@command("stats", "show the daemon's counters (and what events and last_position count)",
         sid=False, render=render_stats)
def _stats(c: Client, a: argparse.Namespace) -> Any:
    return c.stats()
