//! The VM read models: `vms` (each VM as its tenant sees it), `workloads` and the quota usage.
//!
//! The working view of a VM is the aggregate's own state, folded with its own `evolve`. The
//! `vms` row never holds the VM's credentials' reference, its operations or its boot
//! failure's operator detail: only the tenant-safe reason and message.

use chrono::{DateTime, Utc};
use leasehold_domain::values::fleet::VmId;
use leasehold_domain::vm::{Vm, VmEvent, VmOutcome, VmStatus};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};
use crate::shared::{QuotaDelta, WorkloadRow};

/// The workload kind of VMs in the unified listings.
pub const VM_KIND: &str = leasehold_domain::workload_quota::WorkloadKind::Vm.name();

/// Projects VM streams into the VM read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct VmProjection;

/// One VM's working state: its owner and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VmView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub vm: Vm,
}

/// A change to the VM read models.
#[derive(Debug, Clone, PartialEq)]
pub enum VmChange {
    /// Write every row derived from one VM's view.
    Put(Box<VmRows>),
    /// Resources a tenant holds began or stopped counting.
    Quota(QuotaDelta),
    /// A reconciler tore a VM down (stuck, idle): a dead letter for operators.
    DeadLetter(DeadLetterRow),
}

/// A row of `dead_letters` (operators only).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0014_fleet.sql.
pub struct DeadLetterRow {
    pub kind: &'static str,
    pub entity_id: String,
    pub task_id: Option<String>,
    pub reason: String,
    pub payload: serde_json::Value,
    pub at: DateTime<Utc>,
}

impl DeadLetterRow {
    /// An orphan (a VM a host's agent runs, a runner node's instance) whose destroy failed
    /// `attempts` times in a row, on the stream that keeps it (its host's, its node's).
    pub fn orphan(
        stream: &leasehold_domain::StreamId,
        name: &str,
        (attempts, detail): (u32, &leasehold_domain::values::OperatorDetail),
        at: DateTime<Utc>,
    ) -> Self {
        Self {
            kind: "orphan_destroy",
            entity_id: format!("{}/{name}", stream.as_str()),
            task_id: None,
            reason: format!("destroying it failed {attempts} times in a row"),
            payload: serde_json::json!({ "detail": detail.as_str(), "attempts": attempts }),
            at,
        }
    }
}

/// Every row derived from one VM's view.
#[derive(Debug, Clone, PartialEq)]
pub struct VmRows {
    /// The working state, kept for the next batch.
    pub view: VmView,
    /// `vms`.
    pub vm: VmRow,
    /// `workloads`.
    pub workload: WorkloadRow,
}

/// A row of `vms`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0014_fleet.sql.
pub struct VmRow {
    pub vm_id: Uuid,
    pub tenant_id: String,
    pub task_id: String,
    pub state: &'static str,
    pub task_state: Option<&'static str>,
    pub host_id: Option<String>,
    pub url: Option<String>,
    pub spec: serde_json::Value,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub destroy_reason: Option<&'static str>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// 0016_vm_copies.sql: the VM it is a copy of, how, and the copy it migrates to.
    pub copied_from: Option<Uuid>,
    pub copy_kind: Option<&'static str>,
    pub migrating_to: Option<Uuid>,
}

/// Revisions of what the VM projection derives from its view; its version adds the state's
/// schema, so a new `Vm::STATE_SCHEMA` rebuilds it.
/// 1: the copy columns (0016_vm_copies.sql).
// 2: a migrating VM counts once in the quota usage (its charge).
const ROWS_REVISION: u32 = 2;

impl Projection for VmProjection {
    const NAME: &'static str = "vm_views";
    const VERSION: u32 = ROWS_REVISION + Vm::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Vm::STREAM_TYPE];
    type Key = VmId;
    type View = VmView;
    type Change = VmChange;

    fn key(&self, event: &RecordedEvent) -> Option<VmId> {
        (event.stream_type.as_str() == Vm::STREAM_TYPE)
            .then(|| VmId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&VmView>,
        event: &RecordedEvent,
        changes: &mut Vec<VmChange>,
    ) -> Result<VmView, ProjectionError> {
        let decoded = crate::projection::decoded::<VmEvent>(Self::NAME, event)?;
        let before = view
            .cloned()
            .unwrap_or_else(|| VmView { tenant: event.tenant_id.clone(), vm: Vm::initial() });
        let after =
            VmView { tenant: before.tenant.clone(), vm: before.vm.clone().evolve(&decoded) };
        if let Some(delta) = quota_delta(&before, &after) {
            changes.push(VmChange::Quota(delta));
        }
        if let Some(letter) = dead_letter(&after, &decoded) {
            changes.push(VmChange::DeadLetter(letter));
        }
        Ok(after)
    }

    fn put(&self, _key: &VmId, view: &VmView) -> VmChange {
        VmChange::Put(Box::new(rows_of(view)))
    }
}

