//! The run's stored events, and what its tenant may see of each: never node operation ids or
//! fencing tokens. No credential is ever in one.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    Attempt, AttemptId, Cleanup, Outcome, RunBooking, RunTerms, StopOrder, WorkloadObservation,
};
use crate::registry::{AggregateKind, EventView};
use crate::values::{OperationId, Reason};

/// Everything that can happen to a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RunEvent {
    /// A tenant submitted it.
    RunRequested { terms: RunTerms, at: DateTime<Utc> },
    /// It was booked on a rental's schedule.
    RunBookingDecided { booking: RunBooking, at: DateTime<Utc> },
    /// Its booking ran: its first attempt goes out.
    RunBookingDispatched { at: DateTime<Utc> },
    /// An attempt was created on a node.
    RunAttemptCreated { attempt: Attempt, at: DateTime<Utc> },
    /// The launch was recorded before the node was ordered to launch.
    RunLaunchIntentRecorded { attempt: AttemptId, operation: OperationId, at: DateTime<Utc> },
    /// The node accepted the launch.
    RunLaunchAccepted { attempt: AttemptId, at: DateTime<Utc> },
    /// The node refused the launch, or never applied it (its offer is excluded).
    RunLaunchFailed { attempt: AttemptId, reason: Reason, at: DateTime<Utc> },
    /// The launch's answer was lost.
    RunLaunchIndeterminate { attempt: AttemptId, at: DateTime<Utc> },
    /// The node never applied the launch (its reconciliation shows it): nothing ran.
    RunLaunchNotApplied { attempt: AttemptId, at: DateTime<Utc> },
    /// A node's look at an attempt (its times the node's clock; `received_at` Leasehold's).
    RunExternalStateObserved { observation: WorkloadObservation, received_at: DateTime<Utc> },
    /// The first terminal fact: how the run ended.
    RunOutcomeRecorded {
        outcome: Outcome,
        exit_code: Option<i32>,
        reason: Option<Reason>,
        at: DateTime<Utc>,
    },
    /// The tenant asked to cancel it.
    RunCancelRequested { at: DateTime<Utc> },
    /// The cancel's stop was ordered on the attempt's node (linked in the same append).
    RunStopOrdered { attempt: AttemptId, stop: StopOrder, at: DateTime<Utc> },
    /// The node applied the cancel's stop.
    RunCancelAccepted { at: DateTime<Utc> },
    /// The node refused the cancel's stop, or never applied it: another is to be ordered.
    RunStopFailed { attempt: AttemptId, at: DateTime<Utc> },
    /// Its workload is to be cleaned up.
    RunCleanupRequested { at: DateTime<Utc> },
    /// Its cleanup failed.
    RunCleanupFailed { reason: Reason, at: DateTime<Utc> },
    /// Its cleanup is confirmed.
    RunCleanupConfirmed { at: DateTime<Utc> },
    /// The node its attempt was on is retired: the machine's generation ended under it
    /// (confirmed stopped, then resumed as the next; or confirmed terminated).
    RunNodeRetired { attempt: AttemptId, at: DateTime<Utc> },
    /// It is done (`cleanup`: confirmed, or not required).
    RunClosed { cleanup: Cleanup, at: DateTime<Utc> },
}

crate::tagged_events!(RunEvent {
    RunRequested,
    RunBookingDecided,
    RunBookingDispatched,
    RunAttemptCreated,
    RunLaunchIntentRecorded,
    RunLaunchAccepted,
    RunLaunchFailed,
    RunLaunchIndeterminate,
    RunLaunchNotApplied,
    RunExternalStateObserved,
    RunOutcomeRecorded,
    RunCancelRequested,
    RunStopOrdered,
    RunCancelAccepted,
    RunStopFailed,
    RunCleanupRequested,
    RunCleanupFailed,
    RunCleanupConfirmed,
    RunNodeRetired,
    RunClosed,
});

/// What a tenant sees of a node's look at an attempt, on the run's stream and the node's.
pub(crate) const OBSERVED_WORKLOAD: &[&str] = &[
    "observation.run",
    "observation.attempt",
    "observation.phase",
    "observation.observed_at",
    "observation.started_at",
    "observation.finished_at",
    "observation.exit_code",
    "observation.oom_killed",
    "received_at",
];

/// The run kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "run",
    events: &[
        view(
            "RunRequested",
            &["terms.run", "terms.manifest_digest", "terms.max_runtime_seconds", "at"],
            &[],
        ),
        view(
            "RunBookingDecided",
            &["booking.booking", "booking.rental", "booking.generation", "at"],
            &[],
        ),
        view("RunBookingDispatched", AT, &[]),
        view(
            "RunAttemptCreated",
            &[
                "attempt.attempt",
                "attempt.rental",
                "attempt.node",
                "attempt.offer",
                "attempt.launch",
                "attempt.phase",
                "attempt.exit_code",
                "at",
            ],
            &["attempt.fencing_token", "attempt.operation"],
        ),
        view("RunLaunchIntentRecorded", &["attempt", "at"], &["operation"]),
        view("RunLaunchAccepted", &["attempt", "at"], &[]),
        view("RunLaunchFailed", &["attempt", "reason", "at"], &[]),
        view("RunLaunchIndeterminate", &["attempt", "at"], &[]),
        view("RunLaunchNotApplied", &["attempt", "at"], &[]),
        view("RunExternalStateObserved", OBSERVED_WORKLOAD, &[]),
        view("RunOutcomeRecorded", &["outcome", "exit_code", "reason", "at"], &[]),
        view("RunCancelRequested", AT, &[]),
        view("RunStopOrdered", &["attempt", "at"], &["stop.fencing_token", "stop.operation"]),
        view("RunCancelAccepted", AT, &[]),
        view("RunStopFailed", &["attempt", "at"], &[]),
        view("RunCleanupRequested", AT, &[]),
        view("RunCleanupFailed", &["reason", "at"], &[]),
        view("RunCleanupConfirmed", AT, &[]),
        view("RunNodeRetired", &["attempt", "at"], &[]),
        view("RunClosed", &["cleanup", "at"], &[]),
    ],
};

const AT: &[&str] = &["at"];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
