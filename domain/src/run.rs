//! The Run: one piece of work a tenant submits to rented capacity, with its booking on a
//! rental's schedule and its attempts on the rental's nodes (DOMAIN.md §1.7, rules 20, 22, 23).
//!
//! A run is booked on a rental (the rental's schedule holds the booking, in the same append);
//! when its booking runs, an **attempt** is created on the rental's current node and the
//! launch intent recorded before the node is ordered to launch (the order is linked to it).
//! The node's answer accepts or fails the launch; a launch whose answer was lost is
//! **indeterminate** and forbids another attempt until it is reconciled (the node's applied
//! operations, or a look that shows the workload), so nothing is launched twice (rule 20). A
//! replacement attempt never goes to an offer an earlier attempt failed on.
//!
//! The node's looks at the attempt are recorded with Leasehold's receipt time; their own
//! times are the node's clock, kept and never used to order anything (rule 23). The **first
//! terminal fact wins** (rule 22): the outcome is recorded once — an exit seen in phase
//! `exited` (0 succeeded, else failed), a failed launch, or a cancel — and nothing later
//! changes it. An exit code counts only in phase `exited`; `absent` is never an exit. Once
//! the outcome stands, cleanup is pending when the workload was launched (a look showing it
//! absent, or the node applying its stop, confirms it; a failed cleanup blocks), or not
//! required when it never was; the machine's end confirms it too: when the node the attempt
//! was launched on is retired (its machine confirmed stopped and resumed, or terminated, on
//! the assumption that a stopped machine runs nothing), the run closes, failed as
//! `NodeRetired` unless an outcome stands; a run closes as soon as it has an outcome and its cleanup is
//! confirmed or not required, and its booking then leaves the rental's schedule.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Submit(terms) | requested | RunRequested | — |
//! | any but none | Submit | unchanged | — when the same terms (a retry), else `AlreadyExists` | — |
//! | requested | Book(booking, rental, generation) | booked | RunBookingDecided (the rental's schedule books it in the same append) | — |
//! | booked (same booking) | Book | booked | — (a retry) | — |
//! | booked, its last attempt failed | Book(another booking) | booked | RunBookingDecided (a replacement: the previous booking leaves its schedule) | — |
//! | booked, no attempt or the last one failed | CreateAttempt(attempt, node, token, offer, op) | launching | (RunBookingDispatched on the first,) RunAttemptCreated, RunLaunchIntentRecorded (the rental admits the attempt — its booking running, on its node — and the node's launch order, in the same append) | no indeterminate launch (`LaunchIndeterminate`); an offer no attempt failed on (`OfferExcluded`); no cancel asked (`InvalidState`) |
//! | launching | CreateAttempt(same attempt) | launching | — (a retry) | — |
//! | launching, indeterminate | LaunchAnswered(attempt, accepted) | running | RunLaunchAccepted | the current attempt (`NoSuchAttempt`) |
//! | launching, indeterminate | LaunchAnswered(attempt, failed) | booked | RunLaunchFailed (its offer excluded from replacements); with a cancel asked also RunOutcomeRecorded(cancelled), RunClosed | the current attempt |
//! | launching | LaunchAnswered(attempt, indeterminate) | indeterminate | RunLaunchIndeterminate | the current attempt |
//! | launching, indeterminate | LaunchAnswered(attempt, not applied) | booked | RunLaunchNotApplied (the node's reconciliation shows it never ran: its offer is not excluded, a relaunch may go to it); with a cancel asked also RunOutcomeRecorded(cancelled), RunClosed | the current attempt |
//! | running, finished, closed | LaunchAnswered(the same answer) | unchanged | — (a redelivery) | another answer: `ReportContradicts` |
//! | launching, indeterminate, running | Observe(node, attempt, look) | as the look says | RunExternalStateObserved; a workload seen running accepts an indeterminate launch (RunLaunchAccepted); seen exited with a code: RunOutcomeRecorded (0 succeeded, else failed) and RunCleanupRequested | the current attempt, reported by its own node (`NoSuchAttempt`) |
//! | finished | Observe(attempt, absent) | closed | RunExternalStateObserved, RunCleanupConfirmed, RunClosed | the current attempt |
//! | finished | Observe(another terminal look) | finished | RunExternalStateObserved (the first terminal fact stands) | — |
//! | requested, booked | GiveUp(reason) | closed | RunOutcomeRecorded(failed), RunClosed (cleanup not required) | no launch in flight |
//! | requested, booked | Cancel | closed | RunCancelRequested, RunOutcomeRecorded(cancelled), RunClosed (never launched) | — |
//! | launching, indeterminate | Cancel(stop) | unchanged | RunCancelRequested, and no stop: one could overtake the launch it is to stop (once the launch is accepted and the node ready, the run dispatcher orders it: `RunService::order_pending_stop`) | — |
//! | running | Cancel(stop) | running | RunCancelRequested (unless asked already); RunStopOrdered when a stop is given (the node's current fencing token, read by the service) and none is ordered yet (the node's stop order, in the same append) | — |
//! | any with a cancel asked, and its stop ordered or not yet possible | Cancel | unchanged | — (idempotent) | — |
//! | running, its stop ordered | StopFailed(that stop's operation) | running | RunStopFailed (the stop is no longer ordered: the run dispatcher orders another, under a new operation, at most 5 in all) | — for another operation, or once the run has an outcome |
//! | running, its stop ordered | CancelAccepted | finished | RunCancelAccepted, RunOutcomeRecorded(cancelled), RunCleanupRequested | a stop ordered (else `InvalidState`) |
//! | finished | ConfirmCleanup | closed | RunCleanupConfirmed, RunClosed | — |
//! | finished | FailCleanup(reason) | finished | RunCleanupFailed (blocked) | — |
//! | launching, indeterminate, running, finished | NodeRetired(its current attempt's node) | closed | RunNodeRetired (the machine's generation ended under the attempt), RunOutcomeRecorded(failed, `NodeRetired`; cancelled when a cancel was asked) unless an outcome stands, RunCleanupConfirmed, RunClosed | — when another node, or the attempt's launch failed and no outcome stands (its booking waits for the next generation's node) |
//! | closed | Observe, LaunchAnswered (as recorded), Cancel, ConfirmCleanup, NodeRetired | closed | — (late or repeated) | — |
//! | closed | anything else | closed | refused | `InvalidState` |
//!
//! A node lost on lease expiry leaves its runs as they are: their workloads are unobserved,
//! not dead (the read model says so from the node's state). A retired node is different: its
//! generation ended on a confirmed stop or termination of the machine, which is positive
//! proof that nothing launched there runs any more.

