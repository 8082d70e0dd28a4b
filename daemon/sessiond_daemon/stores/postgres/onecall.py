"""One round trip per batch: the commit as one server-side function (PostgreSQL migration 8).

`sessiond_commit(...)` runs in the statement's own transaction (the writer's connection
sends it outside BEGIN/COMMIT: the call is the transaction, its answer comes after the
flush). In order, as store.py's multi-statement commit does:
1. lock the touched sessions in session_id order (`FOR UPDATE`: two hosts never
   deadlock) and compare their stored versions with the ones the writer decided from;
   an idempotency key another host stored first counts too. Stale: nothing is written
   and the stale sessions come back with the head (the writer decides again);
2. upsert the views (a session the writer thought new but another host created is
   stale: raised as SQLSTATE SD001, which rolls the statement back), the snapshots;
3. move the counter row by the batch's size (its lock is taken here and held to the
   end of the transaction: this statement's tail and the flush), insert the events
   numbered from it, apply the read models' rows, store the idempotency results, queue
   one NOTIFY, and return the first position.

Positions known only inside the statement are given as indexes into the batch: the read
models' event column holds the event's index (the writer's position minus its first), and
a keyed result is a template: text parts with the index of the event whose position goes
between each two (`stores.interface.Template`, built by the writer). The function writes
`first + index`.

Read-model ops other than plain row inserts (a fork's shares, which read; deletes and
truncations, whose order against the inserts matters; payload hand-ons; copies) are not
taken here: a batch holding any, or deletes, or a keyed result without a template, is
committed by store.py's multi-statement path instead (store.py decides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sessiond_daemon.stores.models.ops import Insert, Op
from sessiond_daemon.stores.models.sql import conflict_sql
from sessiond_daemon.stores.models.tables import TABLES
from sessiond_daemon.stores.postgres import search
from sessiond_daemon.stores.postgres.executor import FULL_TEXT

# The function's parameters' types, in order (the call casts each: no overload guessing).
_TYPES: Final = (
    "text[]", "bigint[]", "text[]", "text[]",
    "text[]", "bigint[]", "text[]", "text[]", "text[]", "text[]", "text[]", "text[]",
    "text[]", "bigint[]", "bigint[]", "bigint[]", "float8[]", "text[]", "text", "bytea[]",
    "text[]",
    "text[]", "bigint[]", "bytea[]",
    "text[]", "bigint[]", "text[]", "text[]", "int[]", "text[]", "bytea[]", "bytea[]",
    "text[]",
    "jsonb", "int[]", "text[]", "int[]", "text")

# Raised by the function when a view it was to create was created by another host first.
RACED: Final = "SD001"

_CREATE: Final = r"""
CREATE OR REPLACE FUNCTION sessiond_commit(
    want_sids text[], want_versions bigint[], key_sids text[], keys text[],
    v_sid text[], v_ver bigint[], v_st text[], v_ns text[], v_actor text[], v_src text[],
    v_task text[], v_created text[], v_updated text[], v_mc bigint[], v_inp bigint[],
    v_outp bigint[], v_cost float8[], v_hash text[], v_host text, v_state bytea[],
    v_exp text[],
    s_sid text[], s_ver bigint[], s_state bytea[],
    e_sid text[], e_ver bigint[], e_eid text[], e_typ text[], e_sv int[], e_rec text[],
    e_dat bytea[], e_met bytea[], e_hsh text[],
    ops jsonb, r_no int[], r_part text[], r_event int[], channel text,
    OUT first bigint, OUT stale text[], OUT locked_at float8, OUT held float8)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    n int := coalesce(array_length(e_sid, 1), 0);
    top bigint;
    raced text[];
    op jsonb;
