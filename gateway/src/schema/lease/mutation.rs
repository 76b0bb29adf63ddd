//! Mutations: one per lease command. Tenants act on their own leases; agents report on the
//! leases of their provider (fenced by the aggregate); operators close leases. Agents and
//! operators act for the lease's owner, so their operation keys live in the owner's ledger.

use async_graphql::{Context, ID, InputObject, Object};
use chrono::{DateTime, Utc};
use leasehold_commands::lease_input::{self, ItemInput, RequestLeaseInput};
use leasehold_commands::lease_service::{Caller, payload_hash};
use leasehold_domain::lease::{
    CloseCause, LeaseCommand, LeaseId, MaintenanceId, OperationId, ProviderId,
};

use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, require_lease, shared, tenant_of};

/// One item of a request or a restore.
#[derive(Debug, Clone, InputObject)]
#[graphql(name = "LeaseItemInput")]
pub struct LeaseItemInput {
    /// The SKU (`gpu.h100.1x`).
    pub sku: String,
    /// How many, at least 1.
    pub quantity: i64,
    /// The service, for stack leases (every item names one, or there is one item).
    pub service_name: Option<String>,
}

fn items_of(items: Vec<LeaseItemInput>) -> Vec<ItemInput> {
    items
        .into_iter()
        .map(|item| ItemInput {
            sku: item.sku,
            quantity: item.quantity,
            service_name: item.service_name,
        })
        .collect()
}

/// `requestLease`.
#[derive(Debug, Clone, InputObject)]
#[graphql(name = "RequestLeaseInput")]
pub struct RequestLeaseInputGql {
    /// Your idempotency key: a retry with the same key and input answers the first result.
    pub operation_key: String,
    /// The lease's id; minted from your operation key when absent.
    pub lease_id: Option<ID>,
    /// The provider's id.
    pub provider_id: ID,
    /// What to rent.
    pub items: Vec<LeaseItemInput>,
    /// The manifest. Only its SHA-256 is stored: it may hold secrets.
    pub payload: String,
}

/// A command on one lease that needs nothing else.
#[derive(Debug, Clone, InputObject)]
pub struct LeaseOperationInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A backend's report on one operation of a lease (agent).
#[derive(Debug, Clone, InputObject)]
pub struct LeaseReportInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The operation reported on: the provision, restore, restart or update the backend was
    /// asked to carry out (a report on a superseded operation is `FENCED`).
    pub operation_id: ID,
}

/// `updateLease`.
#[derive(Debug, Clone, InputObject)]
pub struct UpdateLeaseInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The new manifest. Only its SHA-256 is stored.
    pub payload: String,
}

/// `restoreLease`.
#[derive(Debug, Clone, InputObject)]
pub struct RestoreLeaseInput {
    /// Your idempotency key.
    pub operation_key: String,
    /// The new lease's id; minted from your operation key when absent.
    pub lease_id: Option<ID>,
    /// The retained lease to restore.
    pub from_lease_id: ID,
    /// The provider, if it must match.
    pub provider_id: Option<ID>,
    /// The items: the same services and quantities as the retained lease.
    pub items: Vec<LeaseItemInput>,
}

/// `setLeaseCustomDomain`.
#[derive(Debug, Clone, InputObject)]
pub struct SetLeaseCustomDomainInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The item's service; absent for a lease of one item.
    pub service_name: Option<String>,
    /// The host name; absent or empty removes it.
    pub custom_domain: Option<String>,
}

/// `reportLeaseFailed`.
#[derive(Debug, Clone, InputObject)]
pub struct ReportLeaseFailedInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The operation reported on (see `LeaseReportInput.operationId`).
    pub operation_id: ID,
    /// Why, from an open set (`Unknown` when absent).
    pub reason: Option<String>,
    /// What the tenant may read.
    pub message: String,
    /// Operator-only detail; never shown to the tenant.
    pub detail: Option<String>,
}

