//! A VM's life against its host's capacity: a boot failure gives back exactly what was
//! reserved, a destroy keeps it charged until the agent confirms, a host with a VM bound
//! cannot be removed; agent reports are fenced by the operation and bound to their host; a
//! tenant never reaches another's VM; a retried create answers its first outcome.

use leasehold_commands::CommandError;
use leasehold_commands::host_service::HostService;
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::host::{HostCommand, HostError};
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::values::{OperationId, OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{BootFailure, PlacementPolicy, VmError, VmStatus, VmUrl};
use leasehold_tests::TestDb;

use super::support::*;

fn failure() -> BootFailure {
    BootFailure {
        reason: Reason::parse("reason", "BootFailed").expect("valid"),
        message: TenantMessage::parse("message", "the VM could not boot").expect("valid"),
        detail: OperatorDetail::new("500 no free VM index"),
    }
}

fn url() -> VmUrl {
    VmUrl::parse("url", "127.0.0.1:19551").expect("valid")
}

#[tokio::test]
async fn a_boot_failure_gives_back_exactly_what_was_reserved() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let kept = vms
        .create(&tenant("acme"), "c-1", (&task("kept"), spec()), &no_secrets())
        .await
        .expect("placed");
    let mut big = spec();
    big.cpus = 8;
    let failing = vms
        .create(&tenant("acme"), "c-2", (&task("failing"), big), &no_secrets())
        .await
        .expect("placed");
    let (host, _) = replay_host(&db, "agent-1").await;
    assert_eq!((host.allocated.cpus, host.allocated.vm_count), (10, 2));
    let (_, stored) = vms.owned(failing.vm).await.expect("stored");
    let boot = stored.operation.expect("a boot");
    let host1 = host_id("agent-1");
    vms.report_boot_failed(&agent(), &host1, "f-1", failing.vm, (boot, failure()))
        .await
        .expect("recorded");
    let (host, never_over) = replay_host(&db, "agent-1").await;
    assert!(never_over.is_ok());
    assert_eq!(
        (host.allocated.cpus, host.allocated.vm_count),
        (2, 1),
        "the other VM keeps its room"
    );
    assert!(
        host.reservations.contains_key(&kept.vm) && !host.reservations.contains_key(&failing.vm)
    );
    let (_, stored) = vms.owned(failing.vm).await.expect("stored");
    assert_eq!(stored.status, VmStatus::Removed);
}

#[tokio::test]
async fn a_destroy_keeps_capacity_charged_until_the_agent_confirms() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let hosts = HostService::new(CommandPipeline::new(db.store(), PipelineConfig::default()));
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let host1 = host_id("agent-1");
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    vms.report_booted(&agent(), &host1, "b-1", created.vm, (boot, url())).await.expect("booted");
    vms.destroy(&tenant("acme"), "d-1", created.vm).await.expect("destroying");
    let (host, _) = replay_host(&db, "agent-1").await;
    assert_eq!(host.allocated.vm_count, 1, "still charged while destroying");
    let removal = hosts.run(&operator(), "rm-1", &host1, HostCommand::Remove).await;
    assert!(
        matches!(removal, Err(CommandError::Refused(HostError::HostHasVms { count: 1 }))),
        "{removal:?}"
    );
    // A report naming the superseded boot is fenced; the destroy's own confirmation settles.
    let stale = vms.confirm_removed(&agent(), &host1, "r-0", (created.vm, boot)).await;
    assert!(matches!(stale, Err(CommandError::Refused(VmError::Fenced))), "{stale:?}");
    let destroy = vms.owned(created.vm).await.expect("stored").1.operation.expect("a destroy");
    vms.confirm_removed(&agent(), &host1, "r-1", (created.vm, destroy)).await.expect("removed");
    let (host, _) = replay_host(&db, "agent-1").await;
    assert_eq!((host.allocated.vm_count, host.allocated.cpus), (0, 0));
    hosts.run(&operator(), "rm-2", &host1, HostCommand::Remove).await.expect("removed now");
}

#[tokio::test]
async fn reports_are_bound_to_their_host_and_tenants_to_their_own_vms() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    register(&db, "agent-2", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    let elsewhere =
        vms.report_booted(&agent(), &host_id("agent-2"), "b-1", created.vm, (boot, url())).await;
    assert!(
        matches!(elsewhere, Err(CommandError::NotFound)),
        "another host's agent: {elsewhere:?}"
    );
    let other = OperationId(uuid::Uuid::from_u128(9));
    let fenced =
        vms.report_booted(&agent(), &host_id("agent-1"), "b-2", created.vm, (other, url())).await;
    assert!(matches!(fenced, Err(CommandError::Refused(VmError::Fenced))), "{fenced:?}");
    for attempt in [
        vms.destroy(&tenant("globex"), "d-1", created.vm).await,
        vms.drain(&tenant("globex"), "d-2", created.vm).await,
    ] {
        assert!(matches!(attempt, Err(CommandError::NotFound)), "another tenant's VM: {attempt:?}");
    }
    // The same task name in another tenant is another VM.
    let theirs = vms
        .create(&tenant("globex"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    assert_ne!(theirs.vm, created.vm);
}

#[tokio::test]
async fn a_retried_create_answers_its_first_outcome_whatever_the_fleet_is_now() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 1)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let first = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    // The host is full now; the retry is still the same request.
    let again = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("a retry");
    assert!(again.outcome.duplicate);
    assert_eq!(again.outcome.cursor, first.outcome.cursor);
    // Another key for the same task: the task has its VM.
    let other = vms.create(&tenant("acme"), "c-2", (&task("t"), spec()), &no_secrets()).await;
    assert!(matches!(other, Err(CommandError::Refused(VmError::TaskAlreadyAssigned))), "{other:?}");
    // The same key with another spec is not a retry.
    let mut bigger = spec();
    bigger.cpus = 4;
    let changed = vms.create(&tenant("acme"), "c-1", (&task("t"), bigger), &no_secrets()).await;
    assert!(matches!(changed, Err(CommandError::IdempotencyConflict)), "{changed:?}");
}

#[tokio::test]
async fn a_vms_activity_is_recorded_at_most_once_a_minute_by_its_hosts_agent_only() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let host1 = host_id("agent-1");
    let early = vms.record_activity(&agent(), &host1, "a-0", created.vm).await;
    assert!(
        matches!(early, Err(CommandError::Refused(VmError::InvalidState { .. }))),
        "a VM still booting is not in use: {early:?}"
    );
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    vms.report_booted(&agent(), &host1, "b-1", created.vm, (boot, url())).await.expect("booted");
    let first = vms.record_activity(&agent(), &host1, "a-1", created.vm).await.expect("recorded");
    assert_eq!(first.outcome.event_types, ["VmActive"]);
    let (_, stored) = vms.owned(created.vm).await.expect("stored");
    assert!(stored.last_activity.is_some());
    let again = vms.record_activity(&agent(), &host1, "a-2", created.vm).await.expect("ok");
    assert!(again.outcome.event_types.is_empty(), "within the minute: nothing");
    let elsewhere = vms.record_activity(&agent(), &host_id("agent-2"), "a-3", created.vm).await;
    assert!(matches!(elsewhere, Err(CommandError::NotFound)), "{elsewhere:?}");
}
