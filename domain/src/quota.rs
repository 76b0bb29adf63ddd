//! The tenant's snapshot quota (DOMAIN.md §1.9): one stream per tenant holding its limits and
//! a reservation per snapshot its quota counts (creating, ready or restoring; build
//! artifacts are never counted), on the stream `tenant-quota-<uuid>` ([`QuotaId`]). Usage is
//! the sum of the reservations, changed only by events: a snapshot's creation reserves in the same append as the snapshot's request, with
//! an expected version on both streams, so concurrent creates can never take more than the
//! limits allow.
//!
//! A creation reserves on an **estimate** of its bytes (the VM's disk, and its memory for a
//! live snapshot), checked against the limits before the host's agent takes the checkpoint
//! (rule 24); the confirmation **settles** the reservation to the honest size the agent
//! reported. The snapshot exists at its host by then, so a settlement is recorded whatever
//! it comes to: an honest size above the estimate may take usage over the bytes limit, and
//! then no create is accepted until usage falls below the limit again (its snapshots
//! deleted, or the limit raised). Leaving the counted states releases the reservation.
//!
//! A limit of 0 disables it. Operators set the limits; a change is an event too. The count
//! refuses at usage ≥ max (as upstream); the bytes refuse a reservation that would take usage
//! past the limit, and any at or past it: stricter than upstream's usage ≥ max, so that no
//! accepted create ever takes usage over the limit.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | any | SetLimits(count, bytes) | unchanged | QuotaLimitsSet, or — when unchanged | — |
//! | any | Reserve(snapshot, bytes) | unchanged | QuotaReserved | count: usage < max (`QuotaExceeded(count)`); bytes: usage + bytes ≤ max (`QuotaExceeded(bytes)`); the same snapshot again: — when the same bytes, else `ReservationMismatch` |
//! | any | Settle(snapshot, bytes) | unchanged | QuotaSettled (the honest size; counted even if it held no reservation), or — when already that | never refused |
//! | any | Release(snapshot) | unchanged | QuotaReleased, or — when it holds none (idempotent) | — |

mod events;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::StreamId;
use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::snapshot::SnapshotId;

pub use events::{KIND, QuotaEvent};

/// A tenant's snapshot limits (0: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaLimits {
    /// Most snapshots counted at once.
    pub max_count: u32,
    /// Most bytes counted at once.
    pub max_bytes: u64,
}

/// What the quota counts now.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaUsage {
    /// Snapshots counted.
    pub count: u32,
    /// Their bytes.
    pub bytes: u64,
}

/// The tenant quota aggregate's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotQuota {
    /// Its limits.
    pub limits: QuotaLimits,
    /// Each counted snapshot's bytes.
    pub reservations: BTreeMap<SnapshotId, u64>,
    /// Their sum.
    pub usage: QuotaUsage,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a quota.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaCommand {
    /// Sets the limits (operators).
    SetLimits {
        /// The new limits.
        limits: QuotaLimits,
    },
    /// Counts a snapshot being created, on an estimate of its bytes.
    Reserve {
        /// The snapshot.
        snapshot: SnapshotId,
        /// Its estimated bytes.
        bytes: u64,
    },
    /// Settles a snapshot's reservation to its honest size.
    Settle {
        /// The snapshot.
        snapshot: SnapshotId,
        /// Its honest bytes.
        bytes: u64,
    },
    /// Stops counting a snapshot.
    Release {
        /// The snapshot.
        snapshot: SnapshotId,
    },
}

/// Which limit refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuotaLimit {
    /// The count.
    Count,
    /// The bytes.
    Bytes,
}

/// Why a quota refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    /// A limit would be exceeded.
    #[error("{}", match limit {
        QuotaLimit::Count => format!("snapshot quota exceeded: at most {max} snapshots"),
        QuotaLimit::Bytes => format!("snapshot quota exceeded: at most {max} bytes"),
    })]
    QuotaExceeded {
        /// Which.
        limit: QuotaLimit,
        /// Its value.
        max: u64,
    },
    /// The snapshot already holds another reservation.
    #[error("the snapshot already holds a different reservation")]
    ReservationMismatch,
}

impl Refusal for QuotaError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::QuotaExceeded { .. } => RefusalKind::QuotaExceeded,
            Self::ReservationMismatch => RefusalKind::Conflict,
        }
    }
}

crate::values::uuid_type!(
    /// A tenant's snapshot quota, one per tenant, its id minted from the tenant by the
    /// command service (`leasehold_commands::quota::quota_of`): a stream id spelled with the
    /// tenant's own id could pass the length limit names share.
    QuotaId
);

