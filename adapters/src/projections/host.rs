//! Writing the host read models, and reading the hosts' working states back as placement's
//! catalog of the fleet ([`PgHostCatalog`]).

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_commands::vm_service::{HostCatalog, SeedCopy};
use leasehold_domain::StoreError;
use leasehold_domain::host::Host;
use leasehold_domain::values::fleet::HostId;
use leasehold_projections::host::{HostChange, HostProjection, HostRows};

use super::kind::{PgProjected, ReadError, decode, encode};
use super::tables::Owned;
use super::tables::dead_letters_of;
use super::{Param, WriteError, execute};
use crate::store::PgEventStore;

const VIEWS_SQL: &str = "SELECT host_id, state FROM host_view_states WHERE host_id = ANY($1)";

const ALL_VIEWS_SQL: &str = "SELECT host_id, state FROM host_view_states";

const PUT_VIEWS_SQL: &str = "INSERT INTO host_view_states (host_id, state) \
     SELECT * FROM unnest($1::text[], $2::bytea[]) \
     ON CONFLICT (host_id) DO UPDATE SET state = excluded.state";

const PUT_HOSTS_SQL: &str = "INSERT INTO hosts (host_id, state, backend, region, url, labels, \
     capacity, allocated, headroom, vm_count, last_seen, updated_at) \
     SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::jsonb[], $7::jsonb[], $8::jsonb[], $9::jsonb[], $10::int8[], $11::timestamptz[], \
     $12::timestamptz[]) \
     ON CONFLICT (host_id) DO UPDATE SET state = excluded.state, backend = excluded.backend, \
     region = excluded.region, url = excluded.url, labels = excluded.labels, \
     capacity = excluded.capacity, allocated = excluded.allocated, \
     headroom = excluded.headroom, vm_count = excluded.vm_count, \
     last_seen = excluded.last_seen, updated_at = excluded.updated_at";

