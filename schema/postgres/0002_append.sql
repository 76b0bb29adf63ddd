-- leasehold_append: the one way events enter the log.
--
-- Appends to one or more streams atomically in one round trip. Streams arrive sorted by
-- stream id; events name their stream by 1-based index into the stream arrays. Payloads and
-- metadata arrive as RFC 8785 canonical JSON text, so the hash chain can be computed here from
-- exactly the bytes a verifier will recompute from what it reads back.
--
-- Outcomes (one row):
--   appended                 r_log_epoch/r_tx_id/r_position: the commit cursor of the last event
--   duplicate                every event id is already stored in its stream: the original cursor
--   wrong_expected_version   r_stream/r_expected/r_actual
--   event_id_conflict        some event ids are stored, but not as this append
--   stream_ownership         r_stream exists with another tenant or stream type
-- With p_check_event_ids, stored event ids are looked for even when every version matches.
-- Raises 40001 when a concurrent append to one of the streams holds a later transaction id
-- (the caller retries in a new transaction).
CREATE FUNCTION leasehold_append(
    p_stream_ids text[], p_stream_types text[], p_tenant_ids text[], p_expected bigint[],
    p_event_ids uuid[], p_event_streams integer[], p_event_types text[],
    p_schema_versions integer[], p_payloads text[], p_metadata text[],
    p_check_event_ids boolean)
