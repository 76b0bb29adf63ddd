//! Writing the lease read models: each kind of change becomes one multi-row statement per
//! batch, so a batch costs a handful of round trips whatever its size.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use deadpool_postgres::ClientWrapper;
use leasehold_domain::lease::LeaseId;
use leasehold_projections::lease::{
    LeaseChange, LeaseProjection, LeaseRows, LeaseView, ReleaseRow,
};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::shared::SharedWrites;
use super::tables::Owned;
use super::tables::workload_partitions;
use super::{Param, WriteError, execute};
use crate::store::to_i64;

const VIEWS_SQL: &str =
    "SELECT lease_id, tenant_id, state FROM lease_view_states WHERE lease_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO lease_view_states (lease_id, tenant_id, state) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
     ON CONFLICT (lease_id) DO UPDATE SET tenant_id = excluded.tenant_id, state = excluded.state";

const PUT_LEASES_SQL: &str = "INSERT INTO leases (lease_id, tenant_id, provider_id, status, \
     chain_state, reason, message, items, fail_count, created_at, updated_at, retained_until, \
     restored_from) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[], \
     $7::text[], $8::jsonb[], $9::int4[], $10::timestamptz[], $11::timestamptz[], \
     $12::timestamptz[], $13::uuid[]) \
     ON CONFLICT (lease_id) DO UPDATE SET status = excluded.status, \
     chain_state = excluded.chain_state, reason = excluded.reason, message = excluded.message, \
     items = excluded.items, fail_count = excluded.fail_count, updated_at = excluded.updated_at, \
     retained_until = excluded.retained_until";

const PUT_DIAGNOSTICS_SQL: &str = "INSERT INTO lease_diagnostics (lease_id, tenant_id, \
     backend_name, last_error, fail_count, generation, budget_verdict, consecutive_failures, \
     updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::int4[], \
     $6::int8[], $7::text[], $8::int4[], $9::timestamptz[]) \
     ON CONFLICT (lease_id) DO UPDATE SET backend_name = excluded.backend_name, \
     last_error = excluded.last_error, fail_count = excluded.fail_count, \
     generation = excluded.generation, budget_verdict = excluded.budget_verdict, \
     consecutive_failures = excluded.consecutive_failures, updated_at = excluded.updated_at";

const PUT_RETAINED_SQL: &str = "INSERT INTO retained_leases (lease_id, tenant_id, provider_id, \
     status, retained_until, updated_at) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::text[], $5::timestamptz[], \
     $6::timestamptz[]) \
     ON CONFLICT (lease_id) DO UPDATE SET status = excluded.status, \
     retained_until = excluded.retained_until, updated_at = excluded.updated_at";

const DELETE_RETAINED_SQL: &str = "DELETE FROM retained_leases WHERE lease_id = ANY($1)";

const START_RELEASES_SQL: &str = "INSERT INTO releases (lease_id, version, tenant_id, \
     payload_hash, status, created_at, updated_at) \
     SELECT u.l, u.v, u.t, u.h, 'deploying', u.at, u.at \
     FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::timestamptz[]) \
     AS u(l, v, t, h, at) ON CONFLICT (lease_id, version) DO NOTHING";

const SET_RELEASES_SQL: &str = "UPDATE releases r SET status = u.s, reason = u.r, \
     message = u.m, updated_at = u.at \
     FROM unnest($1::uuid[], $2::int4[], $3::text[], $4::text[], $5::text[], \
     $6::timestamptz[]) AS u(l, v, s, r, m, at) \
     WHERE r.lease_id = u.l AND r.version = u.v";

impl PgProjected for LeaseProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("lease_view_states"),
        Owned::Table("leases"),
        Owned::Table("lease_diagnostics"),
        Owned::Table("releases"),
        Owned::Table("retained_leases"),
        workload_partitions!("lease")[0],
        workload_partitions!("lease")[1],
        workload_partitions!("lease")[2],
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[LeaseId],
    ) -> Result<HashMap<LeaseId, LeaseView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let lease = LeaseId(row.get(0));
            views.insert(lease, decode(format!("lease {lease}"), row.get(2))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &deadpool_postgres::Transaction<'_>,
        changes: Vec<LeaseChange>,
    ) -> Result<(), WriteError> {
        write_changes(tx, changes).await
    }
}

