//! The `runner-orphans` reconciler: every sweep (60 s by default) it lists each runner node's
//! instances (`GET /instances`) and destroys every `billet-<lease id>` instance still running
//! whose lease has ended (done or failed) or was never recorded: compute nobody is charged
//! for and nobody will tear down. The instance's name is the only link back to its lease
//! after a crash (`RunnerLeaseId::of_instance`); an instance of another name is not
//! Leasehold's and is left alone, and one whose lease is live is its lease's (the dispatcher
//! and the lease's own teardown answer for it).
//!
//! A destroy that fails is tried again on the next sweep; after [`ORPHAN_TRIES_MAX`]
//! failures in a row the instance is dead-lettered on its node's stream (rule 35), once, for
//! operators (`deadLetters`, kind `orphan_destroy`), and the sweep keeps trying.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::runner_service::RunnerService;
use leasehold_commands::{CommandError, CommandStore};
use leasehold_domain::runner::{Phase, RunnerLeaseId, RunnerNodeName};
use leasehold_domain::values::OperatorDetail;
use leasehold_projections::{ReconcileError, Reconciler, Seen, SweepSchedule};

use crate::dispatch::RunnerNodes;
use crate::in_a_row::InARow;
use crate::rented::retry;

/// How often the nodes' instances are listed when nothing else is said.
pub const SWEEP_EVERY_DEFAULT: TimeDelta = TimeDelta::seconds(60);

/// Failed destroys of one orphan in a row before it is dead-lettered (rule 35's default N).
pub const ORPHAN_TRIES_MAX: u32 = 5;

/// The orphan instance sweeper.
#[derive(Debug)]
pub struct RunnerOrphans<S> {
    runners: RunnerService<S>,
    nodes: RunnerNodes,
    schedule: SweepSchedule,
    /// Failed destroys in a row, by node and instance name (forgotten on a restart: a dead
    /// letter then comes five failures later, never sooner).
    failures: InARow<(String, String)>,
}

impl<S> RunnerOrphans<S> {
    /// A sweeper reading leases through `runners`, listing and destroying through `nodes`,
    /// every `every`.
    pub fn new(runners: RunnerService<S>, nodes: RunnerNodes, every: TimeDelta) -> Self {
        Self { runners, nodes, schedule: SweepSchedule::every(every), failures: InARow::default() }
    }
}

impl<S> RunnerOrphans<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// Whether the instance of `lease` is nobody's: its lease ended or never was.
    async fn orphaned(&self, lease: RunnerLeaseId) -> Result<bool, ReconcileError> {
        match self.runners.owned(lease).await {
            Ok((_, stored)) => Ok(matches!(stored.phase, Phase::Done | Phase::Failed)),
            Err(CommandError::NotFound) => Ok(true),
            Err(error) => Err(retry("read a runner lease", &error)),
        }
    }

    /// Forgets the failures of `node`'s instances that are no longer listed running.
    fn forget_gone(
        &self,
        node: &RunnerNodeName,
        listed: &[crate::runner_providers::wire::InstanceWire],
    ) {
        let running = |name: &str| listed.iter().any(|held| held.name == name && !held.terminal);
        self.failures.retain(|(at, name)| at != node.as_str() || running(name));
    }

    /// Counts a failed destroy; the [`ORPHAN_TRIES_MAX`]th in a row is a dead letter.
    async fn failed(
        &self,
        node: &RunnerNodeName,
        key: (String, String),
        failure: &str,
    ) -> Result<(), ReconcileError> {
        let attempts = self.failures.failed(key.clone());
        if attempts != ORPHAN_TRIES_MAX {
            return Ok(());
        }
        let detail = OperatorDetail::new(failure);
        let letter = (key.1.as_str(), attempts, detail);
        match self.runners.dead_letter_orphan(&super::system(Self::NAME), node, letter).await {
            Ok(_) => Ok(()),
            // A node the nodes file names but that never registered has no stream to hold it;
            // a key taken with another detail is the same letter, written before a restart.
            Err(CommandError::NotFound | CommandError::IdempotencyConflict) => Ok(()),
            Err(error) => Err(retry("dead-letter an orphan runner instance", &error)),
        }
    }

    async fn sweep(&self) -> Result<(), ReconcileError> {
        for client in self.nodes.all() {
            let node = &client.config().node;
            let listed = match client.list().await {
                Ok(listed) => listed,
                // One node that does not answer does not hold back the others.
                Err(error) => {
                    tracing::warn!(reconciler = Self::NAME, %node, %error, "a runner node did not list its instances");
                    continue;
                }
            };
            self.forget_gone(node, &listed);
            for instance in listed.into_iter().filter(|instance| !instance.terminal) {
                let Some(lease) = RunnerLeaseId::of_instance(&instance.name) else { continue };
                if !self.orphaned(lease).await? {
                    continue;
                }
                let key = (node.to_string(), instance.name.clone());
                match client.destroy(&instance.id).await {
                    Ok(teardown) => {
                        self.failures.succeeded(&key);
                        tracing::info!(reconciler = Self::NAME, %node, lease = %lease.0, %teardown, "an orphan runner instance destroyed");
                    }
                    Err(error) => {
                        tracing::warn!(reconciler = Self::NAME, %node, lease = %lease.0, %error, "an orphan runner instance was not destroyed");
                        self.failed(node, key, &error.to_string()).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl<S> Reconciler for RunnerOrphans<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "runner-orphans";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        match self.schedule.due(seen.now) {
            Err(scheduled) => Ok(Some(scheduled)),
            Ok(next) => {
                self.sweep().await?;
                Ok(Some(next))
            }
        }
    }
}
