//! The `vm-reaper` reconciler over a real PostgreSQL, on a controlled clock: a VM running past
//! its maximum runtime is struck on one sweep and destroyed on the next (a dead letter for
//! operators); two reapers started together act as one; a reaper stopped after its strike and
//! started again destroys the VM exactly once.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_adapters::PgProjectionStore;
use leasehold_adapters::vm_reaper::{VmReapPolicy, VmReaper};
use leasehold_commands::vm_service::{StreamCatalog, VmService};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{HostBackend, VmId};
use leasehold_domain::vm::{PlacementPolicy, VmUrl};
use leasehold_domain::{Clock, EventStore as _};
use leasehold_projections::vm::VmProjection;
use leasehold_projections::{ManualClock, ReconcilerConfig, ReconcilerRunner, RunnerStats};
use leasehold_tests::TestDb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::support::*;
use crate::projections::support::{last_event, quick, start_of};
use crate::reaping::calls_past;

const WAIT: Duration = Duration::from_secs(60);

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

fn clocked_service(db: &TestDb, clock: &Arc<ManualClock>) -> Service {
    let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default())
        .with_clock(Arc::clone(clock) as Arc<dyn Clock>);
    let catalog = StreamCatalog::new(pipeline.clone(), vec![host_id("agent-1")]);
    let vault = leasehold_adapters::vault::PgCredentialVault::new(db.store(), VAULT_KEY);
    VmService::new(pipeline, (catalog, vault), PlacementPolicy::Spread)
}

/// A running VM, booted at the clock's time.
async fn running_vm(db: &TestDb, vms: &Service) -> VmId {
    register(db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let boot = vms.owned(created.vm).await.expect("stored").1.operation.expect("a boot");
    let url = VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    let booted: (OperationId, VmUrl) = (boot, url);
    vms.report_booted(&agent(), &host_id("agent-1"), "b-1", created.vm, booted)
        .await
        .expect("booted");
    created.vm
}

fn reaper(
    db: &TestDb,
    vms: &Service,
    clock: &Arc<ManualClock>,
) -> (watch::Sender<bool>, JoinHandle<()>, Arc<RunnerStats>) {
    let reaper = VmReaper::new(vms.clone(), db.store(), VmReapPolicy::default());
    let mut config = ReconcilerConfig::new(Arc::clone(clock) as Arc<dyn Clock>);
    config.clock_moved = Some(clock.moved());
    config.retry_interval = Duration::from_millis(50);
    let runner = ReconcilerRunner::new(reaper, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    let stats = runner.stats();
    (stop, tokio::spawn(runner.run(stopped)), stats)
}

async fn types(db: &TestDb, vm: VmId) -> Vec<String> {
    let events = db.store().read_stream(&vm.stream_id(), 1, 100).await.expect("readable");
    events.iter().map(|event| event.event_type.to_string()).collect()
}

async fn count(db: &TestDb, vm: VmId, event_type: &str) -> usize {
    types(db, vm).await.iter().filter(|t| t.as_str() == event_type).count()
}

/// Waits until `vm` has `n` events of `event_type`.
async fn until(db: &TestDb, vm: VmId, event_type: &str, n: usize) {
    let reached = async {
        while count(db, vm, event_type).await < n {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, reached).await.unwrap_or_else(|_| panic!("no {event_type} on {vm}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_vm_is_struck_then_destroyed_and_dead_lettered() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(t0());
    let vms = clocked_service(&db, &clock);
    let vm = running_vm(&db, &vms).await;
    let mut projection = start_of(VmProjection, &db.store(), quick());
    projection.reached(last_event(&db).await).await;
    let (stop, task, stats) = reaper(&db, &vms, &clock);
    calls_past(&stats, 0).await;
    // A second short of two hours: not stuck yet, a sweep strikes nothing.
    let calls = stats.batches.load(Ordering::SeqCst);
    clock.advance(TimeDelta::hours(2) - TimeDelta::seconds(1));
    calls_past(&stats, calls).await;
    assert_eq!(count(&db, vm, "VmStruck").await, 0);
    clock.advance(TimeDelta::seconds(30));
    until(&db, vm, "VmStruck", 1).await;
    projection.reached(last_event(&db).await).await;
    clock.advance(TimeDelta::seconds(30));
    until(&db, vm, "VmDestroying", 1).await;
    assert_eq!(count(&db, vm, "VmStruck").await, 1);
    projection.reached(last_event(&db).await).await;
    let client = db.client().await;
    let letter = client
        .query_one(
            "SELECT kind, task_id, retry_count FROM dead_letters WHERE entity_id = $1",
            &[&vm.0.to_string()],
        )
        .await
        .expect("a dead letter");
    assert_eq!(
        (letter.get::<_, &str>(0), letter.get::<_, Option<&str>>(1), letter.get::<_, i32>(2)),
        ("stuck_task", Some("t"), 1)
    );
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, task).await;
    projection.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reapers_started_together_or_again_destroy_a_vm_exactly_once() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(t0());
    let vms = clocked_service(&db, &clock);
    let vm = running_vm(&db, &vms).await;
    let mut projection = start_of(VmProjection, &db.store(), quick());
    projection.reached(last_event(&db).await).await;
    let (first_stop, first, first_stats) = reaper(&db, &vms, &clock);
    let (second_stop, second, second_stats) = reaper(&db, &vms, &clock);
    clock.advance(TimeDelta::hours(2));
    until(&db, vm, "VmStruck", 1).await;
    // One of them holds the lock and acts; the other only waits for it.
    let acted = [&first_stats, &second_stats]
        .iter()
        .filter(|s| s.batches.load(Ordering::SeqCst) > 0)
        .count();
    assert_eq!(acted, 1, "one reaper acts");
    // The reaper that struck is stopped (as a crash would), and one starts again.
    first.abort();
    second.abort();
    let _ = (first.await, second.await);
    drop((first_stop, second_stop));
    projection.reached(last_event(&db).await).await;
    let (stop, again, stats) = reaper(&db, &vms, &clock);
    calls_past(&stats, 0).await;
    clock.advance(TimeDelta::seconds(30));
    until(&db, vm, "VmDestroying", 1).await;
    // More sweeps change nothing: a destroying VM is not struck.
    projection.reached(last_event(&db).await).await;
    for _ in 0..3 {
        let calls = stats.batches.load(Ordering::SeqCst);
        clock.advance(TimeDelta::seconds(30));
        calls_past(&stats, calls).await;
    }
    assert_eq!(count(&db, vm, "VmStruck").await, 1, "{:?}", types(&db, vm).await);
    assert_eq!(count(&db, vm, "VmDestroying").await, 1);
    stop.send_replace(true);
    let _ = tokio::time::timeout(WAIT, again).await;
    projection.stop().await;
}
