//! The `launch-reconciler`: every sweep it looks at the runs whose launch has had no answer
//! for longer than the answer deadline (2 minutes by default), as the run timeline shows
//! them. A launch still awaiting its answer is recorded indeterminate (no other attempt is
//! made until it is settled: rule 20), and its node is asked for its reconciliation with a
//! recorded lookup (a `report_applied` order under the node's current fencing token). The
//! node answers with the operations it applied, naming the lookup; since it takes its
//! commands in order, the answer settles the launch: applied (the run runs) or never applied
//! (the run is booked again and relaunched, on the same offer, by the run dispatcher).
//!
//! One lookup per attempt and node session (its key names both): a node that refuses the
//! lookup (an agent without it) leaves the launch to its next resume's reconciliation. A
//! node that never comes back settles it otherwise: a lost node's launch stays
//! indeterminate (unobserved is not dead, rule 10), and once the node is retired (its
//! machine confirmed stopped and resumed, or terminated) the run ends with it
//! (`run_dispatch.rs`).

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::node_service::NodeService;
use leasehold_commands::run_service::RunService;
use leasehold_domain::run::{Launch, RunId};
use leasehold_domain::{Actor, TenantId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use super::{retry, settled};
use crate::PgReadModels;

/// How long a launch may go unanswered by default.
pub const ANSWER_WITHIN_DEFAULT: TimeDelta = TimeDelta::minutes(2);

/// The launch reconciler.
#[derive(Debug)]
pub struct LaunchReconciler<S> {
    runs: RunService<S>,
    nodes: NodeService<S>,
    read_models: PgReadModels,
    /// How long a launch may go unanswered, and how often the reconciler sweeps.
    timing: (TimeDelta, TimeDelta),
    next_sweep: std::sync::Mutex<Option<DateTime<Utc>>>,
    /// Where the next sweep's page starts (none: from the first run).
    after: std::sync::Mutex<Option<uuid::Uuid>>,
}

/// Most runs one sweep looks into.
const RUNS_PER_SWEEP: i64 = 200;

impl<S> LaunchReconciler<S> {
    /// A reconciler acting through `runs` and `nodes`, reading `read_models`; a launch may go
    /// unanswered for `answer_within`, and it sweeps every `every`.
    pub fn new(
        (runs, nodes): (RunService<S>, NodeService<S>),
        read_models: PgReadModels,
        (answer_within, every): (TimeDelta, TimeDelta),
    ) -> Self {
        Self {
            runs,
            nodes,
            read_models,
            timing: (answer_within, every),
            next_sweep: std::sync::Mutex::new(None),
            after: std::sync::Mutex::new(None),
        }
    }
}

fn reconciler() -> Caller {
    Caller {
        actor: Actor { subject: "launch-reconciler".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S> LaunchReconciler<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn sweep(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        let after = *self.after.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let unanswered = self
            .read_models
            .launches_unanswered(now - self.timing.0, (after, RUNS_PER_SWEEP))
            .await
            .map_err(|error| retry("read runs", &error))?;
        // A short page was the last: the next sweep starts from the first run again.
        let full = unanswered.len() as i64 == RUNS_PER_SWEEP;
        let next = full.then(|| unanswered.last().map(|(run, _)| *run)).flatten();
        *self.after.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        for (run, tenant) in unanswered {
            let Ok(owner) = TenantId::parse(&tenant) else { continue };
            self.look_into(&owner, RunId(run)).await?;
        }
        Ok(())
    }

    async fn look_into(&self, owner: &TenantId, run: RunId) -> Result<(), ReconcileError> {
        let stored = match self.runs.owned(run).await {
            Ok((_, stored)) => stored,
            Err(leasehold_commands::CommandError::NotFound) => return Ok(()),
            Err(error) => return Err(retry("read a run", &error)),
        };
        let Some(attempt) = stored.current().cloned() else { return Ok(()) };
        match attempt.launch {
            Launch::Intended => {
                let caller = reconciler();
                let lost = self.runs.launch_lost(&caller, owner, (run, attempt.attempt)).await;
                settled("record a lost launch answer", lost)?;
            }
            Launch::Indeterminate => {}
            _ => return Ok(()),
        }
        let token = match self.nodes.owned(attempt.node).await {
            Ok((_, node)) => node.fencing_token,
            Err(leasehold_commands::CommandError::NotFound) => return Ok(()),
            Err(error) => return Err(retry("read a node", &error)),
        };
        let key = format!("launch-lookup:{}:{token}", attempt.attempt.0);
        settled(
            "ask a node for its reconciliation",
            self.nodes.ask_applied(&key, attempt.node).await,
        )
    }
}

impl<S> Reconciler for LaunchReconciler<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "launch-reconciler";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let next = seen.now + self.timing.1;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        self.sweep(seen.now).await?;
        Ok(Some(next))
    }
}