impl PgProjected for HostProjection {
    const TABLES: &'static [Owned] =
        &[Owned::Table("host_view_states"), Owned::Table("hosts"), dead_letters_of!("host")];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[HostId],
    ) -> Result<HashMap<HostId, Host>, ReadError> {
        let ids: Vec<&str> = keys.iter().map(HostId::as_str).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let id: &str = row.get(0);
            let host = HostId::parse("host", id).map_err(|e| ReadError::Corrupt(e.to_string()))?;
            views.insert(host, decode(format!("host {id}"), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(
        tx: &Transaction<'_>,
        changes: Vec<HostChange>,
    ) -> Result<(), WriteError> {
        let mut puts: Vec<HostRows> = Vec::new();
        for change in changes {
            match change {
                HostChange::Put(rows) => puts.push(*rows),
                HostChange::DeadLetter(letter) => {
                    super::vm::write_dead_letter(tx, super::vm::LetterSource::Host, &letter).await?
                }
            }
        }
        if puts.is_empty() {
            return Ok(());
        }
        let mut states = Vec::with_capacity(puts.len());
        for rows in &puts {
            states.push(encode("host", &rows.view)?);
        }
        let rows: Vec<_> = puts.iter().map(|r| &r.host).collect();
        let ids: Vec<&str> = rows.iter().map(|r| r.host_id.as_str()).collect();
        execute(tx, PUT_VIEWS_SQL, &[&ids, &states]).await?;
        let host_states: Vec<&str> = rows.iter().map(|r| r.state).collect();
        let backends: Vec<&str> = rows.iter().map(|r| r.backend).collect();
        let regions: Vec<Option<&str>> = rows.iter().map(|r| r.region.as_deref()).collect();
        let urls: Vec<&str> = rows.iter().map(|r| r.url.as_str()).collect();
        let labels: Vec<&serde_json::Value> = rows.iter().map(|r| &r.labels).collect();
        let capacity: Vec<&serde_json::Value> = rows.iter().map(|r| &r.capacity).collect();
        let allocated: Vec<&serde_json::Value> = rows.iter().map(|r| &r.allocated).collect();
        let headroom: Vec<&serde_json::Value> = rows.iter().map(|r| &r.headroom).collect();
        let counts: Vec<i64> = rows.iter().map(|r| r.vm_count).collect();
        let seen: Vec<Option<DateTime<Utc>>> = rows.iter().map(|r| r.last_seen).collect();
        let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
        let params: [Param<'_>; 12] = [
            &ids,
            &host_states,
            &backends,
            &regions,
            &urls,
            &labels,
            &capacity,
            &allocated,
            &headroom,
            &counts,
            &seen,
            &updated,
        ];
        execute(tx, PUT_HOSTS_SQL, &params).await
    }
}

/// Placement's catalog of the fleet: every host's working state as the host projection last
/// wrote it, in one query. It may lag the log; the host's own Reserve decides.
#[derive(Debug, Clone)]
pub struct PgHostCatalog {
    store: PgEventStore,
}

impl PgHostCatalog {
    /// The catalog in the database of `store`.
    pub fn new(store: PgEventStore) -> Self {
        Self { store }
    }
}

impl HostCatalog for PgHostCatalog {
    async fn hosts(&self) -> Result<Vec<Host>, StoreError> {
        let client = self.store.client().await?;
        let endpoint = self.store.endpoint().to_owned();
        let rows = client
            .query(ALL_VIEWS_SQL, &[])
            .await
            .map_err(|error| crate::store::from_driver(error, &endpoint))?;
        let mut hosts = Vec::with_capacity(rows.len());
        for row in rows {
            let id: &str = row.get(0);
            let host =
                decode::<Host>(format!("host {id}"), row.get(1)).map_err(|error| match error {
                    ReadError::Corrupt(reason) => StoreError::Corrupt { position: 0, reason },
                    ReadError::Driver(error) => crate::store::from_driver(error, &endpoint),
                })?;
            hosts.push(host);
        }
        Ok(hosts)
    }

    /// The seed, and `tenant`'s other ready snapshots with the seed's digest, where they are
    /// (the artifact index over `snapshot_records`; the tenant in the query: another tenant's
    /// artifact never draws a VM anywhere, nor is ever pulled for one).
    async fn seed_copies(
        &self,
        tenant: &leasehold_domain::TenantId,
        seed: &leasehold_domain::vm::SnapshotRef,
    ) -> Result<Vec<SeedCopy>, StoreError> {
        // A seed is named by its snapshot id (a tenant's way) or by its host-store reference.
        let as_id = uuid::Uuid::parse_str(seed.as_str()).ok();
        let client = self.store.client().await?;
        let endpoint = self.store.endpoint().to_owned();
        let statement = client
            .prepare_cached(SEED_COPIES_SQL)
            .await
            .map_err(|error| crate::store::from_driver(error, &endpoint))?;
        let rows = client
            .query(&statement, &[&tenant.as_str(), &seed.as_str(), &as_id])
            .await
            .map_err(|error| crate::store::from_driver(error, &endpoint))?;
        Ok(rows.iter().filter_map(seed_copy).collect())
    }
}

/// A row of [`SEED_COPIES_SQL`] as a copy (a row the domain would not accept is no copy).
fn seed_copy(row: &tokio_postgres::Row) -> Option<SeedCopy> {
    use leasehold_domain::snapshot::Digest;
    use leasehold_domain::vm::SnapshotRef;
    Some(SeedCopy {
        host: HostId::parse("host", row.get::<_, &str>(0)).ok()?,
        store_ref: SnapshotRef::parse("store_ref", row.get::<_, &str>(1)).ok()?,
        digest: row
            .get::<_, Option<&str>>(2)
            .and_then(|digest| Digest::parse("digest", digest).ok()),
        movable: row.get::<_, Option<&str>>(3) == Some("disk"),
        is_seed: row.get(4),
    })
}

/// The seed itself (by its store reference or its snapshot id), and every ready (or
/// restoring: still whole) snapshot of the same tenant's with the seed's digest, by host id,
/// on each host the seed itself first, then movable copies: the same answer every time.
const SEED_COPIES_SQL: &str = "SELECT same.host_id, same.store_ref, \
     same.digest, same.kind, same.snapshot_id = seed.snapshot_id \
     FROM snapshot_records seed JOIN snapshot_records same \
       ON same.tenant_id = seed.tenant_id AND same.state IN ('ready', 'restoring') \
      AND same.store_ref IS NOT NULL \
      AND (same.snapshot_id = seed.snapshot_id OR same.digest = seed.digest) \
     WHERE seed.tenant_id = $1 AND (seed.store_ref = $2 OR seed.snapshot_id = $3::uuid) \
       AND seed.state IN ('ready', 'restoring') \
     ORDER BY same.host_id, same.snapshot_id = seed.snapshot_id DESC, \
       (same.kind = 'disk' AND same.digest IS NOT NULL) DESC, same.snapshot_id";

impl crate::replay::MemProjected for HostProjection {
    fn write_memory(
        changes: Vec<HostChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let mut puts: Vec<HostRows> = Vec::new();
        for change in changes {
            match change {
                HostChange::Put(rows) => puts.push(*rows),
                HostChange::DeadLetter(letter) => {
                    super::vm::dead_letter_memory(tables, super::vm::LetterSource::Host, &letter)?
                }
            }
        }
        for rows in &puts {
            tables.put(PUT_HOSTS_SQL, &rows.host, &[])?;
        }
        Ok(())
    }
}
