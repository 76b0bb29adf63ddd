//! The projections `serve` runs: every registered one, each with its own runner, checkpoint
//! and published progress. A new kind's projection is one more name in `projections!`.

use leasehold_adapters::{PgEventStore, PgProjectionStore};
use leasehold_gateway::ProjectionProgress;
use leasehold_projections::host::HostProjection;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::runner_fleet::RunnerFleetProjection;
use leasehold_projections::runner_job::JobProjection;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_projections::vm::VmProjection;
use leasehold_projections::workload_quota::WorkloadQuotaProjection;
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

/// Registers every projection `serve` runs, one line each: its name and stream types join
/// [`NAMES`] and [`STREAM_TYPES`], and [`start`] runs it. A new kind's projection is one more
/// type here (its storage is an `impl ProjectionStore` in `adapters`).
macro_rules! projections {
    ($($projection:ident),+ $(,)?) => {
        /// The names of every registered projection.
        pub const NAMES: &[&str] = &[$(<$projection as Projection>::NAME),+];

        /// The stream types every registered projection reads.
        #[cfg(test)]
        pub const STREAM_TYPES: &[&[&str]] = &[$(<$projection as Projection>::STREAM_TYPES),+];

        /// Starts a runner for every registered projection; each stops when `stopped` turns
        /// true.
        pub fn start(
            store: &PgEventStore,
            config: RunnerConfig,
            stopped: &watch::Receiver<bool>,
        ) -> Projectors {
            let mut projectors =
                Projectors { tasks: Vec::new(), progress: ProjectionProgress::new() };
            $(projectors.spawn($projection, store, config, stopped);)+
            projectors
        }
    };
}

projections!(
    LeaseProjection,
    VmProjection,
    HostProjection,
    SnapshotProjection,
    RentalProjection,
    NodeProjection,
    RunProjection,
    RunnerProjection,
    JobProjection,
    RunnerFleetProjection,
    WorkloadQuotaProjection,
);

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
    use leasehold_domain::registry::KINDS;

    /// The domain's registry is where a kind is registered; every layer above it must then
    /// carry the kind too. Each failure names the place to add it.
    #[test]
    fn every_registered_kind_is_projected_and_has_graphql() {
        for kind in KINDS {
            assert!(
                super::STREAM_TYPES.iter().any(|types| types.contains(&kind.stream_type)),
                "no projection reads the {0} kind: add its projection to `projections!` in \
                 ops/src/projectors.rs",
                kind.stream_type
            );
            assert!(
                leasehold_gateway::reads::KIND_READS
                    .iter()
                    .any(|reads| reads.stream_type == kind.stream_type),
                "the {0} kind has no GraphQL module: add it to `kinds!` in \
                 gateway/src/schema/mod.rs",
                kind.stream_type
            );
        }
        for reads in leasehold_gateway::reads::KIND_READS {
            assert!(
                leasehold_domain::registry::kind(reads.stream_type).is_some(),
                "the gateway has a module for {0}, which the domain's registry lacks",
                reads.stream_type
            );
        }
    }

    #[test]
    fn every_projection_the_gateway_waits_for_is_run() {
        for name in leasehold_gateway::reads::projections_named() {
            assert!(
                super::NAMES.contains(&name),
                "the gateway waits for {name}, which serve does not run"
            );
        }
    }
}
