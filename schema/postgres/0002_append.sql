-- leasehold_append: the one way events enter the log.
--
-- Appends a group of independent appends in one round trip and one transaction (group
-- commit); each append may touch several streams and is atomic on its own: it is written
-- whole or not at all, whatever happens to the others. A group of one is the plain case.
--
-- The writer computes every event's version and hash from the stream heads it believes in
-- (per entry: the version it expects and that version's hash); this function locks the
-- streams, checks those beliefs in append order and writes. It does no per-event computation.
--
-- Inputs
--   p_streams              every stream of the group, sorted, once each (the lock order)
--   p_entry_*              one entry per (append, stream); appends numbered from 1, entries
--                          ordered by append; p_entry_stream indexes p_streams;
--                          p_entry_head is the hash of version p_entry_expected;
--                          p_entry_last_* is the head after the append
--   p_event_*              one per event, in log order, appends one after another;
--                          p_event_entry indexes the entries; p_append_events counts each
--                          append's events.
--                          Payloads and metadata are RFC 8785 JSON text, exactly as hashed.
--
-- One row per append (r_append):
--   appended                 r_log_epoch/r_tx_id/r_position: the cursor of its last event
--   duplicate                every event id is already stored in its stream: the original
--                            cursor; r_versions: its streams' versions after that append
--   wrong_expected_version   r_stream/r_expected/r_actual
--   event_id_conflict        some event ids are stored, but not as this append
--   stream_ownership         r_stream exists with another tenant or stream type
--   stale_heads              a head the writer believed in is not the stream's: retry alone
--                            after reading the heads under a lock
-- With p_check_event_ids, every append is first looked for among the stored events.
-- Raises 40001 when a concurrent append to one of the streams holds a later transaction id
-- (the caller retries in a new transaction).
CREATE FUNCTION leasehold_append(
    p_streams text[],
    p_entry_append integer[], p_entry_stream integer[], p_entry_type text[],
    p_entry_tenant text[], p_entry_expected bigint[], p_entry_any boolean[],
    p_entry_head bytea[], p_entry_last_version bigint[], p_entry_last_hash bytea[],
    p_event_entry integer[], p_event_ids uuid[], p_event_versions bigint[],
    p_event_types text[], p_event_schema_versions integer[], p_event_payloads text[],
    p_event_metadata text[], p_event_prev_hashes bytea[], p_event_hashes bytea[],
    p_append_events integer[], p_recorded_at timestamptz, p_check_event_ids boolean)
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
AS $fn$
DECLARE
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
    i integer := 1;
    v_first integer;
    d integer;
    -- Streams the accepted appends touch, each counted once: already stored (to update) and
    -- new (to insert).
    n_existing integer := 0;
    n_created integer := 0;
    n_updated integer;
BEGIN
    -- 1. Lock the existing stream rows in stream-id order. This is the first statement, so no
    --    transaction id is held while waiting: a writer that waited for us gets a later one.
    --    Rows come back in the order of p_streams (both sorted by the "C" collation), so one
    --    walk of p_streams places each.
    d_version := array_fill(0::bigint, ARRAY[n_streams]);
    d_hash := array_fill(zero_hash, ARRAY[n_streams]);
    d_exists := array_fill(false, ARRAY[n_streams]);
    d_touched := d_exists;
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
                IF d_touched[d] THEN
                    NULL;
                ELSIF d_existed[d] THEN
                    n_existing := n_existing + 1;
                ELSE
                    n_created := n_created + 1;
                END IF;
                d_version[d] := p_entry_last_version[j];
                d_hash[d] := p_entry_last_hash[j];
                d_type[d] := p_entry_type[j];
                d_tenant[d] := p_entry_tenant[j];
                d_exists[d] := true;
                d_touched[d] := true;
            END LOOP;
        ELSE
            a_outcome[a] := v_fail;
            IF v_fail <> 'duplicate' THEN
                RETURN QUERY SELECT a, v_fail, NULL::integer, NULL::bigint, NULL::bigint,
                    v_stream, v_expected, v_actual, NULL::bigint[];
            END IF;
        END IF;
    END LOOP;

    IF n_existing + n_created = 0 THEN
        RETURN;
    END IF;

    -- 3. Stream rows. The guard refuses to write a stream whose last append ran in a later
    --    transaction than ours (possible only when we took our id while waiting for a second
    --    stream's lock); the caller retries in a new transaction, which gets a later id.
    IF n_existing > 0 THEN
        UPDATE streams st
           SET version = u.v, last_hash = u.h, last_tx_id = pg_current_xact_id()
          FROM unnest(p_streams, d_version, d_hash, d_existed, d_touched) AS u(id, v, h, e, t)
         WHERE u.e AND u.t AND st.stream_id = u.id AND st.last_tx_id <= pg_current_xact_id();
        GET DIAGNOSTICS n_updated = ROW_COUNT;
        IF n_updated <> n_existing THEN
            RAISE EXCEPTION 'a concurrent append to the same stream holds a later transaction id'
                USING ERRCODE = '40001';
        END IF;
    END IF;
    IF n_created > 0 THEN
        INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id)
        SELECT u.id, u.ty, u.te, u.v, u.h, pg_current_xact_id()
          FROM unnest(p_streams, d_type, d_tenant, d_version, d_hash, d_existed, d_touched)
               AS u(id, ty, te, v, h, e, t)
         WHERE u.t AND NOT u.e;
    END IF;

    -- 4. The accepted appends' events, in one multi-row statement, in the order given. Their
    --    positions ascend in that order, so the k-th position is the k-th accepted event's,
    --    and each append's cursor is that of its last event.
    WITH inserted AS (
        INSERT INTO events (event_id, stream_id, version, stream_type, tenant_id, event_type,
                            schema_version, payload, metadata, recorded_at, prev_hash, hash)
        SELECT u.id, p_streams[p_entry_stream[u.en]], u.v, p_entry_type[u.en],
               p_entry_tenant[u.en], u.t, u.sv, u.p::jsonb, u.m::jsonb, p_recorded_at, u.ph, u.h
          FROM unnest(p_event_ids, p_event_entry, p_event_versions, p_event_types,
                      p_event_schema_versions, p_event_payloads, p_event_metadata,
                      p_event_prev_hashes, p_event_hashes) AS u(id, en, v, t, sv, p, m, ph, h)
         WHERE a_outcome[p_entry_append[u.en]] IS NULL
        RETURNING events.log_epoch, events.position)
    SELECT array_agg(ins.position ORDER BY ins.position), min(ins.log_epoch)
      INTO v_positions, r_log_epoch
      FROM inserted ins;
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
