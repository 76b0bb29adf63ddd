//! Mutations on VMs: tenants create, drain, destroy and complete theirs; a host's agent
//! reports on the VMs of its own host (its token names the host), fenced by the operation.

use async_graphql::{Context, Object};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::vm_input::{self, VmInput};
use leasehold_commands::vm_service::MigrateOptions;
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{BootFailure, Found, VmUrl};

use super::types::{
    CreateVmInput, ForkVmInput, MigrateVmInput, VmCopyResult, VmOperationInput, VmReportInput,
};
use crate::auth::Role;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on, caller_of};
use crate::schema::query::uuid_arg;
use crate::schema::{require, shared, tenant_of};

/// The VM's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct VmMutation;

fn input_of(input: CreateVmInput) -> VmInput {
    VmInput {
        task_id: input.task_id,
        cpus: input.cpus,
        ram_mb: input.ram_mb,
        storage_gb: input.storage_gb,
        region: input.region,
        arch: input.arch,
        gpus: input.gpus.unwrap_or(0),
        gpu_kind: input.gpu_kind,
        gpu_profile: input.gpu_profile,
        host_id: input.host_id,
        labels: input.labels.unwrap_or_default().into_iter().map(|l| (l.key, l.value)).collect(),
        max_runtime_seconds: input.max_runtime_seconds,
        idle_timeout_seconds: input.idle_timeout_seconds,
        image: input.image,
        seed_snapshot_id: input.seed_snapshot_id,
        resume_seed: false,
        huge_pages: input.huge_pages.unwrap_or(false),
        egress_proxy: input.egress_proxy,
        startup_script_timeout_seconds: input.startup_script_timeout_seconds,
        guest_files: input.guest_files.unwrap_or_default(),
        expose: input
            .expose
            .unwrap_or_default()
            .into_iter()
            .map(|port| (port.port, port.name, port.protocol))
            .collect(),
    }
}

/// A VM's secrets by name: names unique, at most 64, values at most 64 KiB.
fn secrets_of(
    secrets: Vec<super::types::SecretInput>,
) -> ApiResult<std::collections::BTreeMap<String, String>> {
    if secrets.len() > 64 {
        return Err(ApiError::bad_input("secrets: at most 64"));
    }
    let mut named = std::collections::BTreeMap::new();
    for (n, secret) in secrets.into_iter().enumerate() {
        let bad_name = secret.name.is_empty()
            || secret.name.len() > 128
            || !secret.name.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
        if bad_name {
            return Err(ApiError::bad_input(format!(
                "secrets[{n}].name: 1-128 letters, digits, '.', '_' or '-'"
            )));
        }
        if secret.value.len() > 64 * 1024 {
            return Err(ApiError::bad_input(format!("secrets[{n}].value: at most 64 KiB")));
        }
        if named.insert(secret.name, secret.value).is_some() {
            return Err(ApiError::bad_input(format!("secrets[{n}].name: repeated")));
        }
    }
    Ok(named)
}

/// A copy's answer: its id, and the source's command result.
async fn copy_result(
    ctx: &Context<'_>,
    source: VmId,
    copied: leasehold_commands::vm_service::VmOutcome,
) -> ApiResult<VmCopyResult> {
    let outcome = copied.outcome;
    let result = answer_on::<leasehold_domain::vm::VmError>(ctx, source.0.to_string(), async {
        Ok(outcome)
    })
    .await?;
    Ok(VmCopyResult { copy_id: copied.vm.0.to_string().into(), source: result })
}

/// A host agent reporting on the VMs of its host: the host its token names, and it as a
/// caller of the VM service.
fn reporting_agent<'a>(ctx: &Context<'a>) -> ApiResult<(&'a HostId, Caller)> {
    let principal = require(ctx, &[Role::Agent], "report on VMs")?;
    let host = principal.host.as_ref().ok_or_else(|| ApiError::forbidden("report on VMs"))?;
    Ok((host, caller_of(principal, None)))
}

