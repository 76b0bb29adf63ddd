//! The Runner lease: a CI runner instance leased for one job, launched by a runner node's
//! provider backend (DOMAIN.md §1.8, billet).
//!
//! A lease is requested in the `capacity` phase, is assigned its job (which charges the
//! tenant's runner capacity, in the same append: `runner_capacity.rs`), is launched on a bound
//! node, comes online, runs the job (`busy`), and ends `done` or `failed` (which release the
//! capacity). Phases only ever move forward: capacity → assigned → launching → online → busy
//! → custody → teardown → quarantine → done / failed, by the moves below and no others.
//!
//! Every command of the lease's holders names the **epoch** it was decided under; any other
//! is `Fenced`, with no event. A reap and a re-registration of the lease's node bump the
//! epoch, so a report of an instance's earlier holder can never move it. The instance's name
//! at the provider, `billet-<lease id>` ([`RunnerLeaseId::instance_name`]), is the only link
//! from an instance back to its lease after a crash. The runner's registration (the JIT
//! config) is minted and handed to the provider at launch and is never recorded.
//!
//! A lease expires when its holder stops reporting: requested, every accepted report of its
//! holder (assign, launch, advance, heartbeat) sets `expires_at` to now plus its time to
//! live. A reap of an expired lease that may hold compute (launching, online, busy, custody,
//! teardown) **quarantines** it, still charged (rule 9: unknown is running); one that cannot
//! hold any fails. Quarantine is left only on proof: a destroy confirmed, an inventory of its
//! node that lacks it (re-registered or reported, by a node past the grace), or an operator's
//! force, each recorded as such.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Request(terms) | capacity | RunnerLeaseRequested{epoch 1} | — (an unknown trust class or an empty command cannot be read: `values.rs`) |
//! | any but none | Request | unchanged | — when the same terms, else `AlreadyExists` | — |
//! | capacity | Assign(epoch, job) | assigned | RunnerJobAssigned (charges its capacity) | epoch |
//! | assigned and later | Assign(epoch, job) | unchanged | — when the same job (idempotent), else `JobConflict` | epoch |
//! | assigned | Launch(epoch, node) | launching | RunnerLaunching{node} | epoch; the node's current policy admits the lease (`PolicyRefused`) |
//! | launching | Launch(epoch, node) | unchanged | — when the same node, else `WrongNode` | epoch |
//! | launching … quarantine | RecordInstance(epoch, instance) | unchanged | RunnerInstanceLaunched (a late answer after a release or a reap still names compute that must go), or — when the same instance | epoch; another instance: `OtherInstance` |
//! | launching | Advance(epoch, online) | online | RunnerAdvanced | epoch; bound node's current policy |
//! | online | Advance(epoch, busy) | busy | RunnerAdvanced | epoch; bound node's current policy |
//! | launching, online, busy | Advance(epoch, custody) | custody | RunnerAdvanced | epoch |
//! | the phase itself | Advance(epoch, phase) | unchanged | — (a repeated report) | epoch |
//! | any other | Advance | unchanged | refused | `Backwards` (a phase behind), else `InvalidState` (quarantine, done, failed and teardown are never advanced into) |
//! | capacity … teardown | Heartbeat(epoch) | unchanged | RunnerHeartbeat (`expires_at`), or — within [`RUNNER_HEARTBEAT_RECORD_SECONDS`] of the last recorded | epoch |
//! | capacity, assigned | Release(epoch, outcome, reason) | done / failed | RunnerReleased (releases its capacity) | epoch |
//! | launching, online, busy, custody | Release(epoch, outcome, reason) | teardown | RunnerReleased (still charged: its compute must go first) | epoch |
//! | teardown, quarantine, done, failed | Release(epoch, outcome) | unchanged | — when the outcome recorded, else `OutcomeConflict` | epoch |
//! | teardown | RecordTeardown(epoch, requested) | teardown | RunnerTeardownRequested, or — when recorded | epoch |
//! | teardown, quarantine | RecordTeardown(epoch, stopped) | done / failed (the outcome recorded; failed when none) | RunnerTeardownConfirmed (releases its capacity) | epoch |
//! | capacity … teardown | Reap | quarantine (launching … teardown), else failed (`Expired`) | RunnerReaped{epoch + 1} | expired (`expires_at` ≤ now), else — |
//! | quarantine | ResolveQuarantine(node, inventory absent) | failed, or the outcome recorded | RunnerQuarantineResolved | the lease's node; expired at least [`RUNNER_QUARANTINE_GRACE_SECONDS`] ago, else — (not proof yet) |
//! | custody, teardown, quarantine | ForceRelease(detail) | failed, or the outcome recorded | RunnerForceReleased (recorded as the operator's word) | — |
//! | capacity … quarantine | NodeReregistered(node) | unchanged | RunnerEpochBumped{epoch + 1} | the lease's node, else — |
//! | done, failed | anything but a matching Assign / Release | unchanged | refused | `Finished` (reap and re-registration: —) |

