//! Forks and migrations through the VM service against PostgreSQL: a fork lands on its
//! source's host with its own credentials and leaves the source as it was; a migration moves
//! to another host of the same backend, destroys its source once the copy booted and leaves it
//! untouched when the copy fails; every guard refuses with nothing appended; two concurrent
//! migrations of one VM, one wins.

use std::collections::BTreeMap;

use leasehold_adapters::vault::PgCredentialVault;
use leasehold_commands::CommandError;
use leasehold_commands::vm_service::{CredentialVault as _, MigrateOptions};
use leasehold_domain::EventStore as _;
use leasehold_domain::RefusalKind;
use leasehold_domain::host::Gate;
use leasehold_domain::values::fleet::{HostBackend, VmId};
use leasehold_domain::values::{OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{
    BootFailure, DestroyReason, Found, PlacementPolicy, TaskStatus, VmError, VmOrigin, VmStatus,
    VmUrl,
};
use leasehold_tests::TestDb;

use super::support::*;

fn url() -> VmUrl {
    VmUrl::parse("url", "127.0.0.1:19551").expect("valid")
}

/// Registers `name` with an agent token: Leasehold calls its agent.
async fn called(db: &TestDb, name: &str) {
    register(db, name, host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    vault.keep_host_token(&host_id(name), "an-agent-token").await.expect("kept");
}

fn cold(target: Option<&str>) -> MigrateOptions {
    MigrateOptions { target: target.map(host_id), live: false, lazy: false }
}

/// A VM of `acme` booted on its host, with one secret.
async fn running_vm(vms: &Service, task_name: &str, spec: leasehold_domain::vm::VmSpec) -> VmId {
    let secrets = BTreeMap::from([("API_KEY".to_owned(), "s3cr3t-value".to_owned())]);
    let key = format!("create-{task_name}");
    let created = vms
        .create(&tenant("acme"), &key, (&task(task_name), spec), &secrets)
        .await
        .expect("placed");
    boot(vms, created.vm, &format!("boot-{task_name}")).await;
    created.vm
}

/// The agent's boot report for `vm`'s current operation.
async fn boot(vms: &Service, vm: VmId, key: &str) {
    let (_, stored) = vms.owned(vm).await.expect("stored");
    let host = stored.host().expect("placed").clone();
    let operation = stored.operation.expect("a boot");
    vms.report_booted(&agent(), &host, key, vm, (operation, url())).await.expect("booted");
}

async fn version(db: &TestDb, vm: VmId) -> u64 {
    db.store().read_stream(&vm.stream_id(), 1, 1_000).await.expect("readable").len() as u64
}

#[tokio::test]
async fn a_fork_lands_on_its_sources_host_with_credentials_of_its_own() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    register(&db, "agent-2", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1", "agent-2"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    let (_, before) = vms.owned(source).await.expect("stored");
    let forked = vms.fork(&tenant("acme"), "fork-1", source, &task("fork")).await.expect("forked");
    let (_, fork) = vms.owned(forked.vm).await.expect("stored");
    assert_eq!(fork.status, VmStatus::Provisioning);
    assert_eq!(fork.origin, Some(VmOrigin::Fork { source }));
    assert_eq!(fork.host(), before.host(), "a fork lands on its source's host");
    let (_, after) = vms.owned(source).await.expect("stored");
    assert_eq!(
        (after.status, after.operation, after.generation, after.url.clone()),
        (before.status, before.operation, before.generation, before.url.clone()),
        "the source runs on as it was"
    );
    let (host, never_over) = replay_host(&db, before.host().expect("placed").as_str()).await;
    assert!(never_over.is_ok());
    assert!(host.reservations.contains_key(&forked.vm) && host.reservations.contains_key(&source));
    // New credentials, with the source's secrets.
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    let acme = tenant("acme").tenant.expect("a tenant");
    let theirs = vault.open(before.terms.expect("terms").credentials, &acme).await.expect("ok");
    let ours = vault.open(fork.terms.clone().expect("terms").credentials, &acme).await.expect("ok");
    let (theirs, ours) = (theirs.expect("kept"), ours.expect("kept"));
    assert_ne!(theirs.auth_token, ours.auth_token, "a copy never answers to its source's token");
    assert_eq!(theirs.secrets, ours.secrets);
    // A retry answers the first outcome; the fork's task has its VM for any other key.
    let again = vms.fork(&tenant("acme"), "fork-1", source, &task("fork")).await.expect("retry");
    assert_eq!((again.vm, again.outcome.version), (forked.vm, forked.outcome.version));
    assert_eq!((again.outcome.cursor, again.outcome.duplicate), (forked.outcome.cursor, true));
    let other = vms.fork(&tenant("acme"), "fork-2", source, &task("fork")).await;
    assert!(
        matches!(&other, Err(CommandError::LinkedRefused { kind: RefusalKind::Conflict, reason, .. }) if reason.contains("task already has a VM")),
        "{other:?}"
    );
    // The same key for another fork is a conflict, and touches nothing of the first's.
    let reused = vms.fork(&tenant("acme"), "fork-1", source, &task("fork-b")).await;
    assert!(matches!(reused, Err(CommandError::IdempotencyConflict)), "{reused:?}");
    let still =
        vault.open(fork.terms.clone().expect("terms").credentials, &acme).await.expect("ok");
    assert_eq!(still.expect("kept").auth_token, ours.auth_token);
}

#[tokio::test]
async fn forks_are_refused_for_no_room_another_tenant_and_a_vm_not_running() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 4, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    let stored_before = version(&db, source).await;
    let theirs = vms.fork(&tenant("globex"), "f-1", source, &task("fork")).await;
    assert!(matches!(theirs, Err(CommandError::NotFound)), "{theirs:?}");
    // 4 vCPUs: the source's 2 and a fork's 2 fit, a second fork does not.
    vms.fork(&tenant("acme"), "f-2", source, &task("fork-a")).await.expect("room for one");
    let full = vms.fork(&tenant("acme"), "f-3", source, &task("fork-b")).await;
    assert!(
        matches!(full, Err(CommandError::Refused(VmError::NoHostFits { gate: Gate::Cpus }))),
        "{full:?}"
    );
    let provisioning =
        vms.create(&tenant("acme"), "c-9", (&task("late"), spec()), &BTreeMap::new()).await;
    // (No room left for it either; a VM not running is refused as its state says.)
    assert!(provisioning.is_err());
    vms.destroy(&tenant("acme"), "d-1", source).await.expect("destroying");
    let destroying = vms.fork(&tenant("acme"), "f-4", source, &task("fork-c")).await;
    assert!(
        matches!(
            destroying,
            Err(CommandError::Refused(VmError::InvalidState { status: "destroying", .. }))
        ),
        "{destroying:?}"
    );
    assert_eq!(
        version(&db, source).await,
        stored_before + 3,
        "VmForked once, then the destroy's two"
    );
    assert_eq!(version(&db, vm_of_task("fork-b")).await, 0, "no refused fork appended");
}

fn vm_of_task(name: &str) -> VmId {
    leasehold_commands::vm_service::vm_of(&tenant("acme").tenant.expect("a tenant"), &task(name))
}

#[tokio::test]
async fn a_gpu_vm_is_neither_forked_nor_migrated() {
    let db = TestDb::migrated().await;
    let mut qemu = host_spec(HostBackend::Qemu, 16, 4);
    qemu.capacity.gpus = 2;
    qemu.capacity.gpu_kind =
        Some(leasehold_domain::values::fleet::GpuKind::parse("g", "a100").expect("valid"));
    register(&db, "gpu-1", qemu.clone()).await;
    register(&db, "gpu-2", qemu).await;
    let vms = service(&db, &["gpu-1", "gpu-2"], PlacementPolicy::Spread);
    let mut gpu = spec();
    gpu.gpus = 1;
    let source = running_vm(&vms, "gpu", gpu).await;
    let before = version(&db, source).await;
    let fork = vms.fork(&tenant("acme"), "f-1", source, &task("fork")).await;
    assert!(matches!(fork, Err(CommandError::Refused(VmError::GpuNotCopyable))), "{fork:?}");
    let moved = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await;
    assert!(matches!(moved, Err(CommandError::Refused(VmError::GpuNotCopyable))), "{moved:?}");
    assert_eq!(version(&db, source).await, before, "nothing appended");
}

#[tokio::test]
async fn a_migration_moves_to_another_host_and_destroys_its_source_once_the_copy_booted() {
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    called(&db, "agent-2").await;
    let vms = service(&db, &["agent-1", "agent-2", "qemu-1"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    // A roomier host of another backend, registered once the source runs.
    register(&db, "qemu-1", host_spec(HostBackend::Qemu, 64, 8)).await;
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    vault.keep_host_token(&host_id("qemu-1"), "an-agent-token").await.expect("kept");
    let (_, before) = vms.owned(source).await.expect("stored");
    let source_host = before.host().expect("placed").clone();
    let first = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("migrating");
    let copy = first.vm;
    let (_, placed) = vms.owned(copy).await.expect("stored");
    let target = placed.host().expect("placed").clone();
    assert_ne!(target, source_host, "placement picks another host");
    assert_ne!(target.as_str(), "qemu-1", "never across backends");
    assert_eq!(placed.terms.as_ref().map(|terms| terms.task.clone()), Some(task("src")));
    let (_, migrating) = vms.owned(source).await.expect("stored");
    assert_eq!(migrating.status, VmStatus::Running);
    assert_eq!(migrating.migration.as_ref().map(|m| m.to), Some(copy));
    // While its copy boots, the source is neither destroyed nor drained.
    let destroy = vms.destroy(&tenant("acme"), "d-1", source).await;
    assert!(
        matches!(
            destroy,
            Err(CommandError::Refused(VmError::InvalidState { status: "migrating", .. }))
        ),
        "{destroy:?}"
    );
    // A retry answers its first outcome, before and after the copy booted.
    let again = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("a retry");
    assert_eq!(
        (again.vm, again.outcome.cursor, again.outcome.duplicate),
        (copy, first.outcome.cursor, true)
    );
    boot(&vms, copy, "boot-copy").await;
    let late = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("a retry");
    assert_eq!((late.vm, late.outcome.duplicate), (copy, true));
    let (_, moved) = vms.owned(source).await.expect("stored");
    assert_eq!(
        (moved.status, moved.destroy_reason, moved.migration.clone(), moved.task),
        (VmStatus::Destroying, Some(DestroyReason::Migrated), None, Some(TaskStatus::Moved))
    );
    let (_, copied) = vms.owned(copy).await.expect("stored");
    assert_eq!(copied.running_since, before.running_since, "as old as the VM it moved");
    // The source keeps its room until its removal is confirmed.
    let (host, _) = replay_host(&db, source_host.as_str()).await;
    assert!(host.reservations.contains_key(&source));
    let destroy = moved.operation.expect("a destroy");
    vms.confirm_removed(&agent(), &source_host, "rm-1", (source, destroy)).await.expect("removed");
    let (host, never_over) = replay_host(&db, source_host.as_str()).await;
    assert!(never_over.is_ok() && host.reservations.is_empty());
    let (host, _) = replay_host(&db, target.as_str()).await;
    assert!(host.reservations.contains_key(&copy));
}

#[tokio::test]
async fn a_copys_recovery_lookup_finishes_or_abandons_its_migration() {
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    called(&db, "agent-2").await;
    let vms = service(&db, &["agent-1", "agent-2"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    let lookup = |vm: VmId, found: Found| {
        let vms = vms.clone();
        async move {
            let (_, stored) = vms.owned(vm).await.expect("stored");
            let host = stored.host().expect("placed").clone();
            let operation = stored.operation.expect("an operation");
            let key = format!("lookup-{}", vm.0);
            vms.recover(&agent(), &host, &key, vm, (operation, found)).await
        }
    };
    // Gone at the target: abandoned, the source running as it was.
    let copy = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("ok").vm;
    lookup(copy, Found::Missing).await.expect("recovered");
    let (_, after) = vms.owned(source).await.expect("stored");
    assert_eq!((after.status, after.migration.clone()), (VmStatus::Running, None));
    let (_, lost) = vms.owned(copy).await.expect("stored");
    assert_eq!(lost.task, Some(TaskStatus::Assigned), "the task was never the copy's to fail");
    // Found there: finished, the source destroyed.
    let copy = vms.migrate(&tenant("acme"), "m-2", source, &cold(None)).await.expect("ok").vm;
    lookup(copy, Found::Running { url: url() }).await.expect("recovered");
    let (_, moved) = vms.owned(source).await.expect("stored");
    assert_eq!(moved.destroy_reason, Some(DestroyReason::Migrated));
}

#[tokio::test]
async fn a_migration_needs_both_agents_called_and_a_pinned_vm_stays_on_its_pin() {
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    register(&db, "edge-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1", "edge-1"], PlacementPolicy::Spread);
    let mut pinned = spec();
    pinned.pin = Some(host_id("agent-1"));
    let source = running_vm(&vms, "src", pinned).await;
    let before = version(&db, source).await;
    let uncalled = vms.migrate(&tenant("acme"), "m-1", source, &cold(Some("edge-1"))).await;
    assert!(
        matches!(&uncalled, Err(CommandError::Refused(VmError::HostNotCalled { host })) if host.as_str() == "edge-1"),
        "{uncalled:?}"
    );
    called(&db, "edge-1").await;
    for target in [None, Some("edge-1")] {
        let off_pin = vms.migrate(&tenant("acme"), "m-2", source, &cold(target)).await;
        assert!(matches!(off_pin, Err(CommandError::Refused(VmError::PinMismatch))), "{off_pin:?}");
    }
    // Onto its own host, cold: allowed.
    vms.migrate(&tenant("acme"), "m-3", source, &cold(Some("agent-1"))).await.expect("in place");
    assert_eq!(version(&db, source).await, before + 1, "only the last one appended");
}

#[tokio::test]
async fn a_failed_copy_leaves_its_source_untouched_and_migratable_again() {
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    called(&db, "agent-2").await;
    let vms = service(&db, &["agent-1", "agent-2"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    let (_, before) = vms.owned(source).await.expect("stored");
    let copy = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("ok").vm;
    let (_, placed) = vms.owned(copy).await.expect("stored");
    let target = placed.host().expect("placed").clone();
    let failure = BootFailure {
        reason: Reason::parse("reason", "BootFailed").expect("valid"),
        message: TenantMessage::parse("message", "the host could not boot the VM").expect("ok"),
        detail: OperatorDetail::new("422 artifact transfer failed"),
    };
    let boot = placed.operation.expect("a boot");
    vms.report_boot_failed(&agent(), &target, "f-1", copy, (boot, failure)).await.expect("ok");
    let (_, after) = vms.owned(source).await.expect("stored");
    assert_eq!(
        (after.status, after.url.clone(), after.host().cloned(), after.migration.clone()),
        (VmStatus::Running, before.url.clone(), before.host().cloned(), None)
    );
    let (host, _) = replay_host(&db, target.as_str()).await;
    assert!(host.reservations.is_empty(), "the copy's room is given back");
    let (_, failed) = vms.owned(copy).await.expect("stored");
    assert_eq!(failed.task, Some(TaskStatus::Assigned), "the task runs on at the source");
    vms.migrate(&tenant("acme"), "m-2", source, &cold(None)).await.expect("migratable again");
}

#[tokio::test]
async fn every_migration_guard_refuses_with_nothing_appended() {
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    called(&db, "agent-2").await;
    register(&db, "qemu-1", host_spec(HostBackend::Qemu, 16, 4)).await;
    let vms = service(&db, &["agent-1", "agent-2", "qemu-1"], PlacementPolicy::Spread);
    let mut pinned = spec();
    pinned.pin = Some(host_id("agent-1"));
    let source = running_vm(&vms, "src", pinned).await;
    let before = version(&db, source).await;
    let asks = [
        (MigrateOptions { target: Some(host_id("agent-1")), live: true, lazy: false }, "same host"),
        (
            MigrateOptions { target: Some(host_id("agent-2")), live: false, lazy: true },
            "lazy, cold",
        ),
        (
            MigrateOptions { target: Some(host_id("agent-2")), live: true, lazy: true },
            "no huge pages",
        ),
        (MigrateOptions { target: Some(host_id("qemu-1")), live: false, lazy: false }, "qemu"),
        (MigrateOptions { target: Some(host_id("agent-2")), live: true, lazy: false }, "live"),
    ];
    let mut refusals = Vec::new();
    for (index, (options, why)) in asks.iter().enumerate() {
        let key = format!("m-{index}");
        match vms.migrate(&tenant("acme"), &key, source, options).await {
            Err(CommandError::Refused(error)) => refusals.push(error),
            other => panic!("{why}: {other:?}"),
        }
    }
    assert_eq!(
        refusals,
        vec![
            VmError::LiveNeedsOtherHost,
            VmError::LazyNeedsLive,
            VmError::LazyNeedsHugePages,
            VmError::CrossBackend,
            VmError::LiveUnsupported { backend: "firecracker" },
        ]
    );
    assert_eq!(version(&db, source).await, before, "nothing appended");
    for name in ["agent-1", "agent-2", "qemu-1"] {
        let (host, _) = replay_host(&db, name).await;
        assert_eq!(host.reservations.len(), usize::from(name == "agent-1"), "{name}");
    }
    let theirs = vms.migrate(&tenant("globex"), "m-9", source, &cold(None)).await;
    assert!(matches!(theirs, Err(CommandError::NotFound)), "{theirs:?}");
}

#[tokio::test]
async fn of_two_concurrent_migrations_of_one_vm_one_wins() {
    let db = TestDb::migrated().await;
    for name in ["agent-1", "agent-2", "agent-3"] {
        called(&db, name).await;
    }
    let hosts = ["agent-1", "agent-2", "agent-3"];
    let first = service(&db, &hosts, PlacementPolicy::Spread);
    let second = service(&db, &hosts, PlacementPolicy::Spread);
    let source = running_vm(&first, "src", spec()).await;
    let (acme, options) = (tenant("acme"), cold(None));
    let (a, b) = tokio::join!(
        first.migrate(&acme, "m-a", source, &options),
        second.migrate(&acme, "m-b", source, &options),
    );
    let won = [&a, &b].iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(won, 1, "{a:?} / {b:?}");
    let lost = if a.is_err() { a } else { b };
    assert!(
        matches!(lost, Err(CommandError::Refused(VmError::MigrationInFlight))),
        "the loser is told a migration is in flight: {lost:?}"
    );
    let reserved: usize = {
        let mut count = 0;
        for name in hosts {
            count += replay_host(&db, name).await.0.reservations.len();
        }
        count
    };
    assert_eq!(reserved, 2, "the source and one copy");
}

/// The VMs acme's VM quota holds now, from its events.
async fn vm_quota_holds(db: &TestDb) -> Vec<String> {
    use leasehold_domain::workload_quota::{WorkloadKind, WorkloadQuotaEvent as E};
    use leasehold_domain::{DomainEvent as _, EventStore as _};
    let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
    let stream = leasehold_commands::workload_quota_of(&acme, WorkloadKind::Vm).stream_id();
    let mut held = Vec::new();
    for recorded in db.store().read_stream(&stream, 1, 1_000).await.expect("readable") {
        match E::from_stored(recorded.event_type.as_str(), &recorded.payload).expect("decodes") {
            E::WorkloadReserved { workload, .. } if !held.contains(&workload) => {
                held.push(workload)
            }
            E::WorkloadReleased { workload, .. } => held.retain(|vm| *vm != workload),
            _ => {}
        }
    }
    held
}

/// acme's VM quota as stored now.
async fn vm_quota(db: &TestDb) -> leasehold_domain::workload_quota::WorkloadQuota {
    use leasehold_domain::workload_quota::WorkloadKind;
    let pipeline = leasehold_commands::CommandPipeline::new(db.store(), Default::default());
    let quotas = leasehold_commands::quota::WorkloadQuotas::new(pipeline);
    let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
    quotas.quota(&acme, WorkloadKind::Vm).await.expect("readable").expect("a quota")
}

/// A migration is charged once: its copy holds nothing while it boots (nor ever, when it is
/// found missing before booting), then takes its source's place in the append of its boot;
/// so a tenant at its VM count still migrates, and an agent's report is never refused. A
/// fork is one VM more, refused at the count with nothing appended.
#[tokio::test]
async fn a_migration_counts_once_against_the_vm_quota_and_a_fork_is_one_more() {
    use leasehold_domain::workload_quota::{Limit, WorkloadKind};
    let db = TestDb::migrated().await;
    called(&db, "agent-1").await;
    called(&db, "agent-2").await;
    let vms = service(&db, &["agent-1", "agent-2"], PlacementPolicy::Spread);
    let source = running_vm(&vms, "src", spec()).await;
    let pipeline = leasehold_commands::CommandPipeline::new(db.store(), Default::default());
    let quotas = leasehold_commands::quota::WorkloadQuotas::new(pipeline);
    let operator = leasehold_commands::lease_service::Caller { tenant: None, ..tenant("ops") };
    let acme = leasehold_domain::TenantId::parse("acme").expect("valid");
    let limits = vec![Limit { resource: "count".into(), max: 1 }];
    quotas.set_limits(&operator, "limits", (&acme, WorkloadKind::Vm, limits)).await.expect("set");
    let fork = vms.fork(&tenant("acme"), "fork-1", source, &task("fork")).await;
    assert!(
        matches!(&fork, Err(CommandError::LinkedRefused { kind: RefusalKind::QuotaExceeded, .. })),
        "{fork:?}"
    );
    assert_eq!(version(&db, vm_of_task("fork")).await, 0, "nothing of the refused fork");
    // A copy found missing before it booted: abandoned, never charged.
    let lost = vms.migrate(&tenant("acme"), "m-0", source, &cold(None)).await.expect("migrating");
    let (_, stored) = vms.owned(lost.vm).await.expect("stored");
    let host = stored.host().expect("placed").clone();
    let lookup = (stored.operation.expect("a boot"), Found::Missing);
    vms.recover(&agent(), &host, "lookup-lost", lost.vm, lookup).await.expect("recorded");
    assert_eq!(
        vm_quota_holds(&db).await,
        [source.stream_id().to_string()],
        "a lost copy held nothing"
    );
    let copy = vms.migrate(&tenant("acme"), "m-1", source, &cold(None)).await.expect("migrating");
    let held = vm_quota_holds(&db).await;
    assert_eq!(held, [source.stream_id().to_string()], "the copy holds nothing while it boots");
    boot(&vms, copy.vm, "boot-copy").await;
    let held = vm_quota_holds(&db).await;
    assert_eq!(held, [copy.vm.stream_id().to_string()], "the copy took its source's place");
    let quota = vm_quota(&db).await;
    assert_eq!(quota.usage.get("count"), Some(&1));
    assert_eq!(quota.usage.get("cpus"), Some(&u64::from(spec().cpus)));
}
