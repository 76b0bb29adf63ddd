//! The run's GraphQL types.

use async_graphql::{ID, InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::RunSummary;

/// A run's timeline. Never a fencing token, an operation id, or a registry or source
/// credential.
#[derive(Debug, Clone, SimpleObject)]
pub struct Run {
    /// Its id.
    pub id: ID,
    /// The rental it runs on.
    pub rental_id: Option<ID>,
    /// Its booking on the rental's schedule.
    pub booking_id: Option<ID>,
    /// That booking: `running` (the one the schedule runs), `queued` (behind it) or
    /// `released` (the run closed).
    pub booking_state: Option<String>,
    /// `requested`, `booked`, `launching`, `indeterminate` (a launch whose answer was lost:
    /// no other launch until it is reconciled), `running`, `finished` or `closed`.
    pub status: String,
    /// The node of its current attempt.
    pub node_id: Option<ID>,
    /// Its attempts, oldest first (`attempt`, `node`, `offer`, `launch`, `phase`,
    /// `exit_code`).
    pub attempts: Json<serde_json::Value>,
    /// You asked to cancel it.
    pub cancel_requested: bool,
    /// How it ended: the first terminal fact (`succeeded`, `failed` or `cancelled`).
    pub outcome: Option<String>,
    /// Its exit code (only from a workload seen `exited`).
    pub exit_code: Option<i32>,
    /// Why it failed (tenant-safe).
    pub failure: Option<String>,
    /// Its cleanup: `not_required`, `pending`, `confirmed` or `blocked`.
    pub cleanup: Option<String>,
    /// When Leasehold received the last look at it (its clock; a node's clock orders
    /// nothing).
    pub last_received_at: Option<DateTime<Utc>>,
    /// Its current attempt's node's state (`ready`, `lost`, `retired`, ...).
    pub node_state: Option<String>,
    /// Its workload is unobserved: its node was lost (its lease passed) while the run was
    /// under way. Not a failure: the run's outcome is only what the node reports.
    pub unobserved: bool,
    /// When it was submitted.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<RunSummary> for Run {
    fn from(run: RunSummary) -> Self {
        let id = |id: uuid::Uuid| ID(id.to_string());
        let unobserved = run.unobserved();
        Self {
            id: id(run.run_id),
            rental_id: run.rental_id.map(id),
            booking_id: run.booking_id.map(id),
            booking_state: run.booking_state,
            status: run.status,
            node_id: run.node_id.map(id),
            attempts: Json(run.attempts),
            cancel_requested: run.cancel_requested,
            outcome: run.outcome,
            exit_code: run.exit_code,
            failure: run.failure,
            cleanup: run.cleanup,
            last_received_at: run.last_received_at,
            node_state: run.node_state,
            unobserved,
            created_at: run.created_at,
            updated_at: run.updated_at,
        }
    }
}

/// Which runs to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct RunFilter {
    /// Only runs in this status.
    pub status: Option<String>,
    /// Only runs on this rental.
    pub rental_id: Option<ID>,
}

/// `submitRun`.
#[derive(Debug, Clone, InputObject)]
pub struct SubmitRunInput {
    /// Your idempotency key: a retry with the same key and input answers the first result
    /// (the run's id is minted from it).
    pub operation_key: String,
    /// One of your rentals, active.
    pub rental_id: ID,
    /// Exactly what runs: the manifest's digest (`sha256:<64 hex>`).
    pub manifest_digest: String,
    /// How long it may run, in seconds.
    pub max_runtime_seconds: u64,
}

/// `cancelRun`.
#[derive(Debug, Clone, InputObject)]
pub struct CancelRunInput {
    /// The run.
    pub run_id: ID,
    /// Your idempotency key.
    pub operation_key: String,
}
