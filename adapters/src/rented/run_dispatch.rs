//! The `run-dispatcher` reconciler: whenever a rental's stream moves (a booking made or
//! started, the machine observed), its node enrolls, or a launch on it is accepted, the run
//! its schedule runs now is dispatched ([`RunService::dispatch`]): an attempt is created and
//! its launch ordered on the node, under the node's fencing token, in one append. The run
//! service decides whether it may start (the booking runs, the rental is active, the node is
//! ready, no launch is indeterminate); a run that must wait, or has started already, is left
//! as it is, and the next event on its rental looks again. A run whose tenant cancelled it
//! while its launch was unanswered, or its node could not take orders, has its stop ordered
//! then ([`RunService::order_pending_stop`]): once it runs and its node is ready.
//!
//! Runs queued behind the running one have their image prepared on the rental's node ahead
//! of their launch (`prepare_image`, once per image and node session; not when the node's
//! facts show it hot), so that a queued run starts from a warm cache.
//!
//! When a node is retired (its machine's generation ended: the rental was confirmed stopped
//! and resumed, or confirmed terminated), the run its rental's schedule runs ends with it if
//! its attempt was launched there ([`RunService::node_retired`]), since nothing launched
//! there runs any more; when the rental is terminated, every run still waiting on its
//! schedule fails as `RentalTerminated` ([`RunService::give_up`]): no attempt can be made.
//! Both are looked at on every event of the rental (its retirement's among them), so one
//! missed is acted on at the next.
//!
//! Repeating is safe: an attempt's id and its command's key are minted from the run and the
//! attempt's number, so a dispatch repeated after a crash is the recorded one, and a run
//! whose attempt is under way has nothing to dispatch.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::node_service::NodeService;
use leasehold_commands::run_service::RunService;
use leasehold_domain::node::{Node, NodeId};
use leasehold_domain::rental::{Rental, RentalId, RentalStatus};
use leasehold_domain::run::{Run, RunId, RunStatus};
use leasehold_domain::values::Reason;
use leasehold_domain::{Actor, Aggregate as _, RecordedEvent, TenantId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use super::{retry, settled};

/// The run dispatcher.
#[derive(Debug)]
pub struct RunDispatcher<S> {
    runs: RunService<S>,
    nodes: NodeService<S>,
}

impl<S> RunDispatcher<S> {
    /// A dispatcher acting through `runs`, preparing images through `nodes`.
    pub fn new((runs, nodes): (RunService<S>, NodeService<S>)) -> Self {
        Self { runs, nodes }
    }
}

fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "run-dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S> RunDispatcher<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// The rental `event` may have made a run dispatchable on.
    async fn rental_of(&self, event: &RecordedEvent) -> Result<Option<RentalId>, ReconcileError> {
        match event.stream_type.as_str() {
            Rental::STREAM_TYPE => Ok(RentalId::of_stream(&event.stream_id)),
            // Enrolled: its rental's run may start; retired: the run on it ends.
            Node::STREAM_TYPE
                if matches!(event.event_type.as_str(), "NodeEnrolled" | "NodeRetired") =>
            {
                let Some(node) = NodeId::of_stream(&event.stream_id) else { return Ok(None) };
                let found = self.runs.pipeline().state::<Node>(&node.stream_id()).await;
                let found = found.map_err(|error| retry("read a node", &error))?;
                Ok(found.and_then(|(_, _, node)| node.identity).map(|identity| identity.rental))
            }
            // Accepted: a stop may wait for it; never applied: the run may launch again; a
            // stop not acted on: another may be ordered.
            Run::STREAM_TYPE
                if matches!(
                    event.event_type.as_str(),
                    "RunLaunchAccepted" | "RunLaunchNotApplied" | "RunStopFailed"
                ) =>
            {
                let Some(run) = RunId::of_stream(&event.stream_id) else { return Ok(None) };
                let found = self.runs.pipeline().state::<Run>(&run.stream_id()).await;
                let found = found.map_err(|error| retry("read a run", &error))?;
                Ok(found.and_then(|(_, _, run)| run.booking).map(|booking| booking.rental))
            }
            _ => Ok(None),
        }
    }

    /// Ends the runs `stored` (`owner`'s rental) leaves with nothing to run on: the running
    /// booking's run whose attempt was launched on a retired node (an earlier generation's,
    /// or any once the rental is terminated), and, on a terminated rental, every run still
    /// waiting (see the module's doc). Looked at on every event of the rental, so that a
    /// retirement missed once is acted on at the next.
    async fn end_runs_left(&self, owner: &TenantId, stored: &Rental) -> Result<(), ReconcileError> {
        let caller = dispatcher();
        let terminated = stored.status == RentalStatus::Terminated;
        if let Some(running) = stored.schedule.running {
            let run = self.run_of(running.run).await?;
            let attempt_node = run.as_ref().and_then(Run::current).map(|attempt| attempt.node);
            let retired = attempt_node.filter(|node| terminated || stored.node != Some(*node));
            if let Some(node) = retired {
                let ended = self.runs.node_retired(&caller, owner, (running.run, node)).await;
                settled("end a run with its node", ended)?;
            }
        }
        if !terminated {
            return Ok(());
        }
        let reason = Reason::parse("reason", "RentalTerminated").expect("a valid reason");
        for held in stored.schedule.running.iter().chain(&stored.schedule.queued) {
            // The run that ran there was just ended with its node (or has a launch still
            // answering: its own answer, or its retirement seen again, settles it).
            let waiting = self
                .run_of(held.run)
                .await?
                .is_some_and(|run| matches!(run.status, RunStatus::Requested | RunStatus::Booked));
            if waiting {
                let gone = self.runs.give_up(&caller, owner, (held.run, reason.clone())).await;
                settled("fail a run whose rental is gone", gone)?;
            }
        }
        Ok(())
    }

    async fn run_of(&self, run: RunId) -> Result<Option<Run>, ReconcileError> {
        let found = self.runs.pipeline().state::<Run>(&run.stream_id()).await;
        Ok(found.map_err(|error| retry("read a run", &error))?.map(|(_, _, run)| run))
    }

    /// Dispatches the run `rental`'s schedule runs now, if any.
    async fn dispatch_on(&self, rental: RentalId) -> Result<(), ReconcileError> {
        let found = self.runs.pipeline().state::<Rental>(&rental.stream_id()).await;
        let found = found.map_err(|error| retry("read a rental", &error))?;
        let Some((owner, _, stored)) = found else { return Ok(()) };
        self.end_runs_left(&owner, &stored).await?;
        let Some(running) = stored.schedule.running else { return Ok(()) };
        let caller = dispatcher();
        settled("dispatch a run", self.runs.dispatch(&caller, &owner, running.run).await)?;
        let stop = self.runs.order_pending_stop(&caller, &owner, running.run).await;
        settled("order a cancelled run's stop", stop)?;
        let Some(node) = stored.node else { return Ok(()) };
        for queued in &stored.schedule.queued {
            self.prewarm(queued.run, node).await?;
        }
        Ok(())
    }

    /// Has `node` prepare the image of `run`, which waits on its schedule (see
    /// [`NodeService::prepare_image`]).
    async fn prewarm(&self, run: RunId, node: NodeId) -> Result<(), ReconcileError> {
        let Some(terms) = self.run_of(run).await?.and_then(|run| run.terms) else { return Ok(()) };
        let key = format!("prewarm-{}", run.0);
        let prepared = self.nodes.prepare_image(&key, node, &terms.manifest_digest).await;
        settled("prepare a waiting run's image", prepared)
    }
}

impl<S> Reconciler for RunDispatcher<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "run-dispatcher";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let mut rentals = BTreeSet::new();
        for event in seen.events {
            if let Some(rental) = self.rental_of(event).await? {
                rentals.insert(rental.0);
            }
        }
        for rental in rentals {
            self.dispatch_on(RentalId(rental)).await?;
        }
        Ok(None)
    }
}