/// `reportLeaseMaintenanceCompleted`.
#[derive(Debug, Clone, InputObject)]
pub struct ReportLeaseMaintenanceCompletedInput {
    /// The lease.
    pub lease_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The restart or update being completed.
    pub maintenance_id: ID,
    /// When it was admitted: with `maintenanceId`, the fence.
    pub admitted_at: DateTime<Utc>,
    /// Whether it succeeded.
    pub success: bool,
    /// Operator-only detail of a failure.
    pub error: Option<String>,
}

fn bad(error: leasehold_domain::lease::FieldError) -> ApiError {
    ApiError::bad_input(error.to_string())
}

fn lease_id(field: &str, id: &ID) -> ApiResult<LeaseId> {
    Ok(LeaseId(uuid_arg(field, id)?))
}

/// The lease's mutations, merged into the `Mutation` root.
#[derive(Debug, Default, Clone, Copy)]
pub struct LeaseMutation;

#[Object]
impl LeaseMutation {
    /// Rent compute from a provider (tenant).
    async fn request_lease(
        &self,
        ctx: &Context<'_>,
        input: RequestLeaseInputGql,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "request leases")?;
        let lease = input.lease_id.as_ref().map(|id| lease_id("leaseId", id)).transpose()?;
        let request = RequestLeaseInput {
            provider_id: input.provider_id.to_string(),
            items: items_of(input.items),
            payload_hash: payload_hash(&input.payload),
        };
        keep_manifest(ctx, &caller, &request.payload_hash, &input.payload).await?;
        let leases = &shared(ctx).leases;
        answer(ctx, leases.request(&caller, &input.operation_key, lease, &request)).await
    }

    /// Release a lease; idempotent (tenant).
    async fn deprovision_lease(
        &self,
        ctx: &Context<'_>,
        input: LeaseOperationInput,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "change leases")?;
        let lease = lease_id("leaseId", &input.lease_id)?;
        let command = LeaseCommand::Deprovision;
        let leases = &shared(ctx).leases;
        answer(ctx, leases.on_own(&caller, &input.operation_key, lease, command)).await
    }

    /// Restart a lease's workload (tenant).
    async fn restart_lease(
        &self,
        ctx: &Context<'_>,
        input: LeaseOperationInput,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "restart leases")?;
        let lease = lease_id("leaseId", &input.lease_id)?;
        answer(ctx, shared(ctx).leases.restart(&caller, &input.operation_key, lease)).await
    }

    /// Move a lease to a new manifest (tenant).
    async fn update_lease(
        &self,
        ctx: &Context<'_>,
        input: UpdateLeaseInput,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "update leases")?;
        let lease = lease_id("leaseId", &input.lease_id)?;
        let hash = payload_hash(&input.payload);
        keep_manifest(ctx, &caller, &hash, &input.payload).await?;
        let leases = &shared(ctx).leases;
        answer(ctx, leases.update(&caller, &input.operation_key, lease, &hash)).await
    }

    /// Start a new lease from a retained one's data (tenant).
    async fn restore_lease(
        &self,
        ctx: &Context<'_>,
        input: RestoreLeaseInput,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "restore leases")?;
        let lease = input.lease_id.as_ref().map(|id| lease_id("leaseId", id)).transpose()?;
        let from = lease_id("fromLeaseId", &input.from_lease_id)?;
        let provider = input
            .provider_id
            .as_ref()
            .map(|id| uuid_arg("providerId", id).map(ProviderId))
            .transpose()?;
        let items = items_of(input.items);
        let leases = &shared(ctx).leases;
        let key = &input.operation_key;
        answer(ctx, leases.restore(&caller, key, (lease, from), provider, &items)).await
    }

    /// Route a host name to an item, or remove it; idempotent (tenant).
    async fn set_lease_custom_domain(
        &self,
        ctx: &Context<'_>,
        input: SetLeaseCustomDomainInput,
    ) -> ApiResult<CommandResult> {
        let caller = tenant_caller(ctx, "change leases")?;
        let lease = lease_id("leaseId", &input.lease_id)?;
        let command = lease_input::set_custom_domain(
            input.service_name.as_deref(),
            input.custom_domain.as_deref(),
        )
        .map_err(bad)?;
        let leases = &shared(ctx).leases;
        answer(ctx, leases.on_own(&caller, &input.operation_key, lease, command)).await
    }

    /// The backend provisioned the lease (agent).
    async fn report_lease_provisioned(
        &self,
        ctx: &Context<'_>,
        input: LeaseReportInput,
    ) -> ApiResult<CommandResult> {
        require_lease(ctx, &[Role::Agent], "report on leases")?;
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let command = LeaseCommand::ReportProvisioned { operation };
        owner_call(ctx, &input.lease_id, &input.operation_key, command).await
    }

    /// The lease's workload failed (agent).
    async fn report_lease_failed(
        &self,
        ctx: &Context<'_>,
        input: ReportLeaseFailedInput,
    ) -> ApiResult<CommandResult> {
        require_lease(ctx, &[Role::Agent], "report on leases")?;
        let detail = input.detail.as_deref().unwrap_or_default();
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let reason = input.reason.as_deref();
        let command =
            lease_input::report_failed(operation, reason, &input.message, detail).map_err(bad)?;
        owner_call(ctx, &input.lease_id, &input.operation_key, command).await
    }

    /// A restart or update finished (agent); fenced by `maintenanceId` and `admittedAt`.
    async fn report_lease_maintenance_completed(
        &self,
        ctx: &Context<'_>,
        input: ReportLeaseMaintenanceCompletedInput,
    ) -> ApiResult<CommandResult> {
        require_lease(ctx, &[Role::Agent], "report on leases")?;
        let maintenance_id = MaintenanceId(uuid_arg("maintenanceId", &input.maintenance_id)?);
        let command = LeaseCommand::CompleteMaintenance {
            maintenance_id,
            admitted_at: Some(input.admitted_at),
            outcome: lease_input::maintenance_outcome(input.success, input.error.as_deref()),
        };
        owner_call(ctx, &input.lease_id, &input.operation_key, command).await
    }

    /// Close a lease on the chain (operator).
    async fn close_lease(
        &self,
        ctx: &Context<'_>,
        input: LeaseOperationInput,
    ) -> ApiResult<CommandResult> {
        require(ctx, &[Role::Operator], "close leases")?;
        let command = LeaseCommand::Close { cause: CloseCause::Operator };
        owner_call(ctx, &input.lease_id, &input.operation_key, command).await
    }
}

