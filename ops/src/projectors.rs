//! The projections `serve` runs: every registered one, each with its own runner, checkpoint
//! and published progress. A new kind's projection is one more line in [`start`].

use leasehold_adapters::{PgEventStore, PgProjectionStore};
use leasehold_gateway::ProjectionProgress;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::{Projection, ProjectionStore, Runner, RunnerConfig};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The running projections.
pub struct Projectors {
    /// Each runner's task, by projection name.
    pub tasks: Vec<(&'static str, JoinHandle<()>)>,
    /// Their progress, for the gateway's read-your-writes.
    pub progress: ProjectionProgress,
}

/// The names of every registered projection.
pub const NAMES: &[&str] = &[LeaseProjection::NAME];

/// Starts a runner for every registered projection; each stops when `stopped` turns true.
pub fn start(
    store: &PgEventStore,
    config: RunnerConfig,
    stopped: &watch::Receiver<bool>,
) -> Projectors {
    let mut projectors = Projectors { tasks: Vec::new(), progress: ProjectionProgress::new() };
    projectors.spawn(LeaseProjection, store, config, stopped);
    projectors
}

impl Projectors {
    fn spawn<P>(
        &mut self,
        projection: P,
        store: &PgEventStore,
        config: RunnerConfig,
        stopped: &watch::Receiver<bool>,
    ) where
        P: Projection,
        PgProjectionStore: ProjectionStore<P>,
    {
        let runner = Runner::new(projection, PgProjectionStore::new(store.clone()), config);
        let progress = std::mem::take(&mut self.progress);
        self.progress = progress.published(P::NAME, runner.checkpoints());
        self.tasks.push((P::NAME, tokio::spawn(runner.run(stopped.clone()))));
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_projection_the_gateway_waits_for_is_run() {
        for name in leasehold_gateway::reads::PROJECTIONS_NAMED {
            assert!(
                super::NAMES.contains(name),
                "the gateway waits for {name}, which serve does not run"
            );
        }
    }
}