mod decide;
mod events;
mod evolve;
pub mod values;

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::node::{ManifestDigest, NodeId};
use crate::rental::{OfferId, RentalId};
use crate::values::{OperationId, Reason};
use crate::workload_quota::{Charge, WorkloadKind};

pub(crate) use events::OBSERVED_WORKLOAD;
pub use events::{KIND, RunEvent};
pub use values::{AttemptId, BookingId, RunId, WorkloadObservation, WorkloadPhase};

/// Where a run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Never submitted: the stream is empty.
    None,
    /// Submitted, not booked.
    Requested,
    /// On a rental's schedule, no attempt launching.
    Booked,
    /// An attempt's launch was ordered; no answer yet.
    Launching,
    /// The launch's answer was lost: nothing is launched again until it is reconciled.
    Indeterminate,
    /// Its workload runs.
    Running,
    /// Its outcome is recorded; its cleanup is not done.
    Finished,
    /// Done: an outcome and its cleanup confirmed or not required.
    Closed,
}

impl RunStatus {
    /// Every status.
    pub const ALL: [Self; 8] = [
        Self::None,
        Self::Requested,
        Self::Booked,
        Self::Launching,
        Self::Indeterminate,
        Self::Running,
        Self::Finished,
        Self::Closed,
    ];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Requested => "requested",
            Self::Booked => "booked",
            Self::Launching => "launching",
            Self::Indeterminate => "indeterminate",
            Self::Running => "running",
            Self::Finished => "finished",
            Self::Closed => "closed",
        }
    }
}

