//! Properties over random command sequences: whatever is accepted, the generation never
//! falls, a removed VM never comes back, a VM never returns to provisioning, its task never
//! moves backwards, and a VM holding a migration stays running until the copy settles (only
//! the copy's boot destroys it).

use leasehold_domain::Aggregate;
use leasehold_domain::values::fleet::{HostBackend, VmId};
use leasehold_domain::vm::{
    DestroyReason, MigrateRequest, StrikeReason, TaskStatus, Vm, VmCommand, VmFacts, VmStatus,
};
use proptest::prelude::*;

use super::fixtures::*;

fn command() -> impl Strategy<Value = VmCommand> {
    prop_oneof![
        Just(create()),
        Just(booted()),
        Just(boot_failed(BOOT)),
        Just(VmCommand::Drain),
        Just(VmCommand::Destroy { operation: DESTROY }),
        Just(VmCommand::CompleteTask { operation: DESTROY }),
        Just(VmCommand::ConfirmRemoved { operation: DESTROY }),
        Just(VmCommand::ConfirmRemoved { operation: leasehold_domain::values::OperationId(FRESH) }),
        Just(VmCommand::Strike { reason: StrikeReason::Stuck }),
        Just(VmCommand::Strike { reason: StrikeReason::Idle }),
        Just(VmCommand::ClearStrikes),
        Just(missing(BOOT)),
        Just(VmCommand::RecordActivity),
        Just(VmCommand::Fork { fork: COPY }),
        Just(VmCommand::Migrate { request: Box::new(migration()) }),
        Just(VmCommand::FinishMigration { to: COPY, operation: DESTROY }),
        Just(VmCommand::AbandonMigration { to: COPY }),
    ]
}

const COPY: VmId = VmId(uuid::Uuid::from_u128(0x77));

fn migration() -> MigrateRequest {
    MigrateRequest {
        to: COPY,
        target: host("agent-2"),
        live: false,
        lazy: false,
        source_backend: HostBackend::Firecracker,
        target_backend: HostBackend::Firecracker,
    }
}

fn task_rank(task: Option<TaskStatus>) -> u8 {
    match task {
        None => 0,
        Some(TaskStatus::Assigned) => 1,
        Some(TaskStatus::Running) => 2,
        Some(TaskStatus::Completed | TaskStatus::Failed | TaskStatus::Moved) => 3,
    }
}

proptest! {
    #[test]
    fn vms_only_move_forward(commands in prop::collection::vec(command(), 1..40)) {
        let mut vm = Vm::initial();
        for (minute, command) in commands.iter().enumerate() {
            let before = vm.clone();
            let minute = u32::try_from(minute).unwrap_or(59).min(59);
            if let Ok(events) = vm.decide(command, &ctx_at(minute, VmFacts::default())) {
                vm = events.iter().fold(vm, |vm, event| vm.evolve(event));
            }
            prop_assert!(vm.generation >= before.generation, "the generation never falls");
            prop_assert!(task_rank(vm.task) >= task_rank(before.task), "the task never moves back");
            if before.status == VmStatus::Removed {
                prop_assert_eq!(vm.status, VmStatus::Removed, "a removed VM stays removed");
            }
            if before.status != VmStatus::None {
                prop_assert!(vm.status != VmStatus::Provisioning || before.status == VmStatus::Provisioning);
            }
            if vm.status == VmStatus::Destroying {
                prop_assert!(vm.destroy_reason.is_some());
            }
            // Only its copy's boot, or its host's agent no longer having it, ends a VM that
            // holds a migration.
            let ended_by = [Some(DestroyReason::Migrated), Some(DestroyReason::Missing)];
            if vm.migration.is_some() {
                prop_assert!(vm.status == VmStatus::Running || ended_by.contains(&vm.destroy_reason));
            }
            if before.migration.is_some() && vm.status == VmStatus::Destroying {
                prop_assert!(ended_by.contains(&vm.destroy_reason));
            }
        }
    }
}
