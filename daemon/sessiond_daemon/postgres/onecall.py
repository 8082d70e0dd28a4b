"""One round trip per batch: the commit as one server-side function (PostgreSQL migration 6).

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
between each two (`eventstore.Template`, built by the writer). The function writes `first + index`.

Read-model ops other than plain row inserts (a fork's shares, which read; deletes and
truncations, whose order against the inserts matters; payload hand-ons; copies) are not
taken here: a batch holding any, or deletes, or a keyed result without a template, is
committed by store.py's multi-statement path instead (store.py decides).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sessiond_daemon.stores.models.ops import Insert, Op
from sessiond_daemon.stores.models.tables import TABLES

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

CREATE: Final = r"""
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
DECLARE
    n int := coalesce(array_length(e_sid, 1), 0);
    top bigint;
    raced text[];
    op jsonb;
    cols text;
    exprs text;
    conflict text;
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
    -- The read models' rows: {"t": table, "c": columns, "e": event column, "x": the
    -- conflict clause's key columns (none: plain), "u": columns to update ([] with keys:
    -- first write wins), "w": update only from a later event, "r": rows}.
    FOR op IN SELECT * FROM jsonb_array_elements(ops) LOOP
        SELECT string_agg(quote_ident(c), ', ' ORDER BY o),
               string_agg(CASE WHEN c = op->>'e' THEN format('%s + r.%I', first, c)
                               ELSE format('r.%I', c) END, ', ' ORDER BY o)
        INTO cols, exprs
        FROM jsonb_array_elements_text(op->'c') WITH ORDINALITY AS x(c, o);
        conflict := '';
        IF jsonb_array_length(op->'x') > 0 THEN
            SELECT ' ON CONFLICT (' || string_agg(quote_ident(c), ', ') || ')'
            INTO conflict FROM jsonb_array_elements_text(op->'x') AS x(c);
            IF jsonb_array_length(op->'u') = 0 THEN
                conflict := conflict || ' DO NOTHING';
            ELSE
                SELECT conflict || ' DO UPDATE SET '
                    || string_agg(format('%I = excluded.%I', c, c), ', ')
                INTO conflict FROM jsonb_array_elements_text(op->'u') AS x(c);
                IF (op->>'w')::boolean THEN
                    conflict := conflict || format(' WHERE %I.position < excluded.position',
                                                   op->>'t');
                END IF;
            END IF;
        END IF;
        EXECUTE format('INSERT INTO %I (%s) SELECT %s FROM jsonb_populate_recordset('
                       'NULL::%I, $1) AS r%s', op->>'t', cols, exprs, op->>'t', conflict)
        USING op->'r';
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
        if op.table == "search":  # no full-text index on PostgreSQL yet (executor.NOT_KEPT)
            continue
        t = TABLES[op.table]
        rows: dict[tuple[Any, ...], dict[str, Any]] | list[dict[str, Any]]
        e = t.event_index
        dicts = [{c: (r[k] - numbered if k == e else _json_value(r[k]))
                  for k, c in enumerate(t.columns)} for r in op.rows]
        if op.keep == "error" or not t.key:
            rows = dicts
        else:  # one statement: a key once (executemany's outcome: the first or the last)
            by_key: dict[tuple[Any, ...], dict[str, Any]] = {}
            for d in dicts:
                k = tuple(d[c] for c in t.key)
                if op.keep == "first":
                    by_key.setdefault(k, d)
                else:
                    by_key[k] = d
            rows = list(by_key.values())
        update = [c for c in t.columns if c not in t.key] if op.keep in ("latest", "newer") \
            else []
        out.append({"t": op.table, "c": list(t.columns), "e": t.event_column,
                    "x": [] if op.keep == "error" else list(t.key), "u": update,
                    "w": op.keep == "newer", "r": rows})
    return out
