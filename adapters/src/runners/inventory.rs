//! The `runner-inventory` reconciler: it reads every runner node's registrations and
//! inventory reports as they reach the log, and settles what they prove.
//!
//! - A registration after the first is a new process on the node: each lease bound to it
//!   that has not ended moves to a new epoch (`NodeReregistered`), so whatever the earlier
//!   process still says of them is fenced.
//! - An inventory (a registration's, when the node knows it, or a sweep's report) lists the
//!   leases whose instances the node runs. A quarantined lease of the node that it lacks is
//!   released (`InventoryAbsent`), only past the grace after its expiry: the lease decides
//!   that, on its stream as stored. A registration without an inventory proves nothing (an
//!   unknown inventory and an empty one mean opposite things).
//!
//! The leases bound to a node come from `runner_lease_holds`, which may lag: a lease
//! quarantined after the row was written is settled by the node's next inventory. Each key
//! names the lease and the event it was decided from, so a batch seen again repeats nothing.

use chrono::{DateTime, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::runner_service::{RunnerService, Settlement};
use leasehold_domain::runner::{Phase, RunnerLeaseId, RunnerNodeName};
use leasehold_domain::runner_node::{RunnerNode, RunnerNodeEvent};
use leasehold_domain::{Aggregate, DomainEvent, RecordedEvent, TenantId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use crate::PgReadModels;
use crate::read_models::RunnerHold;
use crate::rented::{retry, settled};

/// The runner inventory reconciler.
#[derive(Debug)]
pub struct RunnerInventory<S> {
    runners: RunnerService<S>,
    read_models: PgReadModels,
}

impl<S> RunnerInventory<S> {
    /// A reconciler acting through `runners`, reading `read_models`.
    pub fn new(runners: RunnerService<S>, read_models: PgReadModels) -> Self {
        Self { runners, read_models }
    }
}

/// What one node event asks of the reconciler.
struct NodeNews {
    node: RunnerNodeName,
    node_epoch: u64,
    reregistered: bool,
    inventory: Option<Vec<RunnerLeaseId>>,
}

fn news_of(event: &RecordedEvent) -> Option<NodeNews> {
    if event.stream_type.as_str() != RunnerNode::STREAM_TYPE {
        return None;
    }
    match RunnerNodeEvent::from_stored(event.event_type.as_str(), &event.payload).ok()? {
        RunnerNodeEvent::RunnerNodeRegistered { registration, inventory, node_epoch, .. } => {
            Some(NodeNews {
                node: registration.node,
                node_epoch,
                reregistered: node_epoch > 1,
                inventory,
            })
        }
        RunnerNodeEvent::RunnerInventoryReported { node, node_epoch, leases, .. } => {
            Some(NodeNews { node, node_epoch, reregistered: false, inventory: Some(leases) })
        }
        RunnerNodeEvent::RunnerNodeRetired { .. }
        | RunnerNodeEvent::RunnerOrphanDeadLettered { .. } => None,
    }
}

impl<S> RunnerInventory<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn settle(&self, event: &RecordedEvent, news: NodeNews) -> Result<(), ReconcileError> {
        let holds = self
            .read_models
            .runner_leases_on_node(news.node.as_str())
            .await
            .map_err(|e| retry("read a node's runner leases", &e))?;
        let caller = super::system(Self::NAME);
        for hold in &holds {
            let Some(lease) = owned(hold) else { continue };
            if news.reregistered {
                let key = format!("runner-rereg:{}:{}", hold.lease, event.event_id);
                let node = news.node.clone();
                let bumped = self
                    .runners
                    .settle(&caller, &key, lease.clone(), Settlement::NodeReregistered { node })
                    .await;
                settled("fence a re-registered node's lease", bumped)?;
            }
            let Some(inventory) = &news.inventory else { continue };
            let absent = !inventory.contains(&lease.1);
            if absent && hold.phase == Phase::Quarantine.name() {
                let key = format!("runner-absent:{}:{}", hold.lease, event.event_id);
                let proof = Settlement::InventoryAbsent {
                    node: news.node.clone(),
                    node_epoch: news.node_epoch,
                };
                settled(
                    "release a lease its node lacks",
                    self.runners.settle(&caller, &key, lease, proof).await,
                )?;
            }
        }
        Ok(())
    }
}

fn owned(hold: &RunnerHold) -> Option<(TenantId, RunnerLeaseId)> {
    Some((TenantId::parse(&hold.tenant).ok()?, RunnerLeaseId(hold.lease)))
}

impl<S> Reconciler for RunnerInventory<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "runner-inventory";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        for event in seen.events {
            if let Some(news) = news_of(event) {
                self.settle(event, news).await?;
            }
        }
        Ok(None)
    }
}