mod decide;
mod events;
mod evolve;
pub mod values;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::limits::{RUNNER_HEARTBEAT_RECORD_SECONDS, RUNNER_QUARANTINE_GRACE_SECONDS};
use crate::values::{OperatorDetail, Reason};

pub use events::{KIND, RunnerEvent};
pub use values::{
    GuestOs, InstanceRef, JobRef, JobRequestId, Outcome, ProviderKind, RunnerLeaseId,
    RunnerNodeName, RunnerResources, StartCommand, Teardown, Tier, TrustClass,
};

/// A runner lease's phase. The declaration order is the order phases move in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Never requested: the stream is empty.
    None,
    /// Requested, waiting for its job.
    Capacity,
    /// Its job assigned; capacity charged.
    Assigned,
    /// Bound to a node, its instance being launched.
    Launching,
    /// Its runner registered and waiting for the job.
    Online,
    /// Running the job.
    Busy,
    /// Its node holds it: an instance may be running that nobody can vouch for yet.
    Custody,
    /// Released; its compute is being destroyed (still charged).
    Teardown,
    /// Expired while it may have held compute: charged until that compute is proven gone.
    Quarantine,
    /// Ended, its job run.
    Done,
    /// Ended otherwise.
    Failed,
}

impl Phase {
    /// Every phase.
    pub const ALL: [Self; 11] = [
        Self::None,
        Self::Capacity,
        Self::Assigned,
        Self::Launching,
        Self::Online,
        Self::Busy,
        Self::Custody,
        Self::Teardown,
        Self::Quarantine,
        Self::Done,
        Self::Failed,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Capacity => "capacity",
            Self::Assigned => "assigned",
            Self::Launching => "launching",
            Self::Online => "online",
            Self::Busy => "busy",
            Self::Custody => "custody",
            Self::Teardown => "teardown",
            Self::Quarantine => "quarantine",
            Self::Done => "done",
            Self::Failed => "failed",
        }
    }

    /// The phases a lease may move to from this one (DOMAIN.md §1.8), and no others.
    pub fn moves(self) -> &'static [Self] {
        use Phase::{
            Assigned, Busy, Capacity, Custody, Done, Failed, Launching, Online, Quarantine,
            Teardown,
        };
        match self {
            Self::None => &[Capacity],
            Capacity => &[Assigned, Done, Failed],
            Assigned => &[Launching, Done, Failed],
            Launching => &[Online, Custody, Teardown, Quarantine, Done, Failed],
            Online => &[Busy, Custody, Teardown, Quarantine, Done, Failed],
            Busy => &[Custody, Teardown, Quarantine, Done, Failed],
            Custody => &[Teardown, Quarantine, Done, Failed],
            Teardown => &[Quarantine, Done, Failed],
            Quarantine => &[Done, Failed],
            Done | Failed => &[],
        }
    }

    /// Whether it has ended.
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Done | Self::Failed)
    }

    /// Whether an instance may exist for a lease in it (a reap quarantines these).
    pub fn may_hold_compute(self) -> bool {
        matches!(self, Self::Launching | Self::Online | Self::Busy | Self::Custody | Self::Teardown)
    }

    /// Whether the lease's capacity is charged in it: from its assignment until it ends.
    pub fn is_charged(self) -> bool {
        self >= Self::Assigned && !self.is_terminal()
    }

    /// The terminal phase of an outcome.
    pub fn of_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Done => Self::Done,
            Outcome::Failed => Self::Failed,
        }
    }
}

/// What a runner lease was asked to be: fixed at its request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerTerms {
    /// The lease.
    pub lease: RunnerLeaseId,
    /// The tier it runs under.
    pub tier: Tier,
    /// Whose code its job runs.
    pub trust: TrustClass,
    /// The guest OS it needs.
    pub guest_os: GuestOs,
    /// What it is charged.
    pub resources: RunnerResources,
    /// The provider kinds it may be launched by, at least one.
    pub providers: Vec<ProviderKind>,
    /// What starts the runner inside the instance.
    pub command: StartCommand,
    /// How long it lives without a report of its holder, in seconds.
    pub ttl_seconds: u32,
}

/// A runner node's policy as it stands now: what its registration says it may run. Looked up
/// by the service when a lease is launched on it or advances on it (re-checked: a node may
/// have re-registered with a narrower policy since the lease was bound).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePolicy {
    /// The node.
    pub node: RunnerNodeName,
    /// Its provider backend.
    pub provider: ProviderKind,
    /// The guest OSes it runs.
    pub guest_os: Vec<GuestOs>,
    /// The trust classes its backend accepts (`Accepts(trust)`).
    pub accepts: Vec<TrustClass>,
    /// Whether it is registered and not retired.
    pub active: bool,
}

