//! The provider-agent protocol's bodies (`docs/mercator-protocol.md` §1): Leasehold's own
//! HTTP wire for mercator's `CapacityProvider` interface, in mercator's JSON spellings, spoken
//! by the dispatcher's client (`client.rs`) and by `leasehold backend-sim --provider`.
//!
//! | route | body | answer |
//! |---|---|---|
//! | `POST /v1/capacity/provision` | [`ProvisionCommand`] | 200 [`ReceiptWire`] |
//! | `POST /v1/capacity/observe` | [`CapacityRef`] | 200 [`ObservationWire`]; 404 not found |
//! | `POST /v1/capacity/stop` | [`CapacityCommand`] | 200 [`ReceiptWire`]; 404; 501 |
//! | `POST /v1/capacity/start` | [`CapacityCommand`] (with the new generation's bootstrap) | 200 [`ReceiptWire`]; 404; 501 |
//! | `POST /v1/capacity/terminate` | [`CapacityCommand`] | 200 [`ReceiptWire`]; 404 |
//! | `POST /v1/capacity/owned` | [`OwnershipQuery`] | 200 [`OwnedList`]; 501 |
//!
//! Every route wants `Authorization: Bearer <the connection's token>`. A refusal is `{"code",
//! "message"}`: `UNSUPPORTED` (501, the operation is not in the provider's declaration: never
//! retried), `NOT_FOUND` (404), `FENCED` (409, a superseded generation), any other 4xx a
//! refusal for good, a 5xx or 429 or no answer a failure tried again.

use chrono::{DateTime, Utc};
use leasehold_domain::rental::{
    CapacityObservation, CapacityReceipt, CapacityState, NativeRef, Pricing, Resources,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// What a fresh machine needs to enroll its node agent (mercator's `NodeBootstrap`), handed
/// to the provider verbatim. Its `Debug` never shows the enrollment token.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeBootstrap {
    /// Where the agent enrolls.
    pub control_plane_url: String,
    /// The node it enrolls as.
    pub node_id: Uuid,
    /// Its rental.
    pub rental_id: Uuid,
    /// Its generation.
    pub generation: u64,
    /// Single-use, time-bounded; never in an event, a read model or a log line.
    pub enrollment_token: String,
    /// The agent build to run.
    pub agent_version: String,
}

impl std::fmt::Debug for NodeBootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeBootstrap")
            .field("control_plane_url", &self.control_plane_url)
            .field("node_id", &self.node_id)
            .field("rental_id", &self.rental_id)
            .field("generation", &self.generation)
            .field("agent_version", &self.agent_version)
            .finish_non_exhaustive()
    }
}

/// A provision (mercator's `ProvisionCommand`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProvisionCommand {
    /// The tenant (mercator's workspace).
    pub workspace_id: String,
    /// The connection.
    pub connection_id: String,
    /// The same key must have the same effect once; a repeat answers `duplicate`.
    pub operation_key: String,
    /// A digest of the request the key was first used with.
    pub request_hash: String,
    /// Leasehold's id for the rental, minted before this call.
    pub rental_id: Uuid,
    /// The rental's generation.
    pub generation: u64,
    /// The mark the provider keeps on the machine (proves ownership when listed).
    pub ownership_token: String,
    /// The offer.
    pub offer_snapshot_id: String,
    /// What it asks of the machine.
    pub resources: Resources,
    /// Delivered to the machine verbatim.
    pub bootstrap: NodeBootstrap,
    /// Spot capacity requested.
    pub interruptible: bool,
    /// The provider-side reclamation backstop.
    pub max_lifetime_seconds: u64,
}

/// Allocated capacity, named well enough to find it after a restart (mercator's
/// `CapacityRef`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityRef {
    /// The tenant.
    pub workspace_id: String,
    /// The connection.
    pub connection_id: String,
    /// Leasehold's id for the rental.
    pub rental_id: Uuid,
    /// The provider's own name for the machine (empty before a receipt named it).
    pub native_ref: String,
    /// The mark on the machine.
    pub ownership_token: String,
}

