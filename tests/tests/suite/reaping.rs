//! The retention reaper (`adapters/src/retention.rs`) over a real PostgreSQL, driven by a
//! controlled clock: grace expiry reaps a retained record once its `retained_until` passes and
//! not before; the per-tenant cap reaps the oldest beyond it, one tenant's records never
//! counting against another's; a reaped record cannot be restored.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_adapters::PgProjectionStore;
use leasehold_adapters::retention::{RetentionPolicy, RetentionReaper};
use leasehold_commands::lease_service::LeaseService;
use leasehold_commands::{CommandError, CommandPipeline, PipelineConfig};
use leasehold_domain::Clock;
use leasehold_domain::lease::{LeaseCommand, LeaseError, LeaseFacts, LeaseId};
use leasehold_projections::{ManualClock, ReconcilerConfig, ReconcilerRunner, RunnerStats};
use leasehold_tests::TestDb;
use tokio::sync::watch;

use crate::commands::support::{Pipeline, ready_lease, request, types_of};
use crate::projections::support::{last_event, quick, start};

const WAIT: Duration = Duration::from_secs(60);

/// How long retained data is kept after its lease was created, in these tests.
const MAX_AGE_DAYS: i64 = 7;

fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

fn pipeline(db: &TestDb, clock: &Arc<ManualClock>) -> Pipeline {
    CommandPipeline::new(db.store(), PipelineConfig::default())
        .with_clock(Arc::clone(clock) as Arc<dyn Clock>)
}

/// A lease of `tenant` created now, released with its data kept.
async fn retained(pipeline: &Pipeline, tenant: &str) -> LeaseId {
    let lease = ready_lease(pipeline, tenant).await;
    let key = |what: &str| format!("{what}-{}", lease.0.simple());
    let plain = LeaseFacts::default();
    pipeline
        .execute(request(tenant, lease, &key("down"), LeaseCommand::Deprovision, plain.clone()))
        .await
        .expect("deprovisioning");
    let kept = LeaseFacts { retention_max_age: Some(TimeDelta::days(MAX_AGE_DAYS)), ..plain };
    let confirm = LeaseCommand::ConfirmDeprovisioned { retained: true };
    pipeline.execute(request(tenant, lease, &key("gone"), confirm, kept)).await.expect("retained");
    lease
}

/// Runs the reaper on `clock` until the returned switch is flipped.
fn reaper(
    db: &TestDb,
    pipeline: &Pipeline,
    clock: &Arc<ManualClock>,
    per_tenant: Option<u32>,
) -> (watch::Sender<bool>, Arc<RunnerStats>) {
    let service = LeaseService::new(pipeline.clone(), None, Default::default());
    let policy = RetentionPolicy { per_tenant, sweep_every: TimeDelta::hours(1) };
    let reaper = RetentionReaper::new(service, db.store(), policy);
    let mut config = ReconcilerConfig::new(Arc::clone(clock) as Arc<dyn Clock>);
    config.clock_moved = Some(clock.moved());
    config.retry_interval = Duration::from_millis(50);
    let runner = ReconcilerRunner::new(reaper, PgProjectionStore::new(db.store()), config);
    let (stop, stopped) = watch::channel(false);
    let stats = runner.stats();
    tokio::spawn(runner.run(stopped));
    (stop, stats)
}

/// Waits until the lease's last event is `event_type`.
async fn until_last_event(db: &TestDb, lease: LeaseId, event_type: &str) {
    let reached = async {
        loop {
            if types_of(db, lease).await.last().map(String::as_str) == Some(event_type) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(WAIT, reached)
        .await
        .unwrap_or_else(|_| panic!("lease {} never got {event_type}", lease.0));
}

/// Waits until a reconciler has finished more than `calls` calls: whatever it was going to do
/// at the clock's reading, it has done.
pub(crate) async fn calls_past(stats: &RunnerStats, calls: u64) {
    let done = async {
        while stats.batches.load(Ordering::SeqCst) <= calls {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(WAIT, done).await.is_err() {
        panic!("the reaper did not run: {:?}", stats.last_error());
    }
}

#[tokio::test]
async fn grace_expiry_reaps_each_record_when_its_deadline_passes_and_then_it_cannot_be_restored() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(t0());
    let pipeline = pipeline(&db, &clock);
    let older = retained(&pipeline, "acme").await;
    clock.advance(TimeDelta::days(2));
    let newer = retained(&pipeline, "acme").await;
    let mut projection = start(&db.store(), quick());
    projection.reached(last_event(&db).await).await;
    let (stop, stats) = reaper(&db, &pipeline, &clock, None);
    calls_past(&stats, 0).await;

    // A second before the older one's deadline: nothing is reaped.
    let calls = stats.batches.load(Ordering::SeqCst);
    clock.advance(TimeDelta::days(MAX_AGE_DAYS - 2) - TimeDelta::seconds(1));
    calls_past(&stats, calls).await;
    assert_eq!(types_of(&db, older).await.last().map(String::as_str), Some("LeaseDeprovisioned"));

    clock.advance(TimeDelta::seconds(2));
    until_last_event(&db, older, "LeaseRetentionReaping").await;
    assert_eq!(types_of(&db, newer).await.last().map(String::as_str), Some("LeaseDeprovisioned"));
    let restore = LeaseCommand::BeginRestore { into: LeaseId(uuid::Uuid::now_v7()) };
    let refused = pipeline
        .execute(request("acme", older, "restore-reaped", restore, LeaseFacts::default()))
        .await;
    assert!(
        matches!(refused, Err(CommandError::Refused(LeaseError::RetainedNotRestorable))),
        "{refused:?}"
    );

    clock.advance(TimeDelta::days(2));
    until_last_event(&db, newer, "LeaseRetentionReaping").await;
    stop.send_replace(true);
    projection.stop().await;
}

#[tokio::test]
async fn the_tenant_cap_reaps_the_oldest_beyond_it_and_counts_each_tenant_alone() {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(t0());
    let pipeline = pipeline(&db, &clock);
    let mut acme = Vec::new();
    for _ in 0..3 {
        acme.push(retained(&pipeline, "acme").await);
        clock.advance(TimeDelta::hours(1));
    }
    let globex = [retained(&pipeline, "globex").await, retained(&pipeline, "globex").await];
    let mut projection = start(&db.store(), quick());
    projection.reached(last_event(&db).await).await;
    let (stop, stats) = reaper(&db, &pipeline, &clock, Some(2));

    // Its first call saw every record (the read models had caught up) and reaped them all.
    calls_past(&stats, 0).await;
    let reaping = events_of_type(&db, acme[0], "LeaseRetentionReaping").await;
    assert_eq!(reaping.len(), 1, "the oldest of acme's three is reaped");
    assert_eq!(reaping[0]["cause"], "tenant_cap_evicted");
    for kept in [acme[1], acme[2], globex[0], globex[1]] {
        assert_eq!(
            types_of(&db, kept).await.last().map(String::as_str),
            Some("LeaseDeprovisioned"),
            "{} is within its tenant's cap",
            kept.0
        );
    }
    stop.send_replace(true);
    projection.stop().await;
}

/// The payloads of the lease's events of `event_type`.
async fn events_of_type(db: &TestDb, lease: LeaseId, event_type: &str) -> Vec<serde_json::Value> {
    crate::commands::support::events_of(db, lease)
        .await
        .into_iter()
        .filter(|e| e.event_type.as_str() == event_type)
        .map(|e| e.payload)
        .collect()
}
