"""Claude Code and Codex CLI transcripts into sessions, once or live (`--follow`).

A transcript becomes one session (a sub-agent's transcript its own, linked session).
The first time, its lines go in with `session.import`, keeping the times the CLI
recorded; after that, each new line is one `events.append` whose idempotency key is the
line's own id (`cc:<uuid>` for Claude Code; `cx:<hash of the line>` for Codex, whose
lines have no id). Every event keeps its line's key in `meta.idempotency_key`, so what a
session holds is read back from the daemon: a re-run, or a follower restarted, appends
exactly the lines the daemon does not have, in their order.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidRequestError,
    SessiondError,
    SessionExistsError,
    SessionImportError,
    SessionNotFoundError,
    TooLargeError,
    VersionConflictError,
)
from sessiond_schemas.events import new_id, now

from .._sync import Client
from .._wire import ConnectionLostError
from ._builder import DocumentBuilder, Problem, problem_of
from ._lines import (
    LINE_FIELD,
    PARSERS,
    Line,
    Parser,
    line_keys,
    open_transcript,
    transcript_files,
)


@dataclass
class Result:
    """What one pass over a transcript did (the CLI's per-file result)."""

    file: str
    session_id: str | None = None
    appended: int = 0  # lines that went in
    created: bool = False
    version: int | None = None
    failures: list[Problem] = field(default_factory=list)
    error: Problem | None = None  # the whole file failed
    moved: bool = False  # the file listed is no longer at its path: list again
    pending: int = 0  # a last line still being written (no newline, not whole JSON)
    warnings: list[str] = field(default_factory=list)

    def as_item(self) -> dict[str, Any]:
        return {"file": self.file, "session_id": self.session_id, "version": self.version,
                "lines": self.appended, "created": self.created, "pending": self.pending,
                "warnings": self.warnings}


@dataclass
class _Tail:
    """One open transcript: where reading stopped, and the line it is in the middle of."""

    parser: Parser
    handle: Any = None
    inode: int = -1
    partial: bytes = b""
    number: int = 0
    offset: int = 0  # where a tail closed between passes goes on from
    pending: list[Line] = field(default_factory=list)  # parsed, not yet in the daemon
    # The file's first bytes and the bytes just before where reading stopped, as read: a
    # file rewritten in place (same inode, as long as before or longer) no longer has
    # them, and is read again from its start (keys make a line read twice count once).
    head: bytes = b""
    mark: bytes = b""
    # (inode, size, mtime) of the file when last read to its end: a pass that finds them
    # unchanged reads nothing (a --follow pass over many idle transcripts is a stat each).
    seen: tuple[int, int, int] | None = None


# A first import's document holds about this much of the transcript (the session.import
# request stays well under the daemon's default max_request_bytes, 128 MiB).
DOCUMENT_BYTES = 48 << 20
CUT_BUDGET = 256 << 10  # characters of content and of the kept line a cut line keeps
MARK_BYTES = 1024  # of a file's start and of what precedes the read offset, kept to
# notice a rewrite in place
OPEN_FILES = 64  # transcripts kept open between passes of --follow (a descriptor each)


def _identity(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


class TranscriptImporter:
    """Brings transcripts of one format into a daemon; call `sync` again for more."""

    def __init__(self, client: Client, fmt: str) -> None:
        self.client, self.fmt = client, fmt
        self.parser_type = PARSERS[fmt]
        self.tails: dict[str, _Tail] = {}
        self._recent: dict[str, None] = {}  # the open tails' paths, least recent first
        self.known: dict[str, set[str]] = {}  # session -> line keys the daemon holds
        self.at: dict[str, int] = {}  # session -> the version `known` is exact at

    def files(self, root: str) -> list[tuple[str, int]]:
        """The transcripts under `root`, oldest first, with the inode each had when
        listed (a rotation between listing and reading is noticed by it)."""
        listed = []
        for path in transcript_files(self.fmt, root):
            try:
                listed.append((path, os.stat(path).st_ino))
            except FileNotFoundError:
                continue  # rotated away meanwhile: the next listing has it
        return listed

    def close(self) -> None:
        for tail in self.tails.values():
            if tail.handle is not None:
                tail.handle.close()
        self.tails.clear()
        self._recent.clear()

    # -- reading -------------------------------------------------------------------

    def _open(self, path: str, tail: _Tail) -> None:
        if tail.handle is not None:
            tail.handle.close()
        tail.handle = open_transcript(path)  # kept open across passes
        tail.inode = os.fstat(tail.handle.fileno()).st_ino
        tail.partial, tail.number, tail.offset = b"", 0, 0
        tail.parser.from_start()
        self._opened(path)

    def _opened(self, path: str) -> None:
        """Keep at most OPEN_FILES transcripts open: the one least recently read is
        closed (its place kept: the next pass opens it again there, or, if the path is
        another file by then, reads that from its start)."""
        self._recent.pop(path, None)
        self._recent[path] = None
        while len(self._recent) > OPEN_FILES:
            oldest = next(iter(self._recent))
            del self._recent[oldest]
            tail = self.tails.get(oldest)
            if tail is not None and tail.handle is not None:
                tail.offset = tail.handle.tell()
                tail.handle.close()
                tail.handle = None

    def _reopen(self, path: str, tail: _Tail) -> None:
        """A tail closed by `_opened`: the same file again at its place, or the new one."""
        try:
            handle = open_transcript(path)  # kept open across passes
        except FileNotFoundError:
            return  # rotated away: its rotated copy is listed, and keys count lines once
        if os.fstat(handle.fileno()).st_ino == tail.inode:
            handle.seek(tail.offset)
            tail.handle = handle
            self._opened(path)
        else:
            handle.close()
            self._open(path, tail)

    def _read(self, path: str, tail: _Tail, final: bool, result: Result) -> None:
        """Read what is new; on a replaced file (new inode: rotated or rewritten) the old
        one is read to its end first, then the new one from its start; on a file cut
        shorter, from its start again. Keys make a line read twice count once."""
        if tail.seen is not None and not final:
            try:
                if _identity(os.stat(path)) == tail.seen:
                    return
            except FileNotFoundError:
                pass  # rotated away: read what the open file still has
        if tail.handle is None:
            self._reopen(path, tail)
            if tail.handle is None:
                return
        self._opened(path)
        if self._rewritten(tail):
            self._from_start(tail)
        while True:
            self._lines(tail, tail.handle.read(), result)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                break  # gone (rotated away, not replaced yet): what it had is read
            if st.st_ino != tail.inode:
                self._finish(tail, result)
                self._open(path, tail)
                continue
            if st.st_size < tail.handle.tell():
                self._from_start(tail)
                continue
            tail.seen = _identity(st) if st.st_size == tail.handle.tell() else None
            break
        self._remember(tail)
        if final:
            self._finish(tail, result, growing=True)

    @staticmethod
    def _from_start(tail: _Tail) -> None:
        tail.handle.seek(0)
        tail.partial, tail.number, tail.head, tail.mark = b"", 0, b"", b""
        tail.parser.from_start()

    @staticmethod
    def _remember(tail: _Tail) -> None:
        fd, at = tail.handle.fileno(), tail.handle.tell()
        tail.head = os.pread(fd, min(at, MARK_BYTES), 0)
        tail.mark = os.pread(fd, min(at, MARK_BYTES), at - min(at, MARK_BYTES))

    @staticmethod
    def _rewritten(tail: _Tail) -> bool:
        """Whether the file no longer holds what was read of it (two small reads)."""
        fd, at = tail.handle.fileno(), tail.handle.tell()
        if not at:
            return False
        return (os.pread(fd, len(tail.head), 0) != tail.head
                or os.pread(fd, len(tail.mark), at - len(tail.mark)) != tail.mark)

    def _finish(self, tail: _Tail, result: Result, growing: bool = False) -> None:
        """The end of a file: a last line without newline counts if it is whole JSON.
        In a file that may still grow (`growing`: a one-off import of a transcript the
        CLI may be writing) one that is not is pending, not a failure: the CLI is still
        writing it, and the next run reads it."""
        if tail.partial.strip():
            rest = tail.partial
            if growing:
                try:
                    json.loads(rest)
                except ValueError:
                    result.pending += 1
                    result.warnings.append(f"line {tail.number + 1} has no newline yet (the"
                                           " CLI is writing it): left for the next run")
                    tail.partial = b""
                    return
            tail.partial = b""
            self._lines(tail, rest + b"\n", result)
        tail.partial = b""

    def _lines(self, tail: _Tail, data: bytes, result: Result) -> None:
        if not data:
            return
        chunks = (tail.partial + data).split(b"\n")
        tail.partial = chunks.pop()
        for raw in chunks:
            tail.number += 1
            if not raw.strip():
                continue
            try:
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise Problem(f"not UTF-8 text (byte {exc.start})", line=tail.number) \
                        from None
                line = tail.parser.parse(text, tail.number)
            except Problem as problem:
                result.failures.append(problem)
                continue
            if line is not None:
                tail.pending.append(line)

    # -- writing -------------------------------------------------------------------

    def _known(self, sid: str, parser: Parser) -> set[str] | None:
        """The line keys session `sid` holds (None: no such session). A session this
        transcript did not make (another file's, another program's) is a Problem: the
        importer appends only to its own."""
        if sid in self.known:
            return self.known[sid]
        try:
            view = self.client.get_session(sid)
        except SessionNotFoundError:
            return None
        if not parser.made_from_here(view.source, view.metadata, view.namespace):
            made = view.metadata.get("transcript") or f"source {view.source!r}"
            raise Problem(f"session {sid} exists and was not made from this transcript"
                          f" (but from {made}): nothing appended to it")
        # A history trimmed by retention (issue 48) is read from where it starts; the keys
        # of the lines trimmed are still answered by the daemon's idempotency table.
        self.known[sid], self.at[sid] = set(), view.history.version - 1 if view.history else 0
        self._since(sid)
        return self.known[sid]

    def _since(self, sid: str) -> bool:
        """Add the line keys of the events written to `sid` since `self.at[sid]` (by
        another writer: SessiondSessionStore, another importer); whether there were any."""
        start: int | None = self.at[sid] + 1
        found = False
        while start is not None:
            page = self.client.read_events(sid, from_version=start, limit=10_000)
            self.known[sid].update(line_keys(page.events))
            if page.events:
                self.at[sid], found = page.events[-1].version, True
            start = page.next
        return found

    def _document(self, parser: Parser, sid: str, lines: list[Line]) -> dict[str, Any]:
        f = parser.facts
        first = f.first_at or next((x.at for x in lines if x.at), None) or now()
        b = DocumentBuilder(sid, parser.adapter)
        metadata: dict[str, Any] = {k: v for k, v in {
            "git_branch": f.first_git_branch, "cli_version": f.cli_version,
            "transcript": os.path.abspath(parser.path),
            "parent_session_id": f.parent_session_id, **f.extra}.items() if v is not None}
        namespace = parser.namespace()
        created: dict[str, Any] = {"namespace": namespace} if namespace else {}
        b.add("session.created", {
            **created, "task": f.task, "working_dir": f.working_dir,
            "model": f.first_model or f.model,
            "adapter": parser.adapter, "source": parser.adapter,
            "correlation_id": f.parent_session_id, "metadata": metadata}, first)
        at, sequence = first, 0
        for line in lines:
            at = line.at or at
            for event in line.events:
                data = dict(event["data"])
                if event["type"] == "message.appended":
                    data.update(message_id=new_id(), sequence=sequence)
                    sequence += 1
                elif event["type"] == "session.compacted":  # as events.append completes it
                    data.setdefault("through_sequence", sequence - 1)
                    data["through_version"] = len(b.events)
                b.add(event["type"], data, at, line.key)
        return b.document()

    def sync(self, path: str, final: bool = True, inode: int | None = None) -> Result:
        """Bring what is new in transcript `path` into its session. `final`: the file is
        read to its end as it is now (a one-off import); else a line still being written
        waits for its newline (--follow). `inode`: the one `files` listed; if a file
        first opened here is another (rotated in meanwhile), nothing is read and
        `moved` says to list again, so that older files are always read first."""
        result = Result(path)
        tail = self.tails.get(path)
        try:
            if tail is None:
                tail = _Tail(self.parser_type(path))
                try:
                    self._open(path, tail)
                except FileNotFoundError:
                    if inode is None:
                        raise
                    result.moved = True  # rotated away since it was listed
                    return result
                if inode is not None and tail.inode != inode:
                    tail.handle.close()
                    result.moved = True
                    return result
                self.tails[path] = tail
            self._read(path, tail, final, result)
            sid = tail.parser.facts.session_id
            result.session_id = sid
            if not tail.pending:
                return result
            if sid is None:
                raise Problem("no session id: the file name has none and no line names one")
            self._write(tail, sid, result)
        except ConnectionLostError:
            raise  # the daemon is gone, not this file: the caller waits for it
        except SessiondError as exc:
            result.error = Problem(exc.message)
        except Exception as exc:  # a file's failure is its own result
            result.error = problem_of(exc)
        return result

    def _write(self, tail: _Tail, sid: str, result: Result) -> None:
        try:
            known = self._known(sid, tail.parser)
        except Problem:
            tail.pending.clear()  # not this transcript's session: its lines go nowhere
            raise
        if known is None:
            # The first lines, up to about DOCUMENT_BYTES, go in with the session (at
            # their recorded times); the rest follow as appends.
            size, take = 0, 0
            for line in tail.pending:
                size += 2 * len(line.events[0]["data"].get(LINE_FIELD, "")) + 512
                if take and size > DOCUMENT_BYTES:
                    break
                take += 1
            lines, tail.pending = tail.pending[:take], tail.pending[take:]
            try:
                state = self.client.import_session(self._document(tail.parser, sid, lines))
            except SessionExistsError:  # another importer was first: append instead
                self.known.pop(sid, None)
                tail.pending = lines + tail.pending
                return self._write(tail, sid, result)
            except (SessionImportError, InvalidParamsError, TooLargeError,
                    InvalidRequestError):
                # The daemon refuses some line's data. The session goes in without its
                # lines, which follow one by one: the bad one fails alone (the others
                # then carry the daemon's time, their own in their metadata).
                tail.pending = lines + tail.pending
                state = self.client.import_session(self._document(tail.parser, sid, []))
                self.known[sid], self.at[sid] = set(), state.version
                result.created, result.version = True, state.version
                return self._write(tail, sid, result)
            except BaseException:
                tail.pending = lines + tail.pending
                raise
            self.known[sid], self.at[sid] = {x.key for x in lines}, state.version
            result.created, result.version = True, state.version
            result.appended += len(lines)
            return self._write(tail, sid, result) if tail.pending else None
        while tail.pending:
            line = tail.pending[0]
            if line.key not in known:
                try:
                    try:
                        write = self.client.append_events(
                            sid, line.events, idempotency_key=line.key,
                            expected_version=self.at[sid])
                    except (TooLargeError, InvalidRequestError) as exc:
                        if isinstance(exc, InvalidRequestError) and (
                                exc.data.get("setting") != "max_request_bytes"):
                            raise
                        # Over a size cap of the daemon: stored cut, marked as such.
                        write = self.client.append_events(
                            sid, line.cut(CUT_BUDGET).events, idempotency_key=line.key,
                            expected_version=self.at[sid])
                        result.warnings.append(f"line {line.number}: over the daemon's"
                                               f" {exc.data.get('setting', 'size cap')}:"
                                               " stored cut")
                except VersionConflictError:
                    # Written meanwhile (the Agent SDK's store mirrors the same session):
                    # what it holds now, then this line again, unless it is among it.
                    if not self._since(sid):  # not appended to: made again, read afresh
                        self.known.pop(sid, None)
                        self.at.pop(sid, None)
                        return self._write(tail, sid, result)
                    continue
                except (InvalidParamsError, TooLargeError, InvalidRequestError) as exc:
                    # The daemon refuses this line's data: it is this line's failure,
                    # and the lines after it still go in.
                    result.failures.append(Problem(exc.message, line=line.number))
                else:
                    # A key the daemon holds already (a line behind a trim) answers
                    # its first write's version: where the session is stays the newest.
                    result.version = write.version
                    self.at[sid] = max(self.at[sid], write.version)
                    result.appended += 1
                    known.add(line.key)
            tail.pending.pop(0)
        return None
