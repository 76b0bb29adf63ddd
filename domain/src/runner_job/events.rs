//! A job's stored events: its tenant sees which of its leases holds it and how it finished.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::registry::{AggregateKind, EventView};
use crate::runner::{JobRef, Outcome, RunnerLeaseId, Tier};
use crate::values::Reason;

/// Everything that can happen to a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RunnerJobEvent {
    /// A lease took the job (in its assignment's append).
    RunnerJobClaimed {
        lease: RunnerLeaseId,
        job: JobRef,
        tier: Tier,
        queued_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// Its lease ended.
    RunnerJobFinished { outcome: Outcome, reason: Option<Reason>, at: DateTime<Utc> },
}

crate::tagged_events!(RunnerJobEvent { RunnerJobClaimed, RunnerJobFinished });

/// The runner job kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "runner-job",
    events: &[
        EventView {
            event_type: "RunnerJobClaimed",
            tenant_fields: &["lease", "job.request", "job.run", "tier", "queued_at", "at"],
            withheld: &[],
        },
        EventView {
            event_type: "RunnerJobFinished",
            tenant_fields: &["outcome", "reason", "at"],
            withheld: &[],
        },
    ],
};
