//! A CI job as runner leases see it: which lease holds it, and how it finished. One stream
//! per job of a tenant (`runner-job-<uuid>`, the id minted from the tenant and the job's
//! request by the command service), so that a job is held by **one** lease across all of
//! them: a lease's assignment claims its job in the same append, and a claim by another
//! lease is `Taken` (`CONFLICT`), while the same lease again is idempotent. The lease's end
//! finishes the job with its outcome. The job history read model is this stream's.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Claim(lease, job, tier, queued_at) | assigned | RunnerJobClaimed | — |
//! | assigned, finished | Claim(the same lease) | unchanged | — (idempotent) | — |
//! | assigned, finished | Claim(another lease) | unchanged | refused | `Taken` |
//! | assigned | Finish(lease, outcome, reason) | finished | RunnerJobFinished | the holding lease, else — (not its job to finish) |
//! | finished | Finish | finished | — | — |
//! | none | Finish | none | — (a lease ended before holding a job) | — |

mod events;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::runner::{JobRef, Outcome, RunnerEvent, RunnerLease, RunnerLeaseId, Tier};
use crate::values::Reason;

pub use events::{KIND, RunnerJobEvent};

crate::values::uuid_type!(
    /// A tenant's CI job, minted from the tenant and the job's request by the command
    /// service (another tenant's job with the same request id is another job).
    RunnerJobId,
    stream = "runner-job"
);

/// Where a job stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    /// No lease holds it yet.
    None,
    /// A lease holds it.
    Assigned,
    /// Its lease ended.
    Finished,
}

/// The runner job aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerJob {
    /// Where it stands.
    pub status: JobStatus,
    /// The job.
    pub job: Option<JobRef>,
    /// The lease that holds it.
    pub lease: Option<RunnerLeaseId>,
    /// How it finished.
    pub outcome: Option<Outcome>,
}

/// What can be asked of a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerJobCommand {
    /// A lease takes the job.
    Claim {
        /// The lease.
        lease: RunnerLeaseId,
        /// The job.
        job: JobRef,
        /// The lease's tier.
        tier: Tier,
        /// When its lease was requested: since when the job waited for a runner.
        queued_at: DateTime<Utc>,
    },
    /// The holding lease ended.
    Finish {
        /// The lease.
        lease: RunnerLeaseId,
        /// How.
        outcome: Outcome,
        /// Why it failed (tenant-safe).
        reason: Option<Reason>,
    },
}

/// Why a job refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerJobError {
    /// Another lease holds the job.
    #[error("the job is assigned to another runner lease")]
    Taken,
}

impl Refusal for RunnerJobError {
    fn kind(&self) -> RefusalKind {
        RefusalKind::Conflict
    }
}

impl Aggregate for RunnerJob {
    const STREAM_TYPE: &'static str = "runner-job";
    const STATE_SCHEMA: u32 = 1;
    type Command = RunnerJobCommand;
    type Event = RunnerJobEvent;
    type Error = RunnerJobError;
    type Facts = ();

    fn initial() -> Self {
        Self { status: JobStatus::None, job: None, lease: None, outcome: None }
    }

    fn decide(
        &self,
        command: &RunnerJobCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<RunnerJobEvent>, RunnerJobError> {
        use RunnerJobCommand as C;
        let at = ctx.now;
        match (self.status, command) {
            (JobStatus::None, C::Claim { lease, job, tier, queued_at }) => {
                Ok(vec![RunnerJobEvent::RunnerJobClaimed {
                    lease: *lease,
                    job: *job,
                    tier: tier.clone(),
                    queued_at: *queued_at,
                    at,
                }])
            }
            (_, C::Claim { lease, .. }) if self.lease == Some(*lease) => Ok(Vec::new()),
            (_, C::Claim { .. }) => Err(RunnerJobError::Taken),
            (JobStatus::Assigned, C::Finish { lease, outcome, reason })
                if self.lease == Some(*lease) =>
            {
                Ok(vec![RunnerJobEvent::RunnerJobFinished {
                    outcome: *outcome,
                    reason: reason.clone(),
                    at,
                }])
            }
            (_, C::Finish { .. }) => Ok(Vec::new()),
        }
    }

    fn evolve(mut self, event: &RunnerJobEvent) -> Self {
        match event {
            RunnerJobEvent::RunnerJobClaimed { lease, job, .. } => {
                self.status = JobStatus::Assigned;
                self.lease = Some(*lease);
                self.job = Some(*job);
            }
            RunnerJobEvent::RunnerJobFinished { outcome, .. } => {
                self.status = JobStatus::Finished;
                self.outcome = Some(*outcome);
            }
        }
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }

    /// A job's stream opens with its first claim, linked by its lease's assignment.
    fn may_open(command: &RunnerJobCommand) -> bool {
        matches!(command, RunnerJobCommand::Claim { .. })
    }
}

/// What a runner lease's events mean for its job (the service links this command to the
/// lease's, on the job's stream): its assignment claims the job, its end finishes it.
pub fn job_effect(
    before: &RunnerLease,
    events: &[RunnerEvent],
) -> Option<(JobRef, RunnerJobCommand)> {
    let terms = before.terms.as_ref()?;
    let after = events.iter().fold(before.clone(), |lease, event| lease.evolve(event));
    let job = after.job?;
    if before.job.is_none() {
        let queued_at = before.requested_at?;
        let tier = terms.tier.clone();
        return Some((job, RunnerJobCommand::Claim { lease: terms.lease, job, tier, queued_at }));
    }
    if after.phase.is_terminal() && !before.phase.is_terminal() {
        let outcome = after.outcome.unwrap_or(Outcome::Failed);
        let reason = after.failure_reason.filter(|_| outcome == Outcome::Failed);
        return Some((job, RunnerJobCommand::Finish { lease: terms.lease, outcome, reason }));
    }
    None
}
