//! The `rented-expiry` reconciler: every sweep (10 s by default) it loses the ready nodes
//! whose lease passed without a heartbeat (their workloads become unobserved, not dead) and
//! terminates the rentals past their max lifetime (cause `max_lifetime`), each as the read
//! models last wrote it. The aggregates decide at the pipeline's clock: a node that beat since
//! the read model was written is left alone, and a termination under a generation a resume
//! replaced is `FENCED` and looked at again on the next sweep.
//!
//! Each command's key names the node and the lease it saw passed, or the rental: a sweep
//! repeated after a crash repeats the same command, which the ledger answers once.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::node_service::NodeService;
use leasehold_commands::rental_service::RentalService;
use leasehold_domain::node::NodeId;
use leasehold_domain::rental::{RentalId, TerminateCause};
use leasehold_domain::{Actor, TenantId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use super::{retry, settled};

use crate::PgReadModels;

/// How often the reconciler sweeps when nothing else is said.
pub const SWEEP_EVERY_DEFAULT: TimeDelta = TimeDelta::seconds(10);

/// The expiry reconciler.
#[derive(Debug)]
pub struct RentedExpiry<S> {
    nodes: NodeService<S>,
    rentals: RentalService<S>,
    read_models: PgReadModels,
    sweep_every: TimeDelta,
    next_sweep: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl<S> RentedExpiry<S> {
    /// A reconciler acting through `nodes` and `rentals`, reading `read_models`, sweeping
    /// every `sweep_every`.
    pub fn new(
        (nodes, rentals): (NodeService<S>, RentalService<S>),
        read_models: PgReadModels,
        sweep_every: TimeDelta,
    ) -> Self {
        Self { nodes, rentals, read_models, sweep_every, next_sweep: std::sync::Mutex::new(None) }
    }
}

fn expiry() -> Caller {
    Caller {
        actor: Actor { subject: "rented-expiry".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S> RentedExpiry<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn sweep(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        let passed =
            self.read_models.nodes_past_lease(now).await.map_err(|e| retry("read nodes", &e))?;
        for (node, lease) in passed {
            let key = format!("node-expiry:{node}:{}", lease.timestamp_micros());
            settled("lose a node", self.nodes.expire(&key, NodeId(node)).await)?;
        }
        let past = self
            .read_models
            .rentals_past_lifetime(now)
            .await
            .map_err(|e| retry("read rentals", &e))?;
        for rental in past {
            let Ok(owner) = TenantId::parse(&rental.tenant) else { continue };
            let generation = u64::try_from(rental.generation).unwrap_or(0);
            let key = format!("rental-lifetime:{}:{generation}", rental.rental);
            let terminated = self
                .rentals
                .terminate_as(
                    &expiry(),
                    &key,
                    (owner, RentalId(rental.rental), generation),
                    TerminateCause::MaxLifetime,
                )
                .await;
            settled("terminate a rental", terminated)?;
        }
        Ok(())
    }
}

impl<S> Reconciler for RentedExpiry<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "rented-expiry";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let next = seen.now + self.sweep_every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        self.sweep(seen.now).await?;
        Ok(Some(next))
    }
}
