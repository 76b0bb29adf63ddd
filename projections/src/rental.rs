//! The rentals read model: `rentals` (each rental as its tenant sees it), its `workloads`
//! row and its tenant's quota usage.
//!
//! A rental's row never holds its ownership token, its bootstrap, the provider's own name for
//! the machine, its operation keys or a failure's operator detail. `state_since` and
//! `observed_at` are the provider's clock as it reported them; `received_at` is Leasehold's.
//! A rental counts against its tenant's quota from its request until its termination is
//! confirmed: a termination asked is still charged (rule 9).

use chrono::{DateTime, Utc};
use leasehold_domain::rental::{Rental, RentalEvent, RentalId};
use leasehold_domain::{Aggregate, RecordedEvent, TenantId};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::projection::{Projection, ProjectionError};
use crate::shared::{QuotaDelta, WorkloadRow};

/// The workload kind of rentals in the unified listings.
pub const RENTAL_KIND: &str = leasehold_domain::workload_quota::WorkloadKind::Rental.name();

/// Projects rental streams into the rentals read model.
#[derive(Debug, Clone, Copy, Default)]
pub struct RentalProjection;

/// One rental's working state: its owner and its aggregate state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RentalView {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The aggregate's state.
    pub rental: Rental,
}

/// A change to the rentals read model.
#[derive(Debug, Clone, PartialEq)]
pub enum RentalChange {
    /// Write every row derived from one rental's view.
    Put(Box<RentalRows>),
    /// Capacity a tenant holds began or stopped counting.
    Quota(QuotaDelta),
}

/// Every row derived from one rental's view.
#[derive(Debug, Clone, PartialEq)]
pub struct RentalRows {
    /// The working state, kept for the next batch.
    pub view: RentalView,
    /// `rentals`.
    pub rental: RentalRow,
    /// `workloads`.
    pub workload: WorkloadRow,
}

/// A row of `rentals`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0019_rentals.sql.
pub struct RentalRow {
    pub rental_id: Uuid,
    pub tenant_id: String,
    pub connection_id: String,
    pub offer_id: String,
    pub state: &'static str,
    pub generation: i64,
    pub node_id: Option<Uuid>,
    pub resources: serde_json::Value,
    pub interruptible_requested: bool,
    pub interruptible_allocated: Option<bool>,
    pub pricing: Option<serde_json::Value>,
    pub max_lifetime_seconds: i64,
    pub observed_state: Option<&'static str>,
    pub state_since: Option<DateTime<Utc>>,
    pub observed_at: Option<DateTime<Utc>>,
    pub received_at: Option<DateTime<Utc>>,
    pub running_run: Option<Uuid>,
    pub queued_runs: i32,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Revisions of what the rental projection derives from its view; its version adds the
/// state's schema, so a new `Rental::STATE_SCHEMA` rebuilds it.
const ROWS_REVISION: u32 = 0;

impl Projection for RentalProjection {
    const NAME: &'static str = "rental_views";
    const VERSION: u32 = ROWS_REVISION + Rental::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Rental::STREAM_TYPE];
    type Key = RentalId;
    type View = RentalView;
    type Change = RentalChange;

    fn key(&self, event: &RecordedEvent) -> Option<RentalId> {
        (event.stream_type.as_str() == Rental::STREAM_TYPE)
            .then(|| RentalId::of_stream(&event.stream_id))
            .flatten()
    }

    fn project(
        &self,
        view: Option<&RentalView>,
        event: &RecordedEvent,
        changes: &mut Vec<RentalChange>,
    ) -> Result<RentalView, ProjectionError> {
        let decoded = crate::projection::decoded::<RentalEvent>(Self::NAME, event)?;
        let before = view.cloned().unwrap_or_else(|| RentalView {
            tenant: event.tenant_id.clone(),
            rental: Rental::initial(),
        });
        let after = RentalView {
            tenant: before.tenant.clone(),
            rental: before.rental.clone().evolve(&decoded),
        };
        let delta =
            QuotaDelta::between(after.tenant.to_string(), RENTAL_KIND, held(&before), held(&after));
        changes.extend(delta.map(RentalChange::Quota));
        Ok(after)
    }

    fn put(&self, _key: &RentalId, view: &RentalView) -> RentalChange {
        RentalChange::Put(Box::new(rows_of(view)))
    }
}

/// What a rental holds of its tenant's quota until its termination is confirmed: its charge
/// (`Rental::charge`).
fn held(view: &RentalView) -> Vec<(String, i64)> {
    crate::shared::held_of(RENTAL_KIND, view.rental.charge())
}

/// Every row of one rental, from its view.
///
/// # Panics
/// When the view has no terms: a rental stream always starts with the event that sets them.
pub fn rows_of(view: &RentalView) -> RentalRows {
    let rental = &view.rental;
    let terms = rental.terms.as_ref().expect("a rental stream starts by setting its terms");
    let created_at = rental.requested_at.unwrap_or_default();
    let updated_at = rental.updated_at.unwrap_or(created_at);
    let resources = serde_json::to_value(terms.resources).expect("resources serialize");
    let observed = rental.observed.as_ref();
    let state = rental.status.name();
    let to_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    let items = serde_json::json!([
        { "sku": "rental.cpu_millis", "quantity": terms.resources.cpu_millis },
        { "sku": "rental.memory_mb", "quantity": terms.resources.memory_mb },
        { "sku": "rental.disk_gb", "quantity": terms.resources.disk_gb },
        { "sku": "rental.gpus", "quantity": terms.resources.gpus },
    ]);
    RentalRows {
        view: view.clone(),
        rental: RentalRow {
            rental_id: terms.rental.0,
            tenant_id: view.tenant.to_string(),
            connection_id: terms.connection.to_string(),
            offer_id: terms.offer.to_string(),
            state,
            generation: to_i64(rental.generation),
            node_id: rental.node.map(|node| node.0),
            resources,
            interruptible_requested: terms.interruptible,
            interruptible_allocated: rental.allocated.as_ref().map(|a| a.interruptible),
            pricing: rental.allocated.as_ref().map(|allocated| {
                serde_json::to_value(&allocated.pricing).expect("pricing serializes")
            }),
            max_lifetime_seconds: to_i64(terms.max_lifetime_seconds),
            observed_state: observed.map(|seen| seen.observation.state.name()),
            state_since: observed.and_then(|seen| seen.observation.state_since),
            observed_at: observed.map(|seen| seen.observation.observed_at),
            received_at: observed.map(|seen| seen.received_at),
            running_run: rental.schedule.running.map(|held| held.run.0),
            queued_runs: i32::try_from(rental.schedule.queued.len()).unwrap_or(i32::MAX),
            created_at,
            updated_at,
        },
        workload: WorkloadRow {
            kind: RENTAL_KIND,
            workload_id: terms.rental.0,
            tenant_id: view.tenant.to_string(),
            status: state,
            backend_name: Some(terms.connection.to_string()),
            items,
            created_at,
            updated_at,
        },
    }
}
