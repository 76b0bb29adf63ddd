//! A request delivered again long after the first, once its aggregate has moved on (to its
//! end, or to another session): the retry is answered with the recorded outcome, marked a
//! duplicate, and appends nothing, whatever the aggregate's state now. The ledger is read
//! before anything the state would refuse; a service that looked at the state first would
//! answer a late retry with a refusal (issue 17, part 4: duplicate deliveries, long after).

use leasehold_commands::CommandOutcome;
use leasehold_commands::node_service::Presented;
use leasehold_commands::run_service::SubmitRun;
use leasehold_domain::node::ManifestDigest;
use leasehold_domain::rental::CapacityState;
use leasehold_domain::values::Reason;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::vm::{PlacementPolicy, VmUrl};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;

use crate::fleet::support as fleet;
use crate::rented::support as rented;

/// The number of events in the log.
async fn log_length(db: &TestDb) -> i64 {
    let client = db.client().await;
    client.query_one("SELECT count(*) FROM events", &[]).await.expect("counted").get(0)
}

/// `again` (the first request's answer, sent again) is the recorded outcome and appended
/// nothing since `before`.
async fn replayed(db: &TestDb, (first, again): (&CommandOutcome, &CommandOutcome), before: i64) {
    assert!(again.duplicate, "{again:?}");
    assert_eq!((again.stream_id.clone(), again.version), (first.stream_id.clone(), first.version));
    assert_eq!(log_length(db).await, before, "nothing appended");
}

#[tokio::test]
async fn a_vm_created_again_after_it_was_destroyed_and_removed_answers_its_creation() {
    let db = TestDb::migrated().await;
    fleet::register(&db, "h-1", fleet::host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = fleet::service(&db, &["h-1"], PlacementPolicy::Spread);
    let (acme, task, secrets) = (fleet::tenant("acme"), fleet::task("t-1"), fleet::no_secrets());
    let create = || vms.create(&acme, "create-1", (&task, fleet::spec()), &secrets);
    let first = create().await.expect("created");
    let (agent, host) = (fleet::agent(), fleet::host_id("h-1"));
    let boot = vms.owned(first.vm).await.expect("read").1.operation.expect("a boot");
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    vms.report_booted(&agent, &host, "booted", first.vm, (boot, url)).await.expect("booted");
    vms.destroy(&acme, "destroy-1", first.vm).await.expect("destroying");
    let removal = vms.owned(first.vm).await.expect("read").1.operation.expect("a removal");
    vms.confirm_removed(&agent, &host, "removed", (first.vm, removal)).await.expect("removed");
    let before = log_length(&db).await;
    let again = create().await.expect("the recorded creation");
    assert_eq!(again.vm, first.vm);
    replayed(&db, (&first.outcome, &again.outcome), before).await;
}

#[tokio::test]
async fn a_rental_provisioned_again_after_it_was_terminated_answers_its_provision() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(rented::start());
    let services = rented::services(&db, &clock);
    let (acme, ask) = (rented::tenant("acme"), rented::ask());
    let first = services.rentals.provision(&acme, "r-1", &ask).await.expect("provisioned");
    let rental = rented::active_rental(&services, "acme", "r-1").await;
    assert_eq!(rental, first.rental);
    services.rentals.terminate(&acme, "end-1", (rental, 1)).await.expect("terminating");
    let gone = rented::looked(CapacityState::Terminated, rented::start());
    let (provider, connection) = (rented::provider(), rented::connection());
    let observed = services.rentals.observe(&provider, "gone", &connection, (rental, 1, gone));
    observed.await.expect("terminated");
    let before = log_length(&db).await;
    let again = services.rentals.provision(&acme, "r-1", &ask).await.expect("the recorded one");
    replayed(&db, (&first.outcome, &again.outcome), before).await;
}

