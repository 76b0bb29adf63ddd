-- Both append paths update the stream rows they write by their own keys, whatever the
-- planner believes about `streams`.
--
-- Each connection makes the generic plan of leasehold_append once, from the statistics of that
-- moment. Made while they said `streams` was empty (a new database analyzed before its first
-- append; a restore analyzed before it is loaded), the plan of the stream-row UPDATE took
-- `streams` as the outer side of its join to the entries: a walk of the whole key index
-- (sequential scans are forbidden in the function), filtered by transaction id, on every
-- append, until statistics moved and the plan was made again. With a few thousand streams a
-- 100-event append ran at a fifth of its speed (test
-- an_append_planned_while_streams_looked_empty_reads_only_its_own_rows, which counts the index
-- fetches: 3,000 for ten new streams, now none). `stream_id = ANY (p_streams)` makes the
-- outer side an index scan of only the streams the call names, so either join order reads
-- only those rows. The functions are otherwise as 0005 (the checked path) and 0007 (the
-- usual path) left them.

CREATE OR REPLACE FUNCTION leasehold_append_checked(
    p_streams text[],
    p_entry_append integer[], p_entry_stream integer[], p_entry_type text[],
    p_entry_tenant text[], p_entry_expected bigint[], p_entry_any boolean[],
    p_entry_head bytea[], p_entry_last_version bigint[], p_entry_last_hash bytea[],
    p_event_entry integer[], p_event_ids uuid[], p_event_versions bigint[],
    p_event_types text[], p_event_schema_versions integer[], p_event_payloads text[],
    p_event_metadata text[], p_event_prev_hashes bytea[], p_event_hashes bytea[],
    p_append_events integer[], p_recorded_at timestamptz, p_check_event_ids boolean,
    p_ledger_append integer[], p_ledger_tenant text[], p_ledger_key text[],
    p_ledger_hash bytea[], p_ledger_stream text[], p_ledger_first bigint[],
    p_ledger_last bigint[], p_ledger_namespace text[], p_ledger_cursor_stream text[],
    p_ledger_cursor_version bigint[])
RETURNS TABLE (r_append integer, r_outcome text, r_log_epoch integer, r_tx_id bigint,
               r_position bigint, r_stream text, r_expected bigint, r_actual bigint,
               r_versions bigint[])
