//! The VM's transition table, row by row (the doc comment of `domain/src/vm.rs`), with every
//! guard's refusal; then properties over random command sequences.

mod fixtures;
mod moves;
mod properties;

use fixtures::*;
use leasehold_domain::values::fleet::GpuKind;
use leasehold_domain::values::{FieldError, OperationId, Problem, ServiceName};
use leasehold_domain::vm::{
    DestroyReason, Found, GuestPath, SnapshotRef, StrikeReason, TaskStatus, VmCommand as C,
    VmError, VmFacts, VmOutcome, VmStatus,
};
use leasehold_domain::{Refusal, RefusalKind};
use uuid::Uuid;

use Expect::{Events, NoChange, Refused};

const STALE: OperationId = OperationId(Uuid::from_u128(0x50));

fn invalid(status: &'static str, command: &'static str) -> Expect {
    Refused(VmError::InvalidState { status, command })
}

#[test]
fn create() {
    let vm =
        check(&[], fixtures::create(), Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]));
    assert_eq!(
        (vm.status, vm.task, vm.generation),
        (VmStatus::Provisioning, Some(TaskStatus::Assigned), 1)
    );
    assert_eq!(vm.host().map(|host| host.as_str()), Some("agent-1"));
    assert_eq!(vm.operation, Some(BOOT));
    for given in [provisioning(), running(), destroying(), removed(), failed()] {
        check(&given, fixtures::create(), Refused(VmError::TaskAlreadyAssigned));
    }
    assert_eq!(VmError::TaskAlreadyAssigned.kind(), RefusalKind::Conflict);
}

#[test]
fn create_checks_the_spec() {
    let refuse = |spec: leasehold_domain::vm::VmSpec, field: &str| {
        let decided = fixtures::replay(&[]);
        let got = leasehold_domain::Aggregate::decide(
            &decided,
            &create_with(spec, placed_on("agent-1")),
            &ctx_at(30, VmFacts::default()),
        );
        match got {
            Err(VmError::BadSpec(FieldError { field: got, .. })) => assert_eq!(got, field),
            other => panic!("{field}: expected a bad spec, got {other:?}"),
        }
    };
    let mut zero_cpus = spec();
    zero_cpus.cpus = 0;
    refuse(zero_cpus, "cpus");
    let mut tiny = spec();
    tiny.ram_mb = 64;
    refuse(tiny, "ramMb");
    let mut kind_alone = spec();
    kind_alone.gpu_kind = Some(GpuKind::parse("gpuKind", "a100").expect("valid"));
    refuse(kind_alone, "gpuKind");
    // A seed snapshot moves to its VM's host: no pin needed; resuming its memory needs one.
    let mut seeded = spec();
    seeded.seed = Some(SnapshotRef::parse("seed", "snap-1-abc").expect("valid"));
    let mut resumed = seeded.clone();
    resumed.resume_seed = true;
    refuse(resumed, "resumeSeed");
    check(
        &[],
        create_with(seeded.clone(), placed_on("agent-1")),
        Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]),
    );
    seeded.pin = Some(host("agent-1"));
    let mut both = seeded.clone();
    both.image =
        Some(leasehold_domain::vm::ImageName::parse("image", "ubuntu-24.04").expect("valid"));
    refuse(both, "seedSnapshotId");
    check(
        &[],
        create_with(seeded, placed_on("agent-1")),
        Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]),
    );
    let mut twice = spec();
    let path = GuestPath::parse("guestFiles[0]", "/etc/app.conf").expect("valid");
    twice.guest_files = vec![path.clone(), path];
    refuse(twice, "guestFiles");
    assert_eq!(
        VmError::BadSpec(FieldError::new("cpus", Problem::Missing)).kind(),
        RefusalKind::BadInput
    );
}

#[test]
fn guest_files_never_land_under_the_reserved_directory() {
    for bad in [
        "/fuse",
        "/fuse/manifest.json",
        "/fuse/tls/key.pem",
        "relative",
        "/a/../fuse/x",
        "/a//b",
        "/a/",
    ] {
        assert!(GuestPath::parse("guestFiles[0]", bad).is_err(), "{bad:?} should be refused");
    }
    for good in ["/fusebox/app.conf", "/etc/app.conf", "/home/u/.bashrc"] {
        assert!(GuestPath::parse("guestFiles[0]", good).is_ok(), "{good:?} should be taken");
    }
}

