//! The fork and migration rows of the VM's transition table: the source's Fork, Migrate,
//! FinishMigration and AbandonMigration, and a copy's Create with its origin.

use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{HostBackend, VmId};
use leasehold_domain::vm::{
    DestroyReason, MigrateRequest, Migration, VmCommand as C, VmError, VmOrigin, VmStatus,
};
use leasehold_domain::{Refusal, RefusalKind};
use uuid::Uuid;

use crate::fixtures::*;
use Expect::{Events, NoChange, Refused};

const COPY: VmId = VmId(Uuid::from_u128(0x77));
const FINISH: OperationId = OperationId(Uuid::from_u128(0x78));

fn request(target: &str, live: bool, lazy: bool) -> MigrateRequest {
    MigrateRequest {
        to: COPY,
        target: host(target),
        live,
        lazy,
        source_backend: HostBackend::Firecracker,
        target_backend: HostBackend::Firecracker,
    }
}

fn migrate(request: MigrateRequest) -> C {
    C::Migrate { request: Box::new(request) }
}

fn migrating() -> History {
    [running(), vec![(migrate(request("agent-2", false, false)), 3)]].concat()
}

fn with_spec(change: impl FnOnce(&mut leasehold_domain::vm::VmSpec)) -> History {
    let mut spec = spec();
    change(&mut spec);
    vec![(create_with(spec, placed_on("agent-1")), 1), (booted(), 2)]
}

#[test]
fn fork_records_the_fork_and_leaves_the_source_running() {
    let before = replay(&running());
    let after = check(&running(), C::Fork { fork: COPY }, Events(&["VmForked"]));
    assert_eq!(
        (after.status, after.operation, after.generation),
        (VmStatus::Running, before.operation, before.generation)
    );
    assert_eq!(after.url, before.url);
}

#[test]
fn only_a_running_vm_without_gpus_is_forked() {
    for (given, status) in [
        (provisioning(), "provisioning"),
        (draining(), "draining"),
        (destroying(), "destroying"),
        (removed(), "removed"),
    ] {
        check(
            &given,
            C::Fork { fork: COPY },
            Refused(VmError::InvalidState { status, command: "fork" }),
        );
    }
    check(&[], C::Fork { fork: COPY }, Refused(VmError::NotFound));
    let gpu = with_spec(|spec| {
        spec.gpus = 1;
        spec.pin = None;
    });
    check(&gpu, C::Fork { fork: COPY }, Refused(VmError::GpuNotCopyable));
    check(&gpu, migrate(request("agent-2", false, false)), Refused(VmError::GpuNotCopyable));
    assert_eq!(VmError::GpuNotCopyable.kind(), RefusalKind::InvalidState);
}

#[test]
fn migrate_holds_the_source_running_until_its_copy_settles() {
    let vm = check(&running(), migrate(request("agent-2", false, false)), Events(&["VmMigrating"]));
    assert_eq!(vm.status, VmStatus::Running);
    assert_eq!(
        vm.migration,
        Some(Migration { to: COPY, target: host("agent-2"), live: false, lazy: false })
    );
    // A cold migration may stay on the VM's own host.
    check(&running(), migrate(request("agent-1", false, false)), Events(&["VmMigrating"]));
}

#[test]
fn migrate_guards_in_order() {
    for (given, status) in
        [(provisioning(), "provisioning"), (draining(), "draining"), (removed(), "removed")]
    {
        check(
            &given,
            migrate(request("agent-2", false, false)),
            Refused(VmError::InvalidState { status, command: "migrate" }),
        );
    }
    check(
        &migrating(),
        migrate(request("agent-3", false, false)),
        Refused(VmError::MigrationInFlight),
    );
    check(&running(), migrate(request("agent-2", false, true)), Refused(VmError::LazyNeedsLive));
    // No huge pages: lazy refused, even where live would be.
    check(
        &running(),
        migrate(request("agent-2", true, true)),
        Refused(VmError::LazyNeedsHugePages),
    );
    let huge = with_spec(|spec| spec.huge_pages = true);
    check(&huge, migrate(request("agent-1", true, true)), Refused(VmError::LiveNeedsOtherHost));
    check(
        &running(),
        migrate(request("agent-1", true, false)),
        Refused(VmError::LiveNeedsOtherHost),
    );
    let mut across = request("agent-2", false, false);
    across.target_backend = HostBackend::Qemu;
    check(&running(), migrate(across), Refused(VmError::CrossBackend));
    // Every backend's agents move a snapshot between hosts without its memory: a live
    // migration is refused rather than done cold.
    check(
        &huge,
        migrate(request("agent-2", true, true)),
        Refused(VmError::LiveUnsupported { backend: "firecracker" }),
    );
    check(
        &running(),
        migrate(request("agent-2", true, false)),
        Refused(VmError::LiveUnsupported { backend: "firecracker" }),
    );
    for (error, kind) in [
        (VmError::MigrationInFlight, RefusalKind::Conflict),
        (VmError::LazyNeedsLive, RefusalKind::BadInput),
        (VmError::LiveNeedsOtherHost, RefusalKind::BadInput),
        (VmError::CrossBackend, RefusalKind::BadInput),
        (VmError::LazyNeedsHugePages, RefusalKind::InvalidState),
        (VmError::LiveUnsupported { backend: "firecracker" }, RefusalKind::InvalidState),
    ] {
        assert_eq!(error.kind(), kind, "{error}");
    }
}