impl NodePolicy {
    /// Why it does not admit a lease of `terms`, if it does not.
    pub fn refuses(&self, terms: &RunnerTerms) -> Option<PolicyProblem> {
        if !self.active {
            Some(PolicyProblem::NodeInactive)
        } else if !terms.providers.contains(&self.provider) {
            Some(PolicyProblem::Provider)
        } else if !self.guest_os.contains(&terms.guest_os) {
            Some(PolicyProblem::GuestOs)
        } else if !self.accepts.contains(&terms.trust) {
            Some(PolicyProblem::Trust)
        } else {
            None
        }
    }
}

/// Why a node's policy does not admit a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicyProblem {
    /// The node is not registered, or retired.
    NodeInactive,
    /// Its provider is not one the lease names.
    Provider,
    /// It does not run the lease's guest OS.
    GuestOs,
    /// Its backend does not accept the lease's trust class.
    Trust,
}

/// What `decide` is told besides the state: the current policy of the node a command binds
/// or runs the lease on (none when the node is unknown).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerFacts {
    /// The node's policy now.
    pub policy: Option<NodePolicy>,
}

/// How a quarantined lease's compute was proven gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "proof", rename_all = "snake_case")]
pub enum QuarantineProof {
    /// Its node's inventory lacked it.
    InventoryAbsent {
        /// The node.
        node: RunnerNodeName,
        /// The node's registration the inventory came from.
        node_epoch: u64,
    },
}

/// The Runner lease aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunnerLease {
    /// Its phase.
    pub phase: Phase,
    /// What it was asked to be.
    pub terms: Option<RunnerTerms>,
    /// Its fencing token: 1 at its request, one more at every reap and re-registration of
    /// its node.
    pub epoch: u64,
    /// Its job.
    pub job: Option<JobRef>,
    /// The node it is bound to.
    pub node: Option<RunnerNodeName>,
    /// Its instance, as the provider named it.
    pub instance: Option<InstanceRef>,
    /// How it ended, or will once its compute is gone.
    pub outcome: Option<Outcome>,
    /// Why it failed (tenant-safe).
    pub failure_reason: Option<Reason>,
    /// What the last destroy proved.
    pub teardown: Option<Teardown>,
    /// When it expires unless its holder reports.
    pub expires_at: Option<DateTime<Utc>>,
    /// When its last heartbeat was recorded.
    pub heartbeat_at: Option<DateTime<Utc>>,
    /// When it entered its phase.
    pub held_since: Option<DateTime<Utc>>,
    /// When it was requested.
    pub requested_at: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

/// What can be asked of a runner lease. Every command of its holders names the epoch it was
/// decided under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerCommand {
    /// Requests a runner lease (its tenant).
    Request {
        /// What is asked.
        terms: RunnerTerms,
    },
    /// Assigns its job (charges its capacity).
    Assign {
        /// The epoch the caller saw.
        epoch: u64,
        /// The job.
        job: JobRef,
    },
    /// Binds it to a node and starts its launch there.
    Launch {
        /// The epoch the caller saw.
        epoch: u64,
        /// The node.
        node: RunnerNodeName,
    },
    /// Records the instance the provider created for it.
    RecordInstance {
        /// The epoch the launch was sent under.
        epoch: u64,
        /// The provider's handle.
        instance: InstanceRef,
    },
    /// A holder's report of its phase (online, busy or custody).
    Advance {
        /// The epoch the holder holds.
        epoch: u64,
        /// The phase reported.
        phase: Phase,
    },
    /// A holder's sign of life.
    Heartbeat {
        /// The epoch the holder holds.
        epoch: u64,
    },
    /// Ends it with an outcome (its tenant, its node, or the dispatcher after a failed
    /// launch); compute it may hold is torn down first.
    Release {
        /// The epoch the caller saw.
        epoch: u64,
        /// How it ended.
        outcome: Outcome,
        /// Why it failed, tenant-safe.
        reason: Option<Reason>,
    },
    /// What a destroy at the provider proved.
    RecordTeardown {
        /// The epoch the destroy was sent under.
        epoch: u64,
        /// Requested or stopped.
        teardown: Teardown,
    },
    /// The expiry reaper's: ends or quarantines it if it expired (decided at the pipeline's
    /// clock).
    Reap,
    /// Leaves quarantine on a proof from the inventory reconciler.
    ResolveQuarantine {
        /// The proof.
        proof: QuarantineProof,
    },
    /// An operator's word that its compute is gone.
    ForceRelease {
        /// What the operator said (operators only).
        detail: OperatorDetail,
    },
    /// Its node registered again: whatever the node's earlier process held is fenced.
    NodeReregistered {
        /// The node.
        node: RunnerNodeName,
    },
}

