"""session.search against a brute-force scan of the same events, and session.fork, through
the real client, socket and store (each test on a SQLite file and on PostgreSQL)."""

from __future__ import annotations

import random
import re
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import msgspec
import pg
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from test_cli import ctl, ctl_json
from test_executors import TOOL, finished

from sessiond import AsyncClient
from sessiond_daemon.stores.models import search as search_model
from sessiond_daemon.stores.sqlite import search as sqlite_search
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessionExistsError,
    SessionImportError,
)
from sessiond_schemas.events import Event

pytestmark = pytest.mark.anyio

WORDS = ["login", "logout", "test", "fixed", "broken", "deploy", "retry", "cache", "alpha",
         "beta"]
Doc = list[list[str]]  # the tokens of each column of one event


def tokens(text: Any) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower()) if isinstance(text, str) else []


def values(v: Any) -> list[str]:
    if isinstance(v, dict):
        return [x for y in v.values() for x in values(y)]
    if isinstance(v, list):
        return [x for y in v for x in values(y)]
    return [v] if isinstance(v, str) else []


def doc_of(e: Event) -> Doc | None:
    """What a person would expect each event to be found by (docs/protocol.md): read from
    the data as stored (Event.fields()), not the daemon's typed rule."""
    d = e.fields()
    if e.type == "message.appended":
        return [tokens(d["content"]),
                [t for v in [d.get("tool_call_id"), *values(d.get("metadata", {}))]
                 for t in tokens(v)]]
    if e.type == "session.created":
        return [tokens(d.get("task")),
                [t for v in [d.get("actor_name"), *values(d.get("metadata", {}))]
                 for t in tokens(v)]]
    if e.type == "session.status_changed":
        return [tokens(d.get("error")), []]
    return None


def has(doc: Doc, word: str) -> bool:
    return any(word in col for col in doc)


def prefix(doc: Doc, start: str) -> bool:
    return any(t.startswith(start) for col in doc for t in col)


def phrase(doc: Doc, words: list[str]) -> bool:
    n = len(words)
    return any(col[i:i + n] == words for col in doc for i in range(len(col) - n + 1))


QUERIES: list[tuple[str, Callable[[Doc], bool]]] = [
    ("login", lambda d: has(d, "login")),
    ("log*", lambda d: prefix(d, "log")),
    ('"login test"', lambda d: phrase(d, ["login", "test"])),
    ("login test", lambda d: has(d, "login") and has(d, "test")),
    ("fixed OR broken", lambda d: has(d, "fixed") or has(d, "broken")),
    ("retry NOT cache", lambda d: has(d, "retry") and not has(d, "cache")),
    ("deploy AND (alpha OR beta)",
     lambda d: has(d, "deploy") and (has(d, "alpha") or has(d, "beta"))),
    ("bash", lambda d: has(d, "bash")),  # a tool name (tool_call_id)
    ("webapp", lambda d: has(d, "webapp")),  # a metadata value
    ("timeout", lambda d: has(d, "timeout")),  # an error
]


async def build(client: AsyncClient, seed: int) -> None:
    rng = random.Random(seed)

    def sentence() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 7))).capitalize() + "."

    for i in range(24):
        sid = f"s{i:02}"
        await client.create_session(
            sid, task=sentence(), namespace=f"ns{i % 2}", actor_name=f"me/{'xy'[i % 3 == 0]}",
            metadata={"repo": rng.choice(["webapp", "api"]), "n": i})
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.2:
                await client.append_message(sid, "tool", sentence(),
                                            tool_call_id=f"bash_{rng.randint(1, 9)}")
            else:
                await client.append_message(sid, rng.choice(["user", "assistant"]), sentence())
        if rng.random() < 0.3:
            await client.pop_message(sid)  # popped messages stay searchable, not current
        if i % 4 == 1:
            await client.transition(sid, "completed")
        elif i % 4 == 2:
            await client.transition(sid, "failed", error=rng.choice(["timeout", "crash"]))


