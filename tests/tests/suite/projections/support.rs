//! Running the lease projection in a test and waiting for it.

use std::sync::Arc;
use std::time::Duration;

use leasehold_adapters::PgEventStore;
use leasehold_domain::Cursor;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::{Runner, RunnerConfig, RunnerStats};
use leasehold_tests::TestDb;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a test waits for a projection to reach a cursor.
const WAIT_MAX: Duration = Duration::from_secs(60);

/// A runner of the lease projection on its own task.
pub struct Running {
    pub task: JoinHandle<()>,
    pub shutdown: watch::Sender<bool>,
    pub stats: Arc<RunnerStats>,
    pub checkpoints: watch::Receiver<Option<Cursor>>,
}

pub fn quick() -> RunnerConfig {
    RunnerConfig {
        poll_interval: Duration::from_millis(50),
        retry_interval: Duration::from_millis(50),
        ..RunnerConfig::default()
    }
}

pub fn start(store: &PgEventStore, config: RunnerConfig) -> Running {
    start_of(LeaseProjection, store, config)
}

/// A runner of `projection` on its own task.
pub fn start_of<P>(projection: P, store: &PgEventStore, config: RunnerConfig) -> Running
where
    P: leasehold_projections::Projection,
    leasehold_adapters::PgProjectionStore: leasehold_projections::ProjectionStore<P>,
{
    let (shutdown, stop) = watch::channel(false);
    let runner =
        Runner::new(projection, leasehold_adapters::PgProjectionStore::new(store.clone()), config);
    let (stats, checkpoints) = (runner.stats(), runner.checkpoints());
    let task = tokio::spawn(runner.run(stop));
    Running { task, shutdown, stats, checkpoints }
}

impl Running {
    /// Waits until this runner has committed (or read) a checkpoint at or past `cursor`.
    pub async fn reached(&mut self, cursor: Cursor) {
        let reached = self.checkpoints.wait_for(|c| c.is_some_and(|c| c >= cursor));
        tokio::time::timeout(WAIT_MAX, reached)
            .await
            .expect("the projection reaches the cursor in time")
            .expect("the runner is running");
    }

    /// Asks the runner to stop and waits until it has.
    pub async fn stop(self) {
        self.shutdown.send_replace(true);
        tokio::time::timeout(WAIT_MAX, self.task)
            .await
            .expect("the runner stops")
            .expect("it did not panic");
    }
}

/// The cursor of the last committed event. (The store's `head` may not see it yet: the
/// horizon is cluster-wide, and other tests' transactions hold it back.)
pub async fn last_event(db: &TestDb) -> Cursor {
    let row = db
        .client()
        .await
        .query_opt(
            "SELECT log_epoch, tx_id::text::bigint, position FROM events \
             ORDER BY log_epoch DESC, tx_id DESC, position DESC LIMIT 1",
            &[],
        )
        .await
        .expect("readable");
    row.map_or(Cursor::START, |row| Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(0)).expect("positive"),
        tx_id: u64::try_from(row.get::<_, i64>(1)).expect("positive"),
        position: u64::try_from(row.get::<_, i64>(2)).expect("positive"),
    })
}

/// Usage counters never fall below zero.
pub async fn assert_usage_never_negative(db: &TestDb) {
    let negative: i64 = db
        .client()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM quota_usage WHERE active_count < 0) \
                  + (SELECT count(*) FROM quota_usage_skus WHERE quantity < 0)",
            &[],
        )
        .await
        .expect("readable")
        .get(0);
    assert_eq!(negative, 0, "no usage counter is negative");
}

/// The lease projection's tables, each with a stable order.
const LEASE_TABLES: &[(&str, &str)] = &[
    ("lease_view_states", "lease_id"),
    ("leases", "lease_id"),
    ("lease_diagnostics", "lease_id"),
    ("releases", "lease_id, version"),
    ("retained_leases", "lease_id"),
    ("workloads", "kind, workload_id"),
    ("quota_usage", "tenant_id, kind"),
    ("quota_usage_skus", "tenant_id, kind, sku"),
];

/// Every read-model table's rows, as text, in a stable order.
pub async fn dump(db: &TestDb) -> Vec<(String, Vec<String>)> {
    dump_of(db, LEASE_TABLES).await
}

/// The rows of `tables` (each with its order), as text.
pub async fn dump_of(db: &TestDb, tables: &[(&str, &str)]) -> Vec<(String, Vec<String>)> {
    let client = db.client().await;
    let mut dumped = Vec::new();
    for (table, order) in tables {
        let rows = client
            .query(&format!("SELECT t::text FROM {table} t ORDER BY {order}"), &[])
            .await
            .expect("readable");
        dumped.push(((*table).to_owned(), rows.iter().map(|row| row.get(0)).collect()));
    }
    dumped
}

/// Empties the read models and forgets the checkpoint, for a rebuild from the start.
pub async fn reset(db: &TestDb) {
    reset_of(db, LEASE_TABLES).await;
}

/// Empties `tables` and forgets every checkpoint, for a rebuild from the start.
pub async fn reset_of(db: &TestDb, tables: &[(&str, &str)]) {
    let names: Vec<&str> = tables.iter().map(|(table, _)| *table).collect();
    let sql = format!("TRUNCATE {}; DELETE FROM projection_checkpoints", names.join(", "));
    db.client().await.batch_execute(&sql).await.expect("reset");
}
