//! The `snapshot-gc` reconciler: every sweep (an hour by default) it deletes the snapshots
//! whose retention has passed, as the snapshot projection last wrote them, through the
//! snapshot service, whose aggregate keeps its guards: never a build artifact, never a VM's
//! latest snapshot, never a parent of a child that is not being deleted. A deletion the
//! host's agent fails leaves the snapshot in `error`; the next sweep tries again, and from
//! the fifth failure in a row on each failure is a dead letter for operators (the aggregate
//! decides it, the projection files it).
//!
//! The same sweep keeps each tenant's layer cache under its cap (`with_layer_cap`): past it,
//! the least recently used ready layers (a cache hit's use, else when it became ready) are
//! evicted, as deletions whose cause is the eviction, each an event.
//!
//! And it gives up on snapshots stuck `creating` past `with_stuck_after` (no agent answered:
//! a host without a token, an agent that lost the work): recorded as the agent's failure of
//! the current operation, so a stuck creation gives its quota back. (A stuck restore is left:
//! the snapshot is whole at its host.)
//!
//! Each deletion's operation key names the snapshot and the state it was decided on (its
//! last change), so a sweep stopped and run again repeats its commands, which the ledger
//! answers once. Sweeps run on the reconciler's clock, never the system's. The projection may
//! lag: a snapshot it still shows `ready` after another deletion is refused by the aggregate,
//! and a parent whose last child was just deleted waits for a later sweep.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::snapshot_service::{SnapshotListing, SnapshotService};
use leasehold_commands::{CommandError, CommandStore, ErrorClass};
use leasehold_domain::Actor;
use leasehold_domain::snapshot::SnapshotId;
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use crate::store::{PgEventStore, from_driver};

/// Most snapshots one sweep looks at (the oldest retention first; the rest wait a sweep).
pub const GC_SWEEP_ROWS_MAX: i64 = 500;

// Past retention, and not one the aggregate would keep as the projection shows it (a VM's
// latest usable snapshot, a parent of a child not being deleted): protected rows never fill
// a sweep's page and starve the rest. The aggregate still decides each deletion.
const DUE_SQL: &str = "SELECT r.snapshot_id, r.updated_at FROM snapshot_records r \
     WHERE r.state IN ('ready', 'error') AND r.mode <> 'build' AND r.retention_until <= $1 \
     AND NOT EXISTS (SELECT 1 FROM snapshot_records c WHERE c.tenant_id = r.tenant_id \
       AND c.parent_snapshot_id = r.snapshot_id AND c.state NOT IN ('deleting', 'deleted')) \
     AND r.snapshot_id IS DISTINCT FROM (SELECT l.snapshot_id FROM snapshot_records l \
       WHERE l.tenant_id = r.tenant_id AND l.vm_id = r.vm_id \
       AND l.state IN ('ready', 'restoring') AND l.mode <> 'build' \
       ORDER BY l.created_at DESC, l.snapshot_id DESC LIMIT 1) \
     ORDER BY r.retention_until, r.snapshot_id LIMIT $2";

/// Each tenant's ready layers past the cap, least recently used first (ties: the older id),
/// but a parent of a child not being deleted (the aggregate keeps it: it would only be refused
/// again every sweep; it still counts toward the cap).
const OVER_CAP_SQL: &str = "SELECT snapshot_id, updated_at FROM ( \
       SELECT snapshot_id, tenant_id, updated_at, last_used, created_at, row_number() OVER ( \
         PARTITION BY tenant_id \
         ORDER BY coalesce(last_used, created_at) DESC, snapshot_id DESC) AS newness \
       FROM snapshot_records \
       WHERE mode = 'build' AND layer_key IS NOT NULL AND state = 'ready') ranked \
     WHERE newness > $1 AND NOT EXISTS (SELECT 1 FROM snapshot_records c \
       WHERE c.tenant_id = ranked.tenant_id AND c.parent_snapshot_id = ranked.snapshot_id \
       AND c.state NOT IN ('deleting', 'deleted')) \
     ORDER BY coalesce(last_used, created_at), snapshot_id LIMIT $2";

