//! The Rental: capacity a tenant rents from an outside provider, through one of Leasehold's
//! provider connections (DOMAIN.md §1.5).
//!
//! Leasehold mints the rental's id, its ownership token and its first node's id **before** it
//! calls the provider, so an accepted answer that was lost is still found again (rule 21).
//! The provision is recorded with the connection's declared capabilities ([`CapacitySupport`],
//! validated when the connection was registered) and a bootstrap (where the node agent
//! enrolls, which agent build) that the provider delivers verbatim; the enrollment token it
//! carries is never recorded (the node's stream holds only its hash). The provider's answers
//! are fenced by the rental's **generation**: every command that acts on the capacity names
//! the generation it was decided under, and any other is `Fenced` with no event. A resume
//! starts a new generation, whose node replaces the previous generation's (retired).
//!
//! Observations are the provider's honest account of the machine: `unknown` changes nothing
//! (rule 10), an older look than the last recorded one changes nothing, and the same look
//! again within [`RENTAL_OBSERVATION_RECORD_SECONDS`] is not recorded twice. Each records the
//! provider's `state_since` and `observed_at` and the moment Leasehold received it
//! (`received_at`, Leasehold's clock, never the provider's). Absence is never proof of
//! termination: a not-found answer terminates the rental only while a termination is asked
//! and only when the provider declares terminated capacity unobservable.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Provision(terms) | requested | CapacityRequested{generation 1} | — (the connection's capabilities were validated at registration) |
//! | any but none | Provision | unchanged | — when the same terms (a retry), else `AlreadyExists` | — |
//! | requested | Accept(gen, receipt) | starting, or active when the receipt says so | CapacityAccepted (native ref, interruptible as allocated, pricing) | generation |
//! | starting, active, stopping, stopped, terminating | Accept(gen, same native ref) | unchanged | — (a redelivery) | another native ref: `OtherMachine` |
//! | requested, or terminating before any receipt | FailProvision(gen, detail) | terminated | CapacityProvisionFailed (nothing was allocated: the provider refused for good) | generation |
//! | any accepted, not terminated | Observe(gen, observation) | as the observation says (below) | CapacityObserved / CapacityStopped / CapacityInterrupted / CapacityTerminated | generation (a look asked before a resume is about the old cycle); the rental's native ref (`OtherMachine`); — when older than the last recorded or the same look again |
//! | requested | Observe | unchanged | refused | `NotAccepted` (no native ref yet) |
//! | active | Stop(gen) | stopping | CapacityStopRequested | generation; support.stop, else `Unsupported` |
//! | stopping, stopped | Stop(gen) | unchanged | — (idempotent) | generation |
//! | stopped | Resume(gen, node) | starting | CapacityResumed{generation + 1, node} (the previous generation's node is retired) | generation; support.resume, else `Unsupported` |
//! | starting (resumed) | Resume(gen - 1, same node) | unchanged | — (a retry of the resume) | — |
//! | requested, starting, active, stopping, stopped | Terminate(gen, cause) | terminating | CapacityTerminationRequested | generation |
//! | terminating, terminated | Terminate | unchanged | — (idempotent, rule 8) | generation |
//! | terminating | NotFound(gen) | terminated | CapacityTerminated{not_found} | only when `!support.observe_after_terminate` and a receipt named the machine; otherwise — (absence is no proof) |
//! | any other | NotFound | unchanged | — (absence is no proof) | generation |
//! | active | Book(gen, booking, run) | active | RentalBooked{running, or queued} | generation; at most 1 running and 4 queued (`ScheduleFull`); nothing queues behind interruptible capacity (`ScheduleFull`); — when that booking is held already |
//! | active | AdmitAttempt(booking, node, attempt) | active | RentalAttemptAdmitted | the booking is the running one and the node the current generation's (a booking made before a resume runs on the resumed node), else `InvalidState` |
//! | any but none | ReleaseBooking(booking) | unchanged | RentalBookingReleased, and RentalBookingStarted for the first queued one when the running one left; — when not held | — |
//! | terminated | anything else | terminated | refused | `InvalidState` |
//!
//! How an observation moves the rental (`state` → status; "—": unchanged):
//!
//! | observed | requested | starting | active | stopping | stopped | terminating |
//! |---|---|---|---|---|---|---|
//! | unknown | — | — | — | — | — | — |
//! | requested, starting | starting | — | — | — | — | — |
//! | active | active | active | — | — (not stopped yet) | active | — |
//! | stopping | — | — | stopping | — | — | — |
//! | stopped | stopped | stopped, but — when starting after a resume, the last recorded look still the stopped one, not interrupted and not dated after the recorded stop (`state_since`, the provider's clock, kept across the resume: the provider has not acted on it yet) | stopped | stopped (CapacityStopped) | — | — |
//! | terminated | terminated | terminated | terminated | terminated | terminated | terminated (CapacityTerminated) |
//!
//! An observation that stops or terminates capacity with `interrupted` set is recorded as
//! CapacityInterrupted: the provider reclaimed it, which is a different fact from an
//! operator's stop. Capacity stays charged until it is confirmed gone (rule 9): `terminating`
//! still counts.