/// How a run ended: the first terminal fact.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Exited 0.
    Succeeded,
    /// Exited otherwise, or its launch failed.
    Failed,
    /// Cancelled.
    Cancelled,
}

/// Where a run's cleanup stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cleanup {
    /// Nothing was launched: nothing to clean.
    NotRequired,
    /// Asked; not confirmed.
    Pending,
    /// Confirmed.
    Confirmed,
    /// It failed; an operator must look.
    Blocked,
}

/// What a run was asked to be: fixed at submission. It holds no credential (a registry pull's
/// is minted when the order is sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunTerms {
    /// The run.
    pub run: RunId,
    /// Exactly what runs.
    pub manifest_digest: ManifestDigest,
    /// How long it may run.
    pub max_runtime_seconds: u64,
}

/// How a launch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    /// Ordered; no answer.
    Intended,
    /// The node accepted it.
    Accepted,
    /// The node refused it (or never applied it).
    Failed,
    /// Its answer was lost.
    Indeterminate,
}

/// One attempt of the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// Its id.
    pub attempt: AttemptId,
    /// The rental it runs on.
    pub rental: RentalId,
    /// The node ordered to launch it.
    pub node: NodeId,
    /// The node's fencing token the order was decided under.
    pub fencing_token: u64,
    /// The rental's offer.
    pub offer: OfferId,
    /// The launch order's operation id.
    pub operation: OperationId,
    /// How the launch stands.
    pub launch: Launch,
    /// The last phase seen.
    pub phase: Option<WorkloadPhase>,
    /// The exit code of the last look in phase exited.
    pub exit_code: Option<i32>,
}

/// The run's booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunBooking {
    /// The booking.
    pub booking: BookingId,
    /// On whose schedule.
    pub rental: RentalId,
    /// The rental's generation it was booked under.
    pub generation: u64,
}

/// The Run aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Run {
    /// Where it stands.
    pub status: RunStatus,
    /// What it was asked to be.
    pub terms: Option<RunTerms>,
    /// Its booking.
    pub booking: Option<RunBooking>,
    /// Its attempts, first first.
    pub attempts: Vec<Attempt>,
    /// Offers an attempt failed on (a replacement never goes there).
    pub excluded_offers: BTreeSet<OfferId>,
    /// A cancel was asked.
    pub cancel_requested: bool,
    /// How it ended.
    pub outcome: Option<Outcome>,
    /// The exit code of the exit that decided it.
    pub exit_code: Option<i32>,
    /// Why it failed, when it did so at launch.
    pub failure: Option<Reason>,
    /// Its cleanup.
    pub cleanup: Option<Cleanup>,
    /// The cancel's stop order on the current attempt's node, once ordered.
    pub stop: Option<StopOrder>,
    /// When it was submitted.
    pub requested_at: Option<DateTime<Utc>>,
    /// When it was last changed.
    pub updated_at: Option<DateTime<Utc>>,
    /// How many of the cancel's stop orders the node refused or never applied: the next
    /// one is ordered under a new operation id (one per try).
    pub stop_failures: u32,
}

impl Run {
    /// Its current attempt.
    pub fn current(&self) -> Option<&Attempt> {
        self.attempts.last()
    }
}

/// A cancel's stop order: under the node's fencing token when it was ordered, with the
/// stop operation's id (one per attempt, however often it is cancelled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopOrder {
    /// The node's fencing token the stop goes out under.
    pub fencing_token: u64,
    /// The stop order's operation id.
    pub operation: OperationId,
}

/// A launch's answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum LaunchAnswer {
    /// The node applied it.
    Accepted,
    /// The node refused it, or its reconciliation shows it never applied it.
    Failed {
        /// Why (tenant-safe, from an open set).
        reason: Reason,
    },
    /// The order's answer was lost (a timeout, a dropped connection).
    Indeterminate,
    /// The node's reconciliation shows it never applied it: nothing ran, so nothing is
    /// wrong with the offer (a relaunch may go to it again).
    NotApplied,
}

