//! Mutations on snapshots: tenants create, restore, delete and export theirs (a create
//! reserves on the tenant's quota in the same append: over it is `QUOTA_EXCEEDED`); a host's
//! agent reports on the snapshots of its own host (its token names the host), fenced by the
//! operation; operators set a tenant's quota.

use async_graphql::{Context, Object};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::snapshot_service::{AgentReport, CreateSnapshot};
use leasehold_domain::quota::QuotaLimits;
use leasehold_domain::snapshot::{
    Digest, ExportDestination, LayerKey, ReportedSizes, RequestedKind, SnapshotError, SnapshotId,
    SnapshotMode, SnapshotName, Written,
};
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail};
use leasehold_domain::vm::SnapshotRef;

use super::types::{
    ConfirmSnapshotInput, CreateSnapshotInput, ExportSnapshotInput, RestoreSnapshotInput,
    SnapshotExportReportInput, SnapshotFailureInput, SnapshotOperationInput, SnapshotQuotaInput,
    SnapshotReportInput, SnapshotStage, UseLayerInput,
};
use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, shared, tenant_of};

/// The snapshot's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct SnapshotMutation;

/// `field`'s text as one of the snapshot's checked values, or the field's refusal.
fn checked<T>(
    parse: impl FnOnce(&str, String) -> Result<T, leasehold_domain::values::FieldError>,
    field: &str,
    value: Option<String>,
) -> ApiResult<Option<T>> {
    value.map(|value| parse(field, value)).transpose().map_err(ApiError::from_field)
}

fn create_of(input: CreateSnapshotInput) -> ApiResult<CreateSnapshot> {
    let parent = input.parent_snapshot_id.as_ref().map(|id| uuid_arg("parentSnapshotId", id));
    Ok(CreateSnapshot {
        vm: VmId(uuid_arg("vmId", &input.vm_id)?),
        requested: input.kind.map_or(RequestedKind::Disk, RequestedKind::from),
        mode: input.mode.map_or(SnapshotMode::Manual, SnapshotMode::from),
        parent: parent.transpose()?.map(SnapshotId),
        layer_key: checked(LayerKey::parse, "layerKey", input.layer_key)?,
        name: checked(SnapshotName::parse, "name", input.name)?,
        retention_until: input.retention_until,
    })
}

/// A host agent reporting on the snapshots of its host: the host its token names, and it as
/// a caller of the snapshot service.
fn reporting_agent<'a>(ctx: &Context<'a>) -> ApiResult<(&'a HostId, Caller)> {
    let principal = require(ctx, &[Role::Agent], "report on snapshots")?;
    let host = principal.host.as_ref().ok_or_else(|| ApiError::forbidden("report on snapshots"))?;
    Ok((host, caller_of(principal, None)))
}

/// Runs a host agent's `report` on `snapshot` and answers it.
async fn report(
    ctx: &Context<'_>,
    (snapshot, key): (SnapshotId, &str),
    report: AgentReport,
) -> ApiResult<CommandResult> {
    let (host, caller) = reporting_agent(ctx)?;
    let run = shared(ctx).snapshots.report(&caller, (host, key), snapshot, report);
    answer_on(ctx, snapshot.0.to_string(), async { run.await.map(|done| done.outcome) }).await
}

fn detail_of(detail: Option<&str>) -> OperatorDetail {
    OperatorDetail::new(detail.unwrap_or("the agent reported no detail"))
}