/// Sorts a batch's changes by table and writes each table once.
async fn write_changes(
    tx: &deadpool_postgres::Transaction<'_>,
    changes: Vec<LeaseChange>,
) -> Result<(), WriteError> {
    let Gathered { puts, starts, settled, mut shared } = gather(changes);
    write_puts(tx, &puts).await?;
    for rows in &puts {
        shared.workload(rows.workload.clone());
    }
    write_releases(tx, &starts, &settled).await?;
    shared.write(tx).await
}

async fn write_puts(
    tx: &deadpool_postgres::Transaction<'_>,
    puts: &[LeaseRows],
) -> Result<(), WriteError> {
    if puts.is_empty() {
        return Ok(());
    }
    let mut states = Vec::with_capacity(puts.len());
    for rows in puts {
        states.push(encode("lease", &rows.view)?);
    }
    let ids: Vec<Uuid> = puts.iter().map(|r| r.lease.lease_id).collect();
    let tenants: Vec<&str> = puts.iter().map(|r| r.lease.tenant_id.as_str()).collect();
    execute(tx, PUT_VIEWS_SQL, &[&ids, &tenants, &states]).await?;
    write_leases(tx, puts).await?;
    write_diagnostics(tx, puts).await?;
    write_retained(tx, puts).await
}

async fn write_leases(
    tx: &deadpool_postgres::Transaction<'_>,
    puts: &[LeaseRows],
) -> Result<(), WriteError> {
    let rows: Vec<_> = puts.iter().map(|r| &r.lease).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.lease_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let providers: Vec<Uuid> = rows.iter().map(|r| r.provider_id).collect();
    let statuses: Vec<&str> = rows.iter().map(|r| r.status).collect();
    let chains: Vec<&str> = rows.iter().map(|r| r.chain_state).collect();
    let reasons: Vec<Option<&str>> = rows.iter().map(|r| r.reason.as_deref()).collect();
    let messages: Vec<Option<&str>> = rows.iter().map(|r| r.message.as_deref()).collect();
    let items: Vec<&serde_json::Value> = rows.iter().map(|r| &r.items).collect();
    let fail_counts: Vec<i32> = rows.iter().map(|r| to_i32(r.fail_count)).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let retained: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.retained_until).collect();
    let restored: Vec<Option<Uuid>> = rows.iter().map(|r| r.restored_from).collect();
    let params: [Param<'_>; 13] = [
        &ids,
        &tenants,
        &providers,
        &statuses,
        &chains,
        &reasons,
        &messages,
        &items,
        &fail_counts,
        &created,
        &updated,
        &retained,
        &restored,
    ];
    execute(tx, PUT_LEASES_SQL, &params).await
}

async fn write_diagnostics(
    tx: &deadpool_postgres::Transaction<'_>,
    puts: &[LeaseRows],
) -> Result<(), WriteError> {
    let rows: Vec<_> = puts.iter().map(|r| &r.diagnostics).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.lease_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    let backends: Vec<Option<&str>> = rows.iter().map(|r| r.backend_name.as_deref()).collect();
    let errors: Vec<Option<&str>> = rows.iter().map(|r| r.last_error.as_deref()).collect();
    let fail_counts: Vec<i32> = rows.iter().map(|r| to_i32(r.fail_count)).collect();
    let generations: Vec<i64> = rows.iter().map(|r| to_i64(r.generation)).collect();
    let verdicts: Vec<Option<&str>> = rows.iter().map(|r| r.budget_verdict).collect();
    let failures: Vec<Option<i32>> =
        rows.iter().map(|r| r.consecutive_failures.map(to_i32)).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let params: [Param<'_>; 9] = [
        &ids,
        &tenants,
        &backends,
        &errors,
        &fail_counts,
        &generations,
        &verdicts,
        &failures,
        &updated,
    ];
    execute(tx, PUT_DIAGNOSTICS_SQL, &params).await
}

async fn write_retained(
    tx: &deadpool_postgres::Transaction<'_>,
    puts: &[LeaseRows],
) -> Result<(), WriteError> {
    let kept: Vec<_> = puts.iter().filter_map(|r| r.retained.as_ref()).collect();
    let gone: Vec<Uuid> =
        puts.iter().filter(|r| r.retained.is_none()).map(|r| r.lease.lease_id).collect();
    if !gone.is_empty() {
        execute(tx, DELETE_RETAINED_SQL, &[&gone]).await?;
    }
    if kept.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = kept.iter().map(|r| r.lease_id).collect();
    let tenants: Vec<&str> = kept.iter().map(|r| r.tenant_id.as_str()).collect();
    let providers: Vec<Uuid> = kept.iter().map(|r| r.provider_id).collect();
    let statuses: Vec<&str> = kept.iter().map(|r| r.status).collect();
    let until: Vec<Option<DateTime<Utc>>> = kept.iter().map(|r| r.retained_until).collect();
    let updated: Vec<DateTime<Utc>> = kept.iter().map(|r| r.updated_at).collect();
    execute(tx, PUT_RETAINED_SQL, &[&ids, &tenants, &providers, &statuses, &until, &updated]).await
}

