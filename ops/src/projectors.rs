//! The projections `serve` runs: every registered one, each with its own runner, checkpoint
//! and published progress. A new kind's projection is one more name in `projections!`.

use leasehold_adapters::projections::tables::Owned;
use leasehold_adapters::projections::{BuildError, BuildProgress, PgProjected};
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
            start: Start,
            stopped: &watch::Receiver<bool>,
        ) -> Projectors {
            let mut projectors =
                Projectors { tasks: Vec::new(), progress: ProjectionProgress::new() };
            $(projectors.spawn(($projection, $projection), store, start, stopped);)+
            projectors
        }

        /// Rebuilds projection `name` beside its active tables and switches it in (see
        /// `PgProjectionStore::rebuild`); `None` when no projection has that name.
        pub async fn rebuild(
            name: &str,
            store: &PgProjectionStore,
            batch_events: usize,
            progress: &mut (dyn FnMut(BuildProgress) + Send),
        ) -> Option<Result<u32, BuildError>> {
            $(if name == <$projection as Projection>::NAME {
                return Some(store.rebuild(&$projection, batch_events, &mut *progress).await);
            })+
            None
        }

        /// The tables projection `name` owns; `None` when no projection has that name.
        pub fn tables(name: &str) -> Option<&'static [Owned]> {
            $(if name == <$projection as Projection>::NAME {
                return Some(<$projection as PgProjected>::TABLES);
            })+
            None
        }
    };
}

/// Rebuilds operators start through GraphQL (`rebuildProjection`): each in the background,
/// one at a time per projection in this process (the build's lock keeps it one across
/// processes).
#[derive(Debug)]
pub struct ServeRebuilds {
    store: PgProjectionStore,
    batch_events: usize,
    running: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<&'static str>>>,
}

impl ServeRebuilds {
    /// Rebuilds over `store`, applying `batch_events` events per transaction.
    pub fn new(store: &PgEventStore, batch_events: usize) -> Self {
        Self {
            store: PgProjectionStore::new(store.clone()),
            batch_events,
            running: Default::default(),
        }
    }
}

impl leasehold_gateway::Rebuilds for ServeRebuilds {
    fn start(&self, name: &str) -> Result<(), leasehold_gateway::RebuildRefused> {
        let Some(name) = NAMES.iter().copied().find(|known| *known == name) else {
            return Err(leasehold_gateway::RebuildRefused::Unknown(NAMES.to_vec()));
        };
        let mut running = self.running.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !running.insert(name) {
            return Err(leasehold_gateway::RebuildRefused::Running);
        }
        drop(running);
        let (store, batch, running) =
            (self.store.clone(), self.batch_events, std::sync::Arc::clone(&self.running));
        tokio::spawn(async move {
            tracing::info!(projection = name, "rebuild started by an operator");
            match rebuild(name, &store, batch, &mut |_| {}).await {
                Some(Ok(build_no)) => {
                    tracing::info!(projection = name, build_no, "rebuilt and switched in");
                }
                Some(Err(error)) => tracing::warn!(projection = name, %error, "the rebuild failed"),
                None => {}
            }
            running.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
        });
        Ok(())
    }
}

/// How `serve` starts the projections.
#[derive(Debug, Clone, Copy)]
pub struct Start {
    /// Each runner's settings.
    pub config: RunnerConfig,
    /// Rebuild a projection whose stored version is another before running it.
    pub rebuild_on_version_change: bool,
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
    /// Spawns `P`'s runner (the first of `projections`), after rebuilding its tables with
    /// the second when they were built by another version and `start` says so.
    fn spawn<P>(
        &mut self,
        (projection, builder): (P, P),
        store: &PgEventStore,
        start: Start,
        stopped: &watch::Receiver<bool>,
    ) where
        P: PgProjected,
        PgProjectionStore: ProjectionStore<P>,
    {
        let projections = PgProjectionStore::new(store.clone());
        let runner = Runner::new(projection, projections.clone(), start.config);
        let progress = std::mem::take(&mut self.progress);
        self.progress = progress.published(P::NAME, runner.checkpoints());
        let stopped = stopped.clone();
        let task = async move {
            if start.rebuild_on_version_change {
                rebuild_if_stale(&builder, &projections, start.config.batch_events).await;
            }
            runner.run(stopped).await;
        };
        self.tasks.push((P::NAME, tokio::spawn(task)));
    }
}

/// Rebuilds `P` when its active tables were built by another version of its code (they keep
/// serving meanwhile); a failure is logged and the runner then stops at the mismatch.
async fn rebuild_if_stale<P: PgProjected>(projection: &P, store: &PgProjectionStore, batch: usize) {
    match store.needs_rebuild::<P>().await {
        Ok(true) => {}
        Ok(false) => return,
        Err(error) => {
            tracing::warn!(projection = P::NAME, %error, "cannot read the projection's version");
            return;
        }
    }
    tracing::info!(
        projection = P::NAME,
        version = P::VERSION,
        "rebuilding: its tables are of another version"
    );
    match store.rebuild(projection, batch, |_| {}).await {
        Ok(build_no) => tracing::info!(projection = P::NAME, build_no, "rebuilt and switched in"),
        Err(error) => tracing::warn!(projection = P::NAME, %error, "the rebuild failed"),
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

    #[test]
    fn an_offline_replay_runs_every_projection_serve_runs() {
        let mut served = super::NAMES.to_vec();
        let mut replayed = leasehold_adapters::replay::REPLAYED.to_vec();
        served.sort_unstable();
        replayed.sort_unstable();
        assert_eq!(replayed, served, "`events replay` runs what `serve` runs");
    }
}