async def everything(client: AsyncClient, query: str, **filters: Any) -> list[Any]:
    """All pages of a search (small pages, to walk the cursor)."""
    found, cursor = [], None
    while True:
        page = await client.search(query, limit=5, hits=20, cursor=cursor, **filters)
        found += page.sessions
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


async def brute(client: AsyncClient, pick: Callable[[Doc], bool], *,
                status: str | None = None, namespace: str | None = None,
                since: str | None = None) -> dict[str, set[int]]:
    """session id -> positions of its matching events, by reading every event."""
    found: dict[str, set[int]] = {}
    for s in (await client.list_sessions(limit=1000)).sessions:
        if (status and s.status != status) or (namespace and s.namespace != namespace):
            continue
        for e in (await client.read_events(s.session_id, limit=1000)).events:
            doc = doc_of(e)
            if doc is not None and pick(doc) and (since is None or e.recorded_at >= since):
                found.setdefault(s.session_id, set()).add(e.position)
    return found


def drop_from_index(daemon: Daemon, position: int) -> None:
    """Take one document out of the search index behind the daemon's back."""
    if daemon.db.startswith("postgresql"):
        pg.query(daemon.db, "DELETE FROM search_index WHERE position = ?", position)
        return
    con = sqlite3.connect(daemon.db)
    sqlite_search.register(con)
    con.execute("INSERT INTO search (search, rowid, body, tags) SELECT 'delete', position,"
                " body, tags FROM search_source WHERE position = ?", (position,))
    con.commit()
    con.close()


# Message text as agents write it: under FTS5's unicode61, symbols (emoji), ligatures,
# superscripts, fractions, roman numerals and private-use characters are part of a word,
# and no compatibility decomposition (NFKD) applies to them.
_TEXTS = {
    "emoji": "✅done, deploy🚀",
    "ligature": "the conﬁguration ﬁle",
    "superscript": "complexity n² here",
    "roman": "chapter Ⅻ notes",
    "accents": "Crème brûlée Ǆemal ǅ İstanbul ﬀ Ωmega ΆΈ",
}
_QUERIES = ["done", "deploy", "configuration", "file", "n2", "xii", "conﬁguration",
            "creme", "brulee", "istanbul", "dzemal", "ff", "ωmega", "αε", "✅done"]


def _fts5_matches() -> dict[str, set[str]]:
    """What FTS5 itself (unicode61 remove_diacritics 2, the SQLite store's index) matches."""
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(name UNINDEXED, body,"
               " tokenize='unicode61 remove_diacritics 2')")
    db.executemany("INSERT INTO t (name, body) VALUES (?, ?)", _TEXTS.items())
    return {q: {r[0] for r in db.execute("SELECT name FROM t WHERE t MATCH ?", (f'"{q}"',))}
            for q in _QUERIES}


