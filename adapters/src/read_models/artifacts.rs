//! The artifact index, derived from the ready rows of `snapshot_records` (never a table of
//! its own): per tenant, a digest to the hosts holding an artifact that hashes to it, and a
//! layer key and arch to the newest ready layer. The tenant is in every query: another
//! tenant's artifact is a miss, never a hit (rule 2). A digest checks integrity; it is looked
//! up to find where bytes already are, never to say two builds are the same.

use leasehold_domain::snapshot::{Digest, LayerKey, SnapshotId};
use leasehold_domain::values::fleet::{Arch, HostId};
use leasehold_domain::{StoreError, TenantId};

use super::PgReadModels;

const HOLDERS_SQL: &str = "SELECT DISTINCT host_id FROM snapshot_records \
     WHERE tenant_id = $1 AND digest = $2 AND state = 'ready' ORDER BY host_id";

const LAYER_SQL: &str = "SELECT snapshot_id, host_id FROM snapshot_records \
     WHERE tenant_id = $1 AND layer_key = $2 AND arch = $3 AND state = 'ready' \
     ORDER BY created_at DESC, snapshot_id DESC LIMIT 1";

/// The newest ready layer for a layer key and arch, and the host holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerHit {
    /// The layer.
    pub snapshot: SnapshotId,
    /// Its host.
    pub host: HostId,
}

impl PgReadModels {
    /// The hosts holding a ready artifact of `tenant`'s that hashes to `digest` (placement's
    /// locality hint).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn artifact_holders(
        &self,
        tenant: &TenantId,
        digest: &Digest,
    ) -> Result<Vec<HostId>, StoreError> {
        let rows = self.query(HOLDERS_SQL, &[&tenant.as_str(), &digest.as_str()]).await?;
        Ok(rows
            .iter()
            .filter_map(|row| HostId::parse("host", row.get::<_, &str>(0)).ok())
            .collect())
    }

    /// `tenant`'s newest ready layer for `layer_key` built on `arch`, if any (a miss is
    /// `None`, never an error).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn newest_layer(
        &self,
        tenant: &TenantId,
        layer_key: &LayerKey,
        arch: &Arch,
    ) -> Result<Option<LayerHit>, StoreError> {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
            [&tenant.as_str(), &layer_key.as_str(), &arch.as_str()];
        let rows = self.query(LAYER_SQL, &params).await?;
        Ok(rows.first().and_then(|row| {
            let host = HostId::parse("host", row.get::<_, &str>(1)).ok()?;
            Some(LayerHit { snapshot: SnapshotId(row.get(0)), host })
        }))
    }
}

// The facts a snapshot's commands are decided with that only the listing of a VM's snapshots
// knows (the snapshot service reads them before deciding).

const LAST_LIVE_SQL: &str = "SELECT snapshot_id FROM snapshot_records \
     WHERE tenant_id = $1 AND vm_id = $2 AND kind = 'live' AND state IN ('ready', 'restoring') \
     ORDER BY created_at DESC, snapshot_id DESC LIMIT 1";

const LIVE_CHILDREN_SQL: &str = "SELECT count(*) FROM snapshot_records \
     WHERE tenant_id = $1 AND parent_snapshot_id = $2 AND state NOT IN ('deleting', 'deleted')";

// The VM's latest usable snapshot: a newer one still being created, failed or being deleted
// does not make it collectable, and build artifacts are GC's to skip anyway.
const LATEST_SQL: &str = "SELECT snapshot_id FROM snapshot_records \
     WHERE tenant_id = $1 AND vm_id = $2 AND state IN ('ready', 'restoring') \
     AND mode <> 'build' ORDER BY created_at DESC, snapshot_id DESC LIMIT 1";

impl PgReadModels {
    /// `vm`'s last live snapshot (as its agent wrote it, ready or restoring): a diff's only
    /// possible parent.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn last_live_snapshot(
        &self,
        tenant: &TenantId,
        vm: leasehold_domain::values::fleet::VmId,
    ) -> Result<Option<SnapshotId>, StoreError> {
        let rows = self.query(LAST_LIVE_SQL, &[&tenant.as_str(), &vm.0]).await?;
        Ok(rows.first().map(|row| SnapshotId(row.get(0))))
    }

    /// How many of `snapshot`'s children are not being deleted (while any is, it stays).
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn live_children(
        &self,
        tenant: &TenantId,
        snapshot: SnapshotId,
    ) -> Result<usize, StoreError> {
        let rows = self.query(LIVE_CHILDREN_SQL, &[&tenant.as_str(), &snapshot.0]).await?;
        let count: i64 = rows.first().map_or(0, |row| row.get(0));
        Ok(usize::try_from(count).unwrap_or(usize::MAX))
    }

    /// `vm`'s latest usable snapshot (ready or restoring, no build artifact): retention GC
    /// never deletes it.
    ///
    /// # Errors
    /// When the database cannot be read.
    pub async fn latest_snapshot_of(
        &self,
        tenant: &TenantId,
        vm: leasehold_domain::values::fleet::VmId,
    ) -> Result<Option<SnapshotId>, StoreError> {
        let rows = self.query(LATEST_SQL, &[&tenant.as_str(), &vm.0]).await?;
        Ok(rows.first().map(|row| SnapshotId(row.get(0))))
    }
}

impl leasehold_commands::snapshot_service::SnapshotListing for PgReadModels {
    async fn last_live(
        &self,
        tenant: &TenantId,
        vm: leasehold_domain::values::fleet::VmId,
    ) -> Result<Option<SnapshotId>, StoreError> {
        self.last_live_snapshot(tenant, vm).await
    }

    async fn latest_of(
        &self,
        tenant: &TenantId,
        vm: leasehold_domain::values::fleet::VmId,
    ) -> Result<Option<SnapshotId>, StoreError> {
        self.latest_snapshot_of(tenant, vm).await
    }

    async fn live_children(
        &self,
        tenant: &TenantId,
        snapshot: SnapshotId,
    ) -> Result<usize, StoreError> {
        PgReadModels::live_children(self, tenant, snapshot).await
    }
}
