//! The runner reconcilers over a real PostgreSQL, on a controlled clock: the reaper
//! quarantines an expired busy lease (still charged) and fails an expired one without
//! compute, never before expiry; the inventory reconciler fences a re-registered node's
//! leases and releases a quarantined lease only when an inventory of its node lacks it past
//! the grace.

use std::sync::Arc;
use std::time::Duration;

use chrono::TimeDelta;
use leasehold_adapters::runners::{RunnerInventory, RunnerReaper};
use leasehold_adapters::{PgProjectionStore, PgReadModels};
use leasehold_domain::Clock;
use leasehold_domain::runner::{Phase, RunnerLeaseId};
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::{ManualClock, Reconciler, ReconcilerConfig, ReconcilerRunner};
use leasehold_tests::TestDb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::support::*;
use crate::projections::support::{last_event, quick, start_of};
use crate::rented::support::eventually;

/// Runs `reconciler` on `clock` until the returned sender stops it.
fn run<R>(
    db: &TestDb,
    reconciler: R,
    clock: &Arc<ManualClock>,
) -> (watch::Sender<bool>, JoinHandle<()>)
where
    R: Reconciler + Send + Sync + 'static,
{
    let mut config = ReconcilerConfig::new(Arc::clone(clock) as Arc<dyn Clock>);
    config.clock_moved = Some(clock.moved());
    config.retry_interval = Duration::from_millis(50);
    let runner = ReconcilerRunner::new(reconciler, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    (stop, tokio::spawn(runner.run(stopped)))
}

async fn phase_of(service: &Service, lease: RunnerLeaseId) -> (Phase, u64) {
    let (_, stored) = service.owned(lease).await.expect("stored");
    (stored.phase, stored.epoch)
}

/// Waits until the runner projection has every event so far.
async fn projected(db: &TestDb) {
    let mut running = start_of(RunnerProjection, &db.store(), quick());
    running.reached(last_event(db).await).await;
    running.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reaper_quarantines_an_expired_busy_lease_and_fails_one_without_compute() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let busy_lease = busy(&service, "busy", 1).await;
    let idle_lease = requested(&service, "idle").await;
    projected(&db).await;
    let reaper = RunnerReaper::new(
        process(&db, &clock),
        PgReadModels::of(&db.store()),
        TimeDelta::seconds(10),
    );
    let (stop, task) = run(&db, reaper, &clock);
    // Before expiry the reaper's first sweep leaves both alone.
    clock.advance(TimeDelta::seconds(30));
    projected(&db).await;
    assert_eq!(phase_of(&service, busy_lease).await, (Phase::Busy, 1));
    clock.advance(TimeDelta::seconds(70));
    eventually("both reaped", || async {
        let busy = phase_of(&service, busy_lease).await;
        let idle = phase_of(&service, idle_lease).await;
        (busy == (Phase::Quarantine, 2) && idle == (Phase::Failed, 2)).then_some(())
    })
    .await;
    let capacity = service.capacity(&acme()).await.expect("readable").expect("opened");
    assert!(capacity.reservations.contains_key(&busy_lease), "quarantined: still charged");
    stop.send(true).expect("running");
    task.await.expect("stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inventory_without_a_quarantined_lease_releases_it_only_past_the_grace() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let listed = busy(&service, "listed", 1).await;
    let missing = busy(&service, "missing", 2).await;
    let node = machine("node:docker-1");
    for (n, lease) in [listed, missing].into_iter().enumerate() {
        clock.advance(TimeDelta::seconds(91));
        let key = format!("reap-{n}");
        service
            .settle(
                &machine("system:test"),
                &key,
                (acme(), lease),
                leasehold_commands::runner_service::Settlement::Reap,
            )
            .await
            .expect("reaped");
    }
    projected(&db).await;
    let inventory = RunnerInventory::new(process(&db, &clock), PgReadModels::of(&db.store()));
    let (stop, task) = run(&db, inventory, &clock);
    // The node restarts knowing it runs only `listed`: its leases move to a new epoch, and
    // the absence of `missing` is no proof yet (within the grace).
    let registered =
        service.register_node(&node, "register-again", (registration(), Some(vec![listed]))).await;
    registered.expect("registered");
    eventually("epochs bumped", || async {
        let both = [phase_of(&service, missing).await, phase_of(&service, listed).await];
        (both == [(Phase::Quarantine, 3); 2]).then_some(())
    })
    .await;
    // Past the grace, its next sweep's inventory still lacks `missing`: released.
    clock.advance(TimeDelta::seconds(301));
    let node_epoch =
        service.node(&node_name()).await.expect("read").expect("registered").node_epoch;
    projected(&db).await;
    service
        .report_inventory(&node, "sweep", (&node_name(), node_epoch, vec![listed]))
        .await
        .expect("reported");
    eventually("the missing lease released", || async {
        (phase_of(&service, missing).await.0 == Phase::Failed).then_some(())
    })
    .await;
    assert_eq!(phase_of(&service, listed).await.0, Phase::Quarantine, "listed: still there");
    // An inventory of an earlier registration is fenced.
    let stale = service.report_inventory(&node, "stale", (&node_name(), 1, Vec::new())).await;
    assert_eq!(stale.expect_err("fenced").class(), leasehold_commands::ErrorClass::Fenced);
    stop.send(true).expect("running");
    task.await.expect("stopped");
}