/// A VM torn down for being stuck or idle is a dead letter (fuse's `stuck_task`,
/// `idle_timeout`).
fn dead_letter(view: &VmView, event: &VmEvent) -> Option<DeadLetterRow> {
    use leasehold_domain::vm::DestroyReason;
    let VmEvent::VmDestroying { reason, at, generation, .. } = event else { return None };
    let (kind, why) = match reason {
        DestroyReason::Stuck => ("stuck_task", "running past its maximum runtime on two sweeps"),
        DestroyReason::Idle => ("idle_timeout", "idle past its timeout on two sweeps"),
        _ => return None,
    };
    let terms = view.vm.terms.as_ref()?;
    Some(DeadLetterRow {
        kind,
        entity_id: terms.id.to_string(),
        task_id: Some(terms.task.to_string()),
        reason: why.to_owned(),
        payload: serde_json::json!({
            "tenant": view.tenant.as_str(),
            "host": view.vm.host().map(ToString::to_string),
            "generation": generation,
        }),
        at: *at,
    })
}

/// A VM's state as its tenant reads it: a removed VM reads as how it ended.
pub fn state_name(vm: &Vm) -> &'static str {
    match (vm.status, vm.outcome) {
        (VmStatus::Removed, Some(VmOutcome::Failed)) => "failed",
        (VmStatus::Removed, _) => "destroyed",
        (status, _) => status.name(),
    }
}

/// What a VM holds of its tenant's quota: its charge (`Vm::charge`: while its host holds
/// room for it, a migration counted once).
fn held(view: &VmView) -> Vec<(String, i64)> {
    crate::shared::held_of(VM_KIND, view.vm.charge())
}

fn quota_delta(before: &VmView, after: &VmView) -> Option<QuotaDelta> {
    QuotaDelta::between(after.tenant.to_string(), VM_KIND, held(before), held(after))
}

/// Every row of one VM, from its view.
///
/// # Panics
/// When the view has no terms: a VM stream always starts with the event that sets them.
pub fn rows_of(view: &VmView) -> VmRows {
    let vm = &view.vm;
    let terms = vm.terms.as_ref().expect("a VM stream starts by setting its terms");
    let updated_at = vm.updated_at.unwrap_or(terms.created_at);
    let spec = serde_json::to_value(&terms.spec).expect("a spec serializes");
    let state = state_name(vm);
    let host = vm.host().map(ToString::to_string);
    let (reason, message) = match &vm.failure {
        Some(failure) => (Some(failure.reason.to_string()), Some(failure.message.to_string())),
        None => (None, None),
    };
    let spec_ref = &terms.spec;
    let items = serde_json::json!([
        { "sku": "vm.cpus", "quantity": spec_ref.cpus },
        { "sku": "vm.ram_mb", "quantity": spec_ref.ram_mb },
        { "sku": "vm.gpus", "quantity": spec_ref.gpus },
    ]);
    VmRows {
        view: view.clone(),
        vm: VmRow {
            vm_id: terms.id.0,
            tenant_id: view.tenant.to_string(),
            task_id: terms.task.to_string(),
            state,
            task_state: vm.task.map(task_name),
            host_id: host.clone(),
            url: vm.url.as_ref().map(ToString::to_string),
            spec,
            reason,
            message,
            destroy_reason: vm.destroy_reason.map(destroy_name),
            created_at: terms.created_at,
            updated_at,
            copied_from: vm.origin.map(|origin| origin.source().0),
            copy_kind: vm.origin.map(|origin| match origin {
                leasehold_domain::vm::VmOrigin::Fork { .. } => "fork",
                leasehold_domain::vm::VmOrigin::Migration { .. } => "migration",
            }),
            migrating_to: vm.migration.as_ref().map(|migration| migration.to.0),
        },
        workload: WorkloadRow {
            kind: VM_KIND,
            workload_id: terms.id.0,
            tenant_id: view.tenant.to_string(),
            status: state,
            backend_name: host,
            items,
            created_at: terms.created_at,
            updated_at,
        },
    }
}

fn task_name(task: leasehold_domain::vm::TaskStatus) -> &'static str {
    use leasehold_domain::vm::TaskStatus as T;
    match task {
        T::Assigned => "assigned",
        T::Running => "running",
        T::Completed => "completed",
        T::Failed => "failed",
        T::Moved => "moved",
    }
}

fn destroy_name(reason: leasehold_domain::vm::DestroyReason) -> &'static str {
    use leasehold_domain::vm::DestroyReason as D;
    match reason {
        D::Requested => "requested",
        D::TaskCompleted => "task_completed",
        D::Stuck => "stuck",
        D::Idle => "idle",
        D::Missing => "missing",
        D::Migrated => "migrated",
    }
}
