//! The host's stored events. A host belongs to the fleet, not to a tenant: its streams are
//! the fleet's, so no tenant reads them, and its [`KIND`] shows tenants nothing (every path
//! is withheld on purpose). Its agent's token never enters an event.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{HostSpec, Reservation};
use crate::registry::{AggregateKind, EventView};
use crate::values::OperatorDetail;
use crate::values::fleet::{HostId, VmId};

/// Everything that can happen to a host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum HostEvent {
    /// An operator registered the host (first time, or again after its removal).
    HostRegistered { host: HostId, spec: HostSpec, at: DateTime<Utc> },
    /// An operator registered it again while it was in the fleet: what it declares changed.
    HostRefreshed { spec: HostSpec, at: DateTime<Utc> },
    /// Its agent was heard from.
    HostHeartbeat { at: DateTime<Utc> },
    /// It takes no new VMs.
    HostCordoned { at: DateTime<Utc> },
    /// It takes no new VMs and is to be emptied.
    HostDraining { at: DateTime<Utc> },
    /// It takes new VMs again.
    HostUncordoned { at: DateTime<Utc> },
    /// It left the fleet.
    HostRemoved { at: DateTime<Utc> },
    /// A VM placed on it holds room.
    HostCapacityReserved { vm: VmId, reservation: Reservation, at: DateTime<Utc> },
    /// A VM gave its room back.
    HostCapacityReleased { vm: VmId, reservation: Reservation, at: DateTime<Utc> },
    /// An orphan on the host (a VM its agent has and the log does not) could not be destroyed
    /// after this many tries in a row: a dead letter for operators.
    HostOrphanDeadLettered {
        name: String,
        attempts: u32,
        detail: OperatorDetail,
        at: DateTime<Utc>,
    },
}

crate::tagged_events!(HostEvent {
    HostRegistered,
    HostRefreshed,
    HostHeartbeat,
    HostCordoned,
    HostDraining,
    HostUncordoned,
    HostRemoved,
    HostCapacityReserved,
    HostCapacityReleased,
    HostOrphanDeadLettered,
});

/// The host kind: its stream type and, per event type, what a tenant sees (nothing).
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "host",
    events: &[
        fleet_only("HostRegistered", &["host", "spec", "at"]),
        fleet_only("HostRefreshed", &["spec", "at"]),
        fleet_only("HostHeartbeat", AT),
        fleet_only("HostCordoned", AT),
        fleet_only("HostDraining", AT),
        fleet_only("HostUncordoned", AT),
        fleet_only("HostRemoved", AT),
        fleet_only("HostCapacityReserved", &["vm", "reservation", "at"]),
        fleet_only("HostCapacityReleased", &["vm", "reservation", "at"]),
        fleet_only("HostOrphanDeadLettered", &["name", "attempts", "detail", "at"]),
    ],
};

const AT: &[&str] = &["at"];

/// An event type whose every path is the fleet's (operators and auditors see them).
const fn fleet_only(event_type: &'static str, withheld: &'static [&'static str]) -> EventView {
    EventView { event_type, tenant_fields: &[], withheld }
}
