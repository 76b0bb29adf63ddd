-- leasehold_append: the one way events enter the log.
--
-- Appends to one or more streams atomically in one round trip. The writer computes every
-- event's version and hash from the stream heads it believes in (p_heads: the version it
-- expects and that version's hash); this function locks the streams, checks those beliefs and
-- writes. It does no per-event computation, so its cost is that of the inserts.
--
-- Streams arrive sorted by stream id; events name their stream by 1-based index. Payloads and
-- metadata arrive as RFC 8785 JSON text, exactly the text the writer hashed.
--
-- Outcomes (one row):
--   appended                 r_log_epoch/r_tx_id/r_position: the commit cursor of the last event
--   duplicate                every event id is already stored in its stream: the original cursor;
--                            r_versions: each stream's version after the original append
--   wrong_expected_version   r_stream/r_expected/r_actual
--   event_id_conflict        some event ids are stored, but not as this append
--   stream_ownership         r_stream exists with another tenant or stream type
--   stale_heads              a head the writer believed in is not the stream's (an "any version"
--                            stream moved, or the writer did not know the hash):
--                            r_versions/r_hashes hold every stream's actual head; recompute, retry
-- With p_check_event_ids, stored event ids are looked for even when every head matches (the
-- writer's previous attempt met an event id already stored).
-- Raises 40001 when a concurrent append to one of the streams holds a later transaction id
-- (the caller retries in a new transaction).
CREATE FUNCTION leasehold_append(
    p_stream_ids text[], p_stream_types text[], p_tenant_ids text[],
    p_expected bigint[], p_any boolean[], p_heads bytea[],
    p_last_versions bigint[], p_last_hashes bytea[],
    p_event_ids uuid[], p_event_streams integer[], p_versions bigint[], p_event_types text[],
    p_schema_versions integer[], p_payloads text[], p_metadata text[],
    p_prev_hashes bytea[], p_hashes bytea[], p_recorded_at timestamptz,
    p_check_event_ids boolean)
RETURNS TABLE (r_outcome text, r_log_epoch integer, r_tx_id bigint, r_position bigint,
               r_stream text, r_expected bigint, r_actual bigint, r_versions bigint[],
               r_hashes bytea[])
LANGUAGE plpgsql
-- Array parameters make every custom plan look cheaper than the generic one, so without this
-- each call would plan every statement again.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    zero_hash constant bytea := '\x0000000000000000000000000000000000000000000000000000000000000000';
    n_streams constant integer := cardinality(p_stream_ids);
    n_events constant integer := cardinality(p_event_ids);
    v_versions bigint[];
    v_hashes bytea[];
    v_exists boolean[];
    v_types text[];
    v_tenants text[];
    v_mismatch integer;
    v_stale boolean := false;
    n_existing integer := 0;
    n_updated integer;
    v_matched bigint;
    v_found bigint;
BEGIN
    -- 1. Lock the existing stream rows in stream-id order. This is the first statement, so no
    --    transaction id is held while waiting: a writer that waited for us gets a later one.
    WITH locked AS MATERIALIZED (
        SELECT st.stream_id, st.stream_type, st.tenant_id, st.version, st.last_hash
          FROM streams st WHERE st.stream_id = ANY (p_stream_ids)
         ORDER BY st.stream_id FOR UPDATE)
    SELECT array_agg(coalesce(l.version, 0) ORDER BY u.o),
           array_agg(coalesce(l.last_hash, zero_hash) ORDER BY u.o),
           array_agg(l.stream_id IS NOT NULL ORDER BY u.o),
           array_agg(l.stream_type ORDER BY u.o),
           array_agg(l.tenant_id ORDER BY u.o)
      INTO v_versions, v_hashes, v_exists, v_types, v_tenants
      FROM unnest(p_stream_ids) WITH ORDINALITY AS u(id, o)
      LEFT JOIN locked l ON l.stream_id = u.id;

    -- 2. Ownership, expected versions and the heads the hashes were chained from.
    FOR s IN 1..n_streams LOOP
        IF v_exists[s] THEN
            n_existing := n_existing + 1;
            IF v_types[s] <> p_stream_types[s] OR v_tenants[s] <> p_tenant_ids[s] THEN
                RETURN QUERY SELECT 'stream_ownership'::text, NULL::integer, NULL::bigint,
                    NULL::bigint, p_stream_ids[s], NULL::bigint, NULL::bigint, NULL::bigint[],
                    NULL::bytea[];
                RETURN;
            END IF;
        END IF;
        IF v_versions[s] <> p_expected[s] THEN
            IF p_any[s] THEN
                v_stale := true;
            ELSIF v_mismatch IS NULL THEN
                v_mismatch := s;
            END IF;
        ELSIF p_heads[s] IS DISTINCT FROM v_hashes[s] THEN
            v_stale := true;
        END IF;
    END LOOP;

    -- 3. Anything unexpected may be a retry of an append that already committed: then its
    --    event ids are stored, and the original cursor is the answer.
    IF v_mismatch IS NOT NULL OR v_stale OR p_check_event_ids THEN
        SELECT count(*) FILTER (WHERE e.stream_id = p_stream_ids[u.s]), count(e.event_id)
          INTO v_matched, v_found
          FROM unnest(p_event_ids, p_event_streams) AS u(id, s)
          LEFT JOIN events e ON e.event_id = u.id;
        IF v_matched = n_events THEN
            RETURN QUERY
            SELECT 'duplicate'::text, e.log_epoch, e.tx_id::text::bigint, e.position,
                   NULL::text, NULL::bigint, NULL::bigint,
                   (SELECT array_agg(m.v ORDER BY u.o)
                      FROM unnest(p_stream_ids) WITH ORDINALITY AS u(id, o)
                      LEFT JOIN (SELECT x.stream_id, max(x.version) AS v FROM events x
                                  WHERE x.event_id = ANY (p_event_ids) GROUP BY x.stream_id) m
                        ON m.stream_id = u.id),
                   NULL::bytea[]
              FROM events e WHERE e.event_id = ANY (p_event_ids)
             ORDER BY e.log_epoch DESC, e.tx_id DESC, e.position DESC LIMIT 1;
            RETURN;
        ELSIF v_found > 0 THEN
            RETURN QUERY SELECT 'event_id_conflict'::text, NULL::integer, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint[],
                NULL::bytea[];
            RETURN;
        ELSIF v_mismatch IS NOT NULL THEN
            RETURN QUERY SELECT 'wrong_expected_version'::text, NULL::integer, NULL::bigint,
                NULL::bigint, p_stream_ids[v_mismatch], p_expected[v_mismatch],
                v_versions[v_mismatch], NULL::bigint[], NULL::bytea[];
            RETURN;
        ELSIF v_stale THEN
            RETURN QUERY SELECT 'stale_heads'::text, NULL::integer, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, v_versions, v_hashes;
            RETURN;
        END IF;
    END IF;

    -- 4. Stream rows. The guard refuses to write a stream whose last append ran in a later
    --    transaction than ours (possible only when we took our id while waiting for a second
    --    stream's lock); the caller retries in a new transaction, which gets a later id.
    IF n_existing > 0 THEN
        UPDATE streams st
           SET version = u.v, last_hash = u.h, last_tx_id = pg_current_xact_id()
          FROM unnest(p_stream_ids, p_last_versions, p_last_hashes, v_exists) AS u(id, v, h, e)
         WHERE u.e AND st.stream_id = u.id AND st.last_tx_id <= pg_current_xact_id();
        GET DIAGNOSTICS n_updated = ROW_COUNT;
        IF n_updated <> n_existing THEN
            RAISE EXCEPTION 'a concurrent append to the same stream holds a later transaction id'
                USING ERRCODE = '40001';
        END IF;
    END IF;
    IF n_existing < n_streams THEN
        INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id)
        SELECT u.id, u.t, u.te, u.v, u.h, pg_current_xact_id()
          FROM unnest(p_stream_ids, p_stream_types, p_tenant_ids, p_last_versions,
                      p_last_hashes, v_exists) AS u(id, t, te, v, h, e)
         WHERE NOT u.e;
    END IF;

    -- 5. The events, in one multi-row statement, in the order given.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO events (event_id, stream_id, version, stream_type, tenant_id, event_type,
                            schema_version, payload, metadata, recorded_at, prev_hash, hash)
        SELECT u.id, p_stream_ids[u.s], u.v, p_stream_types[u.s], p_tenant_ids[u.s], u.t,
               u.sv, u.p::jsonb, u.m::jsonb, p_recorded_at, u.ph, u.h
          FROM unnest(p_event_ids, p_event_streams, p_versions, p_event_types,
                      p_schema_versions, p_payloads, p_metadata, p_prev_hashes, p_hashes)
               AS u(id, s, v, t, sv, p, m, ph, h)
        RETURNING events.log_epoch, events.tx_id, events.position)
    SELECT 'appended'::text, i.log_epoch, i.tx_id::text::bigint, i.position,
           NULL::text, NULL::bigint, NULL::bigint, NULL::bigint[], NULL::bytea[]
      FROM inserted i ORDER BY i.position DESC LIMIT 1;
END;
$fn$;
