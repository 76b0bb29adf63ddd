//! A run's own values: its id, its attempts' and bookings' ids.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::values::uuid_type;

uuid_type!(
    /// A run: one piece of work a tenant submits, minted from its tenant and operation key.
    RunId,
    stream = "run"
);

uuid_type!(
    /// One attempt of a run on one node (a replacement attempt gets a new one).
    AttemptId
);

uuid_type!(
    /// One booking of a run on a rental's schedule.
    BookingId
);

/// Where a workload stands, as its node reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadPhase {
    /// Its image or inputs are being prepared.
    Preparing,
    /// Its container exists, not started.
    Created,
    /// Running.
    Running,
    /// It exited: only now does an exit code count.
    Exited,
    /// The node does not have it: never an exit (rule 10).
    Absent,
}

impl WorkloadPhase {
    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Preparing => "preparing",
            Self::Created => "created",
            Self::Running => "running",
            Self::Exited => "exited",
            Self::Absent => "absent",
        }
    }
}

impl fmt::Display for WorkloadPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One look a node took at a run's attempt. Its times are the node's clock: kept, never used
/// to order anything (rule 23); Leasehold stamps its own receipt time beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadObservation {
    /// The run.
    pub run: RunId,
    /// The attempt.
    pub attempt: AttemptId,
    /// Where it stands.
    pub phase: WorkloadPhase,
    /// When the node looked (its clock).
    pub observed_at: DateTime<Utc>,
    /// When its container started (the node's clock).
    pub started_at: Option<DateTime<Utc>>,
    /// When it finished (the node's clock).
    pub finished_at: Option<DateTime<Utc>>,
    /// Its exit code, meaningful only when `phase` is exited.
    pub exit_code: Option<i32>,
    /// The runtime killed it for memory.
    pub oom_killed: bool,
}