LANGUAGE plpgsql
-- Array parameters make every custom plan look cheaper than the generic one, so without this
-- each call would plan every statement again. A generic plan is made once per session,
-- possibly while the tables are still small; every access here is by key, so forbid the
-- sequential scans such a plan would keep using as the tables grow.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
-- A lock held elsewhere (a caller's long transaction, a slow append on the same key) is
-- waited for at most this long; the store then retries, a bounded number of times.
SET lock_timeout = '5s'
-- Never JIT: with sequential scans forbidden, any plan that must scan (or is merely costed as
-- if it did) crosses jit_above_cost, and compiling it costs more than the whole call.
SET jit = off
AS $fn$
DECLARE
    -- The epoch every event of this call is stamped with (see 0005's header).
    v_epoch integer;
    zero_hash constant bytea := '\x0000000000000000000000000000000000000000000000000000000000000000';
    n_entries constant integer := cardinality(p_entry_append);
    n_streams constant integer := cardinality(p_streams);
    n_appends constant integer := p_entry_append[n_entries];
    -- Per stream: its state as locked, then as the accepted appends leave it.
    d_version bigint[];
    d_hash bytea[];
    d_exists boolean[];
    d_existed boolean[];
    d_type text[];
    d_tenant text[];
    d_touched boolean[];
    -- The append that writes each stream (no two appends of a group share one).
    d_owner integer[];
    -- Per append: NULL while accepted, else why not.
    a_outcome text[] := array_fill(NULL::text, ARRAY[n_appends]);
    v_fail text;
    v_stream text;
    v_expected bigint;
    v_actual bigint;
    v_matched bigint;
    v_found bigint;
    v_count bigint;
    r record;
    v_positions bigint[];
    v_taken integer[];
    a integer;
    i integer := 1;
    v_first integer;
    d integer;
    -- Streams the accepted appends touch, each counted once: already stored (to update) and
    -- new (to insert).
    n_existing integer := 0;
    n_updated integer;
BEGIN
    -- 0. The epoch, read under the shared epoch lock (held to the end of the transaction)
    --    in a statement of its own, so that it sees a raise that committed while we waited.
    PERFORM pg_advisory_xact_lock_shared(7814997442383686760);
    SELECT current_epoch INTO v_epoch FROM log_meta WHERE singleton;

    -- 1. Lock the existing stream rows in stream-id order. This is the first statement, so no
    --    transaction id is held while waiting: a writer that waited for us gets a later one.
    --    Rows come back in the order of p_streams (both sorted by the "C" collation), so one
    --    walk of p_streams places each.
    d_version := array_fill(0::bigint, ARRAY[n_streams]);
    d_hash := array_fill(zero_hash, ARRAY[n_streams]);
    d_exists := array_fill(false, ARRAY[n_streams]);
    d_touched := d_exists;
    d_owner := array_fill(0, ARRAY[n_streams]);
    d_type := array_fill(NULL::text, ARRAY[n_streams]);
    d_tenant := d_type;
    d := 1;
    FOR r IN SELECT st.stream_id, st.stream_type, st.tenant_id, st.version, st.last_hash
               FROM streams st WHERE st.stream_id = ANY (p_streams)
              ORDER BY st.stream_id FOR UPDATE LOOP
        WHILE p_streams[d] <> r.stream_id LOOP
            d := d + 1;
        END LOOP;
        d_version[d] := r.version;
        d_hash[d] := r.last_hash;
        d_exists[d] := true;
        d_type[d] := r.stream_type;
        d_tenant[d] := r.tenant_id;
    END LOOP;
    d_existed := d_exists;

    -- 2. Each append in turn, against the streams as the appends before it left them.
    FOR a IN 1..n_appends LOOP
        v_first := i;
        v_fail := NULL;
        WHILE i <= n_entries AND p_entry_append[i] = a LOOP
            d := p_entry_stream[i];
            IF v_fail IS NULL THEN
                IF d_exists[d] AND (d_type[d] <> p_entry_type[i]
                                    OR d_tenant[d] <> p_entry_tenant[i]) THEN
                    v_fail := 'stream_ownership';
                    v_stream := p_streams[d];
                ELSIF d_version[d] <> p_entry_expected[i] AND NOT p_entry_any[i] THEN
                    v_fail := 'wrong_expected_version';
                    v_stream := p_streams[d];
                    v_expected := p_entry_expected[i];
                    v_actual := d_version[d];
                ELSIF d_version[d] <> p_entry_expected[i]
                      OR p_entry_head[i] IS DISTINCT FROM d_hash[d] THEN
                    v_fail := 'stale_heads';
                END IF;
            END IF;
            i := i + 1;
        END LOOP;

        -- Anything unexpected may be a retry of an append that already committed: then its
        -- event ids are stored, and the original cursor is the answer.
        IF (v_fail IS NOT NULL AND v_fail <> 'stream_ownership') OR p_check_event_ids THEN
            SELECT count(*) FILTER (WHERE e.stream_id = p_streams[p_entry_stream[u.en]]),
                   count(e.event_id), count(*)
              INTO v_matched, v_found, v_count
              FROM unnest(p_event_ids, p_event_entry) AS u(id, en)
              LEFT JOIN events e ON e.event_id = u.id
             WHERE u.en >= v_first AND u.en < i;
            IF v_matched = v_count THEN
                v_fail := 'duplicate';
                RETURN QUERY
                SELECT a, 'duplicate'::text, e.log_epoch, e.tx_id::text::bigint, e.position,
                       NULL::text, NULL::bigint, NULL::bigint,
                       (SELECT array_agg(m.v ORDER BY x.n)
                          FROM generate_series(v_first, i - 1) AS x(n)
                          LEFT JOIN (SELECT y.stream_id, max(y.version) AS v FROM events y
                                      WHERE y.event_id IN (
                                            SELECT u.id FROM unnest(p_event_ids, p_event_entry)
                                                AS u(id, en) WHERE u.en >= v_first AND u.en < i)
                                      GROUP BY y.stream_id) m
                            ON m.stream_id = p_streams[p_entry_stream[x.n]])
                  FROM events e
                 WHERE e.event_id IN (SELECT u.id FROM unnest(p_event_ids, p_event_entry) AS u(id, en)
                                       WHERE u.en >= v_first AND u.en < i)
                 ORDER BY e.log_epoch DESC, e.tx_id DESC, e.position DESC LIMIT 1;
            ELSIF v_found > 0 THEN
                v_fail := 'event_id_conflict';
            END IF;
        END IF;

        IF v_fail IS NULL THEN
            FOR j IN v_first..i - 1 LOOP
                d := p_entry_stream[j];
                d_version[d] := p_entry_last_version[j];
                d_hash[d] := p_entry_last_hash[j];
                d_type[d] := p_entry_type[j];
                d_tenant[d] := p_entry_tenant[j];
                d_exists[d] := true;
                d_touched[d] := true;
                d_owner[d] := a;
            END LOOP;
        ELSE
            a_outcome[a] := v_fail;
            IF v_fail <> 'duplicate' THEN
                RETURN QUERY SELECT a, v_fail, NULL::integer, NULL::bigint, NULL::bigint,
                    v_stream, v_expected, v_actual, NULL::bigint[];
            END IF;
        END IF;
    END LOOP;

    -- 3. Every write, in one statement (one executor start-up for the whole group): the
    --    ledger rows first, in key order, as the transaction's first write; an append whose key
    --    another transaction holds waits for it and, if that commits, is left out whole (no
    --    other append of the group shares its streams). Then the stream rows: an existing
    --    stream is updated only if its last append ran in an earlier transaction than ours
    --    (else, having taken our id while waiting for a second stream's lock, we must retry
    --    in a new transaction); a new stream is inserted, and a concurrent creation of it
    --    fails the statement (the caller retries and meets it as an existing stream). Then
    --    the events, in the order given: their positions ascend in that order, so the k-th
    --    position is the k-th written event's.
    IF NOT EXISTS (SELECT 1 FROM unnest(a_outcome) AS o(v) WHERE o.v IS NULL) THEN
        RETURN;
    END IF;
    WITH ledger AS (
        INSERT INTO idempotency (tenant_id, namespace, operation_key, request_hash, stream_id,
                                 first_version, last_version, cursor_stream_id,
                                 cursor_version, recorded_at)
        SELECT l.te, l.ns, l.k, l.h, l.s, l.f, l.la, l.cs, l.cv, p_recorded_at
          FROM unnest(p_ledger_append, p_ledger_tenant, p_ledger_namespace, p_ledger_key,
                      p_ledger_hash, p_ledger_stream, p_ledger_first, p_ledger_last,
                      p_ledger_cursor_stream, p_ledger_cursor_version)
               WITH ORDINALITY AS l(a, te, ns, k, h, s, f, la, cs, cv, n)
         WHERE a_outcome[l.a] IS NULL
         ORDER BY l.n
        ON CONFLICT DO NOTHING
        RETURNING tenant_id, namespace, operation_key),
    taken AS (
        SELECT l.a AS append_number
          FROM unnest(p_ledger_append, p_ledger_tenant, p_ledger_namespace, p_ledger_key)
               AS l(a, te, ns, k)
         WHERE a_outcome[l.a] IS NULL
           AND NOT EXISTS (SELECT 1 FROM ledger x
                            WHERE x.tenant_id = l.te AND x.namespace = l.ns
                              AND x.operation_key = l.k)),
    updated AS (
        UPDATE streams st
           SET version = u.v, last_hash = u.h, last_tx_id = pg_current_xact_id()
          FROM unnest(p_streams, d_version, d_hash, d_existed, d_touched, d_owner)
               AS u(id, v, h, e, t, o)
         WHERE u.e AND u.t AND u.o NOT IN (SELECT t.append_number FROM taken t)
           AND st.stream_id = u.id AND st.last_tx_id <= pg_current_xact_id()
           -- The streams' own keys, whatever the join order (0008).
           AND st.stream_id = ANY (p_streams)
        RETURNING 1),
    created AS (
        INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id)
        SELECT u.id, u.ty, u.te, u.v, u.h, pg_current_xact_id()
          FROM unnest(p_streams, d_type, d_tenant, d_version, d_hash, d_existed, d_touched,
                      d_owner) AS u(id, ty, te, v, h, e, t, o)
         WHERE u.t AND NOT u.e AND u.o NOT IN (SELECT t.append_number FROM taken t)
        RETURNING 1),
    inserted AS (
        INSERT INTO events (log_epoch, event_id, stream_id, version, stream_type, tenant_id,
                            event_type, schema_version, payload, metadata, recorded_at,
                            prev_hash, hash)
        SELECT v_epoch, u.id, p_streams[p_entry_stream[u.en]], u.v, p_entry_type[u.en],
               p_entry_tenant[u.en], u.t, u.sv, u.p::jsonb, u.m::jsonb, p_recorded_at, u.ph, u.h
          FROM unnest(p_event_ids, p_event_entry, p_event_versions, p_event_types,
                      p_event_schema_versions, p_event_payloads, p_event_metadata,
                      p_event_prev_hashes, p_event_hashes) AS u(id, en, v, t, sv, p, m, ph, h)
         WHERE a_outcome[p_entry_append[u.en]] IS NULL
           AND p_entry_append[u.en] NOT IN (SELECT t.append_number FROM taken t)
        RETURNING events.log_epoch, events.position)
    SELECT (SELECT coalesce(array_agg(t.append_number), '{}') FROM taken t), (SELECT count(*) FROM updated),
           (SELECT array_agg(ins.position ORDER BY ins.position) FROM inserted ins),
           (SELECT min(ins.log_epoch) FROM inserted ins)
      INTO v_taken, n_updated, v_positions, r_log_epoch;

    FOREACH a IN ARRAY v_taken LOOP
        a_outcome[a] := 'operation_key_taken';
        RETURN QUERY SELECT a, 'operation_key_taken'::text, NULL::integer, NULL::bigint,
            NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint[];
    END LOOP;
    FOR d IN 1..n_streams LOOP
        IF d_touched[d] AND d_existed[d] AND a_outcome[d_owner[d]] IS NULL THEN
            n_existing := n_existing + 1;
        END IF;
    END LOOP;
    IF n_updated <> n_existing THEN
        RAISE EXCEPTION 'a concurrent append to the same stream holds a later transaction id'
            USING ERRCODE = '40001';
    END IF;

    r_tx_id := pg_current_xact_id()::text::bigint;
    r_outcome := 'appended';
    r_stream := NULL;
    r_expected := NULL;
    r_actual := NULL;
    r_versions := NULL;
    i := 0;
    FOR a IN 1..n_appends LOOP
        IF a_outcome[a] IS NULL THEN
            i := i + p_append_events[a];
            r_append := a;
            r_position := v_positions[i];
            RETURN NEXT;
        END IF;
    END LOOP;
END;
$fn$;

CREATE OR REPLACE FUNCTION leasehold_append(
    p_streams text[],
    p_entry_append integer[], p_entry_stream integer[], p_entry_type text[],
    p_entry_tenant text[], p_entry_expected bigint[], p_entry_any boolean[],
    p_entry_head bytea[], p_entry_first integer[], p_entry_events integer[],
    p_event_entry integer[], p_event_ids uuid[], p_event_types text[],
    p_event_schema_versions integer[], p_event_payloads text[], p_event_metadata text[],
    p_event_hashes bytea[],
    p_append_events integer[], p_recorded_at timestamptz, p_check_event_ids boolean,
    p_ledger_append integer[], p_ledger_tenant text[], p_ledger_key text[],
    p_ledger_hash bytea[], p_ledger_stream text[], p_ledger_first bigint[],
    p_ledger_last bigint[], p_ledger_namespace text[], p_ledger_cursor_stream text[],
    p_ledger_cursor_version bigint[])
RETURNS TABLE (r_append integer, r_outcome text, r_log_epoch integer, r_tx_id bigint,
               r_position bigint, r_stream text, r_expected bigint, r_actual bigint,
               r_versions bigint[])
LANGUAGE plpgsql
-- Array parameters make every custom plan look cheaper than the generic one, so without this
-- each call would plan every statement again. Every access here is by key, so forbid the
-- sequential scans a generic plan made while the tables were small would keep using.
SET plan_cache_mode = force_generic_plan
SET enable_seqscan = off
-- A lock held elsewhere is waited for at most this long; the store then retries, a bounded
-- number of times.
SET lock_timeout = '5s'
-- Never JIT: with sequential scans forbidden, any plan costed as if it scanned crosses
-- jit_above_cost, and compiling it costs more than the whole call.
SET jit = off
AS $fn$
DECLARE
    zero_hash constant bytea := '\x0000000000000000000000000000000000000000000000000000000000000000';
    n_entries constant integer := cardinality(p_entry_append);
    n_events constant integer := cardinality(p_event_ids);
    v_recorded bigint;
    v_clean boolean;
    v_updates bigint;
    v_existing bigint;
    v_positions bigint[];
    v_count integer := 0;
    v_number integer;
BEGIN
    -- The shared epoch lock (0005, point 3), in a statement of its own: the next statement's
    -- snapshot, taken once the lock is held, sees any raise that committed while we waited,
    -- and no raise can commit until this transaction ends. (The checked path takes the lock
    -- again and reads the epoch itself.)
    PERFORM pg_advisory_xact_lock_shared(7814997442383686760);
    IF NOT p_check_event_ids THEN
        WITH epoch AS MATERIALIZED (
            SELECT current_epoch FROM log_meta WHERE singleton),
        locked AS MATERIALIZED (
            SELECT st.stream_id, st.stream_type, st.tenant_id, st.version, st.last_hash
              FROM streams st WHERE st.stream_id = ANY (p_streams)
             ORDER BY st.stream_id FOR UPDATE),
        verdict AS MATERIALIZED (
            SELECT coalesce(bool_and((l.stream_id IS NULL
                                      OR (l.stream_type = p_entry_type[g.n]
                                          AND l.tenant_id = p_entry_tenant[g.n]))
                                     AND coalesce(l.version, 0) = p_entry_expected[g.n]
                                     AND p_entry_head[g.n] = coalesce(l.last_hash, zero_hash)),
                            false)
                   AND count(DISTINCT g.s) = count(*) AS clean
              FROM unnest(p_entry_stream) WITH ORDINALITY AS g(s, n)
              LEFT JOIN locked l ON l.stream_id = p_streams[g.s]),
        -- A plain insert: a key another transaction holds makes us wait for it and, if it
        -- commits, fails the statement (unique violation); the store then calls again asking
        -- for the checked path. Referenced first by the final SELECT, so that it runs before
        -- any other write, as on the checked path (0005, point 4).
        ledger AS (
            INSERT INTO idempotency (tenant_id, namespace, operation_key, request_hash,
                                     stream_id, first_version, last_version, cursor_stream_id,
                                     cursor_version, recorded_at)
            SELECT l.te, l.ns, l.k, l.h, l.s, l.f, l.la, l.cs, l.cv, p_recorded_at
              FROM unnest(p_ledger_tenant, p_ledger_namespace, p_ledger_key, p_ledger_hash,
                          p_ledger_stream, p_ledger_first, p_ledger_last,
                          p_ledger_cursor_stream, p_ledger_cursor_version)
                   WITH ORDINALITY AS l(te, ns, k, h, s, f, la, cs, cv, n)
             WHERE (SELECT v.clean FROM verdict v)
             ORDER BY l.n
            RETURNING 1),
        updated AS (
            UPDATE streams st
               SET version = p_entry_expected[g.n] + p_entry_events[g.n],
                   last_hash = p_event_hashes[p_entry_first[g.n] + p_entry_events[g.n] - 1],
                   last_tx_id = pg_current_xact_id()
              FROM unnest(p_entry_stream) WITH ORDINALITY AS g(s, n)
             WHERE (SELECT v.clean FROM verdict v) AND p_entry_expected[g.n] > 0
               AND st.stream_id = p_streams[g.s]
               -- The streams' own keys, whatever the join order (0008).
               AND st.stream_id = ANY (p_streams)
               AND st.last_tx_id <= pg_current_xact_id()
            RETURNING 1),
        created AS (
            INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash,
                                 last_tx_id)
            SELECT p_streams[g.s], p_entry_type[g.n], p_entry_tenant[g.n],
                   p_entry_events[g.n],
                   p_event_hashes[p_entry_first[g.n] + p_entry_events[g.n] - 1],
                   pg_current_xact_id()
              FROM unnest(p_entry_stream) WITH ORDINALITY AS g(s, n)
             WHERE (SELECT v.clean FROM verdict v) AND p_entry_expected[g.n] = 0
            RETURNING 1),
        -- The events in the order given: their positions ascend in that order.
        inserted AS (
            INSERT INTO events (log_epoch, event_id, stream_id, version, stream_type,
                                tenant_id, event_type, schema_version, payload, metadata,
                                recorded_at, prev_hash, hash)
            SELECT (SELECT e.current_epoch FROM epoch e), p_event_ids[g.i], p_streams[p_entry_stream[g.en]],
                   p_entry_expected[g.en] + (g.i - p_entry_first[g.en] + 1),
                   p_entry_type[g.en], p_entry_tenant[g.en], p_event_types[g.i],
                   p_event_schema_versions[g.i], p_event_payloads[g.i]::jsonb,
                   p_event_metadata[g.i]::jsonb, p_recorded_at,
                   CASE WHEN g.i = p_entry_first[g.en] THEN p_entry_head[g.en]
                        ELSE p_event_hashes[g.i - 1] END,
                   p_event_hashes[g.i]
              FROM unnest(p_event_entry) WITH ORDINALITY AS g(en, i)
             WHERE (SELECT v.clean FROM verdict v)
            RETURNING events.position)
        SELECT (SELECT count(*) FROM ledger),
               (SELECT v.clean FROM verdict v),
               (SELECT count(*) FROM updated),
               (SELECT count(*) FROM unnest(p_entry_expected) AS e(ex) WHERE e.ex > 0),
               -- One append (the usual call) needs only its last position: no sort.
               CASE WHEN cardinality(p_append_events) = 1
                    THEN (SELECT ARRAY[max(ins.position)] FROM inserted ins)
                    ELSE (SELECT array_agg(ins.position ORDER BY ins.position) FROM inserted ins)
               END,
               (SELECT e.current_epoch FROM epoch e)
          INTO v_recorded, v_clean, v_updates, v_existing, v_positions, r_log_epoch;
    END IF;
    IF p_check_event_ids OR NOT v_clean THEN
        RETURN QUERY SELECT * FROM leasehold_append_checked(
            p_streams, p_entry_append, p_entry_stream, p_entry_type, p_entry_tenant,
            p_entry_expected, p_entry_any, p_entry_head,
            ARRAY(SELECT p_entry_expected[n] + p_entry_events[n]
                    FROM generate_series(1, n_entries) AS n ORDER BY n),
            ARRAY(SELECT p_event_hashes[p_entry_first[n] + p_entry_events[n] - 1]
                    FROM generate_series(1, n_entries) AS n ORDER BY n),
            p_event_entry, p_event_ids,
            ARRAY(SELECT p_entry_expected[p_event_entry[i]] + (i - p_entry_first[p_event_entry[i]] + 1)
                    FROM generate_series(1, n_events) AS i ORDER BY i),
            p_event_types, p_event_schema_versions, p_event_payloads, p_event_metadata,
            ARRAY(SELECT CASE WHEN i = p_entry_first[p_event_entry[i]]
                              THEN p_entry_head[p_event_entry[i]] ELSE p_event_hashes[i - 1] END
                    FROM generate_series(1, n_events) AS i ORDER BY i),
            p_event_hashes, p_append_events, p_recorded_at, p_check_event_ids, p_ledger_append,
            p_ledger_tenant, p_ledger_key, p_ledger_hash, p_ledger_stream, p_ledger_first,
            p_ledger_last, p_ledger_namespace, p_ledger_cursor_stream, p_ledger_cursor_version);
        RETURN;
    END IF;
    IF v_updates <> v_existing THEN
        RAISE EXCEPTION 'a concurrent append to the same stream holds a later transaction id'
            USING ERRCODE = '40001';
    END IF;

    -- The k-th position is the k-th written event's: each append's cursor is its last event's.
    -- (A FOR loop declares its own variable, so each append's number is copied to r_append.)
    r_outcome := 'appended';
    r_tx_id := pg_current_xact_id()::text::bigint;
    IF cardinality(p_append_events) = 1 THEN
        r_append := 1;
        r_position := v_positions[1];
        RETURN NEXT;
        RETURN;
    END IF;
    FOR v_number IN 1..cardinality(p_append_events) LOOP
        v_count := v_count + p_append_events[v_number];
        r_append := v_number;
        r_position := v_positions[v_count];
        RETURN NEXT;
    END LOOP;
END;
$fn$;
