//! The VM's GraphQL types.

use async_graphql::{ID, InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::VmSummary;

/// A VM as its tenant sees it. Never its credentials, their reference, its operations or
/// operator detail.
#[derive(Debug, Clone, SimpleObject)]
pub struct Vm {
    /// Its id.
    pub id: ID,
    /// The task it runs (one VM per task).
    pub task_id: String,
    /// `provisioning`, `running`, `draining`, `destroying`, `destroyed` or `failed`.
    pub state: String,
    /// Its task: `assigned`, `running`, `completed`, `failed` or `moved` (with its migration).
    pub task_state: Option<String>,
    /// The host it is placed on.
    pub host_id: Option<String>,
    /// Where it is reached, once running.
    pub url: Option<String>,
    /// What was asked of it.
    pub spec: Json<serde_json::Value>,
    /// Why its boot failed (tenant-safe).
    pub reason: Option<String>,
    /// What went wrong, for you (tenant-safe).
    pub message: Option<String>,
    /// Why it is being destroyed.
    pub destroy_reason: Option<String>,
    /// When it was created.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
    /// The VM it is a copy of (a fork's or a migration's source).
    pub copied_from: Option<ID>,
    /// `fork` or `migration`, for a copy.
    pub copy_kind: Option<String>,
    /// The copy it is migrating to, while its migration is in flight.
    pub migrating_to: Option<ID>,
}

impl From<VmSummary> for Vm {
    fn from(vm: VmSummary) -> Self {
        Self {
            id: ID(vm.vm_id.to_string()),
            task_id: vm.task_id,
            state: vm.state,
            task_state: vm.task_state,
            host_id: vm.host_id,
            url: vm.url,
            spec: Json(vm.spec),
            reason: vm.reason,
            message: vm.message,
            destroy_reason: vm.destroy_reason,
            created_at: vm.created_at,
            updated_at: vm.updated_at,
            copied_from: vm.copied_from.map(|id| ID(id.to_string())),
            copy_kind: vm.copy_kind,
            migrating_to: vm.migrating_to.map(|id| ID(id.to_string())),
        }
    }
}

/// Something the fleet's reconcilers gave up on or tore down (operators).
#[derive(Debug, Clone, SimpleObject)]
pub struct DeadLetter {
    /// `stuck_task`, `idle_timeout` or `orphan_destroy`.
    pub kind: String,
    /// The VM (or orphan) it is about.
    pub entity_id: String,
    /// Its task.
    pub task_id: Option<String>,
    /// Why.
    pub reason: String,
    /// How many times it happened.
    pub retry_count: i32,
    /// What else is known (tenant, host, generation).
    pub payload: Json<serde_json::Value>,
    /// When it first happened.
    pub first_seen: DateTime<Utc>,
    /// When it last happened.
    pub last_seen: DateTime<Utc>,
}

impl From<leasehold_adapters::read_models::DeadLetter> for DeadLetter {
    fn from(letter: leasehold_adapters::read_models::DeadLetter) -> Self {
        Self {
            kind: letter.kind,
            entity_id: letter.entity_id,
            task_id: letter.task_id,
            reason: letter.reason,
            retry_count: letter.retry_count,
            payload: Json(letter.payload),
            first_seen: letter.first_seen,
            last_seen: letter.last_seen,
        }
    }
}

/// Which VMs to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct VmFilter {
    /// Only VMs in this state.
    pub state: Option<String>,
}