/// What can be asked of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunCommand {
    /// Submits it.
    Submit {
        /// What is asked.
        terms: RunTerms,
    },
    /// Books it on a rental's schedule.
    Book {
        /// The booking.
        booking: RunBooking,
    },
    /// Creates an attempt and records the launch intent.
    CreateAttempt {
        /// The attempt.
        attempt: AttemptId,
        /// The node to launch on.
        node: NodeId,
        /// The node's fencing token now.
        fencing_token: u64,
        /// The rental's offer.
        offer: OfferId,
        /// The launch order's operation id.
        operation: OperationId,
    },
    /// The launch's answer.
    LaunchAnswered {
        /// The attempt.
        attempt: AttemptId,
        /// The answer.
        answer: LaunchAnswer,
    },
    /// A node's look at the attempt (recorded on the node's stream in the same append).
    Observe {
        /// The node that looked: only the attempt's own node reports on it.
        node: NodeId,
        /// What it saw.
        observation: WorkloadObservation,
        /// When Leasehold received it.
        received_at: DateTime<Utc>,
    },
    /// No attempt can be made any more (every offer failed, or its rental is gone).
    GiveUp {
        /// Why.
        reason: Reason,
    },
    /// The tenant cancels it; `stop` is the stop order its node can take now, if any.
    Cancel {
        /// The stop, when the current attempt's node can take orders.
        stop: Option<StopOrder>,
    },
    /// The node applied the cancel's stop.
    CancelAccepted,
    /// The node refused the cancel's stop `operation`, or its reconciliation shows it never
    /// applied it: the stop is to be ordered again (under a new operation).
    StopFailed {
        /// The stop's operation.
        operation: OperationId,
    },
    /// The cleanup is confirmed.
    ConfirmCleanup,
    /// The cleanup failed.
    FailCleanup {
        /// Why.
        reason: Reason,
    },
    /// A node was retired: its machine's generation ended (the run ends with it when its
    /// current attempt was launched there).
    NodeRetired {
        /// The retired node.
        node: NodeId,
    },
}

/// Why a run refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The run was never submitted.
    #[error("no such run")]
    NotFound,
    /// Not allowed in its state.
    #[error("a run that is {status} cannot {command}")]
    InvalidState {
        /// Its status's name.
        status: &'static str,
        /// What was asked.
        command: &'static str,
    },
    /// The run exists with other terms.
    #[error("a run with this id exists with other terms")]
    AlreadyExists,
    /// A launch's answer was lost: reconcile before another attempt.
    #[error("the last launch is indeterminate: it must be reconciled before another attempt")]
    LaunchIndeterminate,
    /// An earlier attempt failed on this offer.
    #[error("an earlier attempt failed on this offer")]
    OfferExcluded,
    /// Not the run's current attempt.
    #[error("no such attempt is current on the run")]
    NoSuchAttempt,
    /// An answer contradicting the one recorded.
    #[error("the launch was already answered otherwise")]
    ReportContradicts,
}

impl Refusal for RunError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound | Self::NoSuchAttempt => RefusalKind::NotFound,
            Self::InvalidState { .. } | Self::LaunchIndeterminate | Self::OfferExcluded => {
                RefusalKind::InvalidState
            }
            Self::AlreadyExists | Self::ReportContradicts => RefusalKind::Conflict,
        }
    }
}

impl Aggregate for Run {
    const STREAM_TYPE: &'static str = "run";
    const STATE_SCHEMA: u32 = 3;
    type Command = RunCommand;
    type Event = RunEvent;
    type Error = RunError;
    type Facts = ();
    const WORKLOAD: Option<WorkloadKind> = Some(WorkloadKind::Run);

    /// A run holds its maximum runtime from its submission until it closes.
    fn charge(&self) -> Option<Charge> {
        let holds = !matches!(self.status, RunStatus::None | RunStatus::Closed);
        let terms = self.terms.as_ref().filter(|_| holds)?;
        Some(Charge::of([("max_runtime_seconds".to_owned(), terms.max_runtime_seconds)]))
    }

