//! `decide` for the VM: the transition table of `vm.rs`, row by row.

use chrono::{DateTime, TimeDelta, Utc};

use super::moves::{self, migrating_to};
use super::{
    BootFailure, DestroyReason, Found, Placement, StrikeReason, Vm, VmCommand, VmError, VmEvent,
    VmFacts, VmOrigin, VmSpec, VmStatus, VmUrl,
};
use crate::aggregate::Context;
use crate::limits::VM_ACTIVITY_RECORD_SECONDS;
use crate::values::{FieldError, OperationId, Problem, Reason};

type Decision = Result<Vec<VmEvent>, VmError>;

pub(super) fn decide(vm: &Vm, command: &VmCommand, ctx: &Context<VmFacts>) -> Decision {
    use VmCommand as C;
    use VmStatus as S;
    let at = ctx.now;
    if vm.status == S::None && !matches!(command, C::Create { .. }) {
        return Err(VmError::NotFound);
    }
    if let Some(operation) = command.reported_operation() {
        if vm.status == S::Removed {
            return Ok(Vec::new());
        }
        if vm.operation != Some(operation) {
            return Err(VmError::Fenced);
        }
    }
    let invalid = || VmError::InvalidState { status: vm.status.name(), command: command.name() };
    // A source whose copy is booting: what would end or change it waits for the copy.
    if vm.migration.is_some() {
        match command {
            C::Drain | C::Destroy { .. } | C::CompleteTask { .. } => {
                return Err(VmError::InvalidState { status: "migrating", command: command.name() });
            }
            C::Strike { .. } | C::ClearStrikes => return Ok(Vec::new()),
            _ => {}
        }
    }
    match (vm.status, command) {
        (S::None, C::Create { vm: id, task, spec, credentials, placement, operation, origin }) => {
            check_create(spec, placement, &ctx.facts)?;
            if origin.is_some_and(|origin| origin.source() == *id) {
                return Err(VmError::BadSpec(FieldError::new(
                    "vm",
                    Problem::BadFormat { expected: "a copy of another VM than itself" },
                )));
            }
            let provisioning = VmEvent::VmProvisioning {
                vm: *id,
                task: task.clone(),
                spec: spec.clone(),
                credentials: *credentials,
                at,
            };
            let copied = origin.map(|origin: VmOrigin| origin.recorded(at));
            let scheduled = VmEvent::VmScheduled {
                placement: placement.clone(),
                operation: *operation,
                generation: vm.generation + 1,
                at,
            };
            let assigned = VmEvent::TaskAssigned { task: task.clone(), at };
            Ok([Some(provisioning), copied, Some(assigned), Some(scheduled)]
                .into_iter()
                .flatten()
                .collect())
        }
        (_, C::Create { .. }) => Err(VmError::TaskAlreadyAssigned),
        (_, C::Fork { fork }) => moves::fork(vm, *fork, at),
        (_, C::Migrate { request }) => moves::migrate(vm, request, at),
        (S::Running | S::Draining, C::FinishMigration { to, operation })
            if migrating_to(vm, *to) =>
        {
            let destroy = destroying(vm, DestroyReason::Migrated, *operation, at);
            Ok([vec![VmEvent::VmMigrated { to: *to, at }], destroy].concat())
        }
        (_, C::FinishMigration { .. }) => Ok(Vec::new()),
        (_, C::AbandonMigration { to }) if migrating_to(vm, *to) => {
            Ok(vec![VmEvent::VmMigrationAbandoned { to: *to, at }])
        }
        (_, C::AbandonMigration { .. }) => Ok(Vec::new()),
        (S::Provisioning, C::ReportBooted { url, .. }) => Ok(booted(url, at)),
        (S::Running | S::Draining, C::ReportBooted { .. }) => Ok(Vec::new()),
        (S::Provisioning, C::ReportBootFailed { failure, .. }) => Ok(boot_failed(vm, failure, at)),
        (S::Running, C::Drain) => Ok(vec![VmEvent::VmDraining { at }]),
        (S::Draining, C::Drain) => Ok(Vec::new()),
        (S::Running | S::Draining, C::Destroy { operation }) => {
            let reason = Reason::parse("reason", "ForceDestroyed").expect("a valid reason");
            let mut events = destroying(vm, DestroyReason::Requested, *operation, at);
            events.push(VmEvent::TaskFailed { reason, at });
            Ok(events)
        }
        (S::Destroying | S::Removed, C::Destroy { .. }) => Ok(Vec::new()),
        (S::Running | S::Draining, C::CompleteTask { operation }) => {
            let destroy = destroying(vm, DestroyReason::TaskCompleted, *operation, at);
            Ok([vec![VmEvent::TaskCompleted { at }], destroy].concat())
        }
        (S::Destroying, C::ConfirmRemoved { .. }) => Ok(vec![VmEvent::VmRemoved { at }]),
        (S::Running, C::Strike { reason }) => {
            Ok(strike(vm, *reason, OperationId(ctx.new_id(0)), at))
        }
        (S::Running, C::ClearStrikes) => Ok(match vm.strikes {
            Some(_) => vec![VmEvent::VmStrikesCleared { at }],
            None => Vec::new(),
        }),
        (status, C::Recover { found, .. }) if status != S::Destroying => {
            recover(vm, found, OperationId(ctx.new_id(0)), at).ok_or_else(invalid)
        }
        (S::Destroying, C::Recover { .. }) => Ok(Vec::new()),
        (S::Running | S::Draining, C::RecordActivity) => Ok(activity(vm, at)),
        _ => Err(invalid()),
    }
}

