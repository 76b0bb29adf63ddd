-- The append sends what only the writer knows, and the function derives the rest.
--
-- Events of one entry (one stream's part of one append) are contiguous in the event arrays
-- and numbered from the head the writer chained from, so each event's version, its
-- prev_hash and each stream's new head follow from the entry's first event, its event count
-- and its head:
--
--   version of event i     = expected[en] + (i - first[en] + 1)
--   prev_hash of event i   = head[en] if i = first[en], else hash of event i - 1
--   the entry's new head   = (expected[en] + events[en], hash of its last event)
--
-- Every walk is an unnest of a parameter array (planned as about ten rows), never a
-- generate_series over a parameter (planned as a thousand): with that estimate the generic
-- plan's join of the entries to `streams` fetched far more index tuples than the streams it
-- writes, more on every call (single appends at 16 writers ran at half speed; a test counts
-- the fetches).
-- Four arrays fewer cross the wire, and a stored prev_hash is the previous stored hash by
-- construction rather than by the writer's word. The one-statement path walks one array (the
-- events' entry numbers, with their ordinality) and reads the others by subscript, instead
-- of unnesting nine of them (each array unnested is materialised on its own), which is where
-- most of its executor work beyond the shaped baseline went (BENCHMARKS.md, session 6). The checked path is unchanged:
-- when the one-statement path cannot settle a call, it derives the old arrays and hands them
-- to leasehold_append_checked (0005), which is rare (a retry, a conflict, a stale head).
-- The ledger arrays may be NULL, which both paths read as no ledger rows (unnest of NULL
-- yields none): the store sends NULL when an append records no operation key.
DROP FUNCTION leasehold_append(text[], integer[], integer[], text[], text[], bigint[], boolean[],
    bytea[], bigint[], bytea[], integer[], uuid[], bigint[], text[], integer[], text[], text[],
    bytea[], bytea[], integer[], timestamptz, boolean, integer[], text[], text[], bytea[],
    text[], bigint[], bigint[], text[], text[], bigint[]);

CREATE FUNCTION leasehold_append(
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

-- The shape rules of 0001's CHECK constraints, as domains. A table's CHECK expression is read
-- back from its stored text and planned again by every statement that writes the table, which
-- was the largest single cost of the append beyond the baseline's (about 1.4% of its
-- instructions); a domain's check is parsed once per session and kept in the type cache. The
-- rules are the same: a version counts from 1, a schema version from 0, a hash is 32 bytes.
-- (Clients see the base types: a row description names a domain's base type.) Changing a
-- column to a domain with a check rewrites `events` and `streams` once, under an exclusive
-- lock: on a large log, run this migration in a maintenance window.
CREATE DOMAIN chain_hash AS bytea CHECK (length(VALUE) = 32);
CREATE DOMAIN stream_version AS bigint CHECK (VALUE >= 1);
CREATE DOMAIN event_schema_version AS integer CHECK (VALUE >= 0);
ALTER TABLE events DROP CONSTRAINT events_shape;
ALTER TABLE streams DROP CONSTRAINT streams_shape;
ALTER TABLE events
    ALTER COLUMN version TYPE stream_version,
    ALTER COLUMN schema_version TYPE event_schema_version,
    ALTER COLUMN prev_hash TYPE chain_hash,
    ALTER COLUMN hash TYPE chain_hash;
ALTER TABLE streams
    ALTER COLUMN version TYPE stream_version,
    ALTER COLUMN last_hash TYPE chain_hash;
