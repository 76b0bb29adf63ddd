//! One lease per job, idempotent and contradictory releases, and reaps with their fence,
//! through the runner service against PostgreSQL.

use chrono::TimeDelta;
use leasehold_commands::ErrorClass;
use leasehold_commands::runner_service::{HolderReport, Settlement, capacity_of, job_of};
use leasehold_domain::EventStore as _;
use leasehold_domain::runner::{Outcome, Phase};
use leasehold_domain::runner_job::JobStatus;
use leasehold_domain::values::Reason;
use leasehold_tests::TestDb;

use super::support::*;
use crate::support::log_len;

#[tokio::test]
async fn the_same_job_assigned_to_another_lease_conflicts_and_appends_nothing() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let first = requested(&service, "first").await;
    let second = requested(&service, "second").await;
    service.assign(&tenant("acme"), "assign-1", (first, 1, job(1))).await.expect("assigned");
    // Assigning it again to the same lease, under a new key, is idempotent.
    let again = service.assign(&tenant("acme"), "assign-1b", (first, 1, job(1))).await;
    assert!(again.expect("idempotent").outcome.event_types.is_empty());
    let before = log_len(&db).await;
    let taken = service.assign(&tenant("acme"), "assign-2", (second, 1, job(1))).await;
    let error = taken.expect_err("the job is the first lease's");
    assert_eq!(error.class(), ErrorClass::Conflict, "{error:?}");
    assert_eq!(log_len(&db).await, before, "nothing appended: not the lease, not its capacity");
    // A different job on a lease that holds one is a conflict too.
    let other = service.assign(&tenant("acme"), "assign-3", (first, 1, job(2))).await;
    assert_eq!(other.expect_err("another job").class(), ErrorClass::Conflict);
    // Another tenant's job of the same request is another job.
    let theirs = service.request(&tenant("globex"), "theirs", &ask()).await.expect("requested");
    service
        .assign(&tenant("globex"), "assign-4", (theirs.lease, 1, job(1)))
        .await
        .expect("globex's own job");
    let held = service.job(&acme(), job(1)).await.expect("readable").expect("claimed");
    assert_eq!((held.status, held.lease), (JobStatus::Assigned, Some(first)));
}

#[tokio::test]
async fn the_same_release_twice_is_recorded_once_and_a_contradictory_one_conflicts() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let lease = requested(&service, "lease").await;
    service.assign(&tenant("acme"), "assign", (lease, 1, job(1))).await.expect("assigned");
    let owned = (acme(), lease, 1);
    let done = (Outcome::Done, None);
    let first = service.release(&tenant("acme"), "release-1", owned.clone(), done.clone()).await;
    assert_eq!(first.expect("released").outcome.event_types, ["RunnerReleased"]);
    // The same outcome again, under another key (the node's, say): success, nothing new.
    let again = service.release(&machine("node:docker-1"), "release-2", owned.clone(), done).await;
    assert!(again.expect("idempotent").outcome.event_types.is_empty());
    let before = log_len(&db).await;
    let failed = (Outcome::Failed, Some(Reason::parse("reason", "JobFailed").expect("valid")));
    let contradiction = service.release(&tenant("acme"), "release-3", owned, failed).await;
    assert_eq!(contradiction.expect_err("another outcome").class(), ErrorClass::Conflict);
    assert_eq!(log_len(&db).await, before);
    // Released before any compute: done, its capacity released, its job finished once.
    let capacity = service.capacity(&acme()).await.expect("readable").expect("opened");
    assert!(capacity.reservations.is_empty(), "{capacity:?}");
    let held = service.job(&acme(), job(1)).await.expect("readable").expect("claimed");
    assert_eq!((held.status, held.outcome), (JobStatus::Finished, Some(Outcome::Done)));
    let job_events = db.store().read_stream(&job_of(&acme(), job(1)).stream_id(), 1, 100).await;
    assert_eq!(job_events.expect("readable").len(), 2, "claimed, finished: once each");
}

#[tokio::test]
async fn a_reaped_busy_lease_is_quarantined_still_charged_and_its_old_epoch_fenced() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let lease = busy(&service, "busy", 1).await;
    let reaper = machine("system:runner-reaper");
    // Not expired yet: nothing.
    let early = service.settle(&reaper, "reap-early", (acme(), lease), Settlement::Reap).await;
    assert!(early.expect("accepted").outcome.event_types.is_empty());
    clock.advance(TimeDelta::seconds(91));
    let reaped = service.settle(&reaper, "reap", (acme(), lease), Settlement::Reap).await;
    assert_eq!(reaped.expect("reaped").outcome.event_types, ["RunnerReaped"]);
    let (_, stored) = service.owned(lease).await.expect("stored");
    assert_eq!((stored.phase, stored.epoch), (Phase::Quarantine, 2));
    let capacity = service.capacity(&acme()).await.expect("readable").expect("opened");
    assert!(capacity.reservations.contains_key(&lease), "quarantined: still charged");
    assert_eq!(capacity.usage.vcpu, 4);
    // The node's process that held epoch 1 is fenced, with nothing appended.
    let before = log_len(&db).await;
    let stale = HolderReport::Heartbeat { epoch: 1 };
    let fenced = service.report(&machine("node:docker-1"), "beat", (acme(), lease), stale).await;
    assert_eq!(fenced.expect_err("stale epoch").class(), ErrorClass::Fenced);
    let release = service
        .release(
            &machine("node:docker-1"),
            "late-release",
            (acme(), lease, 1),
            (Outcome::Done, None),
        )
        .await;
    assert_eq!(release.expect_err("stale epoch").class(), ErrorClass::Fenced);
    assert_eq!(log_len(&db).await, before);
    // An operator's force ends it: released, recorded as the operator's word.
    let force = Settlement::Force { detail: "destroyed by hand".into() };
    let forced = service.settle(&operator(), "force", (acme(), lease), force).await;
    assert_eq!(forced.expect("forced").outcome.event_types, ["RunnerForceReleased"]);
    let capacity = service.capacity(&acme()).await.expect("readable").expect("opened");
    assert!(capacity.reservations.is_empty());
    let _ = capacity_of(&acme());
}
