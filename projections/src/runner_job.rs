//! The job history read model: `job_history` (each of a tenant's CI jobs as runner leases saw
//! it: since when it waited for a runner, when a lease took it, when it finished, how, and
//! why it failed, tenant-safe). One row per job stream.

use chrono::{DateTime, Utc};
use leasehold_domain::runner::{JobRef, Outcome, RunnerLeaseId, Tier};
use leasehold_domain::runner_job::{RunnerJob, RunnerJobEvent, RunnerJobId};
use leasehold_domain::values::Reason;
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};

/// Projects runner job streams into the job history.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobProjection;

/// One job's working state: what its events said.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The job.
    pub job: Option<JobRef>,
    /// The lease that holds it.
    pub lease: Option<RunnerLeaseId>,
    /// Its lease's tier.
    pub tier: Option<Tier>,
    /// Since when it waited for a runner.
    pub queued_at: Option<DateTime<Utc>>,
    /// When a lease took it.
    pub assigned_at: Option<DateTime<Utc>>,
    /// When its lease ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// How.
    pub outcome: Option<Outcome>,
    /// Why it failed.
    pub failure_reason: Option<Reason>,
}

/// A change to the job history: one job's row, from its view.
#[derive(Debug, Clone, PartialEq)]
pub struct JobChange {
    /// The working state, kept for the next batch.
    pub view: JobView,
    /// `job_history`.
    pub row: JobRow,
}

/// A row of `job_history`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0022_runners.sql.
pub struct JobRow {
    pub job_id: Uuid,
    pub tenant_id: String,
    pub request_id: Uuid,
    pub run_id: i64,
    pub lease_id: Uuid,
    pub tier: String,
    pub status: &'static str,
    pub queued_at: DateTime<Utc>,
    pub assigned_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub outcome: Option<&'static str>,
    pub failure_reason: Option<String>,
}

/// Revisions of what the job projection derives from its view.
const ROWS_REVISION: u32 = 0;

impl Projection for JobProjection {
    const NAME: &'static str = "runner_job_views";
    const VERSION: u32 = ROWS_REVISION + RunnerJob::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[RunnerJob::STREAM_TYPE];
    type Key = RunnerJobId;
    type View = JobView;
    type Change = JobChange;

    fn key(&self, event: &RecordedEvent) -> Option<RunnerJobId> {
        (event.stream_type.as_str() == RunnerJob::STREAM_TYPE)
            .then(|| RunnerJobId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&JobView>,
        event: &RecordedEvent,
        _changes: &mut Vec<JobChange>,
    ) -> Result<JobView, ProjectionError> {
        let decoded = crate::projection::decoded::<RunnerJobEvent>(Self::NAME, event)?;
        let mut view = view.cloned().unwrap_or_else(|| JobView {
            tenant: event.tenant_id.clone(),
            job: None,
            lease: None,
            tier: None,
            queued_at: None,
            assigned_at: None,
            finished_at: None,
            outcome: None,
            failure_reason: None,
        });
        match decoded {
            RunnerJobEvent::RunnerJobClaimed { lease, job, tier, queued_at, at } => {
                view.job = Some(job);
                view.lease = Some(lease);
                view.tier = Some(tier);
                view.queued_at = Some(queued_at);
                view.assigned_at = Some(at);
            }
            RunnerJobEvent::RunnerJobFinished { outcome, reason, at } => {
                view.outcome = Some(outcome);
                view.failure_reason = reason;
                view.finished_at = Some(at);
            }
        }
        Ok(view)
    }

    fn put(&self, key: &RunnerJobId, view: &JobView) -> JobChange {
        JobChange { view: view.clone(), row: row_of(key, view) }
    }
}

/// The row of one job, from its view.
///
/// # Panics
/// When the view has no claim: a job stream always starts with its claim.
pub fn row_of(key: &RunnerJobId, view: &JobView) -> JobRow {
    let (Some(job), Some(lease), Some(tier), Some(queued_at), Some(assigned_at)) =
        (view.job, view.lease, view.tier.as_ref(), view.queued_at, view.assigned_at)
    else {
        panic!("a job stream starts with its claim");
    };
    JobRow {
        job_id: key.0,
        tenant_id: view.tenant.to_string(),
        request_id: job.request.0,
        run_id: i64::try_from(job.run).unwrap_or(i64::MAX),
        lease_id: lease.0,
        tier: tier.to_string(),
        status: if view.finished_at.is_some() { "finished" } else { "assigned" },
        queued_at,
        assigned_at,
        finished_at: view.finished_at,
        outcome: view.outcome.map(Outcome::name),
        failure_reason: view.failure_reason.as_ref().map(ToString::to_string),
    }
}
