//! The rental's stored events, and what its tenant may see of each: never the ownership
//! token, the bootstrap, the provider's own name for the machine, operation keys or failure
//! detail. No enrollment token is ever in one (the node's stream keeps only its hash).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{
    Booking, BookingId, CapacityObservation, CapacityReceipt, OwnershipToken, RentalStatus,
    RentalTerms, TerminateCause,
};
use crate::node::NodeId;
use crate::registry::{AggregateKind, EventView};
use crate::run::AttemptId;
use crate::values::{OperationId, OperatorDetail};

/// How a termination was confirmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The provider observed the machine terminated.
    Observed,
    /// The provider no longer knows the machine while a termination was asked, and declares
    /// terminated capacity unobservable.
    NotFound,
}

/// Everything that can happen to a rental.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RentalEvent {
    /// Capacity was asked of the provider (the rental's first generation).
    CapacityRequested {
        terms: RentalTerms,
        ownership: OwnershipToken,
        node: NodeId,
        generation: u64,
        operation: OperationId,
        at: DateTime<Utc>,
    },
    /// The provider accepted: what it allocated.
    CapacityAccepted {
        generation: u64,
        receipt: CapacityReceipt,
        status: RentalStatus,
        at: DateTime<Utc>,
    },
    /// The provider refused the provision for good; nothing was allocated.
    CapacityProvisionFailed { generation: u64, detail: OperatorDetail, at: DateTime<Utc> },
    /// A look at the machine (`status`: the rental's after it).
    CapacityObserved {
        observation: CapacityObservation,
        status: RentalStatus,
        received_at: DateTime<Utc>,
    },
    /// The asked stop was observed done.
    CapacityStopped { observation: CapacityObservation, received_at: DateTime<Utc> },
    /// The provider reclaimed interruptible capacity (`status`: stopped or terminated).
    CapacityInterrupted {
        observation: CapacityObservation,
        status: RentalStatus,
        received_at: DateTime<Utc>,
    },
    /// The machine is confirmed gone (`observation`: the look that showed it, if any).
    CapacityTerminated {
        by: Termination,
        observation: Option<CapacityObservation>,
        received_at: DateTime<Utc>,
    },
    /// A stop was asked of the provider.
    CapacityStopRequested { generation: u64, operation: OperationId, at: DateTime<Utc> },
    /// A resume was asked: a new generation, with its own node.
    CapacityResumed { generation: u64, node: NodeId, operation: OperationId, at: DateTime<Utc> },
    /// A termination was asked of the provider (still charged until confirmed).
    CapacityTerminationRequested {
        generation: u64,
        cause: TerminateCause,
        operation: OperationId,
        at: DateTime<Utc>,
    },
    /// A run was put on the schedule, running or queued.
    RentalBooked { booking: Booking, running: bool, at: DateTime<Utc> },
    /// A queued booking started running (the one before it left).
    RentalBookingStarted { booking: BookingId, at: DateTime<Utc> },
    /// A booking left the schedule.
    RentalBookingReleased { booking: BookingId, at: DateTime<Utc> },
    /// An attempt of the running booking's run was admitted onto the rental's node.
    RentalAttemptAdmitted {
        booking: BookingId,
        node: NodeId,
        attempt: AttemptId,
        at: DateTime<Utc>,
    },
}

crate::tagged_events!(RentalEvent {
    CapacityRequested,
    CapacityAccepted,
    CapacityProvisionFailed,
    CapacityObserved,
    CapacityStopped,
    CapacityInterrupted,
    CapacityTerminated,
    CapacityStopRequested,
    CapacityResumed,
    CapacityTerminationRequested,
    RentalBooked,
    RentalBookingStarted,
    RentalBookingReleased,
    RentalAttemptAdmitted,
});

const OBSERVED: &[&str] = &[
    "observation.state",
    "observation.state_since",
    "observation.observed_at",
    "observation.interrupted",
    "status",
    "received_at",
];

/// The rental kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "rental",
    events: &[
        view(
            "CapacityRequested",
            &[
                "terms.rental",
                "terms.connection",
                "terms.offer",
                "terms.resources.cpu_millis",
                "terms.resources.memory_mb",
                "terms.resources.disk_gb",
                "terms.resources.gpus",
                "terms.interruptible",
                "terms.max_lifetime_seconds",
                "node",
                "generation",
                "at",
            ],
            &["terms.support", "terms.bootstrap", "ownership", "operation"],
        ),
        view(
            "CapacityAccepted",
            &[
                "generation",
                "receipt.state",
                "receipt.accepted_at",
                "receipt.interruptible",
                "receipt.pricing.currency",
                "receipt.pricing.micros_per_hour",
                "receipt.pricing.exact",
                "status",
                "at",
            ],
            &["receipt.native_ref", "receipt.duplicate"],
        ),
        view("CapacityProvisionFailed", &["generation", "at"], &["detail"]),
        view("CapacityObserved", OBSERVED, &["observation.native_ref"]),
        view("CapacityStopped", STOPPED, NATIVE),
        view("CapacityInterrupted", OBSERVED, NATIVE),
        view(
            "CapacityTerminated",
            &[
                "by",
                "observation.state",
                "observation.state_since",
                "observation.observed_at",
                "observation.interrupted",
                "received_at",
            ],
            NATIVE,
        ),
        view("CapacityStopRequested", &["generation", "at"], &["operation"]),
        view("CapacityResumed", &["generation", "node", "at"], &["operation"]),
        view("CapacityTerminationRequested", &["generation", "cause", "at"], &["operation"]),
        view("RentalBooked", &["booking.booking", "booking.run", "running", "at"], &[]),
        view("RentalBookingStarted", &["booking", "at"], &[]),
        view("RentalBookingReleased", &["booking", "at"], &[]),
        view("RentalAttemptAdmitted", &["booking", "node", "attempt", "at"], &[]),
    ],
};

const STOPPED: &[&str] = &[
    "observation.state",
    "observation.state_since",
    "observation.observed_at",
    "observation.interrupted",
    "received_at",
];

const NATIVE: &[&str] = &["observation.native_ref"];

const fn view(
    event_type: &'static str,
    tenant_fields: &'static [&'static str],
    withheld: &'static [&'static str],
) -> EventView {
    EventView { event_type, tenant_fields, withheld }
}