type Settled = BTreeMap<(Uuid, u32), (&'static str, Option<String>, Option<String>, DateTime<Utc>)>;

async fn write_releases(
    tx: &deadpool_postgres::Transaction<'_>,
    starts: &[ReleaseRow],
    settled: &Settled,
) -> Result<(), WriteError> {
    if !starts.is_empty() {
        let ids: Vec<Uuid> = starts.iter().map(|r| r.lease_id).collect();
        let versions: Vec<i32> = starts.iter().map(|r| to_i32(r.version)).collect();
        let tenants: Vec<&str> = starts.iter().map(|r| r.tenant_id.as_str()).collect();
        let hashes: Vec<&str> = starts.iter().map(|r| r.payload_hash.as_str()).collect();
        let created: Vec<DateTime<Utc>> = starts.iter().map(|r| r.created_at).collect();
        execute(tx, START_RELEASES_SQL, &[&ids, &versions, &tenants, &hashes, &created]).await?;
    }
    if settled.is_empty() {
        return Ok(());
    }
    let ids: Vec<Uuid> = settled.keys().map(|(id, _)| *id).collect();
    let versions: Vec<i32> = settled.keys().map(|(_, v)| to_i32(*v)).collect();
    let statuses: Vec<&str> = settled.values().map(|s| s.0).collect();
    let reasons: Vec<Option<&str>> = settled.values().map(|s| s.1.as_deref()).collect();
    let messages: Vec<Option<&str>> = settled.values().map(|s| s.2.as_deref()).collect();
    let at: Vec<DateTime<Utc>> = settled.values().map(|s| s.3).collect();
    execute(tx, SET_RELEASES_SQL, &[&ids, &versions, &statuses, &reasons, &messages, &at]).await
}

fn to_i32(value: u32) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

impl crate::replay::MemProjected for LeaseProjection {
    fn write_memory(
        changes: Vec<LeaseChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        use serde_json::{Value, json};
        let Gathered { puts, starts, settled, mut shared } = gather(changes);
        for rows in &puts {
            tables.put(PUT_LEASES_SQL, &rows.lease, &[])?;
            tables.put(PUT_DIAGNOSTICS_SQL, &rows.diagnostics, &[])?;
            match &rows.retained {
                Some(retained) => tables.put(PUT_RETAINED_SQL, retained, &[])?,
                None => tables.delete("retained_leases", &[json!(rows.lease.lease_id)]),
            }
        }
        for rows in puts {
            shared.workload(rows.workload);
        }
        for row in &starts {
            let extra = [("status", json!("deploying")), ("updated_at", json!(row.created_at))];
            tables.put(START_RELEASES_SQL, row, &extra)?;
        }
        for ((lease, version), (status, reason, message, at)) in settled {
            let values =
                json!({ "status": status, "reason": reason, "message": message, "updated_at": at });
            let Value::Object(values) = values else { unreachable!("an object") };
            tables.update("releases", &[json!(lease), json!(version)], values);
        }
        shared.write_memory(tables)
    }
}

/// A batch's changes as both writers write them.
struct Gathered {
    puts: Vec<LeaseRows>,
    starts: Vec<ReleaseRow>,
    /// Later settlements of the same release win: only the final status is written.
    settled: Settled,
    shared: SharedWrites,
}

fn gather(changes: Vec<LeaseChange>) -> Gathered {
    let mut gathered = Gathered {
        puts: Vec::new(),
        starts: Vec::new(),
        settled: Settled::new(),
        shared: SharedWrites::default(),
    };
    for change in changes {
        match change {
            LeaseChange::Put(rows) => gathered.puts.push(*rows),
            LeaseChange::StartRelease(row) => gathered.starts.push(row),
            LeaseChange::SetRelease { lease_id, version, status, reason, message, at } => {
                gathered.settled.insert((lease_id, version), (status, reason, message, at));
            }
            LeaseChange::Quota(delta) => gathered.shared.quota(delta),
        }
    }
    gathered
}