/// Snapshots creating with no change since `$1`.
const STUCK_SQL: &str = "SELECT snapshot_id, updated_at FROM snapshot_records \
     WHERE state = 'creating' AND updated_at <= $1 \
     ORDER BY updated_at, snapshot_id LIMIT $2";

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcSweep {
    /// Snapshots past their retention it looked at.
    pub due: usize,
    /// Deletions it asked for.
    pub deleting: usize,
    /// Snapshots the aggregate kept (a VM's latest, a parent of a live child, moved on).
    pub kept: usize,
    /// Deletions that failed to be recorded (the next sweep looks again).
    pub failed: usize,
    /// Layers evicted past their tenant's cap.
    pub evicting: usize,
    /// Creations given up on.
    pub given_up: usize,
}

/// The retention garbage collector.
#[derive(Debug)]
pub struct SnapshotGc<S, L> {
    snapshots: SnapshotService<S, L>,
    store: PgEventStore,
    sweep_every: TimeDelta,
    layer_cap: Option<usize>,
    stuck_after: Option<TimeDelta>,
    next_sweep: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl<S, L> SnapshotGc<S, L> {
    /// A collector deleting through `snapshots`, reading the snapshot projection in the
    /// database of `store`, sweeping every `sweep_every`.
    pub fn new(
        snapshots: SnapshotService<S, L>,
        store: PgEventStore,
        sweep_every: TimeDelta,
    ) -> Self {
        let next_sweep = std::sync::Mutex::new(None);
        Self { snapshots, store, sweep_every, layer_cap: None, stuck_after: None, next_sweep }
    }

    /// The same collector giving up on creations unchanged for `after` (none: never).
    #[must_use]
    pub fn with_stuck_after(mut self, after: Option<TimeDelta>) -> Self {
        self.stuck_after = after;
        self
    }

    /// The same collector keeping each tenant's ready layers at most `cap` (none: no cap).
    #[must_use]
    pub fn with_layer_cap(mut self, cap: Option<usize>) -> Self {
        self.layer_cap = cap;
        self
    }
}

fn collector() -> Caller {
    Caller {
        actor: Actor { subject: "snapshot-gc".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S, L> SnapshotGc<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing,
{
    /// The snapshots past their retention at `now`, with the time of their last change.
    async fn due(
        &self,
        now: DateTime<Utc>,
    ) -> Result<Vec<(SnapshotId, DateTime<Utc>)>, ReconcileError> {
        let client = self.store.client().await.map_err(|error| retry(&error))?;
        let rows = client
            .query(DUE_SQL, &[&now, &GC_SWEEP_ROWS_MAX])
            .await
            .map_err(|error| retry(&from_driver(error, self.store.endpoint())))?;
        Ok(rows.iter().map(|row| (SnapshotId(row.get(0)), row.get(1))).collect())
    }

    /// Gives up on the snapshots creating unchanged since `since`.
    async fn give_up(
        &self,
        since: DateTime<Utc>,
        sweep: &mut GcSweep,
    ) -> Result<(), ReconcileError> {
        let client = self.store.client().await.map_err(|error| retry(&error))?;
        let rows = client
            .query(STUCK_SQL, &[&since, &GC_SWEEP_ROWS_MAX])
            .await
            .map_err(|error| retry(&from_driver(error, self.store.endpoint())))?;
        drop(client);
        for row in rows {
            let (snapshot, updated_at): (SnapshotId, DateTime<Utc>) =
                (SnapshotId(row.get(0)), row.get(1));
            let key = format!("snapshot-stuck:{}:{}", snapshot.0, updated_at.timestamp_micros());
            let detail = leasehold_domain::values::OperatorDetail::new(&format!(
                "no answer from the host's agent since {updated_at}"
            ));
            match self.snapshots.give_up(&collector(), &key, (snapshot, since, detail)).await {
                Ok(Some(done))
                    if !done.outcome.duplicate && !done.outcome.event_types.is_empty() =>
                {
                    sweep.given_up += 1;
                }
                Ok(_) => {}
                Err(error) => {
                    sweep.failed += 1;
                    tracing::warn!(snapshot = %snapshot.0, %error, "a stuck snapshot was not given up; the next sweep looks again");
                }
            }
        }
        Ok(())
    }

    /// The layers past their tenant's cap, least recently used first.
    async fn over_cap(
        &self,
        cap: usize,
    ) -> Result<Vec<(SnapshotId, DateTime<Utc>)>, ReconcileError> {
        let client = self.store.client().await.map_err(|error| retry(&error))?;
        let cap = i64::try_from(cap).unwrap_or(i64::MAX);
        let rows = client
            .query(OVER_CAP_SQL, &[&cap, &GC_SWEEP_ROWS_MAX])
            .await
            .map_err(|error| retry(&from_driver(error, self.store.endpoint())))?;
        Ok(rows.iter().map(|row| (SnapshotId(row.get(0)), row.get(1))).collect())
    }

    /// One sweep at `now`: every snapshot past its retention asked to be deleted, then every
    /// layer past its tenant's cap evicted, each on its own (one's failure never ends the
    /// sweep).
    ///
    /// # Errors
    /// When the projection cannot be read.
    pub async fn sweep(&self, now: DateTime<Utc>) -> Result<GcSweep, ReconcileError> {
        let due = self.due(now).await?;
        let mut sweep = GcSweep { due: due.len(), ..GcSweep::default() };
        for (snapshot, updated_at) in due {
            let key = format!("snapshot-gc:{}:{}", snapshot.0, updated_at.timestamp_micros());
            let asked = self.snapshots.collect(&collector(), &key, snapshot).await;
            if tally(&mut sweep, snapshot, asked) {
                sweep.deleting += 1;
            }
        }
        if let Some(after) = self.stuck_after {
            self.give_up(now - after, &mut sweep).await?;
        }
        let Some(cap) = self.layer_cap else { return Ok(sweep) };
        for (snapshot, updated_at) in self.over_cap(cap).await? {
            let key = format!("snapshot-evict:{}:{}", snapshot.0, updated_at.timestamp_micros());
            let asked = self.snapshots.evict(&collector(), &key, snapshot).await;
            if tally(&mut sweep, snapshot, asked) {
                sweep.evicting += 1;
            }
        }
        Ok(sweep)
    }
}

/// Counts a deletion's answer on `sweep`; whether it was asked for now.
fn tally(
    sweep: &mut GcSweep,
    snapshot: SnapshotId,
    asked: Result<
        leasehold_commands::snapshot_service::SnapshotOutcome,
        CommandError<leasehold_domain::snapshot::SnapshotError>,
    >,
) -> bool {
    match asked {
        // A repeat of a deletion already asked for (the ledger's answer), or none.
        Ok(done) if done.outcome.duplicate || done.outcome.event_types.is_empty() => {
            sweep.kept += 1;
            false
        }
        Ok(_) => true,
        // Refused by the snapshot, or by the latest it is linked to (deleted meanwhile).
        Err(
            refused @ (CommandError::Refused(_)
            | CommandError::NotFound
            | CommandError::LinkedRefused { .. }),
        ) if matches!(refused.class(), ErrorClass::InvalidState | ErrorClass::NotFound) => {
            sweep.kept += 1;
            false
        }
        Err(error) => {
            sweep.failed += 1;
            tracing::warn!(snapshot = %snapshot.0, %error, "a GC deletion was not recorded; the next sweep looks again");
            false
        }
    }
}

fn retry(error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry {
        action: "read snapshots past retention".into(),
        reason: error.to_string(),
    }
}

impl<S, L> Reconciler for SnapshotGc<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing + 'static,
{
    const NAME: &'static str = "snapshot-gc";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let next = seen.now + self.sweep_every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        let sweep = self.sweep(seen.now).await?;
        if sweep.due > 0 || sweep.evicting > 0 || sweep.given_up > 0 {
            tracing::info!(
                evicting = sweep.evicting,
                given_up = sweep.given_up,
                due = sweep.due,
                deleting = sweep.deleting,
                kept = sweep.kept,
                failed = sweep.failed,
                "snapshot GC swept"
            );
        }
        Ok(Some(next))
    }
}
