-- Server-side cost of one 100-event append (10 new streams) through leasehold_append against the
-- log-shaped baseline statement, 300 of each inside one transaction (no commit), for BENCHMARKS.md.
-- Run on a database migrated by `leasehold migrate`: psql -d DB -f ops/src/bench/probe_append.sql
CREATE TABLE bench_shaped_events (
    position bigint GENERATED ALWAYS AS IDENTITY,
    log_epoch integer NOT NULL DEFAULT 1,
    tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_id uuid NOT NULL UNIQUE, stream_id text COLLATE "C" NOT NULL, version bigint NOT NULL,
    stream_type text NOT NULL, tenant_id text NOT NULL, event_type text NOT NULL,
    schema_version integer NOT NULL, payload jsonb NOT NULL, metadata jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(), prev_hash bytea NOT NULL, hash bytea NOT NULL,
    PRIMARY KEY (log_epoch, tx_id, position), UNIQUE (stream_id, version));
CREATE TABLE bench_shaped_streams (
    stream_id text COLLATE "C" PRIMARY KEY, stream_type text NOT NULL, tenant_id text NOT NULL,
    version bigint NOT NULL, last_hash bytea NOT NULL, last_tx_id xid8 NOT NULL);
\timing on
-- the store's function: 300 calls of 10 new streams x 10 events, in one transaction
DO $$
DECLARE
  b int; s text[]; ea int[]; es int[]; et text[]; ete text[]; eex bigint[]; eany boolean[]; ehd bytea[]; efi int[]; eev int[];
  ven int[]; vid uuid[]; vt text[]; vsv int[]; vp text[]; vm text[]; vh bytea[];
  z bytea := decode(repeat('00',32),'hex'); h bytea := decode(repeat('ab',32),'hex');
  p text := '{"items":[{"quantity":1,"service_name":"trainer","sku":"gpu.h100.1x"},{"quantity":2,"service_name":"loader","sku":"cpu.standard.4x"}],"lease":"0-3","payload_hash":"9f2c1a7e4b3d5c6e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7","provider":"prov-7f3a","region":"eu-central"}';
BEGIN
  FOR b IN 1..300 LOOP
    s := ARRAY(SELECT 'f-'||b||'-'||i FROM generate_series(0,9) i ORDER BY 1);
    ea := ARRAY(SELECT 1 FROM generate_series(1,10)); es := ARRAY(SELECT i FROM generate_series(1,10) i);
    et := array_fill('lease'::text, ARRAY[10]); ete := array_fill('bench'::text, ARRAY[10]);
    eex := array_fill(0::bigint, ARRAY[10]); eany := array_fill(false, ARRAY[10]); ehd := array_fill(z, ARRAY[10]);
    efi := ARRAY(SELECT 1 + i*10 FROM generate_series(0,9) i); eev := array_fill(10, ARRAY[10]);
    ven := ARRAY(SELECT 1 + i/10 FROM generate_series(0,99) i); vid := ARRAY(SELECT gen_random_uuid() FROM generate_series(1,100));
    vt := array_fill('LeaseProvisionRequested'::text, ARRAY[100]);
    vsv := array_fill(1, ARRAY[100]); vp := array_fill(p, ARRAY[100]); vm := array_fill('{}'::text, ARRAY[100]);
    vh := array_fill(h, ARRAY[100]);
    PERFORM * FROM leasehold_append(s, ea, es, et, ete, eex, eany, ehd, efi, eev, ven, vid, vt, vsv, vp, vm, vh,
        ARRAY[100], now(), false, '{}'::int[], '{}'::text[], '{}'::text[], '{}'::bytea[], '{}'::text[], '{}'::bigint[], '{}'::bigint[], '{}'::text[], '{}'::text[], '{}'::bigint[]);
  END LOOP;
END $$;
-- the shaped baseline: 300 statements of 100 events
DO $$
DECLARE b int; s text[]; v bigint[]; ids uuid[]; ps jsonb[];
  h bytea := decode(repeat('ab',32),'hex');
  p text := '{"items":[{"quantity":1,"service_name":"trainer","sku":"gpu.h100.1x"},{"quantity":2,"service_name":"loader","sku":"cpu.standard.4x"}],"lease":"0-3","payload_hash":"9f2c1a7e4b3d5c6e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7","provider":"prov-7f3a","region":"eu-central"}';
BEGIN
  FOR b IN 1..300 LOOP
    s := ARRAY(SELECT 'r-'||b||'-'||(i/10) FROM generate_series(0,99) i);
    v := ARRAY(SELECT 1 + i%10 FROM generate_series(0,99) i);
    ids := ARRAY(SELECT gen_random_uuid() FROM generate_series(1,100));
    ps := ARRAY(SELECT p::jsonb FROM generate_series(1,100));
    WITH streams AS (
     INSERT INTO bench_shaped_streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id)
     SELECT u.s, 'lease', 'bench', max(u.v), h, pg_current_xact_id()
       FROM unnest(s, v) AS u(s, v) GROUP BY u.s
     ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version,
       last_hash = excluded.last_hash, last_tx_id = excluded.last_tx_id)
     INSERT INTO bench_shaped_events (event_id, stream_id, version, stream_type, tenant_id,
     event_type, schema_version, payload, metadata, prev_hash, hash)
     SELECT u.id, u.s, u.v, 'lease', 'bench', 'LeaseProvisionRequested', 1, u.p, '{}', h, h
     FROM unnest(ids, s, v, ps) AS u(id, s, v, p);
  END LOOP;
END $$;