/// The calling tenant, refused with `FORBIDDEN` ("may not `action`") for any other role.
fn tenant_caller(ctx: &Context<'_>, action: &str) -> ApiResult<Caller> {
    tenant_of(ctx, action)?;
    Ok(caller_of(crate::schema::caller(ctx)?, None))
}

/// An agent's or operator's command, for the lease's owner.
async fn owner_call(
    ctx: &Context<'_>,
    id: &ID,
    operation_key: &str,
    command: LeaseCommand,
) -> ApiResult<CommandResult> {
    let lease = lease_id("leaseId", id)?;
    let caller = caller_of(crate::schema::caller(ctx)?, None);
    answer(ctx, shared(ctx).leases.for_owner(&caller, operation_key, lease, command)).await
}

/// Keeps the manifest sealed for the dispatcher, before the command that names it: a backend
/// is only ever sent a manifest its tenant gave (by hash, the one the lease records).
async fn keep_manifest(
    ctx: &Context<'_>,
    caller: &leasehold_commands::lease_service::Caller,
    hash: &str,
    manifest: &str,
) -> ApiResult<()> {
    if let (Some(vault), Some(tenant)) = (&shared(ctx).manifests, &caller.tenant) {
        vault.put(tenant, hash, manifest.as_bytes()).await?;
    }
    Ok(())
}