#[test]
fn a_booted_copy_finishes_the_migration_and_destroys_the_source() {
    let finish = C::FinishMigration { to: COPY, operation: FINISH };
    let vm = check(&migrating(), finish.clone(), Events(&["VmMigrated", "VmDestroying"]));
    assert_eq!(
        (vm.status, vm.destroy_reason, vm.operation, vm.migration.clone()),
        (VmStatus::Destroying, Some(DestroyReason::Migrated), Some(FINISH), None)
    );
    // Lost by its host meanwhile (the copy then runs on), or migrating elsewhere, or not at
    // all: nothing.
    let lost = [migrating(), vec![(missing(BOOT), 4)]].concat();
    check(&lost, finish.clone(), NoChange);
    check(&running(), finish.clone(), NoChange);
    check(&migrating(), C::FinishMigration { to: VM, operation: FINISH }, NoChange);
}

#[test]
fn a_failed_copy_abandons_the_migration_and_leaves_the_source_as_it_was() {
    let before = replay(&running());
    let vm =
        check(&migrating(), C::AbandonMigration { to: COPY }, Events(&["VmMigrationAbandoned"]));
    assert_eq!(
        (vm.status, vm.migration.clone(), vm.url.clone()),
        (VmStatus::Running, None, before.url)
    );
    check(&running(), C::AbandonMigration { to: COPY }, NoChange);
    check(&migrating(), C::AbandonMigration { to: VM }, NoChange);
    // Abandoned, it may migrate again.
    let abandoned = [migrating(), vec![(C::AbandonMigration { to: COPY }, 4)]].concat();
    check(&abandoned, migrate(request("agent-2", false, false)), Events(&["VmMigrating"]));
}

#[test]
fn a_copy_records_its_origin_when_created() {
    let origin = VmOrigin::Fork { source: COPY };
    let C::Create { vm, task, spec, credentials, placement, operation, .. } = create() else {
        unreachable!()
    };
    let copy = C::Create {
        vm,
        task: task.clone(),
        spec: spec.clone(),
        credentials,
        placement: placement.clone(),
        operation,
        origin: Some(origin),
    };
    let created =
        check(&[], copy, Events(&["VmProvisioning", "VmCopied", "TaskAssigned", "VmScheduled"]));
    assert_eq!(created.origin, Some(origin));
    let itself = C::Create {
        vm,
        task,
        spec,
        credentials,
        placement,
        operation,
        origin: Some(VmOrigin::Migration {
            source: vm,
            live: false,
            lazy: false,
            running_since: None,
        }),
    };
    let refused = leasehold_domain::Aggregate::decide(
        &replay(&[]),
        &itself,
        &ctx_at(30, leasehold_domain::vm::VmFacts::default()),
    );
    assert!(matches!(refused, Err(VmError::BadSpec(_))), "{refused:?}");
}

#[test]
fn a_migrating_source_waits_for_its_copy_before_it_ends_or_is_judged() {
    for command in
        [C::Drain, C::Destroy { operation: DESTROY }, C::CompleteTask { operation: DESTROY }]
    {
        let name = command.name();
        check(
            &migrating(),
            command,
            Refused(VmError::InvalidState { status: "migrating", command: name }),
        );
    }
    for command in
        [C::Strike { reason: leasehold_domain::vm::StrikeReason::Stuck }, C::ClearStrikes]
    {
        check(&migrating(), command, NoChange);
    }
    // A fork of it is still a fork.
    check(&migrating(), C::Fork { fork: VmId(Uuid::from_u128(0x79)) }, Events(&["VmForked"]));
    // Finished, its task moved with it.
    let vm = check(
        &migrating(),
        C::FinishMigration { to: COPY, operation: FINISH },
        Events(&["VmMigrated", "VmDestroying"]),
    );
    assert_eq!(vm.task, Some(leasehold_domain::vm::TaskStatus::Moved));
}

#[test]
fn a_vm_with_a_mig_instance_is_not_copied_either() {
    let mig = with_spec(|spec| {
        spec.gpu_profile = Some(
            leasehold_domain::values::fleet::MigProfile::parse("p", "1g.10gb").expect("valid"),
        );
    });
    check(&mig, C::Fork { fork: COPY }, Refused(VmError::GpuNotCopyable));
}

/// A migration's copy of a source that ran since minute 2, created at minute 5.
fn copy_of_a_migration() -> History {
    let C::Create { vm, task, spec, credentials, placement, operation, .. } = create() else {
        unreachable!()
    };
    let origin =
        VmOrigin::Migration { source: COPY, live: false, lazy: false, running_since: Some(t(2)) };
    vec![(C::Create { vm, task, spec, credentials, placement, operation, origin: Some(origin) }, 5)]
}

#[test]
fn a_migrations_copy_that_never_boots_leaves_its_task_to_the_source() {
    check(&copy_of_a_migration(), boot_failed(BOOT), Events(&["VmProvisionFailed"]));
    check(&copy_of_a_migration(), missing(BOOT), Events(&["VmRecovered", "VmDestroying"]));
    // A fork's failure is its own task's.
    check(&provisioning(), boot_failed(BOOT), Events(&["VmProvisionFailed", "TaskFailed"]));
}

#[test]
fn a_migrations_copy_is_as_old_as_the_vm_it_moved() {
    let booted = [copy_of_a_migration(), vec![(booted(), 9)]].concat();
    assert_eq!(replay(&booted).running_since, Some(t(2)), "its maximum runtime is never reset");
    assert_eq!(replay(&running()).running_since, Some(t(2)));
}