#[Object]
impl SnapshotMutation {
    /// Asks for a snapshot of one of your running VMs (no GPU): `creating` until the VM's
    /// host agent confirms it. Its estimate (the VM's disk, and memory for `LIVE` and `DIFF`)
    /// is reserved on your snapshot quota in the same append; over the quota is
    /// `QUOTA_EXCEEDED`. A `DIFF` needs the VM's last live snapshot as its parent.
    async fn create_snapshot(
        &self,
        ctx: &Context<'_>,
        input: CreateSnapshotInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "create snapshots")?;
        tenant_of(ctx, "create snapshots")?;
        let key = input.operation_key.clone();
        let ask = create_of(input)?;
        let caller = caller_of(principal, None);
        let created = shared(ctx).snapshots.create(&caller, &key, &ask).await?;
        answer_on::<SnapshotError>(ctx, created.snapshot.0.to_string(), async {
            Ok(created.outcome)
        })
        .await
    }

    /// Restores one of your ready snapshots onto its own running VM (a diff never alone).
    async fn restore_snapshot(
        &self,
        ctx: &Context<'_>,
        input: RestoreSnapshotInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "restore snapshots")?;
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let caller = caller_of(principal, None);
        let run = shared(ctx).snapshots.restore(&caller, &input.operation_key, (snapshot, vm));
        answer_on(ctx, snapshot.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// Deletes one of your snapshots (idempotent): `INVALID_STATE` while a child of it is
    /// not being deleted. Its quota is given back at once.
    async fn delete_snapshot(
        &self,
        ctx: &Context<'_>,
        input: SnapshotOperationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "delete snapshots")?;
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let caller = caller_of(principal, None);
        let run = shared(ctx).snapshots.delete(&caller, &input.operation_key, snapshot);
        answer_on(ctx, snapshot.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// Exports one of your ready snapshots to object storage (`pending` until its host's
    /// agent reports; asking again for a pending or ready destination changes nothing).
    async fn export_snapshot(
        &self,
        ctx: &Context<'_>,
        input: ExportSnapshotInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "export snapshots")?;
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let destination = ExportDestination::parse("destination", input.destination)
            .map_err(ApiError::from_field)?;
        let caller = caller_of(principal, None);
        let snapshots = &shared(ctx).snapshots;
        let run = snapshots.request_export(&caller, &input.operation_key, (snapshot, destination));
        answer_on(ctx, snapshot.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// A host agent reports a snapshot of its host written: its kind as written, its sizes
    /// (the honest size counts memory for `LIVE`), digest and store reference. Settles the
    /// tenant's quota to the honest size.
    async fn confirm_snapshot(
        &self,
        ctx: &Context<'_>,
        input: ConfirmSnapshotInput,
    ) -> ApiResult<CommandResult> {
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let diff_of = input.diff_of.as_ref().map(|id| uuid_arg("diffOf", id)).transpose()?;
        let written = Written {
            kind: input.kind.into(),
            sizes: ReportedSizes {
                disk_bytes: input.disk_bytes,
                memory_bytes: input.memory_bytes.unwrap_or(0),
            },
            digest: checked(Digest::parse, "digest", input.digest)?,
            store_ref: SnapshotRef::parse("storeRef", input.store_ref)
                .map_err(ApiError::from_field)?,
            diff_of: diff_of.map(SnapshotId),
        };
        let key = input.operation_key.as_str();
        report(ctx, (snapshot, key), AgentReport::Written { operation, written }).await
    }

    /// A host agent reports a snapshot of its host's creation, restore (`missing` when its
    /// store no longer has it) or deletion failed; `detail` is for operators only.
    async fn report_snapshot_failure(
        &self,
        ctx: &Context<'_>,
        input: SnapshotFailureInput,
    ) -> ApiResult<CommandResult> {
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let detail = detail_of(input.detail.as_deref());
        let missing = input.missing.unwrap_or(false);
        if missing && input.stage != SnapshotStage::Restore {
            return Err(ApiError::bad_input("missing: only a restore's failure"));
        }
        let failure = match input.stage {
            SnapshotStage::Create => AgentReport::WriteFailed { operation, detail },
            SnapshotStage::Restore => AgentReport::RestoreFailed { operation, missing, detail },
            SnapshotStage::Delete => AgentReport::DeleteFailed { operation, detail },
        };
        report(ctx, (snapshot, input.operation_key.as_str()), failure).await
    }

    /// A host agent reports a snapshot of its host restored onto its VM.
    async fn confirm_snapshot_restored(
        &self,
        ctx: &Context<'_>,
        input: SnapshotReportInput,
    ) -> ApiResult<CommandResult> {
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let key = input.operation_key.as_str();
        report(ctx, (snapshot, key), AgentReport::Restored { operation }).await
    }

    /// A host agent reports a snapshot of its host deleted, or not found (`notFound`): a
    /// deletion too.
    async fn confirm_snapshot_deleted(
        &self,
        ctx: &Context<'_>,
        input: SnapshotReportInput,
        #[graphql(desc = "The store answered it has no such snapshot.")] not_found: Option<bool>,
    ) -> ApiResult<CommandResult> {
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let deleted = AgentReport::Deleted { operation, not_found: not_found.unwrap_or(false) };
        report(ctx, (snapshot, input.operation_key.as_str()), deleted).await
    }

    /// A host agent reports an export of a snapshot of its host written, or failed, naming
    /// the export's operation it was sent (an earlier request's is `FENCED`).
    async fn report_snapshot_export(
        &self,
        ctx: &Context<'_>,
        input: SnapshotExportReportInput,
    ) -> ApiResult<CommandResult> {
        let snapshot = SnapshotId(uuid_arg("snapshotId", &input.snapshot_id)?);
        let destination = ExportDestination::parse("destination", input.destination)
            .map_err(ApiError::from_field)?;
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let detail = (!input.ready).then(|| detail_of(input.detail.as_deref()));
        let exported = AgentReport::Exported { destination, operation, ready: input.ready, detail };
        report(ctx, (snapshot, input.operation_key.as_str()), exported).await
    }

    /// A layer cache lookup that counts as a use: your newest ready build layer for a layer
    /// key built on `arch`, recorded as used now (the least recently used layers are evicted
    /// first past your cap). Null on a miss (another tenant's layer is always a miss).
    async fn use_layer_artifact(
        &self,
        ctx: &Context<'_>,
        input: UseLayerInput,
    ) -> ApiResult<Option<CommandResult>> {
        let principal = require(ctx, &[Role::Tenant], "use layer artifacts")?;
        let tenant = tenant_of(ctx, "use layer artifacts")?;
        let layer_key =
            LayerKey::parse("layerKey", input.layer_key).map_err(ApiError::from_field)?;
        let arch = leasehold_domain::values::fleet::Arch::parse("arch", input.arch)
            .map_err(ApiError::from_field)?;
        let state = shared(ctx);
        let Some(hit) = state.read_models.newest_layer(tenant, &layer_key, &arch).await? else {
            return Ok(None);
        };
        let caller = caller_of(principal, None);
        let used = state.snapshots.use_layer(&caller, &input.operation_key, (tenant, hit.snapshot));
        match used.await {
            Ok(done) => {
                let id = hit.snapshot.0.to_string();
                answer_on::<SnapshotError>(ctx, id, async { Ok(done.outcome) }).await.map(Some)
            }
            // Evicted or deleted since the index was projected: a miss.
            Err(leasehold_commands::CommandError::Refused(SnapshotError::InvalidState {
                ..
            })) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Sets a tenant's snapshot quota (operators; 0 disables a limit). A change is an event
    /// on the tenant's quota stream; lowering a limit below the usage deletes nothing, and
    /// new creates are refused until usage falls under it.
    async fn set_snapshot_quota(
        &self,
        ctx: &Context<'_>,
        input: SnapshotQuotaInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Operator], "set snapshot quotas")?;
        let tenant = crate::schema::query::tenant_arg(&input.tenant_id)?;
        let limits = QuotaLimits { max_count: input.max_count, max_bytes: input.max_bytes };
        let caller = caller_of(principal, None);
        let key = input.operation_key.as_str();
        let id = leasehold_commands::quota::quota_of(&tenant).0.to_string();
        let run = shared(ctx).snapshots.set_limits(&caller, key, (&tenant, limits));
        answer_on(ctx, id, run).await
    }
}
