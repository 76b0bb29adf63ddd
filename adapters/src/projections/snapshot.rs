//! Writing the snapshot read models: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::StreamId;
use leasehold_projections::snapshot::{
    QuotaRow, SnapshotChange, SnapshotProjection, SnapshotPut, SnapshotRow, SnapshotRowKind,
};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::tables::Owned;
use super::tables::dead_letters_of;
use super::{Param, WriteError, execute};

const VIEWS_SQL: &str =
    "SELECT stream_id, state FROM snapshot_view_states WHERE stream_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO snapshot_view_states (stream_id, state) \
     SELECT * FROM unnest($1::text[], $2::bytea[]) \
     ON CONFLICT (stream_id) DO UPDATE SET state = excluded.state";

const PUT_SNAPSHOTS_SQL: &str = "INSERT INTO snapshot_records (snapshot_id, tenant_id, vm_id, task_id, \
     host_id, state, mode, requested, kind, parent_snapshot_id, layer_key, arch, digest, name, \
     size_bytes, retention_until, exports, last_error, created_at, last_used, updated_at, \
     store_ref) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::text[], $9::text[], $10::uuid[], $11::text[], $12::text[], \
     $13::text[], $14::text[], $15::int8[], $16::timestamptz[], $17::jsonb[], $18::text[], \
     $19::timestamptz[], $20::timestamptz[], $21::timestamptz[], $22::text[]) \
     ON CONFLICT (snapshot_id) DO UPDATE SET state = excluded.state, kind = excluded.kind, \
     store_ref = excluded.store_ref, \
     digest = excluded.digest, size_bytes = excluded.size_bytes, exports = excluded.exports, \
     last_error = excluded.last_error, last_used = excluded.last_used, \
     updated_at = excluded.updated_at";

const PUT_QUOTAS_SQL: &str = "INSERT INTO snapshot_quota_usage (tenant_id, count, bytes, \
     max_count, max_bytes, updated_at) \
     SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], \
     $6::timestamptz[]) \
     ON CONFLICT (tenant_id) DO UPDATE SET count = excluded.count, bytes = excluded.bytes, \
     max_count = excluded.max_count, max_bytes = excluded.max_bytes, \
     updated_at = excluded.updated_at";

impl PgProjected for SnapshotProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("snapshot_view_states"),
        Owned::Table("snapshot_records"),
        Owned::Table("snapshot_quota_usage"),
        dead_letters_of!("snapshot"),
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[StreamId],
    ) -> Result<HashMap<StreamId, leasehold_projections::snapshot::SnapshotView>, ReadError> {
        let ids: Vec<&str> = keys.iter().map(StreamId::as_str).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: &str = row.get(0);
            let stream = StreamId::parse(id).map_err(|e| ReadError::Corrupt(e.to_string()))?;
            views.insert(stream, decode(format!("stream {id}"), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<SnapshotChange>,
    ) -> Result<(), WriteError> {
        let mut puts: Vec<SnapshotPut> = Vec::new();
        for change in changes {
            match change {
                SnapshotChange::Put(put) => puts.push(*put),
                SnapshotChange::DeadLetter(letter) => {
                    super::vm::write_dead_letter(tx, super::vm::LetterSource::Snapshot, &letter)
                        .await?
                }
            }
        }
        if puts.is_empty() {
            return Ok(());
        }
        let mut states = Vec::with_capacity(puts.len());
        for put in &puts {
            states.push(encode("snapshot", &put.view)?);
        }
        let ids: Vec<&str> = puts.iter().map(|put| put.stream.as_str()).collect();
        execute(tx, PUT_VIEWS_SQL, &[&ids, &states]).await?;
        let (mut snapshots, mut quotas) = (Vec::new(), Vec::new());
        for put in &puts {
            match &put.row {
                SnapshotRowKind::Snapshot(row) => snapshots.push(&**row),
                SnapshotRowKind::Quota(row) => quotas.push(row),
            }
        }
        write_snapshots(tx, &snapshots).await?;
        write_quotas(tx, &quotas).await
    }
}

async fn write_snapshots(tx: &Transaction<'_>, rows: &[&SnapshotRow]) -> Result<(), WriteError> {
    if rows.is_empty() {
        return Ok(());
    }
    let text = |f: fn(&SnapshotRow) -> &str| rows.iter().map(|r| f(r)).collect::<Vec<&str>>();
    let maybe = |f: fn(&SnapshotRow) -> Option<&str>| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.snapshot_id).collect();
    let vms: Vec<Uuid> = rows.iter().map(|r| r.vm_id).collect();
    let parents: Vec<Option<Uuid>> = rows.iter().map(|r| r.parent_snapshot_id).collect();
    let sizes: Vec<i64> = rows.iter().map(|r| r.size_bytes).collect();
    let retention: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.retention_until).collect();
    let exports: Vec<&serde_json::Value> = rows.iter().map(|r| &r.exports).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let used: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.last_used).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let (tenants, tasks, hosts) =
        (text(|r| &r.tenant_id), text(|r| &r.task_id), text(|r| &r.host_id));
    let (states, modes, requested) = (text(|r| r.state), text(|r| r.mode), text(|r| r.requested));
    let (kinds, layers) = (maybe(|r| r.kind), maybe(|r| r.layer_key.as_deref()));
    let (arches, digests) = (text(|r| &r.arch), maybe(|r| r.digest.as_deref()));
    let (names, errors) = (maybe(|r| r.name.as_deref()), maybe(|r| r.last_error.as_deref()));
    let refs = maybe(|r| r.store_ref.as_deref());
    let params: [Param<'_>; 22] = [
        &ids, &tenants, &vms, &tasks, &hosts, &states, &modes, &requested, &kinds, &parents,
        &layers, &arches, &digests, &names, &sizes, &retention, &exports, &errors, &created, &used,
        &updated, &refs,
    ];
    execute(tx, PUT_SNAPSHOTS_SQL, &params).await
}

async fn write_quotas(tx: &Transaction<'_>, rows: &[&QuotaRow]) -> Result<(), WriteError> {
    if rows.is_empty() {
        return Ok(());
    }
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let counts: Vec<i64> = rows.iter().map(|r| r.count).collect();
    let bytes: Vec<i64> = rows.iter().map(|r| r.bytes).collect();
    let max_counts: Vec<i64> = rows.iter().map(|r| r.max_count).collect();
    let max_bytes: Vec<i64> = rows.iter().map(|r| r.max_bytes).collect();
    let updated: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 6] = [&tenants, &counts, &bytes, &max_counts, &max_bytes, &updated];
    execute(tx, PUT_QUOTAS_SQL, &params).await
}

impl crate::replay::MemProjected for SnapshotProjection {
    fn write_memory(
        changes: Vec<SnapshotChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let mut puts: Vec<SnapshotPut> = Vec::new();
        for change in changes {
            match change {
                SnapshotChange::Put(put) => puts.push(*put),
                SnapshotChange::DeadLetter(letter) => super::vm::dead_letter_memory(
                    tables,
                    super::vm::LetterSource::Snapshot,
                    &letter,
                )?,
            }
        }
        // As the database: every snapshot's row, then every quota's.
        for put in &puts {
            if let SnapshotRowKind::Snapshot(row) = &put.row {
                tables.put(PUT_SNAPSHOTS_SQL, &**row, &[])?;
            }
        }
        for put in &puts {
            if let SnapshotRowKind::Quota(row) = &put.row {
                tables.put(PUT_QUOTAS_SQL, row, &[])?;
            }
        }
        Ok(())
    }
}