#[test]
fn create_guards() {
    let mut slow = spec();
    slow.startup_script_timeout_seconds = Some(51);
    check(
        &[],
        create_with(slow.clone(), placed_on("agent-1")),
        Refused(VmError::StartupTimeoutTooLarge { max: 50 }),
    );
    slow.startup_script_timeout_seconds = Some(50);
    check(
        &[],
        create_with(slow, placed_on("agent-1")),
        Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]),
    );

    let mut proxied = spec();
    proxied.egress_proxy = Some(ServiceName::parse("egress", "squid").expect("valid"));
    check(
        &[],
        create_with(proxied.clone(), placed_on("agent-1")),
        Refused(VmError::NoEgressRegistry),
    );
    let registry = VmFacts { egress_registry: true, ..VmFacts::default() };
    check_with(
        &[],
        create_with(proxied, placed_on("agent-1")),
        registry,
        30,
        Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]),
    );

    let mut pinned = spec();
    pinned.pin = Some(host("agent-2"));
    check(&[], create_with(pinned.clone(), placed_on("agent-1")), Refused(VmError::PinMismatch));
    check(
        &[],
        create_with(pinned, placed_on("agent-2")),
        Events(&["VmProvisioning", "TaskAssigned", "VmScheduled"]),
    );
}

#[test]
fn report_booted() {
    let vm = check(&provisioning(), booted(), Events(&["VmRunning", "TaskRunning"]));
    assert_eq!(
        (vm.status, vm.task, vm.url.clone()),
        (VmStatus::Running, Some(TaskStatus::Running), Some(url()))
    );
    check(&running(), booted(), NoChange);
    check(&draining(), booted(), NoChange);
    check(&removed(), booted(), NoChange);
    check(
        &provisioning(),
        C::ReportBooted { operation: STALE, url: url() },
        Refused(VmError::Fenced),
    );
    // A boot report after a destroy started names a superseded operation.
    check(&destroying(), booted(), Refused(VmError::Fenced));
    check(&[], booted(), Refused(VmError::NotFound));
}

#[test]
fn report_boot_failed() {
    let vm =
        check(&provisioning(), boot_failed(BOOT), Events(&["VmProvisionFailed", "TaskFailed"]));
    assert_eq!(
        (vm.status, vm.outcome, vm.task),
        (VmStatus::Removed, Some(VmOutcome::Failed), Some(TaskStatus::Failed))
    );
    check(&running(), boot_failed(BOOT), invalid("running", "report boot failed"));
    check(&provisioning(), boot_failed(STALE), Refused(VmError::Fenced));
    check(&failed(), boot_failed(BOOT), NoChange);
}

#[test]
fn drain() {
    let vm = check(&running(), C::Drain, Events(&["VmDraining"]));
    assert_eq!(vm.status, VmStatus::Draining);
    check(&draining(), C::Drain, NoChange);
    check(&provisioning(), C::Drain, invalid("provisioning", "drain"));
    check(&destroying(), C::Drain, invalid("destroying", "drain"));
    check(&removed(), C::Drain, invalid("removed", "drain"));
}

#[test]
fn destroy() {
    let destroy = C::Destroy { operation: DESTROY };
    check(&provisioning(), destroy.clone(), invalid("provisioning", "destroy"));
    for given in [running(), draining()] {
        let vm = check(&given, destroy.clone(), Events(&["VmDestroying", "TaskFailed"]));
        assert_eq!(
            (vm.status, vm.destroy_reason),
            (VmStatus::Destroying, Some(DestroyReason::Requested))
        );
        assert_eq!((vm.operation, vm.generation), (Some(DESTROY), 2));
    }
    check(&destroying(), destroy.clone(), NoChange);
    check(&removed(), destroy.clone(), NoChange);
    check(&failed(), destroy, NoChange);
}

#[test]
fn complete_task() {
    for given in [running(), draining()] {
        let vm = check(
            &given,
            C::CompleteTask { operation: DESTROY },
            Events(&["TaskCompleted", "VmDestroying"]),
        );
        assert_eq!(
            (vm.task, vm.destroy_reason),
            (Some(TaskStatus::Completed), Some(DestroyReason::TaskCompleted))
        );
    }
    check(
        &provisioning(),
        C::CompleteTask { operation: DESTROY },
        invalid("provisioning", "complete task"),
    );
}