mod decide;
mod events;
mod evolve;
pub mod values;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::node::NodeId;
use crate::run::{AttemptId, BookingId, RunId};
use crate::values::{OperationId, OperatorDetail};
use crate::workload_quota::{Charge, WorkloadKind};

pub use events::{KIND, RentalEvent, Termination};
pub use values::{
    CapacityObservation, CapacityReceipt, CapacityState, CapacitySupport, ConnectionId,
    IdempotentProvision, NativeRef, OfferId, OwnershipToken, Pricing, RentalId, Resources,
    SupportError,
};

/// Most bookings queued behind a rental's running one.
pub const SCHEDULE_QUEUED_MAX: usize = 4;

/// How long after a recorded observation the same look is recorded again, in seconds.
pub const RENTAL_OBSERVATION_RECORD_SECONDS: i64 = 60;

/// Where a rental stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RentalStatus {
    /// Never asked for: the stream is empty.
    None,
    /// Asked of the provider; no answer recorded yet.
    Requested,
    /// Accepted (or resumed), not running yet.
    Starting,
    /// Running.
    Active,
    /// A stop was asked; not confirmed yet.
    Stopping,
    /// Stopped, its identity kept.
    Stopped,
    /// A termination was asked; not confirmed yet (still charged).
    Terminating,
    /// Gone, confirmed.
    Terminated,
}

impl RentalStatus {
    /// Every status.
    pub const ALL: [Self; 8] = [
        Self::None,
        Self::Requested,
        Self::Starting,
        Self::Active,
        Self::Stopping,
        Self::Stopped,
        Self::Terminating,
        Self::Terminated,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Requested => "requested",
            Self::Starting => "starting",
            Self::Active => "active",
            Self::Stopping => "stopping",
            Self::Stopped => "stopped",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
        }
    }
}

/// Who ends a rental.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminateCause {
    /// Its tenant.
    Tenant,
    /// An operator.
    Operator,
    /// Its max lifetime passed (the lifetime reconciler).
    MaxLifetime,
}

/// Where the node agent on a rented machine enrolls, as the provider delivers it verbatim.
/// The node's id, the rental and the generation are the rental's own; the enrollment token
/// is added when the bootstrap is sent and is never recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bootstrap {
    /// The control plane's URL the agent enrolls at.
    pub control_plane_url: String,
    /// The node agent build the machine should run.
    pub agent_version: String,
}

/// What a rental was asked to be: fixed at provision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalTerms {
    /// The rental.
    pub rental: RentalId,
    /// The provider connection it is rented through.
    pub connection: ConnectionId,
    /// The offer it was made from.
    pub offer: OfferId,
    /// What it asks of the machine.
    pub resources: Resources,
    /// Interruptible (spot) capacity requested.
    pub interruptible: bool,
    /// The provider-side reclamation backstop, and when Leasehold terminates it itself.
    pub max_lifetime_seconds: u64,
    /// The connection's capabilities as registered.
    pub support: CapacitySupport,
    /// What the provider delivers to the machine.
    pub bootstrap: Bootstrap,
}

/// What the provider allocated, from its receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocated {
    /// Its name for the machine.
    pub native_ref: NativeRef,
    /// Interruptible as allocated.
    pub interruptible: bool,
    /// What it charges.
    pub pricing: Pricing,
    /// When it accepted, on its clock.
    pub accepted_at: DateTime<Utc>,
}

/// The last observation recorded, with Leasehold's receipt time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observed {
    /// What the provider reported.
    pub observation: CapacityObservation,
    /// When Leasehold received it (its own clock).
    pub received_at: DateTime<Utc>,
}

/// One booking on a rental's schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Booking {
    /// The booking.
    pub booking: BookingId,
    /// The run it is for.
    pub run: RunId,
}

/// The rental's schedule: at most one running booking and [`SCHEDULE_QUEUED_MAX`] queued.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// The booking running now.
    pub running: Option<Booking>,
    /// Those waiting, first first.
    pub queued: Vec<Booking>,
}