impl QuotaId {
    /// The quota's stream: `tenant-quota-<uuid>`.
    pub fn stream_id(&self) -> StreamId {
        StreamId::parse(format!("tenant-quota-{}", self.0)).expect("a UUID makes a stream id")
    }
}

impl Aggregate for SnapshotQuota {
    const STREAM_TYPE: &'static str = "tenant-quota";
    const STATE_SCHEMA: u32 = 1;
    type Command = QuotaCommand;
    type Event = QuotaEvent;
    type Error = QuotaError;
    type Facts = ();

    fn initial() -> Self {
        Self::default()
    }

    fn decide(
        &self,
        command: &QuotaCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<QuotaEvent>, QuotaError> {
        let at = ctx.now;
        match command {
            QuotaCommand::SetLimits { limits } if *limits == self.limits => Ok(Vec::new()),
            QuotaCommand::SetLimits { limits } => {
                Ok(vec![QuotaEvent::QuotaLimitsSet { limits: *limits, at }])
            }
            QuotaCommand::Reserve { snapshot, bytes } => self.reserve(*snapshot, *bytes, at),
            // The snapshot exists at its host: its settlement is recorded whatever it comes to,
            // counted even without a reservation (never refused, or its confirmation would be).
            QuotaCommand::Settle { snapshot, bytes } => match self.reservations.get(snapshot) {
                Some(held) if held == bytes => Ok(Vec::new()),
                _ => Ok(vec![QuotaEvent::QuotaSettled { snapshot: *snapshot, bytes: *bytes, at }]),
            },
            QuotaCommand::Release { snapshot } => match self.reservations.get(snapshot) {
                None => Ok(Vec::new()),
                Some(bytes) => {
                    Ok(vec![QuotaEvent::QuotaReleased { snapshot: *snapshot, bytes: *bytes, at }])
                }
            },
        }
    }

    fn evolve(mut self, event: &QuotaEvent) -> Self {
        match event {
            QuotaEvent::QuotaLimitsSet { limits, at } => {
                self.limits = *limits;
                self.updated_at = Some(*at);
            }
            QuotaEvent::QuotaReserved { snapshot, bytes, at }
            | QuotaEvent::QuotaSettled { snapshot, bytes, at } => {
                if let Some(before) = self.reservations.insert(*snapshot, *bytes) {
                    self.uncount(before);
                }
                self.usage.count = self.usage.count.saturating_add(1);
                self.usage.bytes = self.usage.bytes.saturating_add(*bytes);
                self.updated_at = Some(*at);
            }
            QuotaEvent::QuotaReleased { snapshot, at, .. } => {
                if let Some(before) = self.reservations.remove(snapshot) {
                    self.uncount(before);
                }
                self.updated_at = Some(*at);
            }
        }
        self
    }

    fn is_terminal(&self) -> bool {
        false
    }

    /// A tenant's quota exists from its first snapshot (or its first limits) on: before
    /// that, no limits and nothing counted.
    fn may_open(_command: &QuotaCommand) -> bool {
        true
    }
}

impl SnapshotQuota {
    fn reserve(
        &self,
        snapshot: SnapshotId,
        bytes: u64,
        at: DateTime<Utc>,
    ) -> Result<Vec<QuotaEvent>, QuotaError> {
        match self.reservations.get(&snapshot) {
            Some(held) if *held == bytes => return Ok(Vec::new()),
            Some(_) => return Err(QuotaError::ReservationMismatch),
            None => {}
        }
        let QuotaLimits { max_count, max_bytes } = self.limits;
        if max_count > 0 && self.usage.count >= max_count {
            return Err(QuotaError::QuotaExceeded {
                limit: QuotaLimit::Count,
                max: u64::from(max_count),
            });
        }
        // At or over the limit nothing more fits (a settlement may have taken usage over it).
        let bytes_after = self.usage.bytes.saturating_add(bytes);
        if max_bytes > 0 && (self.usage.bytes >= max_bytes || bytes_after > max_bytes) {
            return Err(QuotaError::QuotaExceeded { limit: QuotaLimit::Bytes, max: max_bytes });
        }
        Ok(vec![QuotaEvent::QuotaReserved { snapshot, bytes, at }])
    }

    fn uncount(&mut self, bytes: u64) {
        self.usage.count = self.usage.count.saturating_sub(1);
        self.usage.bytes = self.usage.bytes.saturating_sub(bytes);
    }
}
