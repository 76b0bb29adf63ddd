//! The runner lease's stored events, and what its tenant may see of each: never its epoch
//! (a fencing token), its node, its instance's handle, its start command (it may carry what
//! a tenant pasted in) or an operator's word. The runner's registration (the JIT config) is
//! in none of them: it is never recorded anywhere.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{InstanceRef, JobRef, Outcome, Phase, QuarantineProof, RunnerNodeName, RunnerTerms};
use crate::registry::{AggregateKind, EventView};
use crate::values::{OperatorDetail, Reason};

/// Everything that can happen to a runner lease.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", content = "data")]
#[allow(missing_docs)] // Each field is described on the aggregate's transition table.
pub enum RunnerEvent {
    /// A tenant requested it (phase capacity, epoch 1).
    RunnerLeaseRequested {
        terms: RunnerTerms,
        epoch: u64,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// Its job was assigned (its capacity charged in the same append).
    RunnerJobAssigned { job: JobRef, expires_at: DateTime<Utc>, at: DateTime<Utc> },
    /// It was bound to a node and its launch started.
    RunnerLaunching { node: RunnerNodeName, expires_at: DateTime<Utc>, at: DateTime<Utc> },
    /// The provider created its instance.
    RunnerInstanceLaunched { instance: InstanceRef, at: DateTime<Utc> },
    /// A holder reported it online, busy or in custody.
    RunnerAdvanced { phase: Phase, expires_at: DateTime<Utc>, at: DateTime<Utc> },
    /// A holder's sign of life.
    RunnerHeartbeat { expires_at: DateTime<Utc>, at: DateTime<Utc> },
    /// It was released with an outcome (`phase`: teardown while compute may remain, else the
    /// outcome's).
    RunnerReleased { outcome: Outcome, reason: Option<Reason>, phase: Phase, at: DateTime<Utc> },
    /// Its destroy was asked of the provider; the compute may still run (still charged).
    RunnerTeardownRequested { at: DateTime<Utc> },
    /// The provider confirmed its compute gone (`phase`: where it ended).
    RunnerTeardownConfirmed { phase: Phase, at: DateTime<Utc> },
    /// It expired: quarantined (it may hold compute) or failed; the epoch moves on.
    RunnerReaped { phase: Phase, epoch: u64, reason: Reason, at: DateTime<Utc> },
    /// Its node registered again; the epoch moves on.
    RunnerEpochBumped { epoch: u64, node: RunnerNodeName, at: DateTime<Utc> },
    /// Its quarantine ended on a proof that its compute is gone.
    RunnerQuarantineResolved { proof: QuarantineProof, phase: Phase, at: DateTime<Utc> },
    /// An operator asserted its compute gone.
    RunnerForceReleased { detail: OperatorDetail, phase: Phase, at: DateTime<Utc> },
}

crate::tagged_events!(RunnerEvent {
    RunnerLeaseRequested,
    RunnerJobAssigned,
    RunnerLaunching,
    RunnerInstanceLaunched,
    RunnerAdvanced,
    RunnerHeartbeat,
    RunnerReleased,
    RunnerTeardownRequested,
    RunnerTeardownConfirmed,
    RunnerReaped,
    RunnerEpochBumped,
    RunnerQuarantineResolved,
    RunnerForceReleased,
});

const AT: &[&str] = &["at"];
const PHASE_AT: &[&str] = &["phase", "at"];
const EXPIRY: &[&str] = &["expires_at", "at"];

/// The runner lease kind: its stream type and, per event type, what its tenant sees.
pub const KIND: AggregateKind = AggregateKind {
    stream_type: "runner-lease",
    events: &[
        EventView {
            event_type: "RunnerLeaseRequested",
            tenant_fields: &[
                "terms.lease",
                "terms.tier",
                "terms.trust",
                "terms.guest_os",
                "terms.resources.vcpu",
                "terms.resources.memory_mb",
                "terms.providers[]",
                "terms.ttl_seconds",
                "expires_at",
                "at",
            ],
            withheld: &["terms.command", "epoch"],
        },
        EventView {
            event_type: "RunnerJobAssigned",
            tenant_fields: &["job.request", "job.run", "expires_at", "at"],
            withheld: &[],
        },
        EventView { event_type: "RunnerLaunching", tenant_fields: EXPIRY, withheld: &["node"] },
        EventView {
            event_type: "RunnerInstanceLaunched",
            tenant_fields: AT,
            withheld: &["instance"],
        },
        EventView {
            event_type: "RunnerAdvanced",
            tenant_fields: &["phase", "expires_at", "at"],
            withheld: &[],
        },
        EventView { event_type: "RunnerHeartbeat", tenant_fields: EXPIRY, withheld: &[] },
        EventView {
            event_type: "RunnerReleased",
            tenant_fields: &["outcome", "reason", "phase", "at"],
            withheld: &[],
        },
        EventView { event_type: "RunnerTeardownRequested", tenant_fields: AT, withheld: &[] },
        EventView { event_type: "RunnerTeardownConfirmed", tenant_fields: PHASE_AT, withheld: &[] },
        EventView {
            event_type: "RunnerReaped",
            tenant_fields: &["phase", "reason", "at"],
            withheld: &["epoch"],
        },
        EventView {
            event_type: "RunnerEpochBumped",
            tenant_fields: AT,
            withheld: &["epoch", "node"],
        },
        EventView {
            event_type: "RunnerQuarantineResolved",
            tenant_fields: PHASE_AT,
            withheld: &["proof"],
        },
        EventView {
            event_type: "RunnerForceReleased",
            tenant_fields: PHASE_AT,
            withheld: &["detail"],
        },
    ],
};