impl Schedule {
    /// Whether `booking` is held (running or queued).
    pub fn holds(&self, booking: BookingId) -> bool {
        self.running.is_some_and(|held| held.booking == booking)
            || self.queued.iter().any(|held| held.booking == booking)
    }
}

/// The Rental aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rental {
    /// Where it stands.
    pub status: RentalStatus,
    /// What it was asked to be.
    pub terms: Option<RentalTerms>,
    /// Its mark on the capacity (never shown to tenants).
    pub ownership: Option<OwnershipToken>,
    /// Its lifecycle cycle: 1 at provision, one more at every resume.
    pub generation: u64,
    /// The current generation's node.
    pub node: Option<NodeId>,
    /// The ask in flight at the provider (its operation key there).
    pub operation: Option<OperationId>,
    /// What the provider allocated.
    pub allocated: Option<Allocated>,
    /// The last observation recorded.
    pub observed: Option<Observed>,
    /// Why it is being (or was) terminated.
    pub termination: Option<TerminateCause>,
    /// Its schedule of runs.
    pub schedule: Schedule,
    /// The last failure (operators only).
    pub last_error: Option<OperatorDetail>,
    /// When it was asked for.
    pub requested_at: Option<DateTime<Utc>>,
    /// When it was last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// When the provider says its machine last stopped (the `state_since` of the look that
    /// stopped it, the provider's clock), kept across a resume: a stopped look after a resume
    /// dated no later is still that stop (the provider has not acted on the resume yet).
    pub stopped_since: Option<DateTime<Utc>>,
}

/// What can be asked of a rental. Commands that act on the capacity name the generation
/// they were decided under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RentalCommand {
    /// Rents capacity.
    Provision {
        /// What is asked.
        terms: RentalTerms,
        /// Its mark, minted with the rental.
        ownership: OwnershipToken,
        /// The first generation's node, minted with the rental.
        node: NodeId,
        /// The provision's operation key at the provider.
        operation: OperationId,
    },
    /// The provider's receipt for the provision.
    Accept {
        /// The generation it was sent under.
        generation: u64,
        /// The receipt.
        receipt: CapacityReceipt,
    },
    /// The provider refused the provision for good.
    FailProvision {
        /// The generation it was sent under.
        generation: u64,
        /// Why (operators only).
        detail: OperatorDetail,
    },
    /// The provider's look at the machine.
    Observe {
        /// The generation the look was asked under: a look asked before a resume may still
        /// see the stopped machine, and is not a fact about the resumed one.
        generation: u64,
        /// What it reported.
        observation: CapacityObservation,
    },
    /// The provider does not know the machine.
    NotFound {
        /// The generation the look was made under.
        generation: u64,
    },
    /// Suspends the capacity.
    Stop {
        /// The generation the caller saw.
        generation: u64,
        /// The stop's operation key at the provider.
        operation: OperationId,
    },
    /// Brings stopped capacity back as a new generation.
    Resume {
        /// The generation the caller saw.
        generation: u64,
        /// The new generation's node.
        node: NodeId,
        /// The resume's operation key at the provider.
        operation: OperationId,
    },
    /// Ends the rental.
    Terminate {
        /// The generation the caller saw.
        generation: u64,
        /// Who ends it.
        cause: TerminateCause,
        /// The termination's operation key at the provider.
        operation: OperationId,
    },
    /// Puts a run on the schedule.
    Book {
        /// The generation the run was placed under.
        generation: u64,
        /// The booking.
        booking: Booking,
    },
    /// Takes a booking off the schedule (its run closed or moved).
    ReleaseBooking {
        /// The booking.
        booking: BookingId,
    },
    /// Admits an attempt of the running booking's run onto the rental's node: checked in
    /// the attempt's own append, so that no attempt starts on a schedule or a node that
    /// changed after the dispatcher looked. The node is the fence: each generation has its
    /// own (minted from the rental and the generation), so an attempt decided before a
    /// resume names the retired one. (Not the booking's generation: a booking queued before
    /// a resume runs on the resumed generation's node.)
    AdmitAttempt {
        /// The booking it runs under.
        booking: BookingId,
        /// The node it launches on.
        node: NodeId,
        /// The attempt.
        attempt: AttemptId,
    },
}