/// A placement label (a host's, or a VM's selector).
#[derive(Debug, Clone, InputObject)]
pub struct LabelInput {
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// A port a VM publishes.
#[derive(Debug, Clone, InputObject)]
pub struct ExposeInput {
    /// The guest's port.
    pub port: i64,
    /// Its name.
    #[graphql(name = "as")]
    pub name: String,
    /// `tcp` (default) or `udp`.
    pub protocol: Option<String>,
}

/// `createVm`.
#[derive(Debug, Clone, InputObject)]
pub struct CreateVmInput {
    /// Your idempotency key: a retry with the same key and input answers the first result.
    pub operation_key: String,
    /// The task the VM runs (one VM per task).
    pub task_id: String,
    /// vCPUs.
    pub cpus: i64,
    /// RAM in MiB.
    pub ram_mb: i64,
    /// Disk in GiB.
    pub storage_gb: i64,
    /// A region.
    pub region: Option<String>,
    /// Only hosts of this architecture (`amd64`, `arm64`).
    pub arch: Option<String>,
    /// Whole GPUs, or MIG instances with `gpuProfile`.
    pub gpus: Option<i64>,
    /// The GPU model.
    pub gpu_kind: Option<String>,
    /// A MIG profile (`1g.10gb`).
    pub gpu_profile: Option<String>,
    /// The host it must run on (a hard gate).
    pub host_id: Option<String>,
    /// Every label must be among the host's.
    pub labels: Option<Vec<LabelInput>>,
    /// Seconds after which a running VM counts as stuck (default: the fleet's, 2 h).
    pub max_runtime_seconds: Option<i64>,
    /// Seconds without activity after which it counts as idle.
    pub idle_timeout_seconds: Option<i64>,
    /// A base image (never with a seed snapshot).
    pub image: Option<String>,
    /// One of your ready snapshots to boot from instead of an image (its id, or its host
    /// store's reference). Unpinned, the VM goes where the gates and the policy say, a host
    /// already holding the snapshot breaking a tie, and the chosen host's agent pulls it from
    /// a holder first when it has none (the snapshot must have a digest).
    pub seed_snapshot_id: Option<String>,
    /// Guest memory on 2 MiB pages.
    pub huge_pages: Option<bool>,
    /// The egress proxy provider (none: direct).
    pub egress_proxy: Option<String>,
    /// How long its startup script may run, in seconds.
    pub startup_script_timeout_seconds: Option<i64>,
    /// Where its guest files go (never under `/fuse`).
    pub guest_files: Option<Vec<String>>,
    /// Ports it publishes.
    pub expose: Option<Vec<ExposeInput>>,
    /// Secrets for the VM, by name: kept sealed apart from the log, never in an event, a read
    /// model, a log line or an answer; a retry keeps the first ones.
    pub secrets: Option<Vec<SecretInput>>,
}

/// One secret of a VM.
#[derive(Debug, Clone, InputObject)]
pub struct SecretInput {
    /// Its name.
    pub name: String,
    /// Its value.
    #[graphql(secret)]
    pub value: String,
}

/// A command on one of your VMs that needs nothing else.
#[derive(Debug, Clone, InputObject)]
pub struct VmOperationInput {
    /// The VM.
    pub vm_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A host agent's report on one operation of a VM of its host.
#[derive(Debug, Clone, InputObject)]
pub struct VmReportInput {
    /// The VM.
    pub vm_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
    /// The operation reported on (a report on a superseded one is `FENCED`).
    pub operation_id: ID,
    /// Where the VM is reached (a boot report).
    pub url: Option<String>,
    /// Why it failed (a failure report): a tenant-safe reason (`BootFailed`).
    pub reason: Option<String>,
    /// A tenant-safe message (a failure report).
    pub message: Option<String>,
    /// Operator detail (a failure report), never shown to the tenant.
    pub detail: Option<String>,
}

/// Forks one of your running VMs.
#[derive(Debug, Clone, InputObject)]
pub struct ForkVmInput {
    /// The VM to fork (running, no GPU).
    pub vm_id: ID,
    /// The fork's own task (one VM per task).
    pub task_id: String,
    /// Your idempotency key.
    pub operation_key: String,
}

/// Migrates one of your running VMs.
#[derive(Debug, Clone, InputObject)]
pub struct MigrateVmInput {
    /// The VM to migrate (running, no GPU).
    pub vm_id: ID,
    /// The host to move it to; none: a host of its backend other than its own.
    pub target_host_id: Option<String>,
    /// Carry the guest's memory across (never falls back to a cold move).
    pub live: Option<bool>,
    /// Resume before the memory has arrived (needs live and a VM booted with huge pages).
    pub lazy: Option<bool>,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A fork's or a migration's answer: the copy, and the source's command.
#[derive(Debug, Clone, SimpleObject)]
pub struct VmCopyResult {
    /// The copy: a VM of its own, provisioning.
    pub copy_id: ID,
    /// The command on the source (`VmForked`, `VmMigrating`), whose cursor also covers the
    /// copy's creation.
    pub source: crate::schema::command::CommandResult,
}