/// Why a runner lease refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunnerError {
    /// The lease was never requested.
    #[error("no such runner lease")]
    NotFound,
    /// The lease exists with other terms.
    #[error("a runner lease with this id exists with other terms")]
    AlreadyExists,
    /// The command was decided under another epoch.
    #[error("the command names epoch {given}; the runner lease is at epoch {current}")]
    Fenced {
        /// The epoch the command names.
        given: u64,
        /// The lease's.
        current: u64,
    },
    /// The lease is assigned another job.
    #[error("the runner lease is assigned another job")]
    JobConflict,
    /// The lease was released with another outcome.
    #[error("the runner lease was released as {recorded}")]
    OutcomeConflict {
        /// The outcome recorded.
        recorded: Outcome,
    },
    /// The lease is bound to another node.
    #[error("the runner lease is bound to another node")]
    WrongNode,
    /// The report names another instance than the one recorded.
    #[error("the report names another instance than the runner lease's")]
    OtherInstance,
    /// The node's current policy does not admit the lease.
    #[error("the node does not admit this runner lease ({problem:?})")]
    PolicyRefused {
        /// Why.
        problem: PolicyProblem,
    },
    /// The reported phase is behind the lease's.
    #[error("a runner lease in {phase} cannot go back to {to}")]
    Backwards {
        /// Its phase's name.
        phase: &'static str,
        /// The phase asked for.
        to: &'static str,
    },
    /// Not allowed in its phase.
    #[error("a runner lease in {phase} cannot {command}")]
    InvalidState {
        /// Its phase's name.
        phase: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// The lease has ended.
    #[error("the runner lease has ended ({phase})")]
    Finished {
        /// Its phase's name.
        phase: &'static str,
    },
}

impl Refusal for RunnerError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound => RefusalKind::NotFound,
            Self::Fenced { .. } => RefusalKind::Fenced,
            Self::AlreadyExists
            | Self::JobConflict
            | Self::OutcomeConflict { .. }
            | Self::WrongNode
            | Self::OtherInstance => RefusalKind::Conflict,
            Self::PolicyRefused { .. }
            | Self::Backwards { .. }
            | Self::InvalidState { .. }
            | Self::Finished { .. } => RefusalKind::InvalidState,
        }
    }
}

impl Aggregate for RunnerLease {
    const STREAM_TYPE: &'static str = "runner-lease";
    const STATE_SCHEMA: u32 = 1;
    type Command = RunnerCommand;
    type Event = RunnerEvent;
    type Error = RunnerError;
    type Facts = RunnerFacts;

    fn initial() -> Self {
        Self {
            phase: Phase::None,
            terms: None,
            epoch: 0,
            job: None,
            node: None,
            instance: None,
            outcome: None,
            failure_reason: None,
            teardown: None,
            expires_at: None,
            heartbeat_at: None,
            held_since: None,
            requested_at: None,
            updated_at: None,
        }
    }

    fn decide(
        &self,
        command: &RunnerCommand,
        ctx: &Context<RunnerFacts>,
    ) -> Result<Vec<RunnerEvent>, RunnerError> {
        decide::decide(self, command, &ctx.facts, ctx.now)
    }

    fn evolve(self, event: &RunnerEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.phase.is_terminal()
    }

    fn is_creation(command: &RunnerCommand) -> bool {
        matches!(command, RunnerCommand::Request { .. })
    }

    fn generation(&self) -> Option<u64> {
        Some(self.epoch)
    }
}

impl RunnerLease {
    /// Whether its capacity is charged now.
    pub fn is_charged(&self) -> bool {
        self.phase.is_charged()
    }

    /// Whether it expired at `now`.
    pub fn is_expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|expires| expires <= now)
    }

    /// Whether an inventory without it may prove it gone at `now`: it expired at least the
    /// grace ago.
    pub fn past_grace(&self, now: DateTime<Utc>) -> bool {
        let grace = chrono::TimeDelta::seconds(RUNNER_QUARANTINE_GRACE_SECONDS);
        self.expires_at.is_some_and(|expires| expires + grace <= now)
    }

    /// Whether a heartbeat at `now` is recorded (the last one is old enough).
    pub fn records_heartbeat(&self, now: DateTime<Utc>) -> bool {
        let every = chrono::TimeDelta::seconds(RUNNER_HEARTBEAT_RECORD_SECONDS);
        self.heartbeat_at.is_none_or(|last| last + every <= now)
    }
}
