//! The run timeline read model: `run_timeline` (each run as its tenant sees it: its attempts,
//! booking, outcome, exit code, cleanup, and when Leasehold last received a look at it) and
//! its `workloads` row, and its tenant's quota usage: a run is active from its submission
//! until it closes, holding its maximum runtime (`run.max_runtime_seconds`); the
//! capacity it runs on is its rental's, counted there.
//!
//! An attempt's fencing token and operation ids are never here, nor any registry or source
//! credential (a run's terms hold none). A run on a lost node reads as unobserved, not dead:
//! the node's state is in `nodes`, and the gateway reads the two together.

use chrono::{DateTime, Utc};
use leasehold_domain::run::{Run, RunEvent, RunId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};
use crate::shared::{QuotaDelta, WorkloadRow};

/// The workload kind of runs in the unified listings.
pub const RUN_KIND: &str = leasehold_domain::workload_quota::WorkloadKind::Run.name();

/// Projects run streams into the run timeline.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunProjection;

/// One run's working state: its owner, its aggregate state, and when Leasehold last
/// received a look at it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub run: Run,
    /// When Leasehold received the last look at its attempts (its own clock).
    pub last_received_at: Option<DateTime<Utc>>,
}

/// A change to the run timeline.
#[derive(Debug, Clone, PartialEq)]
pub enum RunChange {
    /// Write every row derived from one run's view.
    Put(Box<RunRows>),
    /// A run began or stopped counting in its tenant's quota usage.
    Quota(QuotaDelta),
}

/// Every row derived from one run's view.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRows {
    /// The working state, kept for the next batch.
    pub view: RunView,
    /// `run_timeline`.
    pub row: RunRow,
    /// `workloads`.
    pub workload: WorkloadRow,
}

/// A row of `run_timeline`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0021_run_timeline.sql.
pub struct RunRow {
    pub run_id: Uuid,
    pub tenant_id: String,
    pub rental_id: Option<Uuid>,
    pub booking_id: Option<Uuid>,
    pub status: &'static str,
    pub node_id: Option<Uuid>,
    pub attempts: serde_json::Value,
    pub cancel_requested: bool,
    pub outcome: Option<&'static str>,
    pub exit_code: Option<i32>,
    pub failure: Option<String>,
    pub cleanup: Option<&'static str>,
    pub last_received_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Revisions of what the run projection derives from its view; its version adds the
/// state's schema, so a new `Run::STATE_SCHEMA` rebuilds it.
const ROWS_REVISION: u32 = 1;

impl Projection for RunProjection {
    const NAME: &'static str = "run_views";
    const VERSION: u32 = ROWS_REVISION + Run::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Run::STREAM_TYPE];
    type Key = RunId;
    type View = RunView;
    type Change = RunChange;

    fn key(&self, event: &RecordedEvent) -> Option<RunId> {
        (event.stream_type.as_str() == Run::STREAM_TYPE)
            .then(|| RunId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&RunView>,
        event: &RecordedEvent,
        changes: &mut Vec<RunChange>,
    ) -> Result<RunView, ProjectionError> {
        let decoded = crate::projection::decoded::<RunEvent>(Self::NAME, event)?;
        let before = view.cloned().unwrap_or_else(|| RunView {
            tenant: event.tenant_id.clone(),
            run: Run::initial(),
            last_received_at: None,
        });
        let last_received_at = match &decoded {
            RunEvent::RunExternalStateObserved { received_at, .. } => Some(*received_at),
            _ => before.last_received_at,
        };
        let after = RunView {
            tenant: before.tenant.clone(),
            run: before.run.clone().evolve(&decoded),
            last_received_at,
        };
        let delta =
            QuotaDelta::between(after.tenant.to_string(), RUN_KIND, held(&before), held(&after));
        changes.extend(delta.map(RunChange::Quota));
        Ok(after)
    }

    fn put(&self, _key: &RunId, view: &RunView) -> RunChange {
        let (row, workload) = rows_of(view);
        RunChange::Put(Box::new(RunRows { view: view.clone(), row, workload }))
    }
}

/// What a run holds of its tenant's quota usage until it closes: its charge (`Run::charge`).
fn held(view: &RunView) -> Vec<(String, i64)> {
    crate::shared::held_of(RUN_KIND, view.run.charge())
}

/// The rows of one run, from its view.
///
/// # Panics
/// When the view has no terms: a run stream always starts with its submission.
pub fn rows_of(view: &RunView) -> (RunRow, WorkloadRow) {
    let run = &view.run;
    let terms = run.terms.as_ref().expect("a run stream starts with its submission");
    let created_at = run.requested_at.unwrap_or_default();
    let updated_at = run.updated_at.unwrap_or(created_at);
    let attempts: Vec<serde_json::Value> = run
        .attempts
        .iter()
        .map(|attempt| {
            serde_json::json!({
                "attempt": attempt.attempt.0,
                "node": attempt.node.0,
                "offer": attempt.offer.to_string(),
                "launch": attempt.launch,
                "phase": attempt.phase,
                "exit_code": attempt.exit_code,
            })
        })
        .collect();
    let status = run.status.name();
    let row = RunRow {
        run_id: terms.run.0,
        tenant_id: view.tenant.to_string(),
        rental_id: run.booking.map(|booking| booking.rental.0),
        booking_id: run.booking.map(|booking| booking.booking.0),
        status,
        node_id: run.current().map(|attempt| attempt.node.0),
        attempts: serde_json::Value::Array(attempts),
        cancel_requested: run.cancel_requested,
        outcome: run.outcome.map(outcome_name),
        exit_code: run.exit_code,
        failure: run.failure.as_ref().map(ToString::to_string),
        cleanup: run.cleanup.map(cleanup_name),
        last_received_at: view.last_received_at,
        created_at,
        updated_at,
    };
    let workload = WorkloadRow {
        kind: RUN_KIND,
        workload_id: terms.run.0,
        tenant_id: view.tenant.to_string(),
        status,
        backend_name: None,
        items: serde_json::json!([]),
        created_at,
        updated_at,
    };
    (row, workload)
}

fn outcome_name(outcome: leasehold_domain::run::Outcome) -> &'static str {
    use leasehold_domain::run::Outcome as O;
    match outcome {
        O::Succeeded => "succeeded",
        O::Failed => "failed",
        O::Cancelled => "cancelled",
    }
}

fn cleanup_name(cleanup: leasehold_domain::run::Cleanup) -> &'static str {
    use leasehold_domain::run::Cleanup as C;
    match cleanup {
        C::NotRequired => "not_required",
        C::Pending => "pending",
        C::Confirmed => "confirmed",
        C::Blocked => "blocked",
    }
}