    fn initial() -> Self {
        Self {
            status: RunStatus::None,
            terms: None,
            booking: None,
            attempts: Vec::new(),
            excluded_offers: BTreeSet::new(),
            cancel_requested: false,
            outcome: None,
            exit_code: None,
            failure: None,
            cleanup: None,
            stop: None,
            requested_at: None,
            updated_at: None,
            stop_failures: 0,
        }
    }

    fn decide(&self, command: &RunCommand, ctx: &Context<()>) -> Result<Vec<RunEvent>, RunError> {
        decide::decide(self, command, ctx.now)
    }

    fn evolve(self, event: &RunEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.status == RunStatus::Closed
    }

    fn is_creation(command: &RunCommand) -> bool {
        matches!(command, RunCommand::Submit { .. })
    }
}

/// What a run's events mean for the rental's schedule and the node (the service links these
/// commands to the run's, on their streams, so that they commit together or not at all).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEffect {
    /// Book the run on the rental's schedule.
    Book {
        /// The booking.
        booking: RunBooking,
    },
    /// Take a booking off the rental's schedule (the run closed, or moved to another one).
    ReleaseBooking {
        /// The booking.
        booking: RunBooking,
    },
    /// Admit the attempt on the rental: its booking still runs there, on that node.
    AdmitAttempt {
        /// The run's booking.
        booking: RunBooking,
        /// The node.
        node: NodeId,
        /// The attempt.
        attempt: AttemptId,
    },
    /// Order the node to launch the attempt.
    OrderLaunch {
        /// The node.
        node: NodeId,
        /// The fencing token the attempt was created under.
        fencing_token: u64,
        /// The order's operation id.
        operation: OperationId,
        /// The order.
        order: crate::node::NodeOrder,
    },
    /// Order the node to stop the attempt (a cancel), under the node's fencing token at the
    /// cancel (the service reads it: the node may have enrolled again since the launch).
    OrderStop {
        /// The node.
        node: NodeId,
        /// The attempt.
        attempt: AttemptId,
        /// The order.
        stop: StopOrder,
    },
}

/// Seconds a cancelled workload gets to exit before it is killed.
pub const CANCEL_GRACE_SECONDS: u64 = 30;

/// The effects of `events` decided on `before`, in order.
pub fn run_effects(before: &Run, events: &[RunEvent]) -> Vec<RunEffect> {
    let mut effects = Vec::new();
    let mut state = before.clone();
    for event in events {
        match event {
            RunEvent::RunBookingDecided { booking, .. } => {
                if let Some(previous) = state.booking {
                    effects.push(RunEffect::ReleaseBooking { booking: previous });
                }
                effects.push(RunEffect::Book { booking: *booking });
            }
            RunEvent::RunAttemptCreated { attempt, .. } => {
                if let Some(booking) = state.booking {
                    effects.push(RunEffect::AdmitAttempt {
                        booking,
                        node: attempt.node,
                        attempt: attempt.attempt,
                    });
                }
            }
            RunEvent::RunLaunchIntentRecorded { attempt, operation, .. } => {
                let created = state.attempts.iter().find(|known| known.attempt == *attempt);
                if let (Some(created), Some(terms), Some(booking)) =
                    (created, &state.terms, state.booking)
                {
                    effects.push(RunEffect::OrderLaunch {
                        node: created.node,
                        fencing_token: created.fencing_token,
                        operation: *operation,
                        order: crate::node::NodeOrder::LaunchWorkload {
                            run: terms.run,
                            attempt: *attempt,
                            booking: booking.booking,
                            manifest_digest: terms.manifest_digest.clone(),
                            max_runtime_seconds: terms.max_runtime_seconds,
                        },
                    });
                }
            }
            RunEvent::RunStopOrdered { attempt, stop, .. } => {
                let ordered = state.attempts.iter().find(|known| known.attempt == *attempt);
                if let Some(ordered) = ordered {
                    effects.push(RunEffect::OrderStop {
                        node: ordered.node,
                        attempt: *attempt,
                        stop: *stop,
                    });
                }
            }
            RunEvent::RunClosed { .. } => {
                if let Some(booking) = state.booking {
                    effects.push(RunEffect::ReleaseBooking { booking });
                }
            }
            _ => {}
        }
        state = state.evolve(event);
    }
    effects
}