BEGIN
    -- 1. The touched sessions, locked in session_id order, checked against the bases.
    SELECT array_agg(w.sid ORDER BY w.sid) INTO stale
    FROM unnest(want_sids, want_versions) AS w(sid, ver)
    LEFT JOIN (SELECT s.session_id, s.version FROM sessions s
               WHERE s.session_id = ANY(want_sids) ORDER BY s.session_id FOR UPDATE) l
        ON l.session_id = w.sid
    WHERE coalesce(l.version, 0) <> w.ver;
    IF stale IS NULL AND coalesce(array_length(key_sids, 1), 0) > 0 THEN
        SELECT array_agg(DISTINCT i.session_id) INTO stale
        FROM idempotency i JOIN unnest(key_sids, keys) AS k(session_id, key)
            USING (session_id, key);
    END IF;
    IF stale IS NOT NULL THEN
        SELECT h.position INTO first FROM log_head h WHERE h.id = 1;
        RETURN;
    END IF;
    -- 2. Views (a new one another host created meanwhile: raced), snapshots.
    IF coalesce(array_length(v_sid, 1), 0) > 0 THEN
        WITH up AS (
            INSERT INTO sessions (session_id, version, status, namespace, actor_name, source,
                task, created_at, updated_at, message_count, input_tokens, output_tokens,
                estimated_cost, last_hash, host, state, expires_at)
            SELECT v.sid, v.ver, v.st, v.ns, v.actor, v.src, v.task, v.created, v.updated,
                v.mc, v.inp, v.outp, v.cost, v.hash, v_host, v.state, v.exp
            FROM unnest(v_sid, v_ver, v_st, v_ns, v_actor, v_src, v_task, v_created,
                v_updated, v_mc, v_inp, v_outp, v_cost, v_hash, v_state, v_exp)
                AS v(sid, ver, st, ns, actor, src, task, created, updated, mc, inp, outp,
                     cost, hash, state, exp)
            ON CONFLICT (session_id) DO UPDATE SET version = excluded.version,
                status = excluded.status, namespace = excluded.namespace,
                actor_name = excluded.actor_name, source = excluded.source,
                task = excluded.task, created_at = excluded.created_at,
                updated_at = excluded.updated_at, message_count = excluded.message_count,
                input_tokens = excluded.input_tokens, output_tokens = excluded.output_tokens,
                estimated_cost = excluded.estimated_cost, last_hash = excluded.last_hash,
                state = excluded.state, expires_at = excluded.expires_at
            RETURNING session_id, xmax = 0 AS inserted)
        SELECT array_agg(up.session_id) INTO raced
        FROM up JOIN unnest(want_sids, want_versions) AS w(sid, ver) ON w.sid = up.session_id
        WHERE w.ver = 0 AND NOT up.inserted;
        IF raced IS NOT NULL THEN
            RAISE EXCEPTION 'sessions created by another host' USING ERRCODE = 'SD001',
                DETAIL = array_to_string(raced, ',');
        END IF;
    END IF;
    IF coalesce(array_length(s_sid, 1), 0) > 0 THEN
        INSERT INTO snapshots (session_id, version, state)
        SELECT * FROM unnest(s_sid, s_ver, s_state)
        ON CONFLICT (session_id, version) DO UPDATE SET state = excluded.state;
    END IF;
    -- 3. The positions: the counter row's lock is held from here to the end.
    UPDATE log_head SET position = position + n WHERE id = 1 RETURNING position INTO top;
    locked_at := extract(epoch FROM clock_timestamp());
    first := top - n + 1;
    INSERT INTO events (position, session_id, version, event_id, type, schema_version,
        recorded_at, data, meta, hash)
    SELECT first + e.i - 1, e.sid, e.ver, e.eid, e.typ, e.sv, e.rec, e.dat, e.met, e.hsh
    FROM unnest(e_sid, e_ver, e_eid, e_typ, e_sv, e_rec, e_dat, e_met, e_hsh)
        WITH ORDINALITY AS e(sid, ver, eid, typ, sv, rec, dat, met, hsh, i);
    -- The read models' rows: {"k": "table:keep", "r": rows}, one static INSERT each
    -- (generated from stores/models' tables and conflict rules: `_branches`).
    FOR op IN SELECT * FROM jsonb_array_elements(ops) LOOP
        CASE op->>'k'
@BRANCHES@
        ELSE
            RAISE EXCEPTION 'sessiond_commit: no read-model insert %', op->>'k';
        END CASE;
    END LOOP;
    -- Keyed results: part, then the position of the batch's event r_event, ...
    IF coalesce(array_length(key_sids, 1), 0) > 0 THEN
        INSERT INTO idempotency (session_id, key, result)
        SELECT k.sid, k.key, convert_to(string_agg(
            r.part || coalesce((first + r.ev)::text, ''), '' ORDER BY r.o), 'UTF8')
        FROM unnest(key_sids, keys) WITH ORDINALITY AS k(sid, key, no)
        JOIN unnest(r_no, r_part, r_event) WITH ORDINALITY AS r(no, part, ev, o)
            ON r.no = k.no
        GROUP BY k.no, k.sid, k.key;
    END IF;
    PERFORM pg_notify(channel, top::text);
    held := extract(epoch FROM clock_timestamp()) - locked_at;  -- to here; then the flush
END
$fn$
"""

KEEPS: Final = ("error", "first", "latest", "newer")


def _branches() -> str:
    """One static INSERT per read-model table and keep (stores/models: its columns, its
    conflict rule, written once in sql.py), the event column given as an index."""
    # The full-text index's rows: this store's own table (postgres/search.py), each row's
    # session from its event, the tsvector built by the writer (search.tsvector).
    out = [f"        WHEN '{FULL_TEXT}:error' THEN\n"
           "            INSERT INTO search_index (position, session_id, body, tags, doc)"
           " SELECT first + r.position, e.session_id, r.body, r.tags, r.doc::tsvector"
           " FROM jsonb_to_recordset(op->'r') AS r(position bigint, body text, tags text,"
           " doc text) JOIN events e ON e.position = first + r.position"
           " ON CONFLICT (position) DO NOTHING;"]
    for name, t in TABLES.items():
        if name == FULL_TEXT:
            continue
        picked = ", ".join(f"first + r.{c}" if c == t.event_column else f"r.{c}"
                           for c in t.columns)
        for keep in KEEPS:
            out.append(f"        WHEN '{name}:{keep}' THEN\n"
                       f"            INSERT INTO {name} ({', '.join(t.columns)}) SELECT {picked}"
                       f" FROM jsonb_populate_recordset(NULL::{name}, op->'r') AS r"
                       f"{conflict_sql(name, keep)};")
    return "\n".join(out)


# The function, as migration 8 creates it. It is generated from the read models' tables:
# a change to them (stores/models/tables.py) needs a migration that creates it again.
CREATE: Final = _CREATE.replace("@BRANCHES@", _branches())

CALL: Final = ("SELECT first, stale, locked_at, held FROM sessiond_commit("
               + ", ".join(f"${i}::{t}" for i, t in enumerate(_TYPES, 1)) + ")")


def _json_value(v: Any) -> Any:
    return "\\x" + v.hex() if isinstance(v, bytes | bytearray | memoryview) else v


def ops_json(ops: Sequence[Op], numbered: int) -> list[dict[str, Any]] | None:
    """The Insert ops as the function takes them, their event column as an index into the
    batch (`numbered`: the writer's first position); None when an op is not an Insert."""
    out = []
    for op in ops:
        if type(op) is not Insert:
            return None
        if op.table == FULL_TEXT:
            if op.keep != "error":
                return None
            out.append({"k": f"{FULL_TEXT}:error", "r": [
                {"position": r[0] - numbered, "body": r[1], "tags": r[2],
                 "doc": r[3] if len(r) > 3 else search.tsvector(r[1], r[2])}
                for r in op.rows]})
            continue
        t = TABLES[op.table]
        e = t.event_index
        dicts = [{c: (r[k] - numbered if k == e else _json_value(r[k]))
                  for k, c in enumerate(t.columns)} for r in op.rows]
        rows: list[dict[str, Any]] = dicts
        if op.keep != "error" and t.key:
            # One statement: a key once (executemany's outcome: the first or the last).
            by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
            for d in dicts:
                k = tuple(d[c] for c in t.key)
                if op.keep == "first":
                    by_key.setdefault(k, d)
                else:
                    by_key[k] = d
            rows = list(by_key.values())
        out.append({"k": f"{op.table}:{op.keep}", "r": rows})
    return out
