//! The snapshot's queries, merged into the `Query` root: a tenant's own snapshots, quota and
//! artifact index (the tenant from the token in every query: another tenant's is not found, a
//! miss); every tenant's quota usage for operators.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::SnapshotPage;
use leasehold_domain::snapshot::{Digest, LayerKey, SnapshotId, SnapshotMode};
use leasehold_domain::values::fleet::Arch;
use uuid::Uuid;

use super::types::{Snapshot, SnapshotFilter, SnapshotQuotaUsage};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::events::read_models_as_of;
use crate::schema::query::{page_rows, uuid_arg};
use crate::schema::{caller, require, shared, tenant_of};

/// The snapshot's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct SnapshotQuery;

fn page_of(filter: SnapshotFilter, first: usize) -> ApiResult<SnapshotPage> {
    let vm = filter.vm_id.as_ref().map(|id| uuid_arg("filter.vmId", id)).transpose()?;
    Ok(SnapshotPage {
        vm,
        task: filter.task_id,
        state: filter.state,
        mode: filter.mode.map(|mode| SnapshotMode::from(mode).name().to_owned()),
        layer_key: filter.layer_key,
        arch: filter.arch,
        name: filter.name,
        after: None,
        first,
    })
}

#[Object]
impl SnapshotQuery {
    /// One of your snapshots by id (`NOT_FOUND` when you have none with that id).
    async fn snapshot(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(desc = "A log cursor you were given: the snapshot as it was when the log \
                          stood there.")]
        as_of: Option<String>,
    ) -> ApiResult<Snapshot> {
        let tenant = tenant_of(ctx, "read snapshots")?;
        let snapshot = SnapshotId(uuid_arg("id", &id)?);
        let entity = Entity::Snapshot(snapshot);
        let read_models =
            read_models_as_of(ctx, as_of.as_deref(), (entity, "snapshot"), Some(tenant.as_str()))
                .await?;
        let found = read_models.snapshot(tenant, snapshot).await?;
        found.map(Snapshot::from).ok_or_else(|| ApiError::not_found("snapshot"))
    }

    /// Your snapshots, newest first, filtered by VM, task, state, mode, layer key, arch or
    /// name.
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn snapshots(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Snapshots wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<SnapshotFilter>,
    ) -> ApiResult<Connection<String, Snapshot>> {
        let tenant = tenant_of(ctx, "read snapshots")?;
        let state = shared(ctx);
        let scope = caller(ctx)?.cursor_scope();
        let first = page_rows(first)?;
        let after = after
            .map(|text| {
                let kind = CursorKind::Snapshots;
                state.cursors.open::<(DateTime<Utc>, Uuid)>(kind, &scope, "after", &text)
            })
            .transpose()?;
        let mut page = page_of(filter.unwrap_or_default(), first + 1)?;
        page.after = after;
        let mut rows = state.read_models.snapshots(tenant, &page).await?;
        let has_next = rows.len() > first;
        rows.truncate(first);
        let mut connection = Connection::new(after.is_some(), has_next);
        for row in rows {
            let position = (row.created_at, row.snapshot_id.0);
            let cursor = state.cursors.seal(CursorKind::Snapshots, &scope, &position);
            connection.edges.push(Edge::new(cursor, Snapshot::from(row)));
        }
        Ok(connection)
    }

    /// Your snapshot quota: what it counts against its limits (none until your first
    /// snapshot or an operator's limits).
    async fn snapshot_quota_usage(
        &self,
        ctx: &Context<'_>,
    ) -> ApiResult<Option<SnapshotQuotaUsage>> {
        let tenant = tenant_of(ctx, "read the snapshot quota")?;
        let usage = shared(ctx).read_models.snapshot_quota_usage(tenant).await?;
        // A tenant's answer never names a tenant (its own included).
        Ok(usage
            .map(SnapshotQuotaUsage::from)
            .map(|usage| SnapshotQuotaUsage { tenant_id: None, ..usage }))
    }

    /// Every tenant's snapshot quota usage, by tenant (operators).
    async fn snapshot_quota_usages(&self, ctx: &Context<'_>) -> ApiResult<Vec<SnapshotQuotaUsage>> {
        require(ctx, &[Role::Operator], "read every tenant's snapshot quota")?;
        let usages = shared(ctx).read_models.snapshot_quota_usages().await?;
        Ok(usages.into_iter().map(SnapshotQuotaUsage::from).collect())
    }

    /// Your newest ready build layer for a layer key built on `arch` (none: a miss; another
    /// tenant's layer is always a miss).
    async fn layer_artifact(
        &self,
        ctx: &Context<'_>,
        layer_key: String,
        arch: String,
    ) -> ApiResult<Option<Snapshot>> {
        let tenant = tenant_of(ctx, "read the artifact index")?;
        let layer_key = LayerKey::parse("layerKey", layer_key).map_err(ApiError::from_field)?;
        let arch = Arch::parse("arch", arch).map_err(ApiError::from_field)?;
        let read_models = &shared(ctx).read_models;
        let Some(hit) = read_models.newest_layer(tenant, &layer_key, &arch).await? else {
            return Ok(None);
        };
        Ok(read_models.snapshot(tenant, hit.snapshot).await?.map(Snapshot::from))
    }

    /// The hosts holding a ready artifact of yours whose rootfs hashes to `digest` (where its
    /// bytes already are; never a claim that two builds are the same).
    async fn artifact_hosts(&self, ctx: &Context<'_>, digest: String) -> ApiResult<Vec<String>> {
        let tenant = tenant_of(ctx, "read the artifact index")?;
        let digest = Digest::parse("digest", digest).map_err(ApiError::from_field)?;
        let hosts = shared(ctx).read_models.artifact_holders(tenant, &digest).await?;
        Ok(hosts.into_iter().map(|host| host.to_string()).collect())
    }
}
