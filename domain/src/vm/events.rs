//! The VM's stored events. No credential, startup script or guest file content ever enters
//! one: Create carries only the reference to the VM's encrypted credentials. What a tenant
//! sees of each event is declared in [`KIND`], leaf by leaf; the placement decision's
//! figures (candidates, headroom) describe the fleet, not the VM, and are withheld.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::moves::CopyKind;
use super::values::{CredentialRef, Placement, VmSpec, VmUrl};
use super::{DestroyReason, StrikeReason};
use crate::registry::{AggregateKind, EventView};
use crate::values::fleet::{HostId, TaskId, VmId};
use crate::values::{OperationId, OperatorDetail, Reason, TenantMessage};

/// Everything that can happen to a VM and its task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum VmEvent {
    /// A tenant created the VM for a task.
    VmProvisioning {
        vm: VmId,
        task: TaskId,
        spec: Box<VmSpec>,
        credentials: CredentialRef,
        at: DateTime<Utc>,
    },
    /// The task was given its VM.
    TaskAssigned { task: TaskId, at: DateTime<Utc> },
    /// The VM was placed on a host (whose room it holds, in the same append), and its boot
    /// started.
    VmScheduled { placement: Placement, operation: OperationId, generation: u64, at: DateTime<Utc> },
    /// It booted.
    VmRunning { url: VmUrl, at: DateTime<Utc> },
    /// Its task started running.
    TaskRunning { at: DateTime<Utc> },
    /// Its boot failed; its room was given back.
    VmProvisionFailed {
        reason: Reason,
        message: TenantMessage,
        detail: OperatorDetail,
        at: DateTime<Utc>,
    },
    /// Its task ended without completing.
    TaskFailed { reason: Reason, at: DateTime<Utc> },
    /// Its task completed.
    TaskCompleted { at: DateTime<Utc> },
    /// It takes no new work.
    VmDraining { at: DateTime<Utc> },
    /// Its destroy started.
    VmDestroying {
        reason: DestroyReason,
        operation: OperationId,
        generation: u64,
        at: DateTime<Utc>,
    },
    /// Its host's agent confirmed it gone; its room was given back.
    VmRemoved { at: DateTime<Utc> },
    /// A reconcile found it stuck or idle.
    VmStruck { reason: StrikeReason, strikes: u32, at: DateTime<Utc> },
    /// A reconcile found it fine again.
    VmStrikesCleared { at: DateTime<Utc> },
    /// A recovery lookup found it (`running`) or did not (`missing`).
    VmRecovered { running: bool, at: DateTime<Utc> },
    /// It was used.
    VmActive { at: DateTime<Utc> },
    /// It is a copy of `source`: a fork, or a migration (`live`, `lazy` as asked; both false
    /// for a fork).
    VmCopied {
        source: VmId,
        kind: CopyKind,
        live: bool,
        lazy: bool,
        since: Option<DateTime<Utc>>,
        at: DateTime<Utc>,
    },
    /// It was forked (`fork` is the copy); it runs on as it was.
    VmForked { fork: VmId, at: DateTime<Utc> },
    /// Its migration to `target` started (`to` is the copy).
    VmMigrating { to: VmId, target: HostId, live: bool, lazy: bool, at: DateTime<Utc> },
    /// Its migration's copy booted (its task moved there); it is destroyed next.
    VmMigrated { to: VmId, at: DateTime<Utc> },
    /// Its migration's copy failed; it runs on, untouched.
    VmMigrationAbandoned { to: VmId, at: DateTime<Utc> },
}

crate::tagged_events!(VmEvent {
    VmProvisioning,
    TaskAssigned,
    VmScheduled,
    VmRunning,
    TaskRunning,
    VmProvisionFailed,
    TaskFailed,
    TaskCompleted,
    VmDraining,
    VmDestroying,
    VmRemoved,
    VmStruck,
    VmStrikesCleared,
    VmRecovered,
    VmActive,
    VmCopied,
    VmForked,
    VmMigrating,
    VmMigrated,
    VmMigrationAbandoned,
});

/// The spec's leaves a tenant sees (its own VM's spec, all of it but nothing new).
const SPEC: &[&str] = &[
    "vm",
    "task",
    "spec.cpus",
    "spec.ram_mb",
    "spec.storage_gb",
    "spec.region",
    "spec.arch",
    "spec.gpus",
    "spec.gpu_kind",
    "spec.gpu_profile",
    "spec.pin",
    "spec.labels[].key",
    "spec.labels[].value",
    "spec.max_runtime_seconds",
    "spec.idle_timeout_seconds",
    "spec.image",
    "spec.seed",
    "spec.resume_seed",
    "spec.huge_pages",
    "spec.egress_proxy",
    "spec.startup_script_timeout_seconds",
    "spec.guest_files[]",
    "spec.expose[].port",
    "spec.expose[].name",
    "spec.expose[].protocol",
    "at",
];

/// The VM kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "vm",
    events: &[
        view("VmProvisioning", SPEC, &["credentials"]),
        view("TaskAssigned", &["task", "at"], &[]),
        view(
            "VmScheduled",
            &["placement.host", "placement.policy", "at"],
            &[
                "placement.candidates",
                "placement.headroom_cpus",
                "placement.headroom_ram_mb",
                "placement.artifact_local",
                "placement.retries",
                "operation",
                "generation",
            ],
        ),
        view("VmRunning", &["url", "at"], &[]),
        view("TaskRunning", AT, &[]),
        view("VmProvisionFailed", &["reason", "message", "at"], &["detail"]),
        view("TaskFailed", &["reason", "at"], &[]),
        view("TaskCompleted", AT, &[]),
        view("VmDraining", AT, &[]),
        view("VmDestroying", &["reason", "at"], &["operation", "generation"]),
        view("VmRemoved", AT, &[]),
        view("VmStruck", &["reason", "strikes", "at"], &[]),
        view("VmStrikesCleared", AT, &[]),
        view("VmRecovered", &["running", "at"], &[]),
        view("VmActive", AT, &[]),
        view("VmCopied", &["source", "kind", "live", "lazy", "since", "at"], &[]),
        view("VmForked", &["fork", "at"], &[]),
        view("VmMigrating", &["to", "target", "live", "lazy", "at"], &[]),
        view("VmMigrated", &["to", "at"], &[]),
        view("VmMigrationAbandoned", &["to", "at"], &[]),
    ],
};

const AT: &[&str] = &["at"];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
