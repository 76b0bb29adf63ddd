//! `evolve` for the VM: folds one recorded event into the state. No rules here.

use chrono::{DateTime, Utc};

use super::{
    BootFailure, Migration, TaskStatus, Vm, VmEvent, VmOrigin, VmOutcome, VmStatus, VmTerms,
};

pub(super) fn evolve(mut vm: Vm, event: &VmEvent) -> Vm {
    use VmEvent as E;
    match event {
        E::VmProvisioning { vm: id, task, spec, credentials, at } => {
            vm.status = VmStatus::Provisioning;
            let terms = VmTerms {
                id: *id,
                task: task.clone(),
                spec: spec.as_ref().clone(),
                credentials: *credentials,
                created_at: *at,
            };
            vm.terms = Some(terms);
            touch(&mut vm, *at);
        }
        E::TaskAssigned { at, .. } => task(&mut vm, TaskStatus::Assigned, *at),
        E::VmScheduled { placement, operation, generation, at } => {
            vm.placement = Some(placement.clone());
            vm.operation = Some(*operation);
            vm.generation = *generation;
            touch(&mut vm, *at);
        }
        E::VmRunning { url, at } => {
            vm.status = VmStatus::Running;
            vm.url = Some(url.clone());
            // A migration's copy is as old as the VM it moved.
            let moved_since = match vm.origin {
                Some(VmOrigin::Migration { running_since, .. }) => running_since,
                _ => None,
            };
            vm.running_since = Some(moved_since.unwrap_or(*at));
            touch(&mut vm, *at);
        }
        E::TaskRunning { at } => task(&mut vm, TaskStatus::Running, *at),
        E::VmProvisionFailed { reason, message, detail, at } => {
            vm.status = VmStatus::Removed;
            vm.outcome = Some(VmOutcome::Failed);
            let failure = BootFailure {
                reason: reason.clone(),
                message: message.clone(),
                detail: detail.clone(),
            };
            vm.failure = Some(failure);
            touch(&mut vm, *at);
        }
        E::TaskFailed { at, .. } => task(&mut vm, TaskStatus::Failed, *at),
        E::TaskCompleted { at } => task(&mut vm, TaskStatus::Completed, *at),
        E::VmDraining { at } => {
            vm.status = VmStatus::Draining;
            touch(&mut vm, *at);
        }
        E::VmDestroying { reason, operation, generation, at } => {
            vm.status = VmStatus::Destroying;
            vm.destroy_reason = Some(*reason);
            vm.operation = Some(*operation);
            vm.generation = *generation;
            vm.strikes = None;
            touch(&mut vm, *at);
        }
        E::VmRemoved { at } => {
            vm.status = VmStatus::Removed;
            vm.outcome = Some(VmOutcome::Destroyed);
            touch(&mut vm, *at);
        }
        E::VmStruck { reason, strikes, at } => {
            vm.strikes = Some((*reason, *strikes));
            touch(&mut vm, *at);
        }
        E::VmStrikesCleared { at } => {
            vm.strikes = None;
            touch(&mut vm, *at);
        }
        E::VmRecovered { at, .. } => touch(&mut vm, *at),
        E::VmActive { at } => vm.last_activity = Some(*at),
        E::VmCopied { source, kind, live, lazy, since, at } => {
            vm.origin = Some(VmOrigin::of_recorded(*source, *kind, (*live, *lazy), *since));
            touch(&mut vm, *at);
        }
        E::VmForked { at, .. } => touch(&mut vm, *at),
        E::VmMigrating { to, target, live, lazy, at } => {
            let migration = Migration { to: *to, target: target.clone(), live: *live, lazy: *lazy };
            vm.migration = Some(migration);
            touch(&mut vm, *at);
        }
        E::VmMigrated { at, .. } => {
            vm.migration = None;
            vm.task = Some(TaskStatus::Moved);
            touch(&mut vm, *at);
        }
        E::VmMigrationAbandoned { at, .. } => {
            vm.migration = None;
            touch(&mut vm, *at);
        }
    }
    vm
}

fn task(vm: &mut Vm, status: TaskStatus, at: DateTime<Utc>) {
    vm.task = Some(status);
    touch(vm, at);
}

fn touch(vm: &mut Vm, at: DateTime<Utc>) {
    vm.updated_at = Some(at);
}