#[Object]
impl VmMutation {
    /// Creates a VM for a task, placed on a host of the fleet that fits it (its room is held
    /// in the same append). No host fitting is `INVALID_STATE`, naming the gate.
    async fn create_vm(&self, ctx: &Context<'_>, input: CreateVmInput) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "create VMs")?;
        tenant_of(ctx, "create VMs")?;
        let key = input.operation_key.clone();
        let secrets = secrets_of(input.secrets.clone().unwrap_or_default())?;
        let (task, spec) = vm_input::vm(&input_of(input)).map_err(ApiError::from_field)?;
        let caller = caller_of(principal, None);
        let created = shared(ctx).vms.create(&caller, &key, (&task, spec), &secrets).await?;
        answer_on::<leasehold_domain::vm::VmError>(ctx, created.vm.0.to_string(), async {
            Ok(created.outcome)
        })
        .await
    }

    /// Destroys one of your VMs (idempotent). Its host's room is held until the host's agent
    /// confirms the VM gone.
    async fn destroy_vm(
        &self,
        ctx: &Context<'_>,
        input: VmOperationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "destroy VMs")?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let caller = caller_of(principal, None);
        let run = shared(ctx).vms.destroy(&caller, &input.operation_key, vm);
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// Forks one of your running VMs (no GPU): the fork, a VM of its own for `taskId` with new
    /// credentials (and the source's secrets), boots on the source's host from a snapshot of
    /// it; the source runs on as it was. No room on that host is `INVALID_STATE`, naming the
    /// gate.
    async fn fork_vm(&self, ctx: &Context<'_>, input: ForkVmInput) -> ApiResult<VmCopyResult> {
        let principal = require(ctx, &[Role::Tenant], "fork VMs")?;
        let source = VmId(uuid_arg("vmId", &input.vm_id)?);
        let task = leasehold_domain::values::fleet::TaskId::parse("taskId", &input.task_id)
            .map_err(ApiError::from_field)?;
        let caller = caller_of(principal, None);
        let forked = shared(ctx).vms.fork(&caller, &input.operation_key, source, &task).await?;
        copy_result(ctx, source, forked).await
    }

    /// Migrates one of your running VMs (no GPU) to `targetHostId`, or to a host of its backend
    /// other than its own: a copy (new credentials) boots there from a snapshot of it, and the
    /// VM is destroyed once the copy booted; if the copy fails the VM runs on untouched. A
    /// live migration needs another host and a backend that moves memory between hosts
    /// (none does yet: refused, never done cold); lazy needs live and huge pages.
    async fn migrate_vm(
        &self,
        ctx: &Context<'_>,
        input: MigrateVmInput,
    ) -> ApiResult<VmCopyResult> {
        let principal = require(ctx, &[Role::Tenant], "migrate VMs")?;
        let source = VmId(uuid_arg("vmId", &input.vm_id)?);
        let target = input
            .target_host_id
            .as_deref()
            .map(|host| HostId::parse("targetHostId", host))
            .transpose()
            .map_err(ApiError::from_field)?;
        let options = MigrateOptions {
            target,
            live: input.live.unwrap_or(false),
            lazy: input.lazy.unwrap_or(false),
        };
        let caller = caller_of(principal, None);
        let moved =
            shared(ctx).vms.migrate(&caller, &input.operation_key, source, &options).await?;
        copy_result(ctx, source, moved).await
    }