#[tokio::test]
async fn a_run_submitted_again_after_it_closed_answers_its_submission() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(rented::start());
    let services = rented::services(&db, &clock);
    let rental = rented::active_rental(&services, "acme", "r-1").await;
    let digest = ManifestDigest::parse("d", format!("sha256:{}", "cd".repeat(32)));
    let ask =
        SubmitRun { rental, manifest_digest: digest.expect("valid"), max_runtime_seconds: 60 };
    let acme = rented::tenant("acme");
    let first = services.runs.submit(&acme, "run-1", &ask).await.expect("submitted");
    let owner = acme.tenant.clone().expect("a tenant");
    let reason = Reason::parse("reason", "RentalGone").expect("valid");
    let system = rented::provider();
    services.runs.give_up(&system, &owner, (first.run, reason)).await.expect("closed");
    let before = log_length(&db).await;
    let again = services.runs.submit(&acme, "run-1", &ask).await.expect("the recorded one");
    assert_eq!(again.run, first.run);
    assert!(again.outcome.duplicate, "{:?}", again.outcome);
    assert_eq!(log_length(&db).await, before, "nothing appended");
}

#[tokio::test]
async fn a_heartbeat_sent_again_after_its_node_enrolled_anew_answers_as_it_did() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(rented::start());
    let services = rented::services(&db, &clock);
    let rental = rented::active_rental(&services, "acme", "r-1").await;
    let enrolled = rented::enroll(&services, rental).await;
    let session = rented::session_of(&services, &enrolled);
    let facts = Some(rented::facts());
    let first = services.nodes.heartbeat(&session, "beat-1", facts.clone()).await.expect("beat");
    // The node enrolls again: the session that beat is closed, and its token fenced.
    let resumed = Presented::Credential(&enrolled.credential);
    let node = rented::node1(rental);
    services
        .nodes
        .enroll(node, resumed, (rented::agent_version(), rented::facts()))
        .await
        .expect("resumed");
    let before = log_length(&db).await;
    let again = services.nodes.heartbeat(&session, "beat-1", facts).await.expect("as it was");
    replayed(&db, (&first, &again), before).await;
    // A new beat under the closed session is fenced.
    let stale = services.nodes.heartbeat(&session, "beat-2", None).await;
    assert!(stale.is_err(), "{stale:?}");
}

#[tokio::test]
async fn a_snapshot_asked_again_after_its_vm_was_removed_answers_its_creation() {
    use leasehold_commands::snapshot_service::{SnapshotConfig, SnapshotService};
    use leasehold_domain::snapshot::RequestedKind;
    let db = TestDb::migrated().await;
    fleet::register(&db, "h-1", fleet::host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = fleet::service(&db, &["h-1"], PlacementPolicy::Spread);
    let (acme, task, secrets) = (fleet::tenant("acme"), fleet::task("t-1"), fleet::no_secrets());
    let vm = vms.create(&acme, "create-1", (&task, fleet::spec()), &secrets).await;
    let vm = vm.expect("created").vm;
    let (agent, host) = (fleet::agent(), fleet::host_id("h-1"));
    let boot = vms.owned(vm).await.expect("read").1.operation.expect("a boot");
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    vms.report_booted(&agent, &host, "booted", vm, (boot, url)).await.expect("booted");
    let pipeline = leasehold_commands::CommandPipeline::new(db.store(), Default::default());
    let listing = leasehold_adapters::PgReadModels::of(&db.store());
    let snapshots = SnapshotService::new(pipeline, listing, SnapshotConfig::default());
    let ask = fleet::snapshot_ask(vm, RequestedKind::Disk);
    let first = snapshots.create(&acme, "s-1", &ask).await.expect("asked");
    // The VM is destroyed and removed: nothing could be snapshotted of it now.
    vms.destroy(&acme, "destroy-1", vm).await.expect("destroying");
    let removal = vms.owned(vm).await.expect("read").1.operation.expect("a removal");
    vms.confirm_removed(&agent, &host, "removed", (vm, removal)).await.expect("removed");
    let before = log_length(&db).await;
    let again = snapshots.create(&acme, "s-1", &ask).await.expect("the recorded one");
    assert_eq!(again.snapshot, first.snapshot);
    replayed(&db, (&first.outcome, &again.outcome), before).await;
}
