//! A lease's assignment and its reservation on its tenant's runner capacity are one append
//! with an expected version on both streams: sixteen concurrent assignments from sixteen
//! processes against room for ten commit exactly ten, and no point of the log ever shows
//! the capacity past its limit.

use futures_util::future::join_all;
use leasehold_commands::ErrorClass;
use leasehold_commands::runner_service::capacity_of;
use leasehold_domain::runner_capacity::{RunnerCapacity, RunnerCapacityEvent, RunnerLimits};
use leasehold_domain::{Aggregate, DomainEvent, EventStore as _};
use leasehold_tests::TestDb;

use super::support::*;

const CONTENDERS: u128 = 16;
const ROOM: u64 = 10;

#[tokio::test]
async fn sixteen_concurrent_assignments_with_room_for_ten_commit_exactly_ten() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let setup = process(&db, &clock);
    let limits = RunnerLimits { vcpu: ROOM * 4, ..RunnerLimits::default() };
    setup.set_limits(&operator(), "limits", (&acme(), limits)).await.expect("limits set");
    let mut leases = Vec::new();
    for n in 0..CONTENDERS {
        leases.push(requested(&setup, &format!("lease-{n}")).await);
    }
    // Each assignment from a process of its own, all at once.
    let processes: Vec<Service> = (0..CONTENDERS).map(|_| process(&db, &clock)).collect();
    let assignments =
        processes.iter().zip(&leases).enumerate().map(|(n, (service, lease))| {
            let job = job(n as u128);
            async move {
                service.assign(&tenant("acme"), &format!("assign-{n}"), (*lease, 1, job)).await
            }
        });
    let answers = join_all(assignments).await;
    let committed = answers.iter().filter(|answer| answer.is_ok()).count();
    assert_eq!(committed, ROOM as usize, "{answers:?}");
    for refused in answers.iter().filter_map(|answer| answer.as_ref().err()) {
        assert_eq!(refused.class(), ErrorClass::QuotaExceeded, "{refused:?}");
    }
    // Every prefix of the capacity's stream stays within the limit.
    let stream = capacity_of(&acme()).stream_id();
    let events = db.store().read_stream(&stream, 1, 10_000).await.expect("readable");
    let mut capacity = RunnerCapacity::initial();
    for recorded in &events {
        let event =
            RunnerCapacityEvent::from_stored(recorded.event_type.as_str(), &recorded.payload)
                .expect("decodes");
        capacity = capacity.evolve(&event);
        assert!(capacity.usage.vcpu <= ROOM * 4, "past the limit at version {}", recorded.version);
    }
    assert_eq!(capacity.usage.vcpu, ROOM * 4);
    assert_eq!(capacity.reservations.len(), ROOM as usize);
    // The leases that lost were not assigned: nothing of theirs was appended.
    let mut assigned = 0;
    for lease in &leases {
        let stored = setup.owned(*lease).await.expect("stored").1;
        assigned += usize::from(stored.job.is_some());
        assert_eq!(stored.is_charged(), capacity.reservations.contains_key(lease));
    }
    assert_eq!(assigned, ROOM as usize);
}