fn check_create(spec: &VmSpec, placement: &Placement, facts: &VmFacts) -> Result<(), VmError> {
    spec.check().map_err(VmError::BadSpec)?;
    let max = facts.startup_script_timeout_max_seconds;
    if spec.startup_script_timeout_seconds.is_some_and(|seconds| seconds > max) {
        return Err(VmError::StartupTimeoutTooLarge { max });
    }
    if spec.egress_proxy.is_some() && !facts.egress_registry {
        return Err(VmError::NoEgressRegistry);
    }
    if spec.pin.as_ref().is_some_and(|pin| pin != &placement.host) {
        return Err(VmError::PinMismatch);
    }
    Ok(())
}

fn booted(url: &VmUrl, at: DateTime<Utc>) -> Vec<VmEvent> {
    vec![VmEvent::VmRunning { url: url.clone(), at }, VmEvent::TaskRunning { at }]
}

fn boot_failed(vm: &Vm, failure: &BootFailure, at: DateTime<Utc>) -> Vec<VmEvent> {
    let failed = VmEvent::VmProvisionFailed {
        reason: failure.reason.clone(),
        message: failure.message.clone(),
        detail: failure.detail.clone(),
        at,
    };
    let task = VmEvent::TaskFailed { reason: failure.reason.clone(), at };
    if carries_its_sources_task(vm) { vec![failed] } else { vec![failed, task] }
}

/// A migration's copy that never booted: its task runs on at the source, and is not failed.
fn carries_its_sources_task(vm: &Vm) -> bool {
    vm.status == VmStatus::Provisioning && matches!(vm.origin, Some(VmOrigin::Migration { .. }))
}

fn destroying(
    vm: &Vm,
    reason: DestroyReason,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Vec<VmEvent> {
    vec![VmEvent::VmDestroying { reason, operation, generation: vm.generation + 1, at }]
}

/// The first strike of a reason is recorded; a second in a row destroys the VM.
fn strike(
    vm: &Vm,
    reason: StrikeReason,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Vec<VmEvent> {
    match vm.strikes {
        Some((struck, count)) if struck == reason && count >= 1 => {
            let why = match reason {
                StrikeReason::Stuck => "StuckTask",
                StrikeReason::Idle => "IdleTimeout",
            };
            let failed = Reason::parse("reason", why).expect("a valid reason");
            let mut events = destroying(vm, reason.into(), operation, at);
            events.push(VmEvent::TaskFailed { reason: failed, at });
            events
        }
        _ => vec![VmEvent::VmStruck { reason, strikes: 1, at }],
    }
}

fn recover(
    vm: &Vm,
    found: &Found,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Option<Vec<VmEvent>> {
    match (vm.status, found) {
        (VmStatus::Provisioning, Found::Running { url }) => {
            Some([vec![VmEvent::VmRecovered { running: true, at }], booted(url, at)].concat())
        }
        (VmStatus::Running | VmStatus::Draining, Found::Running { .. }) => Some(Vec::new()),
        (status, Found::Missing) if status.is_live() => {
            let failed = Reason::parse("reason", "VmMissing").expect("a valid reason");
            let mut events = vec![VmEvent::VmRecovered { running: false, at }];
            events.extend(destroying(vm, DestroyReason::Missing, operation, at));
            if !carries_its_sources_task(vm) {
                events.push(VmEvent::TaskFailed { reason: failed, at });
            }
            Some(events)
        }
        _ => None,
    }
}

fn activity(vm: &Vm, at: DateTime<Utc>) -> Vec<VmEvent> {
    let every = TimeDelta::seconds(VM_ACTIVITY_RECORD_SECONDS);
    match vm.last_activity {
        Some(last) if at < last + every => Vec::new(),
        _ => vec![VmEvent::VmActive { at }],
    }
}