/// A command on allocated capacity (mercator's `CapacityCommand`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapacityCommand {
    /// The capacity.
    #[serde(flatten)]
    pub capacity: CapacityRef,
    /// As a provision's.
    pub operation_key: String,
    /// As a provision's.
    pub request_hash: String,
    /// The generation it is stamped with: a provider ignores a superseded one (`FENCED`).
    pub generation: u64,
    /// For `start` (a resume): the new generation's bootstrap, whose node replaces the
    /// previous one (Leasehold's addition: mercator's `StartCapacity` carries none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<NodeBootstrap>,
}

/// A provider's receipt (mercator's `CapacityReceipt`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptWire {
    /// Its name for the machine.
    pub native_ref: NativeRef,
    /// The machine's state.
    pub state: CapacityState,
    /// When it accepted.
    pub accepted_at: DateTime<Utc>,
    /// The operation key was accepted before.
    #[serde(default)]
    pub duplicate: bool,
    /// What it allocated (may differ from the request).
    #[serde(default)]
    pub interruptible: bool,
    /// What it charges.
    pub pricing: Pricing,
}

impl From<ReceiptWire> for CapacityReceipt {
    fn from(wire: ReceiptWire) -> Self {
        Self {
            native_ref: wire.native_ref,
            state: wire.state,
            accepted_at: wire.accepted_at,
            duplicate: wire.duplicate,
            interruptible: wire.interruptible,
            pricing: wire.pricing,
        }
    }
}

/// A look at a machine (mercator's `CapacityObservation`, with the seed's `state_since`).
/// `endpoint` and `native_json` are taken and dropped: provenance Leasehold does not keep (a
/// provider's raw JSON may hold anything).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationWire {
    /// Its name for the machine.
    pub native_ref: NativeRef,
    /// The machine's state.
    pub state: CapacityState,
    /// When it entered that state, on the provider's clock, if the provider dates it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_since: Option<DateTime<Utc>>,
    /// When the provider looked.
    pub observed_at: DateTime<Utc>,
    /// Reclaimed by the provider (interruptible capacity), not stopped by anyone.
    #[serde(default)]
    pub interrupted: bool,
    /// Where the machine can be reached (dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The provider's own record (dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_json: Option<String>,
}

impl From<ObservationWire> for CapacityObservation {
    fn from(wire: ObservationWire) -> Self {
        Self {
            native_ref: wire.native_ref,
            state: wire.state,
            state_since: wire.state_since,
            observed_at: wire.observed_at,
            interrupted: wire.interrupted,
        }
    }
}

/// Whose owned capacity to list (mercator's `OwnershipQuery`; empty: the connection's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnershipQuery {
    /// The tenant, or every one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_id: Option<String>,
}

/// One machine the provider says the connection allocated (mercator's `OwnedCapacity`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedCapacity {
    /// Its name for the machine.
    pub native_ref: NativeRef,
    /// The connection.
    pub connection_id: String,
    /// The tenant.
    #[serde(default)]
    pub workspace_id: String,
    /// The rental it was provisioned for, when the provider kept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rental_id: Option<Uuid>,
    /// Its generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The mark on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ownership_token: Option<String>,
    /// Its state.
    pub state: CapacityState,
    /// When it was made.
    pub created_at: DateTime<Utc>,
    /// Interruptible as allocated (Leasehold's addition, so that an adopted machine's
    /// receipt says it).
    #[serde(default)]
    pub interruptible: bool,
    /// What it charges (Leasehold's addition, as above), when the provider lists it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pricing: Option<Pricing>,
}

/// The answer to `owned`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OwnedList {
    /// Every machine.
    pub capacity: Vec<OwnedCapacity>,
}

/// A refusal's body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRefusal {
    /// `UNSUPPORTED`, `NOT_FOUND`, `FENCED`, `INVALID_REQUEST`, `UNAUTHORIZED`, ...
    pub code: String,
    /// For operators.
    #[serde(default)]
    pub message: String,
}