/// Why a rental refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RentalError {
    /// The rental was never provisioned.
    #[error("no such rental")]
    NotFound,
    /// Not allowed in its state.
    #[error("a rental that is {status} cannot {command}")]
    InvalidState {
        /// Its status's name.
        status: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// The command was decided under another generation than the rental's.
    #[error("the command names generation {given}; the rental is at generation {current}")]
    Fenced {
        /// The generation the command names.
        given: u64,
        /// The rental's.
        current: u64,
    },
    /// The connection cannot do this (a routing bug, never retried).
    #[error("the provider connection does not support {operation}")]
    Unsupported {
        /// What was asked.
        operation: &'static str,
    },
    /// The rental exists with other terms.
    #[error("a rental with this id exists with other terms")]
    AlreadyExists,
    /// A report about another machine than the rental's.
    #[error("the report names another machine than the rental's")]
    OtherMachine,
    /// No machine is known yet to observe.
    #[error("the provider has not accepted the rental yet")]
    NotAccepted,
    /// The schedule has no room.
    #[error("the rental's schedule is full")]
    ScheduleFull,
}

impl Refusal for RentalError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound => RefusalKind::NotFound,
            Self::InvalidState { .. } | Self::NotAccepted | Self::ScheduleFull => {
                RefusalKind::InvalidState
            }
            Self::Fenced { .. } => RefusalKind::Fenced,
            Self::Unsupported { .. } => RefusalKind::Unsupported,
            Self::AlreadyExists | Self::OtherMachine => RefusalKind::Conflict,
        }
    }
}

impl Aggregate for Rental {
    const STREAM_TYPE: &'static str = "rental";
    const STATE_SCHEMA: u32 = 2;
    type Command = RentalCommand;
    type Event = RentalEvent;
    type Error = RentalError;
    type Facts = ();
    const WORKLOAD: Option<WorkloadKind> = Some(WorkloadKind::Rental);

    /// A rental holds its resources from its request until its termination is confirmed (a
    /// termination asked is still charged: rule 9).
    fn charge(&self) -> Option<Charge> {
        let holds = !matches!(self.status, RentalStatus::None | RentalStatus::Terminated);
        let resources = self.terms.as_ref().filter(|_| holds)?.resources;
        Some(Charge::of([
            ("cpu_millis".to_owned(), resources.cpu_millis),
            ("disk_gb".to_owned(), resources.disk_gb),
            ("gpus".to_owned(), u64::from(resources.gpus)),
            ("memory_mb".to_owned(), resources.memory_mb),
        ]))
    }

    fn initial() -> Self {
        Self {
            status: RentalStatus::None,
            terms: None,
            ownership: None,
            generation: 0,
            node: None,
            operation: None,
            allocated: None,
            observed: None,
            termination: None,
            schedule: Schedule::default(),
            last_error: None,
            requested_at: None,
            updated_at: None,
            stopped_since: None,
        }
    }

    fn decide(
        &self,
        command: &RentalCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<RentalEvent>, RentalError> {
        decide::decide(self, command, ctx.now)
    }

    fn evolve(self, event: &RentalEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.status == RentalStatus::Terminated
    }

    fn is_creation(command: &RentalCommand) -> bool {
        matches!(command, RentalCommand::Provision { .. })
    }

    fn generation(&self) -> Option<u64> {
        Some(self.generation)
    }
}

impl Rental {
    /// Whether its capacity is charged: from the provision until it is confirmed gone.
    pub fn is_charged(&self) -> bool {
        !matches!(self.status, RentalStatus::None | RentalStatus::Terminated)
    }
}

/// What a rental's events mean for its nodes (the service links these commands to the
/// rental's, on the nodes' streams): a provision invites the first generation's node, a
/// resume retires the previous generation's and invites the new one's, and a confirmed
/// termination retires the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeEffect {
    /// Invite this node for this generation.
    Invite {
        /// The node.
        node: NodeId,
        /// Its generation.
        generation: u64,
    },
    /// Retire this node: its generation ended.
    Retire {
        /// The node.
        node: NodeId,
        /// Its generation.
        generation: u64,
    },
}

/// The node effects of `events` decided on `before`, in order.
pub fn node_effects(before: &Rental, events: &[RentalEvent]) -> Vec<NodeEffect> {
    let mut effects = Vec::new();
    for event in events {
        match event {
            RentalEvent::CapacityRequested { node, .. } => {
                effects.push(NodeEffect::Invite { node: *node, generation: 1 });
            }
            RentalEvent::CapacityResumed { generation, node, .. } => {
                if let Some(previous) = before.node {
                    effects.push(NodeEffect::Retire { node: previous, generation: generation - 1 });
                }
                effects.push(NodeEffect::Invite { node: *node, generation: *generation });
            }
            RentalEvent::CapacityTerminated { .. }
            | RentalEvent::CapacityProvisionFailed { .. }
            | RentalEvent::CapacityInterrupted { status: RentalStatus::Terminated, .. } => {
                if let Some(node) = before.node {
                    effects.push(NodeEffect::Retire { node, generation: before.generation });
                }
            }
            _ => {}
        }
    }
    effects
}
