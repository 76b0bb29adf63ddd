//! The bench's events and the raw baseline table.

use leasehold_domain::{
    EventId, EventType, ExpectedVersion, Metadata, NewEvent, StreamAppend, StreamId, StreamType,
    TenantId,
};
use serde_json::{Value, json};
use uuid::Uuid;

/// Events per stream before a writer moves to its next stream (as in the pgbench scripts of
/// notes/performance.md).
pub const EVENTS_PER_STREAM: u64 = 10;

/// A bare table with the events table's columns: a primary key and nothing else.
pub const RAW_TABLE_SQL: &str = "CREATE TABLE bench_raw_events (
    position bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    log_epoch integer NOT NULL DEFAULT 1,
    tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_id uuid NOT NULL, stream_id text NOT NULL, version bigint NOT NULL,
    stream_type text NOT NULL, tenant_id text NOT NULL, event_type text NOT NULL,
    schema_version integer NOT NULL, payload jsonb NOT NULL, metadata jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(), prev_hash bytea NOT NULL, hash bytea NOT NULL)";

/// A raw table of the log's own shape: the same three indexes (log order, event id, stream
/// and version) and a per-stream row, so that a baseline on it measures what the log's own
/// machinery (checks, hash chain, ledger, function call) costs beyond the data it must write.
pub const SHAPED_TABLES_SQL: &str = "CREATE TABLE bench_shaped_events (
    position bigint GENERATED ALWAYS AS IDENTITY,
    log_epoch integer NOT NULL DEFAULT 1,
    tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
    event_id uuid NOT NULL UNIQUE, stream_id text COLLATE \"C\" NOT NULL, version bigint NOT NULL,
    stream_type text NOT NULL, tenant_id text NOT NULL, event_type text NOT NULL,
    schema_version integer NOT NULL, payload jsonb NOT NULL, metadata jsonb NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(), prev_hash bytea NOT NULL, hash bytea NOT NULL,
    PRIMARY KEY (log_epoch, tx_id, position), UNIQUE (stream_id, version));
  CREATE TABLE bench_shaped_streams (
    stream_id text COLLATE \"C\" PRIMARY KEY, stream_type text NOT NULL, tenant_id text NOT NULL,
    version bigint NOT NULL, last_hash bytea NOT NULL, last_tx_id xid8 NOT NULL)";

/// A batch into the shaped tables in one statement: the events, and each stream's row
/// upserted to its last version.
pub const SHAPED_INSERT_BATCH_SQL: &str = "WITH streams AS ( \
     INSERT INTO bench_shaped_streams (stream_id, stream_type, tenant_id, version, last_hash, last_tx_id) \
     SELECT u.s, 'lease', 'bench', max(u.v), $4, pg_current_xact_id() \
       FROM unnest($2::text[], $3::bigint[]) AS u(s, v) GROUP BY u.s \
     ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, \
       last_hash = excluded.last_hash, last_tx_id = excluded.last_tx_id) \
     INSERT INTO bench_shaped_events (event_id, stream_id, version, stream_type, tenant_id, \
     event_type, schema_version, payload, metadata, prev_hash, hash) \
     SELECT u.id, u.s, u.v, 'lease', 'bench', 'LeaseProvisionRequested', 1, u.p, '{}', $4, $4 \
     FROM unnest($1::uuid[], $2::text[], $3::bigint[], $5::jsonb[]) AS u(id, s, v, p)";

/// One-row insert into the raw table.
pub const RAW_INSERT_SQL: &str = "INSERT INTO bench_raw_events (event_id, stream_id, version, \
     stream_type, tenant_id, event_type, schema_version, payload, metadata, prev_hash, hash) \
     VALUES ($1, $2, $3, 'lease', 'bench', 'LeaseProvisionRequested', 1, $4, '{}', $5, $5)";

/// Multi-row insert of a batch into the raw table.
pub const RAW_INSERT_BATCH_SQL: &str = "INSERT INTO bench_raw_events (event_id, stream_id, \
     version, stream_type, tenant_id, event_type, schema_version, payload, metadata, prev_hash, hash) \
     SELECT u.id, u.s, u.v, 'lease', 'bench', 'LeaseProvisionRequested', 1, u.p, '{}', $4, $4 \
     FROM unnest($1::uuid[], $2::text[], $3::bigint[], $5::jsonb[]) AS u(id, s, v, p)";

/// A lease-request payload of about 300 bytes.
pub fn payload(writer: usize, n: u64) -> Value {
    json!({
        "lease": format!("{writer}-{n}"),
        "provider": "prov-7f3a",
        "items": [
            {"sku": "gpu.h100.1x", "quantity": 1, "service_name": "trainer"},
            {"sku": "cpu.standard.4x", "quantity": (n % 4) + 1, "service_name": "loader"}
        ],
        "payload_hash": "9f2c1a7e4b3d5c6e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9012a3b4c5d6e7",
        "region": "eu-central",
    })
}

/// The stream and version of a writer's `n`-th event in the run tagged `run`.
pub fn stream_of(run: &str, writer: usize, n: u64) -> (String, u64) {
    (format!("{run}-{writer}-{}", n / EVENTS_PER_STREAM), n % EVENTS_PER_STREAM + 1)
}

/// An event for the store.
pub fn new_event(payload: Value) -> NewEvent {
    NewEvent {
        event_id: EventId::from_uuid(Uuid::now_v7()),
        event_type: EventType::parse("LeaseProvisionRequested").expect("a valid name"),
        schema_version: 1,
        payload,
        metadata: Metadata::default(),
    }
}

/// An append to one stream at an exact version.
pub fn stream_append(stream: &str, version_before: u64, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::parse(stream).expect("a valid name"),
        stream_type: StreamType::parse("lease").expect("a valid name"),
        tenant_id: TenantId::parse("bench").expect("a valid name"),
        expected: if version_before == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(version_before)
        },
        events,
    }
}
