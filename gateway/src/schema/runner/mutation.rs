//! Mutations on runner leases, by role: a tenant's requests, assignments and releases of its
//! own leases; a runner node agent's registration, inventory and reports on the leases bound
//! to its node (another node's lease, like another tenant's, is `NOT_FOUND`), each stamped
//! with the epoch it read (`FENCED` otherwise); operators' forces and limits.
//!
//! A tenant's command applies to its lease as it stands: the gateway stamps it with the
//! lease's current epoch, which tenants never see (epochs fence machine actors' reports).

use async_graphql::{Context, ID, Object};
use leasehold_commands::CommandError;
use leasehold_commands::runner_service::{
    HolderReport, RequestRunner, RunnerOutcome, Settlement, capacity_of,
};
use leasehold_domain::TenantId;
use leasehold_domain::runner::{
    GuestOs, InstanceRef, JobRef, JobRequestId, Outcome, Phase, ProviderKind, RunnerError,
    RunnerLease, RunnerLeaseId, RunnerResources, StartCommand, Teardown, Tier, TrustClass,
};
use leasehold_domain::runner_capacity::{RunnerLimits, TierLimit};
use leasehold_domain::runner_node::Registration;
use leasehold_domain::values::{FieldError, Reason};

use super::types::{
    AssignRunnerJobInput, ForceRunnerReleaseInput, RegisterRunnerNodeInput,
    ReleaseRunnerLeaseInput, RequestRunnerLeaseInput, RunnerInventoryInput, RunnerReportInput,
    SetRunnerLimitsInput,
};
use super::{node_agent, runners};
use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, tenant_of};

/// The runner lease's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct RunnerMutation;

/// Answers a runner lease command's result.
async fn answer(
    ctx: &Context<'_>,
    lease: RunnerLeaseId,
    run: impl std::future::Future<Output = Result<RunnerOutcome, CommandError<RunnerError>>>,
) -> ApiResult<CommandResult> {
    // Boxed: a resolver's future is part of the mutation root's (see the rental's).
    let run = Box::pin(run);
    answer_on(ctx, lease.0.to_string(), async { run.await.map(|done| done.outcome) }).await
}

fn field<T>(parsed: Result<T, FieldError>) -> ApiResult<T> {
    parsed.map_err(ApiError::from_field)
}

fn lease_arg(id: &ID) -> ApiResult<RunnerLeaseId> {
    Ok(RunnerLeaseId(uuid_arg("leaseId", id)?))
}

fn leases_arg(name: &str, ids: &[ID]) -> ApiResult<Vec<RunnerLeaseId>> {
    ids.iter()
        .enumerate()
        .map(|(index, id)| Ok(RunnerLeaseId(uuid_arg(&format!("{name}[{index}]"), id)?)))
        .collect()
}

fn each<T>(
    name: &str,
    texts: &[String],
    parse: fn(&str, &str) -> Result<T, FieldError>,
) -> ApiResult<Vec<T>> {
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| field(parse(&format!("{name}[{index}]"), text)))
        .collect()
}

fn outcome_arg(outcome: &str, reason: Option<&str>) -> ApiResult<(Outcome, Option<Reason>)> {
    let outcome = field(Outcome::parse("outcome", outcome))?;
    let reason = reason.map(|reason| field(Reason::parse("reason", reason))).transpose()?;
    Ok((outcome, reason))
}

/// The ask of `requestRunnerLease`, checked.
fn ask_of(input: RequestRunnerLeaseInput) -> ApiResult<RequestRunner> {
    let resources = input.resources;
    Ok(RequestRunner {
        tier: field(Tier::parse("tier", input.tier.as_str()))?,
        trust: field(TrustClass::parse("trust", &input.trust))?,
        guest_os: field(GuestOs::parse("guestOs", &input.guest_os))?,
        resources: field(RunnerResources::new("resources", resources.vcpu, resources.memory_mb))?,
        providers: each("providers", &input.providers, ProviderKind::parse)?,
        command: field(StartCommand::parse("command", input.command))?,
        ttl_seconds: input.ttl_seconds,
    })
}

/// A tenant's command on its lease, stamped with the epoch the gateway read: a reap or a
/// node's re-registration in between is `FENCED` without the epochs, which tenants never see.
async fn tenant_answer(
    ctx: &Context<'_>,
    lease: RunnerLeaseId,
    run: impl std::future::Future<Output = Result<RunnerOutcome, CommandError<RunnerError>>>,
) -> ApiResult<CommandResult> {
    let outcome = Box::pin(run).await;
    if let Err(CommandError::Refused(RunnerError::Fenced { .. })) = &outcome {
        return Err(ApiError::new(
            crate::errors::Code::Fenced,
            "the lease moved on while this was decided (it was reaped, or its node registered \
             again): read it and try again",
        ));
    }
    answer(ctx, lease, async { outcome }).await
}

