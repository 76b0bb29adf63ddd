//! The rental's GraphQL types.

use async_graphql::{ID, InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{NodeSummary, RentalSummary};

/// A rental, beside its current node. Never its ownership token, its bootstrap, the
/// provider's own name for the machine, an enrollment or session token, or failure detail.
#[derive(Debug, Clone, SimpleObject)]
pub struct Rental {
    /// Its id (minted by Leasehold before any provider was called).
    pub id: ID,
    /// Its tenant (operators only; null for tenants, who see only their own).
    pub tenant_id: Option<String>,
    /// The provider connection it was rented through.
    pub connection_id: String,
    /// The provider's offer.
    pub offer_id: String,
    /// `requested`, `starting`, `active`, `stopping`, `stopped`, `terminating` or
    /// `terminated`.
    pub state: String,
    /// Its generation: pass it with `stopRental`, `resumeRental` and `terminateRental` (a
    /// command stamped with an older one is `FENCED`).
    pub generation: u64,
    /// Its current generation's node.
    pub node_id: Option<ID>,
    /// That node's state: `enrolling` (invited), `ready`, `lost` or `retired`.
    pub node_state: Option<String>,
    /// When that node is lost unless it beats (Leasehold's clock).
    pub node_lease_expires: Option<DateTime<Utc>>,
    /// How old that node's last facts are, in seconds (from Leasehold's receipt of them).
    pub facts_age_seconds: Option<i64>,
    /// What was asked of the machine (`cpu_millis`, `memory_mb`, `disk_gb`, `gpus`).
    pub resources: Json<serde_json::Value>,
    /// Interruptible (spot) capacity was asked for.
    pub interruptible_requested: bool,
    /// What the provider allocated (it may differ); null until it accepted.
    pub interruptible_allocated: Option<bool>,
    /// Its price as the provider states it (`currency`, `micros_per_hour`, `exact`).
    pub price: Option<Json<serde_json::Value>>,
    /// When Leasehold reclaims it, in seconds from its provision.
    pub max_lifetime_seconds: i64,
    /// The provider's last observed state of the machine (`unknown` is an honest answer).
    pub observed_state: Option<String>,
    /// When the provider says the machine entered that state (its clock; null when it does
    /// not say).
    pub state_since: Option<DateTime<Utc>>,
    /// When the provider looked (its clock).
    pub observed_at: Option<DateTime<Utc>>,
    /// When Leasehold received that look (its clock).
    pub received_at: Option<DateTime<Utc>>,
    /// The run its schedule runs now.
    pub running_run_id: Option<ID>,
    /// Runs queued on its schedule (at most four).
    pub queued_runs: i32,
    /// When it was provisioned.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl Rental {
    /// `summary` as shown to a tenant (`operator`: with its tenant), with the facts' age
    /// at `now`.
    pub(crate) fn of(summary: RentalSummary, operator: bool, now: DateTime<Utc>) -> Self {
        Self {
            id: ID(summary.rental_id.to_string()),
            tenant_id: operator.then_some(summary.tenant_id),
            connection_id: summary.connection_id,
            offer_id: summary.offer_id,
            state: summary.state,
            generation: u64::try_from(summary.generation).unwrap_or(0),
            node_id: summary.node_id.map(|id| ID(id.to_string())),
            node_state: summary.node_state,
            node_lease_expires: summary.node_lease_expires,
            facts_age_seconds: summary
                .node_facts_received_at
                .map(|at| (now - at).num_seconds().max(0)),
            resources: Json(summary.resources),
            interruptible_requested: summary.interruptible_requested,
            interruptible_allocated: summary.interruptible_allocated,
            price: summary.pricing.map(Json),
            max_lifetime_seconds: summary.max_lifetime_seconds,
            observed_state: summary.observed_state,
            state_since: summary.state_since,
            observed_at: summary.observed_at,
            received_at: summary.received_at,
            running_run_id: summary.running_run.map(|id| ID(id.to_string())),
            queued_runs: summary.queued_runs,
            created_at: summary.created_at,
            updated_at: summary.updated_at,
        }
    }
}

/// A node of a rental. Never its enrollment token or its hash, its fencing token, its
/// credential or its operations' ids.
#[derive(Debug, Clone, SimpleObject)]
pub struct RentalNode {
    /// Its id.
    pub id: ID,
    /// Its rental.
    pub rental_id: ID,
    /// The rental's generation it belongs to (a node never outlives its generation).
    pub generation: u64,
    /// `enrolling` (invited, not enrolled yet), `ready`, `lost` (its lease expired: its
    /// workloads are unobserved, not dead) or `retired` (its generation ended).
    pub state: String,
    /// The node agent's version.
    pub agent_version: Option<String>,
    /// What it last reported of itself (`observed_at` is its own clock, which orders
    /// nothing).
    pub facts: Option<Json<serde_json::Value>>,
    /// How old those facts are, in seconds (from Leasehold's receipt of them).
    pub facts_age_seconds: Option<i64>,
    /// When it last enrolled.
    pub enrolled_at: Option<DateTime<Utc>>,
    /// Its last heartbeat, as Leasehold received it.
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// When it is lost unless it beats.
    pub lease_expires: Option<DateTime<Utc>>,
    /// Operations ordered and not answered yet.
    pub pending_operations: i32,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl RentalNode {
    /// `summary`, with the facts' age at `now`.
    pub(crate) fn of(summary: NodeSummary, now: DateTime<Utc>) -> Self {
        Self {
            id: ID(summary.node_id.to_string()),
            rental_id: ID(summary.rental_id.to_string()),
            generation: u64::try_from(summary.generation).unwrap_or(0),
            state: summary.state,
            agent_version: summary.agent_version,
            facts: summary.facts.map(Json),
            facts_age_seconds: summary.facts_received_at.map(|at| (now - at).num_seconds().max(0)),
            enrolled_at: summary.enrolled_at,
            last_heartbeat_at: summary.last_heartbeat_at,
            lease_expires: summary.lease_expires,
            pending_operations: summary.pending_operations,
            updated_at: summary.updated_at,
        }
    }
}

/// Which rentals to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct RentalFilter {
    /// Only rentals in this state.
    pub state: Option<String>,
}

/// What to ask of a rented machine.
#[derive(Debug, Clone, InputObject)]
pub struct ResourcesInput {
    /// CPU in thousandths of a core.
    pub cpu_millis: u64,
    /// Memory in MiB.
    pub memory_mb: u64,
    /// Disk in GiB.
    pub disk_gb: u64,
    /// GPUs (default 0).
    pub gpus: Option<u32>,
}

/// `provisionRental`.
#[derive(Debug, Clone, InputObject)]
pub struct ProvisionRentalInput {
    /// Your idempotency key: a retry with the same key and input answers the first result
    /// (the rental's id is minted from it).
    pub operation_key: String,
    /// The provider connection to rent through.
    pub connection_id: String,
    /// The provider's offer.
    pub offer_id: String,
    /// What to ask of the machine.
    pub resources: ResourcesInput,
    /// Interruptible (spot) capacity (default false).
    pub interruptible: Option<bool>,
    /// When Leasehold reclaims it, in seconds (60 to 30 days).
    pub max_lifetime_seconds: u64,
}

/// A tenant's command on one of its rentals, stamped with the generation it read.
#[derive(Debug, Clone, InputObject)]
pub struct RentalGenerationInput {
    /// The rental.
    pub rental_id: ID,
    /// The generation you read (`FENCED` when it is not the rental's).
    pub generation: u64,
    /// Your idempotency key.
    pub operation_key: String,
}

/// A price as the provider states it.
#[derive(Debug, Clone, InputObject)]
pub struct PricingInput {
    /// ISO 4217 currency (`USD`).
    pub currency: String,
    /// Millionths of the currency per hour.
    pub micros_per_hour: u64,
    /// A billable rate, not an estimate.
    pub exact: bool,
}

/// A provider agent's receipt for a rental's provision.
#[derive(Debug, Clone, InputObject)]
pub struct RentalReceiptInput {
    /// The rental.
    pub rental_id: ID,
    /// The generation the provision was sent under.
    pub generation: u64,
    /// Your idempotency key.
    pub operation_key: String,
    /// The provider's name for the machine.
    pub native_ref: String,
    /// The machine's state as accepted (`requested`, `starting`, ...).
    pub state: String,
    /// When the provider accepted (its clock).
    pub accepted_at: DateTime<Utc>,
    /// It had accepted this operation key before.
    pub duplicate: bool,
    /// What it allocated is interruptible.
    pub interruptible: bool,
    /// What it charges.
    pub pricing: PricingInput,
}

/// A provider agent's look at a rental's machine.
#[derive(Debug, Clone, InputObject)]
pub struct RentalObservationInput {
    /// The rental.
    pub rental_id: ID,
    /// The generation the look was asked under (`FENCED` after a resume).
    pub generation: u64,
    /// Your idempotency key.
    pub operation_key: String,
    /// The provider's name for the machine.
    pub native_ref: String,
    /// Its state: `requested`, `starting`, `active`, `stopping`, `stopped`, `terminated` or
    /// `unknown` (an honest answer, never a reason to act).
    pub state: String,
    /// When the machine entered that state, if the provider dates its transitions.
    pub state_since: Option<DateTime<Utc>>,
    /// When the provider looked (its clock; Leasehold stamps its own receipt time).
    pub observed_at: DateTime<Utc>,
    /// The provider reclaimed interruptible capacity (not an operator's stop).
    pub interrupted: Option<bool>,
}

/// A provider agent's report that names only the rental.
#[derive(Debug, Clone, InputObject)]
pub struct RentalReportInput {
    /// The rental.
    pub rental_id: ID,
    /// The generation it is about.
    pub generation: u64,
    /// Your idempotency key.
    pub operation_key: String,
    /// Operator detail (a refused provision), never shown to the tenant.
    pub detail: Option<String>,
}
