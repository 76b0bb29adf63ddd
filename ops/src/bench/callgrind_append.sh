#!/usr/bin/env bash
# Instructions PostgreSQL executes per 100-event append (10 new streams of 10 events): through
# leasehold_append, and through the log-shaped baseline statement of `bench log`
# (append_batch_100), counted by valgrind's callgrind in a single-user backend. Instruction
# counts do not move with the machine's load or its disk, so two variants of the function can
# be compared in one run to a fraction of a percent, where timings on this machine drift by
# 10% or more (BENCHMARKS.md).
#
# Event ids and stream names are derived from the run's number (no randomness; ids ascend, as the v7 ids of `bench log` do), so a run
# repeats its count to about a tenth of a percent. Each side runs its loop twice, 100 and 200 calls, and the difference is taken, so that
# start-up and the first (planning) call cancel; the loop's own work (building the arrays) is
# measured alone the same way and subtracted. The server's receipt of the parameters over the
# wire is not included (the calls are made from PL/pgSQL).
#
# Usage: ops/src/bench/callgrind_append.sh [PATH_TO_LEASEHOLD_BINARY] [VARIANT.sql]
#   VARIANT.sql, if given, runs in the function side's transaction before its loop (for
#   example `ALTER TABLE events DROP CONSTRAINT events_shape;`), so its effect is measured
#   against the unchanged baseline. Statements in it are separated by blank lines. It runs in
#   the measured transaction, so keep it to changes that do not rewrite a table or replace
#   the function (ALTER COLUMN ... TYPE, CREATE OR REPLACE FUNCTION gave counts that mean
#   nothing): measure those by editing the migration and rebuilding the binary instead.
# Needs valgrind and PostgreSQL's server binaries (/usr/lib/postgresql/*/bin); runs as root
# (the throwaway cluster runs as `postgres`) or as any user that can run initdb.
set -euo pipefail
binary=${1:-target/release/leasehold}
variant=${2:-}
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
work=$(mktemp -d /tmp/leasehold-callgrind.XXXXXX)
chmod 755 "$work"
port=$((20000 + RANDOM % 20000))
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
if [ "$(id -u)" = 0 ]; then chown postgres "$work"; fi
cleanup() {
    as_postgres "$bin/pg_ctl" -D "$work/data" stop -m immediate >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

as_postgres "$bin/initdb" -D "$work/data" -A trust -U postgres >/dev/null
as_postgres "$bin/pg_ctl" -D "$work/data" -l "$work/server.log" \
    -o "-p $port -k $work -c listen_addresses=127.0.0.1" start >/dev/null
for _ in $(seq 1 50); do "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break; sleep 0.2; done
"$binary" migrate --database-url "postgres://postgres@127.0.0.1:$port/probe" >/dev/null 2>&1
# The baseline's tables, as the timing probe beside this script creates them.
sed -n '/^CREATE TABLE bench_shaped_events/,/^\\timing on/p' "$(dirname "$0")/probe_append.sql" \
    | grep -v '^\\timing' | psql -q -h 127.0.0.1 -p "$port" -U postgres -d probe
as_postgres "$bin/pg_ctl" -D "$work/data" stop >/dev/null

payload='{"items":[{"quantity":1,"service_name":"trainer","sku":"gpu.h100.1x"},{"quantity":2,"service_name":"loader","sku":"cpu.standard.4x"}],"lease":"0-3","payload_hash":"9f2c1a7e4b3d5c6e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7","provider":"prov-7f3a","region":"eu-central"}'

# The function side's loop: $1 calls, stream names tagged $2, the call itself $3 (or none).
function_loop() {
    cat <<SQL
DO \$\$
DECLARE
  b int; s text[]; ea int[]; es int[]; et text[]; ete text[]; eex bigint[]; eany boolean[];
  ehd bytea[]; efi int[]; eev int[]; ven int[]; vid uuid[]; vt text[];
  vsv int[]; vp text[]; vm text[]; vh bytea[];
  z bytea := decode(repeat('00', 32), 'hex'); h bytea := decode(repeat('ab', 32), 'hex');
  p text := '$payload';
BEGIN
  ea := array_fill(1, ARRAY[10]); es := ARRAY(SELECT i FROM generate_series(1, 10) i);
  et := array_fill('lease'::text, ARRAY[10]); ete := array_fill('bench'::text, ARRAY[10]);
  eex := array_fill(0::bigint, ARRAY[10]); eany := array_fill(false, ARRAY[10]);
  ehd := array_fill(z, ARRAY[10]); efi := ARRAY(SELECT 1 + i * 10 FROM generate_series(0, 9) i);
  eev := array_fill(10, ARRAY[10]); ven := ARRAY(SELECT 1 + i / 10 FROM generate_series(0, 99) i);
  vt := array_fill('LeaseProvisionRequested'::text, ARRAY[100]); vsv := array_fill(1, ARRAY[100]);
  vp := array_fill(p, ARRAY[100]); vm := array_fill('{}'::text, ARRAY[100]);
  vh := array_fill(h, ARRAY[100]);
  FOR b IN 1..$1 LOOP
    s := ARRAY(SELECT '$2-' || b || '-' || i FROM generate_series(0, 9) i ORDER BY 1);
    vid := ARRAY(SELECT lpad(to_hex(b * 1000 + i), 32, '0')::uuid FROM generate_series(1, 100) i);
    $3
  END LOOP;
END \$\$;

SQL
}

# The baseline's loop, the same way.
baseline_loop() {
    cat <<SQL
DO \$\$
DECLARE b int; s text[]; v bigint[]; ids uuid[]; ps text[];
  h bytea := decode(repeat('ab', 32), 'hex');
  p text := '$payload';
BEGIN
  v := ARRAY(SELECT 1 + i % 10 FROM generate_series(0, 99) i);
  ps := array_fill(p, ARRAY[100]);
  FOR b IN 1..$1 LOOP
    s := ARRAY(SELECT '$2-' || b || '-' || (i / 10) FROM generate_series(0, 99) i);
    ids := ARRAY(SELECT lpad(to_hex(b * 1000 + i), 32, '0')::uuid FROM generate_series(1, 100) i);
    $3
  END LOOP;
END \$\$;

SQL
}

function_call="PERFORM * FROM leasehold_append(s, ea, es, et, ete, eex, eany, ehd, efi, eev, ven, vid, vt, vsv, vp, vm, vh, ARRAY[100], now(), false, '{}'::int[], '{}'::text[], '{}'::text[], '{}'::bytea[], '{}'::text[], '{}'::bigint[], '{}'::bigint[], '{}'::text[], '{}'::text[], '{}'::bigint[]);"
# The statement `bench log` runs for append_batch_100's baseline, payloads parsed in it.
baseline_call="WITH streams AS (INSERT INTO bench_shaped_streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id) SELECT u.s, 'lease', 'bench', max(u.v), h, pg_current_xact_id() FROM unnest(s, v) AS u(s, v) GROUP BY u.s ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, last_hash = excluded.last_hash, last_tx_id = excluded.last_tx_id) INSERT INTO bench_shaped_events (event_id, stream_id, version, stream_type, tenant_id, event_type, schema_version, payload, metadata, prev_hash, hash) SELECT u.id, u.s, u.v, 'lease', 'bench', 'LeaseProvisionRequested', 1, u.p::jsonb, '{}', h, h FROM unnest(ids, s, v, ps) AS u(id, s, v, p);"

run=0
# Instructions of one single-user session reading $1 (a file of commands).
count() {
    run=$((run + 1))
    chmod 644 "$1"
    as_postgres valgrind --tool=callgrind --callgrind-out-file="$work/run$run.out" \
        "$bin/postgres" --single -D "$work/data" -j probe <"$1" >"$work/run$run.stdout" 2>"$work/run$run.err"
    if grep -q ERROR "$work/run$run.stdout"; then
        echo "the session failed:" >&2
        grep ERROR "$work/run$run.stdout" >&2
        exit 1
    fi
    awk '/Collected/ { print $NF }' "$work/run$run.err"
}

# Per-call instructions of a side: loop $1 (function_loop or baseline_loop), call $2, with
# the optional variant file $3 before it; the building alone is subtracted.
per_call() {
    local totals=()
    for calls in 100 200; do
        for call in "$2" ""; do
            local file="$work/session.sql"
            { echo "BEGIN;"; echo
              if [ -n "${3:-}" ]; then cat "$3"; echo; echo; fi
              "$1" "$calls" "t$run" "$call"
              echo "ROLLBACK;"; echo; } >"$file"
            totals+=("$(count "$file")")
        done
    done
    # (200 calls - 100 calls) minus (200 builds - 100 builds), per call.
    echo $(( ((totals[2] - totals[0]) - (totals[3] - totals[1])) / 100 ))
}

echo "counting (8 sessions under valgrind, a few minutes)" >&2
store=$(per_call function_loop "$function_call" "$variant")
baseline=$(per_call baseline_loop "$baseline_call")
echo "leasehold_append: $store instructions per 100-event append"
echo "shaped baseline:  $baseline instructions per 100-event append"
awk -v b="$baseline" -v s="$store" 'BEGIN { printf "ratio (baseline / function): %.3f\n", b / s }'
