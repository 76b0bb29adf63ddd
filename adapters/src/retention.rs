//! The retention reaper: the reconciler that ends retained data's life (DOMAIN.md §1.1,
//! RetainedLease). A released lease whose data the backend kept is restorable until its grace
//! period ends (`retained_until`, from `--retention-max-age`) or until its tenant keeps more
//! retained leases than the cap allows (`--retained-per-tenant`, the oldest go first; a record
//! being restored does not count, as it is about to be consumed). Then
//! the reaper issues `Reap`: the record turns `reaping`, still counts toward disk usage, and
//! can no longer be restored. It is deleted (`ConfirmReaped`) only when the backend's own
//! complete retention listing no longer holds it (the inventory reconciler's positive fact):
//! the backends' protocol has no call that destroys retained data, so the backend's own sweep,
//! configured with the same policy, does.
//!
//! It reads the `retained_leases` read model on a tick (and when events arrive, once due);
//! every `Reap` is keyed by the record's cause, lease and last change as read, so a restarted
//! reaper that reads the same record issues the same command, which the pipeline answers with
//! its recorded outcome. A record changed since (a restore began, then rolled back) is read
//! with a newer change time, so the aggregate decides afresh.

use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_commands::{CommandError, CommandStore};
use leasehold_domain::lease::{LeaseCommand, LeaseId, ReapCause};
use leasehold_domain::{Actor, StoreError};
use leasehold_projections::{ReconcileError, Reconciler, Seen};
use uuid::Uuid;

use crate::store::{PgEventStore, from_driver, from_pool};

/// Most records reaped in one call; more are reaped on the next, at once.
const REAP_BATCH: i64 = 500;

/// When retained data is reaped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Most retained leases a tenant keeps; the oldest beyond it are reaped (`None`: no cap).
    pub per_tenant: Option<u32>,
    /// How often the reaper looks, besides each record's own deadline.
    pub sweep_every: TimeDelta,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self { per_tenant: None, sweep_every: TimeDelta::seconds(60) }
    }
}

/// One record to reap, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Candidate {
    lease: LeaseId,
    cause: ReapCause,
    changed: DateTime<Utc>,
}

/// The retention reaper.
#[derive(Debug)]
pub struct RetentionReaper<S> {
    service: LeaseService<S>,
    log: PgEventStore,
    policy: RetentionPolicy,
    next_sweep: Mutex<Option<DateTime<Utc>>>,
}

impl<S: CommandStore + Clone + Send + Sync + 'static> RetentionReaper<S> {
    /// Reaps by `policy`, reading the read models in `log`'s database and issuing commands
    /// through `service` (whose clock must be the reconciler runner's).
    pub fn new(service: LeaseService<S>, log: PgEventStore, policy: RetentionPolicy) -> Self {
        Self { service, log, policy, next_sweep: Mutex::new(None) }
    }

    /// The records due at `now`, grace expiries first, and the next deadline after `now`.
    async fn due(
        &self,
        now: DateTime<Utc>,
    ) -> Result<(Vec<Candidate>, Option<DateTime<Utc>>), StoreError> {
        let endpoint = self.log.endpoint();
        let client = self.log.pool().get().await.map_err(|e| from_pool(e, endpoint))?;
        let fail = |error| from_driver(error, endpoint);
        // A cap of -1 keeps nothing from the cap's half of the query.
        let cap = self.policy.per_tenant.map_or(-1, i64::from);
        let rows = client
            .query(
                "SELECT lease_id, updated_at, 'grace' FROM retained_leases \
                 WHERE status = 'active' AND retained_until <= $1 \
                 UNION ALL \
                 SELECT lease_id, updated_at, 'cap' FROM ( \
                   SELECT r.lease_id, r.updated_at, r.status, row_number() OVER ( \
                     PARTITION BY r.tenant_id ORDER BY l.created_at DESC, r.lease_id DESC) AS rank \
                   FROM retained_leases r JOIN leases l ON l.lease_id = r.lease_id \
                   WHERE r.status = 'active') AS ranked \
                 WHERE $2::bigint >= 0 AND rank > $2::bigint \
                 LIMIT $3",
                &[&now, &cap, &REAP_BATCH],
            )
            .await
            .map_err(fail)?;
        let mut due: Vec<Candidate> = Vec::with_capacity(rows.len());
        for row in &rows {
            let lease = LeaseId(row.get::<_, Uuid>(0));
            if due.iter().any(|c| c.lease == lease) {
                continue;
            }
            let cause = match row.get::<_, &str>(2) {
                "grace" => ReapCause::GraceExpired,
                _ => ReapCause::TenantCapEvicted,
            };
            due.push(Candidate { lease, cause, changed: row.get(1) });
        }
        let next = client
            .query_one(
                "SELECT min(retained_until) FROM retained_leases \
                 WHERE status = 'active' AND retained_until > $1",
                &[&now],
            )
            .await
            .map_err(fail)?
            .get::<_, Option<DateTime<Utc>>>(0);
        let more = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= REAP_BATCH;
        Ok((due, if more { Some(now) } else { next }))
    }

    /// Issues `Reap` for `candidate`. A refusal (it is no longer active, or gone) is its
    /// answer: nothing to do.
    async fn reap(&self, candidate: Candidate) -> Result<(), ReconcileError> {
        let Candidate { lease, cause, changed } = candidate;
        let why = match cause {
            ReapCause::GraceExpired => "grace",
            ReapCause::TenantCapEvicted => "cap",
        };
        let key = format!("retention-reaper:{why}:{}:{}", lease.0, changed.timestamp_micros());
        match self.service.for_owner(&reaper(), &key, lease, LeaseCommand::Reap { cause }).await {
            Ok(_) => {
                tracing::info!(lease = %lease.0, cause = why, "retained data reaped");
                Ok(())
            }
            Err(CommandError::Refused(_) | CommandError::NotFound) => Ok(()),
            Err(error) => Err(ReconcileError::Retry {
                action: "reap retained data".into(),
                reason: error.to_string(),
            }),
        }
    }
}

impl<S: CommandStore + Clone + Send + Sync + 'static> Reconciler for RetentionReaper<S> {
    const NAME: &'static str = "retention-reaper";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let (due, deadline) = self.due(seen.now).await?;
        for candidate in due {
            self.reap(candidate).await?;
        }
        let sweep = seen.now + self.policy.sweep_every;
        let next = deadline.map_or(sweep, |deadline| deadline.min(sweep));
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        Ok(Some(next))
    }
}

/// The reaper, as the events' metadata names it.
fn reaper() -> Caller {
    Caller {
        actor: Actor { subject: "retention-reaper".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}
