//! The `runner-reaper` reconciler: every sweep (10 s by default) it reaps the runner leases
//! whose holders stopped reporting, as `runner_lease_holds` last showed them: a lease that
//! may hold compute is quarantined (still charged; unknown is running), one that cannot
//! fails. The lease decides at the pipeline's clock: one its holder renewed since the row was
//! written is left alone.
//!
//! Each reap's key names the lease, the epoch and the expiry it saw passed: a sweep repeated
//! after a crash repeats the same command, which the ledger answers once.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::runner_service::{RunnerService, Settlement};
use leasehold_domain::TenantId;
use leasehold_domain::runner::RunnerLeaseId;
use leasehold_projections::{ReconcileError, Reconciler, Seen, SweepSchedule};

use crate::PgReadModels;
use crate::rented::{retry, settled};

/// How often the reaper sweeps when nothing else is said.
pub const SWEEP_EVERY_DEFAULT: TimeDelta = TimeDelta::seconds(10);

/// The runner lease reaper.
#[derive(Debug)]
pub struct RunnerReaper<S> {
    runners: RunnerService<S>,
    read_models: PgReadModels,
    schedule: SweepSchedule,
}

impl<S> RunnerReaper<S> {
    /// A reaper acting through `runners`, reading `read_models`, sweeping every `every`.
    pub fn new(runners: RunnerService<S>, read_models: PgReadModels, every: TimeDelta) -> Self {
        Self { runners, read_models, schedule: SweepSchedule::every(every) }
    }
}

impl<S> RunnerReaper<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn sweep(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        let expired = self
            .read_models
            .runner_leases_expired(now)
            .await
            .map_err(|e| retry("read runner leases", &e))?;
        let caller = super::system(Self::NAME);
        for hold in expired {
            let Ok(owner) = TenantId::parse(&hold.tenant) else { continue };
            let expires = hold.expires_at.map_or(0, |at| at.timestamp_micros());
            let key = format!("runner-reap:{}:{}:{expires}", hold.lease, hold.epoch);
            let lease = (owner, RunnerLeaseId(hold.lease));
            let reaped = self.runners.settle(&caller, &key, lease, Settlement::Reap).await;
            settled("reap a runner lease", reaped)?;
        }
        Ok(())
    }
}

impl<S> Reconciler for RunnerReaper<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "runner-reaper";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        match self.schedule.due(seen.now) {
            Err(scheduled) => Ok(Some(scheduled)),
            Ok(next) => {
                self.sweep(seen.now).await?;
                Ok(Some(next))
            }
        }
    }
}