class TestSearch:
    @pytest.mark.slow_on_postgresql
    async def test_results_equal_a_brute_force_scan(self, client: AsyncClient) -> None:
        """Every query form and filter: the same sessions and matching events as a scan of
        the events, best first, every hit marked and in its session."""
        await build(client, seed=7)
        middle = (await client.read_events(None, from_position=60, limit=1)).events[0]
        cases = [(q, pick, {}) for q, pick in QUERIES] + [
            ("login", QUERIES[0][1], {"status": "completed"}),
            ("log*", QUERIES[1][1], {"namespace": "ns1"}),
            ("fixed OR broken", QUERIES[4][1], {"since": middle.recorded_at})]
        nonempty = 0
        for query, pick, filters in cases:
            expected = await brute(client, pick, **filters)
            api = {k: ([v] if k == "status" else v) for k, v in filters.items()}
            got = await everything(client, query, **api)
            assert {s.session_id: s.matches for s in got} == {
                sid: len(p) for sid, p in expected.items()}, (query, filters)
            assert len({s.session_id for s in got}) == len(got), "a session on two pages"
            scores = [s.score for s in got]
            assert scores == sorted(scores), query
            for s in got:
                assert s.hits and {h.position for h in s.hits} <= expected[s.session_id]
                assert all("\u00ab" in h.snippet and "\u00bb" in h.snippet for h in s.hits)
            nonempty += bool(got)
        assert nonempty >= len(cases) - 2  # the data makes most queries match something

    async def test_hits_name_the_message_and_filters_apply(self, client: AsyncClient) -> None:
        """A hit gives sequence, role, position; popped messages say current=false; status,
        namespace and actor filters cut; a deleted session is gone from the index."""
        await client.create_session("h1", task="nothing here", actor_name="me/a", namespace="n")
        await client.append_message("h1", "user", "first words")
        await client.append_message("h1", "assistant", "the zebra login fix")
        await client.append_message("h1", "user", "zebra again, later")
        await client.pop_message("h1")
        [s] = (await client.search("zebra", mark=["<", ">"])).sessions
        by_seq = {h.sequence: h for h in s.hits}
        assert by_seq[1].snippet == "the <zebra> login fix" and by_seq[1].role == "assistant"
        assert by_seq[1].current is True and by_seq[2].current is False
        third = (await client.read_events("h1", from_version=3)).events[0]
        assert by_seq[1].position == third.position
        assert (await client.search("zebra", actor_name="me/b")).sessions == []
        assert (await client.search("zebra", namespace="other")).sessions == []
        assert (await client.search("zebra", status=["completed"])).sessions == []
        assert (await client.search("zebra", until="2000-01-01T00:00:00Z")).sessions == []
        await client.delete_session("h1")
        assert (await client.search("zebra")).sessions == []
        assert (await client.verify()).ok

    async def test_the_ranked_window_is_bounded(self, client: AsyncClient,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
        """Past `window` matching events, the newest are ranked and complete is false."""
        for i in range(4):
            await client.create_session(f"w{i}")
            await client.append_message(f"w{i}", "user", "walrus")
        assert (await client.search("walrus")).complete is True
        monkeypatch.setattr(search_model, "WINDOW", 3)
        cut = await client.search("walrus", mark=["[", "]"])
        assert cut.complete is False
        assert sorted(s.session_id for s in cut.sessions) == ["w1", "w2", "w3"]

    async def test_a_bad_query_is_invalid_params_naming_query(self, client: AsyncClient) -> None:
        for bad in ['"unterminated', "AND", "nosuchcolumn: word", "a NEAR("]:
            with pytest.raises(InvalidParamsError) as err:
                await client.search(bad)
            assert err.value.data["path"] == "$.query", bad
        with pytest.raises(InvalidParamsError) as err:
            await client.search("x", cursor="nonsense")
        assert err.value.data["path"] == "$.cursor"

    async def test_a_deeply_nested_query_is_invalid_params(self, client: AsyncClient) -> None:
        """FTS5 refuses 98 nested parentheses ("fts5: parser stack overflow", -32602): so
        does the PostgreSQL store's parse (it recursed until RecursionError, -32603), and
        both take 97."""
        await client.create_session("s")
        await client.append_message("s", "user", "a")
        for depth in (98, 450):
            with pytest.raises(InvalidParamsError) as err:
                await client.search("(" * depth + "a" + ")" * depth)
            assert err.value.data["path"] == "$.query"
            assert "parser stack overflow" in err.value.message
        assert (await client.search("(" * 97 + "a" + ")" * 97)).sessions
        assert (await client.search("a")).sessions  # and the daemon goes on

    async def test_search_finds_what_fts5_finds(self, client: AsyncClient) -> None:
        """Text as agents write it (emoji, ligatures, superscripts, roman numerals): the
        PostgreSQL store's tokens are unicode61's (remove_diacritics 2), not NFKD's, so
        both stores match what FTS5 itself matches ('file' does not find 'ﬁle')."""
        for name, text in _TEXTS.items():
            await client.create_session(name)
            await client.append_message(name, "assistant", text)
        expected = _fts5_matches()
        got = {q: {s.session_id for s in (await client.search(f'"{q}"')).sessions}
               for q in _QUERIES}
        assert got == expected

    @pytest.mark.slow_on_postgresql
    async def test_reindex_rebuilds_and_verify_finds_a_stale_index(
            self, daemon: Daemon, client: AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
        """The index is a read model: verify notices an entry gone; reindex puts it back,
        a few positions per transaction, with writes and deletes between them."""
        from sessiond_daemon.features import search as search_fork
        await build(client, seed=3)
        before = {q: {s.session_id for s in await everything(client, q)} for q, _ in QUERIES}
        await client.create_session("r1", task="rebuild me")
        await client.append_message("r1", "user", "quokka")
        position = (await client.read_events("r1", from_version=2)).events[0].position
        # Found, so indexed (on SQLite a search first indexes what the commits left out):
        # only then is there a document to take out.
        assert [s.session_id for s in (await client.search("quokka")).sessions] == ["r1"]
        drop_from_index(daemon, position)
        assert (await client.search("quokka")).sessions == []
        report = await client.verify()
        assert not report.ok and "not indexed" in report.problems[0].problem
        monkeypatch.setattr(search_fork, "REINDEX_RANGE", 7)
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.reindex)
            for i in range(5):  # writes and deletes while it runs
                await client.delete_session(f"s{i:02}")
                await client.append_message("r1", "user", f"quokka {i}")
        assert [s.session_id for s in (await client.search("quokka")).sessions] == ["r1"]
        assert (await client.search("quokka")).sessions[0].matches == 6
        for q, _ in QUERIES:
            found = {s.session_id for s in await everything(client, q)}
            assert found == before[q] - {f"s{i:02}" for i in range(5)}, q
        assert (await client.verify()).ok


class TestFork:
    async def test_fork_copies_history_up_to_the_point(self, client: AsyncClient) -> None:
        await client.create_session("src", task="the login test", actor_name="me/bot")
        for i in range(5):
            await client.append_message("src", "user", f"message {i}")
        await client.save_checkpoint("src", {"at": 6}, checkpoint_id="cp6")
        await client.append_message("src", "user", "after the checkpoint")
        fork = await client.fork("src", at_version=7, new_session_id="f1")
        assert fork.session_id == "f1" and fork.version == 8 and fork.message_count == 5
        assert (fork.forked_from.session_id, fork.forked_from.version) == ("src", 7)
        assert fork.task == "the login test"
        assert [m.content for m in (await client.list_messages("f1")).messages] == [
            f"message {i}" for i in range(5)]
        assert (await client.get_checkpoint("f1", "cp6")).payload == {"at": 6}
        # Each goes its own way.
        await client.append_message("f1", "user", "another try")
        assert (await client.get_session("src")).message_count == 6
        assert [m.content for m in (await client.list_messages("f1")).messages][-1] == "another try"
        forks = await client.forks("src")
        assert forks.count == 1 and forks.forks[0].session_id == "f1"
        assert forks.forks[0].version == 7
        assert (await client.forks("f1")).forked_from.session_id == "src"
        assert (await client.verify()).ok

    async def test_errors(self, client: AsyncClient) -> None:
        await client.create_session("e1")
        with pytest.raises(InvalidParamsError) as err:
            await client.fork("e1", at_version=5)
        assert err.value.data["path"] == "$.at_version"
        await client.create_session("taken")
        with pytest.raises(SessionExistsError):
            await client.fork("e1", new_session_id="taken")
        await client.fork("e1", new_session_id="e1-fork")
        with pytest.raises(InvalidTransitionError):  # its history is shared
            await client.delete_session("e1")
        await client.delete_session("e1-fork")
        await client.delete_session("e1")

    async def test_a_fork_and_its_sources_deletion_never_both_happen(
            self, client: AsyncClient) -> None:
        """Sent together, either the fork is made and the delete refused, or the source is
        deleted and the fork finds nothing: never a fork whose source is gone."""
        from sessiond import SessiondError

        async def attempt(results: dict[str, Any], name: str, call: Any) -> None:
            try:
                results[name] = await call
            except SessiondError as exc:
                results[name] = exc

        for i in range(20):
            src = f"race-{i}"
            await client.create_session(src)
            await client.append_message(src, "user", "shared")
            results: dict[str, Any] = {}
            async with anyio.create_task_group() as tg:
                tg.start_soon(attempt, results, "fork",
                              client.fork(src, new_session_id=f"{src}-f"))
                tg.start_soon(attempt, results, "delete", client.delete_session(src))
            forked = not isinstance(results["fork"], SessiondError)
            deleted = results["delete"] is True
            assert forked != deleted, results
        assert (await client.verify()).ok

    async def test_idempotent_under_a_key(self, client: AsyncClient) -> None:
        await client.create_session("k1")
        await client.append_message("k1", "user", "hello")
        a = await client.fork("k1", at_version=2, idempotency_key="retry-me")
        b = await client.fork("k1", at_version=2, idempotency_key="retry-me")
        assert msgspec.to_builtins(a) == msgspec.to_builtins(b)
        assert (await client.forks("k1")).count == 1
        c = await client.fork("k1", at_version=2, new_session_id="k1-named",
                              idempotency_key="same")
        d = await client.fork("k1", at_version=2, new_session_id="k1-named",
                              idempotency_key="same")
        assert c.version == d.version == 3 and (await client.forks("k1")).count == 2

    async def test_running_executor_refuses(self, client: AsyncClient) -> None:
        """A fork is data, not a process: -32003 while a turn runs, and a fork of an
        ended executor session has no pid."""
        await client.spawn([*TOOL, "stubborn"], session_id="run1")
        async def started() -> bool:
            return (await client.get_session("run1")).pid is not None

        await eventually(started, "the executor's process")
        with pytest.raises(InvalidTransitionError) as err:
            await client.fork("run1")
        assert "running executor" in err.value.message
        await client.kill("run1")
        await finished(client, "run1")
        fork = await client.fork("run1")
        assert fork.pid is None and fork.status == "killed"

    async def test_export_import_verifies_the_shared_prefix(self, client: AsyncClient,
                                                           short_dir: str) -> None:
        await client.create_session("x1", task="exported")
        await client.append_message("x1", "user", "one")
        await client.fork("x1", at_version=2, new_session_id="x2")
        await client.append_message("x2", "user", "two")
        await client.fork("x2", at_version=4, new_session_id="x3")
        docs = [await client.export_session(s) for s in ("x1", "x2", "x3")]
        other = daemon_config(short_dir + "/o", socket=short_dir + "/o.sock")
        async with running_daemon(other), AsyncClient(other.socket) as c2:
            with pytest.raises(SessionImportError):  # its source is not here
                await c2.import_session(docs[1])
            for doc in docs:
                await c2.import_session(doc)
            assert [m.content for m in (await c2.list_messages("x3")).messages] == ["one", "two"]
            assert (await c2.verify()).ok
            # A source with another history at the fork point is refused.
            await c2.delete_session("x3")
            await c2.delete_session("x2")
            await c2.delete_session("x1")
            await c2.create_session("x1", task="not the same")
            await c2.append_message("x1", "user", "one")
            with pytest.raises(SessionImportError):
                await c2.import_session(docs[1])


class TestCli:
    @pytest.mark.slow_on_postgresql
    async def test_search_fork_and_the_tree(self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("c1", task="fix the login test", actor_name="me/bot")
        await client.append_message("c1", "assistant", "the login test passes now")
        await client.transition("c1", "completed")
        shown = await ctl(daemon, "search", "login test", "--status", "completed",
                          "--since", "7d")
        assert "c1" in shown.stdout and "passes now" in shown.stdout
        assert "\x02" not in shown.stdout
        found = await ctl_json(daemon, "search", "login test", "--since", "7d")
        assert found["sessions"][0]["session_id"] == "c1"
        assert "\u00ab" in found["sessions"][0]["hits"][0]["snippet"]
        fork_id = (await ctl(daemon, "fork", "c1", "--at", "2")).stdout.strip()
        assert (await client.get_session(fork_id)).forked_from.session_id == "c1"
        child = (await ctl(daemon, "fork", fork_id)).stdout.strip()
        tree = (await ctl(daemon, "show", fork_id)).stdout
        assert "fork tree" in tree and "c1 @ v2" in tree and child in tree
        bad = await ctl(daemon, "search", '"oops', check=False)
        assert bad.returncode == 1 and "query" in bad.stderr


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class TestPostgresSearch:
    """What only the PostgreSQL store's search has to show: its parse of FTS5's syntax
    finds what FTS5 finds, and migration 7 indexes the events stored before it."""

    @pytest.mark.postgresql
    async def test_the_parse_of_fts5_syntax_finds_what_fts5_finds(self, pg_url: str) -> None:
        """The same documents in an FTS5 table and as postgres/search.py's tsvectors; a
        few hundred queries of every form: the same documents match, or both refuse."""
        import asyncpg

        from sessiond_daemon.stores.postgres import search as pg_search
        from sessiond_schemas.errors import InvalidParamsError as Invalid

        rng = random.Random(26)
        vocab = ["alpha", "alps", "beta", "bet", "gamma", "Gämma", "delta", "x_y", "a1", "AND",
                 "or", "near"]
        docs = [(" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 14))) or None,
                 " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 4))) or None)
                for _ in range(120)]
        con = sqlite3.connect(":memory:")
        con.execute("CREATE VIRTUAL TABLE t USING fts5(body, tags,"
                    " tokenize='unicode61 remove_diacritics 2')")
        con.executemany("INSERT INTO t (rowid, body, tags) VALUES (?, ?, ?)",
                        [(i, b, t) for i, (b, t) in enumerate(docs)])

        def phrase() -> str:
            words = [rng.choice([*vocab, "nothere", "al*"]) for _ in range(rng.randint(1, 3))]
            text = f'"{" ".join(words)}"' if len(words) > 1 or rng.random() < 0.2 else words[0]
            r = rng.random()
            if r < 0.2:
                text += "*"
            elif r < 0.3:
                text += " + " + rng.choice(vocab)
            elif r < 0.35:
                text = "^" + text
            return text

        def unit(depth: int) -> str:
            r = rng.random()
            if depth < 2 and r < 0.2:
                return f"({expr(depth + 1)})"
            if r < 0.3:
                return (f"NEAR({' '.join(phrase() for _ in range(rng.randint(1, 4)))},"
                        f" {rng.randint(0, 4)})")
            if r < 0.35:
                return f"NEAR({phrase()} {phrase()})"
            if r < 0.45:
                column = rng.choice(["body", "tags", "-tags", "{body tags}", "{tags}", "Body",
                                     "nosuch"])
                return f"{column}: " + (phrase() if rng.random() < 0.7
                                        else f"({expr(depth + 1)})")
            return phrase()

        def expr(depth: int = 0) -> str:
            out = unit(depth)
            for _ in range(rng.randint(0, 2)):
                out += rng.choice([" ", " AND ", " OR ", " NOT "]) + unit(depth)
            return out

        queries = [expr() for _ in range(800)] + [
            "alpha", "alp*", '"alpha beta"', "alpha NOT beta gamma", "a OR b c", "x_y",
            "gamma", "GAMMA", "body:(alpha NOT beta)", "NEAR(alpha beta)", '"" alpha',
            "alpha AND", "(alpha", "alpha)", "nosuchcolumn: alpha", "alpha.beta", "NOT alpha",
            "(alpha) beta", "alpha (beta OR gamma)", "alpha AND (beta OR gamma)", "al* + x_y",
            "^alps", 'body: ^"x_y x_y"', "NEAR(a1 bet alps)", "NEAR(x_y a1 gamma, 1)"]
        pg_con = await asyncpg.connect(pg_url)
        try:
            await pg_con.execute("CREATE TEMP TABLE d (id INT, doc TSVECTOR)")
            await pg_con.executemany("INSERT INTO d VALUES ($1, $2::tsvector)",
                                     [(i, pg_search.tsvector(b, t))
                                      for i, (b, t) in enumerate(docs)])
            compared = 0
            for q in queries:
                try:
                    want: set[int] | None = {r[0] for r in con.execute(
                        "SELECT rowid FROM t WHERE t MATCH ?", (q,))}
                except sqlite3.OperationalError:
                    want = None
                try:
                    tsquery = pg_search.to_tsquery_text(q)
                except Invalid as exc:  # or what the PostgreSQL store says it cannot do
                    assert want is None or "not supported" in exc.message, (q, exc.message)
                    continue
                assert want is not None, (q, "FTS5 refuses it, this parse does not")
                got = set() if tsquery is None else {r[0] for r in await pg_con.fetch(
                    "SELECT id FROM d WHERE doc @@ $1::tsquery", tsquery)}
                assert got == want, (q, tsquery)
                compared += 1
            assert compared > 450
            for bad in ['"unterminated', "AND", "nosuchcolumn: word", "a NEAR(", "a.b",
                        "NEAR(a b, x)", "(alpha) beta"]:  # and FTS5's words for why
                with pytest.raises(sqlite3.OperationalError) as theirs:
                    con.execute("SELECT rowid FROM t WHERE t MATCH ?", (bad,))
                with pytest.raises(Invalid) as ours:
                    pg_search.to_tsquery_text(bad)
                assert ours.value.data["detail"] == str(theirs.value), bad
        finally:
            await pg_con.close()

    @pytest.mark.postgresql
    async def test_migration_7_indexes_the_events_stored_before_it(
            self, short_dir: str, pg_url: str) -> None:
        """A database at schema 6 (no index) with sessions in it: the daemon of this
        release migrates it, and search finds them as if they had been written now."""
        url = pg_url
        config = daemon_config(short_dir, db=url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await build(client, seed=5)
            expected = {q: await brute(client, pick) for q, pick in QUERIES}
        pg.query(url, "DROP TABLE search_index")
        pg.query(url, "UPDATE meta SET value = '6' WHERE key = 'schema_version'")
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            from sessiond_daemon.stores.postgres.schema import LATEST  # 7, and the ones after it

            assert pg.query(url, "SELECT value FROM meta WHERE key = 'schema_version'") == [
                (str(LATEST),)]
            for q, _ in QUERIES:
                got = {s.session_id: s.matches for s in await everything(client, q)}
                assert got == {sid: len(p) for sid, p in expected[q].items()}, q
            assert (await client.verify()).ok


@pytest.mark.fleet
def test_the_unicode61_tables_are_fts5s() -> None:
    """stores/models/unicode61.py's tables are what this FTS5 measures, and its tokens of
    random text (every kind of code point) are the ones FTS5 indexes."""
    from sessiond_daemon.stores.models import unicode61, unicode61_tables

    assert unicode61.measure() == (unicode61_tables.SEPARATORS, unicode61_tables.FOLD)
    rng = random.Random(61)
    pools = [range(0x20, 0x80), range(0x80, 0x800), range(0x800, 0xD800),
             range(0xE000, 0x10000), range(0x10000, 0x110000)]
    texts = ["".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(1, 30)))
             for _ in range(3_000)]
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    db.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)", enumerate(texts, 1))
    theirs: dict[int, list[tuple[int, str]]] = {}
    for term, doc, offset in db.execute("SELECT term, doc, offset FROM v"):
        theirs.setdefault(doc, []).append((offset, term))
    for i, text in enumerate(texts, 1):
        assert unicode61.tokens(text) == [t for _, t in sorted(theirs.get(i, []))], text


async def _relink_racing(client: AsyncClient, db_url: str, monkeypatch: pytest.MonkeyPatch,
                         write: Callable[[], Any], *, after_first_op: bool) -> None:
    """daemon.reindex on PostgreSQL with `write` (a client call) made while its relink of
    the forks runs: at its first op (after the first page of session.forked events was
    read), before that op or after it; the relink goes on once `write` returned or waits
    for a lock (one the relink holds)."""
    import asyncpg
    from conftest import POLL_S

    from sessiond_daemon.stores.models.ops import DeleteWhere
    from sessiond_daemon.stores.postgres import executor

    real = executor.run
    raced: list[bool] = []
    go = anyio.Event()
    writing = anyio.Event()

    async def hooked(con: Any, ops: Any, shift: int = 0) -> None:
        first = not raced and bool(ops) and ops[0] == DeleteWhere("forks", ())
        if first:
            raced.append(True)
        if first and not after_first_op:
            writing.set()
            await go.wait()
        await real(con, ops, shift)
        if first and after_first_op:
            writing.set()
            await go.wait()

    async def waiting_for_a_lock() -> bool:
        con = await asyncpg.connect(db_url)
        try:
            return bool(await con.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"))
        finally:
            await con.close()

    monkeypatch.setattr(executor, "run", hooked)
    done = anyio.Event()

    async def write_then_note() -> None:
        await write()
        done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(client.reindex)
        await writing.wait()
        tg.start_soon(write_then_note)
        while not done.is_set() and not await waiting_for_a_lock():
            await anyio.sleep(POLL_S)
        go.set()
    assert raced == [True]


class TestRelinkOnPostgres:
    """daemon.reindex's relink of the forks on PostgreSQL runs on a connection of its own:
    it must be ordered with every host's commits (as SQLite's, on its writer's thread)."""

    @pytest.fixture(autouse=True)
    def _postgres_only(self, store_kind: str) -> None:
        if store_kind != "postgresql":
            pytest.skip("SQLite's relink runs on the writer's thread")

    async def test_a_fork_made_meanwhile_keeps_its_link(
            self, client: AsyncClient, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A fork committed between the relink's read of a page and its delete of the
        links lost its link: its source's delete then succeeded, orphaning the fork."""
        await client.create_session("src")
        await client.append_message("src", "user", "shared")

        async def fork() -> None:
            await client.fork("src", new_session_id="f1")

        await _relink_racing(client, db_url, monkeypatch, fork, after_first_op=False)
        assert (await client.forks("src")).count == 1
        with pytest.raises(InvalidTransitionError):
            await client.delete_session("src")
        assert (await client.verify()).ok

    async def test_a_fork_deleted_meanwhile_stays_unlinked(
            self, client: AsyncClient, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
        """A fork deleted while the relink runs (here: its event in the second page) had
        its link written back: session.forks listed a session that no longer exists and
        the source's delete was refused until the next reindex."""
        from sessiond_daemon.stores.postgres import search as pg_search

        monkeypatch.setattr(pg_search, "RELINK_PAGE", 1)
        await client.create_session("src")
        await client.append_message("src", "user", "shared")
        await client.fork("src", new_session_id="f0")
        await client.fork("src", new_session_id="f1")
        deleted: list[bool] = []

        async def delete() -> None:
            deleted.append(await client.delete_session("f1"))

        await _relink_racing(client, db_url, monkeypatch, delete, after_first_op=True)
        assert deleted == [True]
        forks = await client.forks("src")
        assert [f.session_id for f in forks.forks] == ["f0"], forks
        assert await client.delete_session("f0")
        assert await client.delete_session("src")