RETURNS TABLE (r_outcome text, r_log_epoch integer, r_tx_id bigint, r_position bigint,
               r_stream text, r_expected bigint, r_actual bigint, r_versions bigint[])
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
    v_any boolean := false;
    v_mismatch integer;
    v_recorded_at constant timestamptz := now();
    v_recorded_text text;
    ev_stream_ids text[] := '{}';
    ev_versions bigint[] := '{}';
    ev_prev bytea[] := '{}';
    ev_hash bytea[] := '{}';
    s integer;
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

    -- 2. Ownership and expected versions.
    FOR s IN 1..n_streams LOOP
        IF v_exists[s] THEN
            n_existing := n_existing + 1;
            IF v_types[s] <> p_stream_types[s] OR v_tenants[s] <> p_tenant_ids[s] THEN
                RETURN QUERY SELECT 'stream_ownership'::text, NULL::integer, NULL::bigint,
                    NULL::bigint, p_stream_ids[s], NULL::bigint, NULL::bigint, NULL::bigint[];
                RETURN;
            END IF;
        END IF;
        IF p_expected[s] IS NULL THEN
            v_any := true;
        ELSIF p_expected[s] <> v_versions[s] AND v_mismatch IS NULL THEN
            v_mismatch := s;
        END IF;
    END LOOP;
    FOR i IN 1..n_events LOOP
        ev_stream_ids[i] := p_stream_ids[p_event_streams[i]];
    END LOOP;

    -- 3. A mismatch, or a stream appended at any version, may be a retry of an append that
    --    already committed: then its event ids are stored, and the original cursor is the answer.
    --    The caller asks for the check too when an insert met an event id already stored.
    IF v_mismatch IS NOT NULL OR v_any OR p_check_event_ids THEN
        SELECT count(*) FILTER (WHERE e.stream_id = u.sid), count(e.event_id)
          INTO v_matched, v_found
          FROM unnest(p_event_ids, ev_stream_ids) AS u(id, sid)
          LEFT JOIN events e ON e.event_id = u.id;
        IF v_matched = n_events THEN
            RETURN QUERY
            SELECT 'duplicate'::text, e.log_epoch, e.tx_id::text::bigint, e.position,
                   NULL::text, NULL::bigint, NULL::bigint,
                   (SELECT array_agg(m.v ORDER BY u.o)
                      FROM unnest(p_stream_ids) WITH ORDINALITY AS u(id, o)
                      LEFT JOIN (SELECT x.stream_id, max(x.version) AS v FROM events x
                                  WHERE x.event_id = ANY (p_event_ids) GROUP BY x.stream_id) m
                        ON m.stream_id = u.id)
              FROM events e WHERE e.event_id = ANY (p_event_ids)
             ORDER BY e.log_epoch DESC, e.tx_id DESC, e.position DESC LIMIT 1;
            RETURN;
        ELSIF v_found > 0 THEN
            RETURN QUERY SELECT 'event_id_conflict'::text, NULL::integer, NULL::bigint,
                NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::bigint[];
            RETURN;
        ELSIF v_mismatch IS NOT NULL THEN
            RETURN QUERY SELECT 'wrong_expected_version'::text, NULL::integer, NULL::bigint,
                NULL::bigint, p_stream_ids[v_mismatch], p_expected[v_mismatch],
                v_versions[v_mismatch], NULL::bigint[];
            RETURN;
        END IF;
    END IF;

    -- 4. Versions and the per-stream hash chain:
    --    hash = sha256(prev_hash || RFC 8785 JSON of the event's stored fields).
    --    Keys are in RFC 8785 order; names are restricted to [A-Za-z0-9._:-], and to_json
    --    escapes strings exactly as RFC 8785 does.
    v_recorded_text := to_char(v_recorded_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"');
    FOR i IN 1..n_events LOOP
        s := p_event_streams[i];
        v_versions[s] := v_versions[s] + 1;
        ev_versions[i] := v_versions[s];
        ev_prev[i] := v_hashes[s];
        v_hashes[s] := sha256(v_hashes[s] || convert_to(
            '{"event_id":"' || p_event_ids[i]::text
            || '","event_type":' || to_json(p_event_types[i])::text
            || ',"metadata":' || p_metadata[i]
            || ',"payload":' || p_payloads[i]
            || ',"recorded_at":"' || v_recorded_text
            || '","schema_version":' || p_schema_versions[i]::text
            || ',"stream_id":' || to_json(p_stream_ids[s])::text
            || ',"stream_type":' || to_json(p_stream_types[s])::text
            || ',"tenant_id":' || to_json(p_tenant_ids[s])::text
            || ',"version":' || v_versions[s]::text || '}', 'UTF8'));
        ev_hash[i] := v_hashes[s];
    END LOOP;

    -- 5. Stream rows. The guard refuses to write a stream whose last append ran in a later
    --    transaction than ours (possible only when we took our id while waiting for a second
    --    stream's lock); the caller retries in a new transaction, which gets a later id.
    IF n_existing > 0 THEN
        UPDATE streams st
           SET version = u.v, last_hash = u.h, last_tx_id = pg_current_xact_id()
          FROM unnest(p_stream_ids, v_versions, v_hashes, v_exists) AS u(id, v, h, e)
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
          FROM unnest(p_stream_ids, p_stream_types, p_tenant_ids, v_versions, v_hashes, v_exists)
               AS u(id, t, te, v, h, e)
         WHERE NOT u.e;
    END IF;

    -- 6. The events, in one multi-row statement, in the order given.
    RETURN QUERY
    WITH inserted AS (
        INSERT INTO events (event_id, stream_id, version, stream_type, tenant_id, event_type,
                            schema_version, payload, metadata, recorded_at, prev_hash, hash)
        SELECT u.id, p_stream_ids[u.s], u.v, p_stream_types[u.s], p_tenant_ids[u.s], u.t,
               u.sv, u.p::jsonb, u.m::jsonb, v_recorded_at, u.ph, u.h
          FROM unnest(p_event_ids, p_event_streams, ev_versions, p_event_types,
                      p_schema_versions, p_payloads, p_metadata, ev_prev, ev_hash)
               WITH ORDINALITY AS u(id, s, v, t, sv, p, m, ph, h, o)
         ORDER BY u.o
        RETURNING events.log_epoch, events.tx_id, events.position)
    SELECT 'appended'::text, i.log_epoch, i.tx_id::text::bigint, i.position,
           NULL::text, NULL::bigint, NULL::bigint, v_versions
      FROM inserted i ORDER BY i.position DESC LIMIT 1;
END;
$fn$;
