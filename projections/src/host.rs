//! The host read models: `hosts` (operators: capacity, allocation, headroom, labels, state,
//! last seen, backend) and each host's working state, which placement reads as its catalog
//! of the fleet. A host's agent token is never in an event, so it is never here either.

use chrono::{DateTime, Utc};
use leasehold_domain::host::{Host, HostEvent};
use leasehold_domain::values::fleet::HostId;
use leasehold_domain::{Aggregate, RecordedEvent};

use crate::projection::{Projection, ProjectionError};

/// Projects host streams into the host read models.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostProjection;

/// A change to the host read models.
#[derive(Debug, Clone, PartialEq)]
pub enum HostChange {
    /// Write every row derived from one host's state.
    Put(Box<HostRows>),
    /// An orphan that could not be destroyed: a dead letter for operators.
    DeadLetter(crate::vm::DeadLetterRow),
}

/// Every row derived from one host's state.
#[derive(Debug, Clone, PartialEq)]
pub struct HostRows {
    /// The working state (the aggregate's own), kept for the next batch and for placement.
    pub view: Host,
    /// `hosts`.
    pub host: HostRow,
}

/// A row of `hosts`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[allow(missing_docs)] // The columns of 0014_fleet.sql.
pub struct HostRow {
    pub host_id: String,
    pub state: &'static str,
    pub backend: &'static str,
    pub region: Option<String>,
    pub url: String,
    pub labels: serde_json::Value,
    pub capacity: serde_json::Value,
    pub allocated: serde_json::Value,
    pub headroom: serde_json::Value,
    pub vm_count: i64,
    pub last_seen: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

const ROWS_REVISION: u32 = 0;

impl Projection for HostProjection {
    const NAME: &'static str = "host_views";
    const VERSION: u32 = ROWS_REVISION + Host::STATE_SCHEMA;
    const STREAM_TYPES: &'static [&'static str] = &[Host::STREAM_TYPE];
    type Key = HostId;
    type View = Host;
    type Change = HostChange;

    fn key(&self, event: &RecordedEvent) -> Option<HostId> {
        if event.stream_type.as_str() != Host::STREAM_TYPE {
            return None;
        }
        let id = event.stream_id.as_str().strip_prefix("host-")?;
        HostId::parse("host", id).ok()
    }

    fn project(
        &self,
        view: Option<&Host>,
        event: &RecordedEvent,
        changes: &mut Vec<HostChange>,
    ) -> Result<Host, ProjectionError> {
        let decoded = crate::projection::decoded::<HostEvent>(Self::NAME, event)?;
        if let HostEvent::HostOrphanDeadLettered { name, attempts, detail, at } = &decoded {
            let letter =
                crate::vm::DeadLetterRow::orphan(&event.stream_id, name, (*attempts, detail), *at);
            changes.push(HostChange::DeadLetter(letter));
        }
        Ok(view.cloned().unwrap_or_else(Host::initial).evolve(&decoded))
    }

    fn put(&self, key: &HostId, view: &Host) -> HostChange {
        HostChange::Put(Box::new(rows_of(key, view)))
    }
}

/// Every row of one host, from its state.
///
/// # Panics
/// When the host was never registered: a host stream starts with its registration.
pub fn rows_of(key: &HostId, host: &Host) -> HostRows {
    let spec = host.spec.as_ref().expect("a host stream starts with its registration");
    let headroom = host.headroom().expect("a registered host");
    let to_json = |value: serde_json::Result<serde_json::Value>| value.expect("serializes");
    HostRows {
        view: host.clone(),
        host: HostRow {
            host_id: key.to_string(),
            state: host.status.name(),
            backend: spec.backend.name(),
            region: spec.region.as_ref().map(ToString::to_string),
            url: spec.url.to_string(),
            labels: to_json(serde_json::to_value(&spec.labels)),
            capacity: to_json(serde_json::to_value(&spec.capacity)),
            allocated: to_json(serde_json::to_value(&host.allocated)),
            headroom: to_json(serde_json::to_value(headroom)),
            vm_count: i64::from(host.allocated.vm_count),
            last_seen: host.last_seen,
            updated_at: host.updated_at.unwrap_or_default(),
        },
    }
}