/// The caller's own lease as stored now (another tenant's is `NOT_FOUND`).
async fn own_lease(
    ctx: &Context<'_>,
    tenant: &TenantId,
    lease: RunnerLeaseId,
) -> ApiResult<RunnerLease> {
    let (owner, stored) = Box::pin(runners(ctx).owned(lease)).await?;
    if &owner != tenant {
        return Err(ApiError::not_found("runner lease"));
    }
    Ok(stored)
}

/// A node agent's report on a lease bound to its node (any other is `NOT_FOUND`).
async fn node_report(
    ctx: &Context<'_>,
    input: &RunnerReportInput,
    report: HolderReport,
) -> ApiResult<CommandResult> {
    let (node, caller) = node_agent(ctx, "report on runner leases")?;
    let lease = lease_arg(&input.lease_id)?;
    let (owner, stored) = Box::pin(runners(ctx).owned(lease)).await?;
    if stored.node.as_ref() != Some(node) {
        return Err(ApiError::not_found("runner lease"));
    }
    let key = input.operation_key.as_str();
    answer(ctx, lease, runners(ctx).report(&caller, key, (owner, lease), report)).await
}

#[Object]
impl RunnerMutation {
    /// Requests a runner lease (its id minted from your operation key). Nothing is charged
    /// until its job is assigned. An unknown trust class or an empty command is
    /// `BAD_USER_INPUT`.
    async fn request_runner_lease(
        &self,
        ctx: &Context<'_>,
        input: RequestRunnerLeaseInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "request runner leases")?;
        let key = input.operation_key.clone();
        let ask = ask_of(input)?;
        let caller = caller_of(principal, None);
        let requested = Box::pin(runners(ctx).request(&caller, &key, &ask)).await?;
        let lease = requested.lease;
        answer(ctx, lease, async { Ok(requested) }).await
    }

    /// Assigns one of your leases its job, charging your runner capacity in the same append
    /// (`QUOTA_EXCEEDED` when it has no room). The same job again is success; another job, or
    /// a job another lease holds, is `CONFLICT`.
    async fn assign_runner_job(
        &self,
        ctx: &Context<'_>,
        input: AssignRunnerJobInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "assign runner jobs")?;
        let tenant = tenant_of(ctx, "assign runner jobs")?;
        let lease = lease_arg(&input.lease_id)?;
        let job = JobRef {
            request: JobRequestId(uuid_arg("requestId", &input.request_id)?),
            run: input.run_id,
        };
        let epoch = own_lease(ctx, tenant, lease).await?.epoch;
        let caller = caller_of(principal, None);
        let key = input.operation_key.as_str();
        tenant_answer(ctx, lease, runners(ctx).assign(&caller, key, (lease, epoch, job))).await
    }

    /// Releases one of your leases with its outcome: the same outcome again is success,
    /// another is `CONFLICT`. A lease that may hold compute goes to teardown, still charged
    /// until its compute is confirmed gone.
    async fn release_runner_lease(
        &self,
        ctx: &Context<'_>,
        input: ReleaseRunnerLeaseInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "release runner leases")?;
        let tenant = tenant_of(ctx, "release runner leases")?;
        let lease = lease_arg(&input.lease_id)?;
        let released = outcome_arg(&input.outcome, input.reason.as_deref())?;
        let epoch = own_lease(ctx, tenant, lease).await?.epoch;
        let caller = caller_of(principal, None);
        let key = input.operation_key.as_str();
        let run = runners(ctx).release(&caller, key, (tenant.clone(), lease, epoch), released);
        tenant_answer(ctx, lease, run).await
    }

    /// Your node registers (again): a new node epoch, and every lease bound to it moves to a
    /// new epoch of its own. `inventory` null means you do not know what you hold.
    async fn register_runner_node(
        &self,
        ctx: &Context<'_>,
        input: RegisterRunnerNodeInput,
    ) -> ApiResult<CommandResult> {
        let (node, caller) = node_agent(ctx, "register runner nodes")?;
        let registration = Registration {
            node: node.clone(),
            provider: field(ProviderKind::parse("provider", &input.provider))?,
            guest_os: each("guestOs", &input.guest_os, GuestOs::parse)?,
            accepts: each("accepts", &input.accepts, TrustClass::parse)?,
            vcpu: input.vcpu,
            memory_mb: input.memory_mb,
        };
        let inventory =
            input.inventory.as_deref().map(|ids| leases_arg("inventory", ids)).transpose()?;
        let id = leasehold_commands::runner_service::node_of(node).0.to_string();
        let key = input.operation_key.as_str();
        let run = runners(ctx).register_node(&caller, key, (registration, inventory));
        answer_on(ctx, id, Box::pin(run)).await
    }

    /// Your node's inventory from a sweep, under the registration it was taken in (`FENCED`
    /// for an earlier one). A quarantined lease of your node missing from it is settled once
    /// past the grace.
    async fn report_runner_inventory(
        &self,
        ctx: &Context<'_>,
        input: RunnerInventoryInput,
    ) -> ApiResult<CommandResult> {
        let (node, caller) = node_agent(ctx, "report runner inventories")?;
        let leases = leases_arg("leases", &input.leases)?;
        let id = leasehold_commands::runner_service::node_of(node).0.to_string();
        let key = input.operation_key.as_str();
        let run = runners(ctx).report_inventory(&caller, key, (node, input.node_epoch, leases));
        answer_on(ctx, id, Box::pin(run)).await
    }

    /// Your node's provider created a lease's instance (its handle at the provider).
    async fn report_runner_instance(
        &self,
        ctx: &Context<'_>,
        input: RunnerReportInput,
        instance_id: String,
    ) -> ApiResult<CommandResult> {
        let instance = field(InstanceRef::parse("instanceId", instance_id.as_str()))?;
        let report = HolderReport::Instance { epoch: input.epoch, instance };
        node_report(ctx, &input, report).await
    }

    /// A lease's runner is `online`, `busy` (running its job) or in your node's `custody`.
    async fn report_runner_phase(
        &self,
        ctx: &Context<'_>,
        input: RunnerReportInput,
        phase: String,
    ) -> ApiResult<CommandResult> {
        let phase = match phase.as_str() {
            "online" => Phase::Online,
            "busy" => Phase::Busy,
            "custody" => Phase::Custody,
            _ => return Err(ApiError::bad_input("phase: one of online, busy, custody")),
        };
        node_report(ctx, &input, HolderReport::Phase { epoch: input.epoch, phase }).await
    }

    /// A lease's runner is alive: its expiry moves on.
    async fn report_runner_heartbeat(
        &self,
        ctx: &Context<'_>,
        input: RunnerReportInput,
    ) -> ApiResult<CommandResult> {
        node_report(ctx, &input, HolderReport::Heartbeat { epoch: input.epoch }).await
    }

    /// What your provider's destroy of a lease's instance proved: `requested` (asked to go,
    /// still charged) or `stopped` (confirmed gone: its capacity is released).
    async fn report_runner_teardown(
        &self,
        ctx: &Context<'_>,
        input: RunnerReportInput,
        teardown: String,
    ) -> ApiResult<CommandResult> {
        let teardown = field(Teardown::parse("teardown", &teardown))?;
        node_report(ctx, &input, HolderReport::Teardown { epoch: input.epoch, teardown }).await
    }

    /// A lease's job ended on your node: its outcome (the same again is success, another
    /// `CONFLICT`).
    async fn report_runner_outcome(
        &self,
        ctx: &Context<'_>,
        input: RunnerReportInput,
        outcome: String,
        reason: Option<String>,
    ) -> ApiResult<CommandResult> {
        let (node, caller) = node_agent(ctx, "report on runner leases")?;
        let released = outcome_arg(&outcome, reason.as_deref())?;
        let lease = lease_arg(&input.lease_id)?;
        let (owner, stored) = Box::pin(runners(ctx).owned(lease)).await?;
        if stored.node.as_ref() != Some(node) {
            return Err(ApiError::not_found("runner lease"));
        }
        let key = input.operation_key.as_str();
        let run = runners(ctx).release(&caller, key, (owner, lease, input.epoch), released);
        answer(ctx, lease, run).await
    }

    /// Takes a lease out of custody, teardown or quarantine on your word that its compute is
    /// gone (operators), recorded as such.
    async fn force_runner_release(
        &self,
        ctx: &Context<'_>,
        input: ForceRunnerReleaseInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Operator], "force runner releases")?;
        let lease = lease_arg(&input.lease_id)?;
        let (owner, _) = Box::pin(runners(ctx).owned(lease)).await?;
        let caller = caller_of(principal, None);
        let key = input.operation_key.as_str();
        let settlement = Settlement::Force { detail: input.detail };
        answer(ctx, lease, runners(ctx).settle(&caller, key, (owner, lease), settlement)).await
    }

    /// Sets a tenant's runner capacity (operators): an event on its capacity stream.
    async fn set_runner_limits(
        &self,
        ctx: &Context<'_>,
        input: SetRunnerLimitsInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Operator], "set runner limits")?;
        let tenant = crate::schema::query::tenant_arg(&input.tenant_id)?;
        let mut tiers = Vec::with_capacity(input.tiers.len());
        for (index, limit) in input.tiers.iter().enumerate() {
            let tier = field(Tier::parse(&format!("tiers[{index}].tier"), limit.tier.as_str()))?;
            if tiers.iter().any(|known: &TierLimit| known.tier == tier) {
                return Err(ApiError::bad_input(format!("tiers[{index}].tier: listed twice")));
            }
            tiers.push(TierLimit { tier, max: limit.max });
        }
        let limits = RunnerLimits {
            vcpu: input.vcpu,
            memory_mb: input.memory_mb,
            tiers,
            macos_slots: input.macos_slots,
        };
        let caller = caller_of(principal, None);
        let id = capacity_of(&tenant).0.to_string();
        let key = input.operation_key.as_str();
        let run = runners(ctx).set_limits(&caller, key, (&tenant, limits));
        answer_on(ctx, id, Box::pin(run)).await
    }
}