    /// Drains one of your running VMs: it takes no new work (there is no undrain).
    async fn drain_vm(
        &self,
        ctx: &Context<'_>,
        input: VmOperationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "drain VMs")?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let caller = caller_of(principal, None);
        let run = shared(ctx).vms.drain(&caller, &input.operation_key, vm);
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// Your VM's task is done: the VM is destroyed.
    async fn complete_vm_task(
        &self,
        ctx: &Context<'_>,
        input: VmOperationInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Tenant], "complete VM tasks")?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let caller = caller_of(principal, None);
        let run = shared(ctx).vms.complete_task(&caller, &input.operation_key, vm);
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// A host agent reports a VM of its host booted (`url`) or failed to (`reason`,
    /// `message`, `detail`): a failure gives the VM's room back.
    async fn report_vm_boot(
        &self,
        ctx: &Context<'_>,
        input: VmReportInput,
    ) -> ApiResult<CommandResult> {
        let (host, caller) = reporting_agent(ctx)?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let vms = &shared(ctx).vms;
        let key = input.operation_key.as_str();
        let run = async {
            match (&input.url, &input.reason) {
                (Some(url), None) => {
                    let url = VmUrl::parse("url", url.as_str()).map_err(ApiError::from_field)?;
                    Ok(vms.report_booted(&caller, host, key, vm, (operation, url)).await?)
                }
                (None, Some(reason)) => {
                    let failure = BootFailure {
                        reason: Reason::parse("reason", reason.as_str())
                            .map_err(ApiError::from_field)?,
                        message: TenantMessage::parse(
                            "message",
                            input.message.clone().unwrap_or_default(),
                        )
                        .map_err(ApiError::from_field)?,
                        detail: OperatorDetail::new(input.detail.as_deref().unwrap_or_default()),
                    };
                    Ok(vms.report_boot_failed(&caller, host, key, vm, (operation, failure)).await?)
                }
                _ => Err(ApiError::bad_input("url or reason: exactly one of them")),
            }
        };
        let done: Result<_, ApiError> = run.await;
        let outcome = done?.outcome;
        answer_on::<leasehold_domain::vm::VmError>(ctx, vm.0.to_string(), async { Ok(outcome) })
            .await
    }

    /// A host agent's recovery lookup of a VM of its host: `url` when it has it (a
    /// provisioning VM is then running), neither `url` nor anything else when it has not (a
    /// live VM is then destroyed as missing). Names the VM's current operation.
    async fn report_vm_lookup(
        &self,
        ctx: &Context<'_>,
        input: VmReportInput,
    ) -> ApiResult<CommandResult> {
        let (host, caller) = reporting_agent(ctx)?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        if input.reason.is_some() || input.message.is_some() || input.detail.is_some() {
            return Err(ApiError::bad_input(
                "a lookup takes a url, or nothing when the VM is gone",
            ));
        }
        let found = match input.url.as_deref() {
            Some(url) => {
                Found::Running { url: VmUrl::parse("url", url).map_err(ApiError::from_field)? }
            }
            None => Found::Missing,
        };
        let run =
            shared(ctx).vms.recover(&caller, host, &input.operation_key, vm, (operation, found));
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// A host agent reports a VM of its host used (an exec, an attach into it): a VM with an
    /// idle timeout is idle only that long after its last recorded use. Recorded at most once
    /// a minute (a report within it changes nothing).
    async fn report_vm_activity(
        &self,
        ctx: &Context<'_>,
        input: VmOperationInput,
    ) -> ApiResult<CommandResult> {
        let (host, caller) = reporting_agent(ctx)?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let run = shared(ctx).vms.record_activity(&caller, host, &input.operation_key, vm);
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }

    /// A host agent confirms a VM of its host gone after its destroy: its room is given back.
    async fn confirm_vm_removed(
        &self,
        ctx: &Context<'_>,
        input: VmReportInput,
    ) -> ApiResult<CommandResult> {
        let (host, caller) = reporting_agent(ctx)?;
        let vm = VmId(uuid_arg("vmId", &input.vm_id)?);
        let operation = OperationId(uuid_arg("operationId", &input.operation_id)?);
        let run =
            shared(ctx).vms.confirm_removed(&caller, host, &input.operation_key, (vm, operation));
        answer_on(ctx, vm.0.to_string(), async { run.await.map(|done| done.outcome) }).await
    }
}