#[test]
fn confirm_removed() {
    let vm = check(&destroying(), C::ConfirmRemoved { operation: DESTROY }, Events(&["VmRemoved"]));
    assert_eq!((vm.status, vm.outcome), (VmStatus::Removed, Some(VmOutcome::Destroyed)));
    check(&destroying(), C::ConfirmRemoved { operation: BOOT }, Refused(VmError::Fenced));
    check(&removed(), C::ConfirmRemoved { operation: DESTROY }, NoChange);
    check(&running(), C::ConfirmRemoved { operation: BOOT }, invalid("running", "confirm removed"));
}

#[test]
fn two_strikes_in_a_row_destroy() {
    let strike = |reason| C::Strike { reason };
    let vm = check(&running(), strike(StrikeReason::Stuck), Events(&["VmStruck"]));
    assert_eq!(vm.strikes, Some((StrikeReason::Stuck, 1)));
    let once = [running(), vec![(strike(StrikeReason::Stuck), 10)]].concat();
    let vm = check(&once, strike(StrikeReason::Stuck), Events(&["VmDestroying", "TaskFailed"]));
    assert_eq!((vm.status, vm.destroy_reason), (VmStatus::Destroying, Some(DestroyReason::Stuck)));
    assert_eq!(vm.operation, Some(OperationId(FRESH)), "the destroy is a new operation");
    // Not consecutive: cleared in between, or a strike of another reason.
    let cleared = [once.clone(), vec![(C::ClearStrikes, 11)]].concat();
    check(&cleared, strike(StrikeReason::Stuck), Events(&["VmStruck"]));
    let vm = check(&once, strike(StrikeReason::Idle), Events(&["VmStruck"]));
    assert_eq!(vm.strikes, Some((StrikeReason::Idle, 1)));
    check(&provisioning(), strike(StrikeReason::Stuck), invalid("provisioning", "strike"));
    check(&draining(), strike(StrikeReason::Idle), invalid("draining", "strike"));
}

#[test]
fn clear_strikes() {
    let once = [running(), vec![(C::Strike { reason: StrikeReason::Idle }, 10)]].concat();
    let vm = check(&once, C::ClearStrikes, Events(&["VmStrikesCleared"]));
    assert_eq!(vm.strikes, None);
    check(&running(), C::ClearStrikes, NoChange);
}

#[test]
fn recover() {
    let found = C::Recover { operation: BOOT, found: Found::Running { url: url() } };
    let vm =
        check(&provisioning(), found.clone(), Events(&["VmRecovered", "VmRunning", "TaskRunning"]));
    assert_eq!(vm.status, VmStatus::Running);
    check(&running(), found.clone(), NoChange);
    check(&draining(), found.clone(), NoChange);
    for given in [provisioning(), running(), draining()] {
        let vm =
            check(&given, missing(BOOT), Events(&["VmRecovered", "VmDestroying", "TaskFailed"]));
        assert_eq!(
            (vm.status, vm.destroy_reason),
            (VmStatus::Destroying, Some(DestroyReason::Missing))
        );
    }
    // Only a confirmed removal ends a destroy; a late lookup on a removed VM is ignored.
    check(&destroying(), missing(DESTROY), NoChange);
    check(&removed(), missing(DESTROY), NoChange);
    check(&running(), missing(STALE), Refused(VmError::Fenced));
}

#[test]
fn record_activity() {
    let vm = check(&running(), C::RecordActivity, Events(&["VmActive"]));
    assert_eq!(vm.last_activity, Some(t(30)));
    let active = [running(), vec![(C::RecordActivity, 30)]].concat();
    check_with(&active, C::RecordActivity, VmFacts::default(), 30, NoChange);
    check_with(&active, C::RecordActivity, VmFacts::default(), 31, Events(&["VmActive"]));
    check(&draining(), C::RecordActivity, Events(&["VmActive"]));
    check(&provisioning(), C::RecordActivity, invalid("provisioning", "record activity"));
}

#[test]
fn a_command_on_no_vm_is_not_found() {
    for command in [C::Drain, C::Destroy { operation: DESTROY }, C::ClearStrikes, C::RecordActivity]
    {
        check(&[], command, Refused(VmError::NotFound));
    }
}
