//! `decide` for the rental: the transition table of `rental.rs`, row by row.

use chrono::{DateTime, TimeDelta, Utc};

use super::{
    Booking, BookingId, CapacityObservation, CapacityReceipt, CapacityState, Rental, RentalCommand,
    RentalError, RentalEvent, RentalStatus, SCHEDULE_QUEUED_MAX, Termination,
};
use super::{RENTAL_OBSERVATION_RECORD_SECONDS, TerminateCause};
use crate::node::NodeId;
use crate::run::AttemptId;
use crate::values::OperationId;

pub(super) fn decide(
    rental: &Rental,
    command: &RentalCommand,
    now: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    use RentalCommand as C;
    use RentalStatus as S;
    let at = now;
    if rental.status == S::None && !matches!(command, C::Provision { .. }) {
        return Err(RentalError::NotFound);
    }
    if is_recorded_resume(rental, command) {
        return Ok(Vec::new());
    }
    fence(rental, command)?;
    match (rental.status, command) {
        (_, C::Provision { terms, ownership, node, operation }) => {
            if rental.status != S::None {
                let same = rental.terms.as_ref() == Some(terms)
                    && rental.ownership.as_ref() == Some(ownership);
                return if same { Ok(Vec::new()) } else { Err(RentalError::AlreadyExists) };
            }
            Ok(vec![RentalEvent::CapacityRequested {
                terms: terms.clone(),
                ownership: ownership.clone(),
                node: *node,
                generation: 1,
                operation: *operation,
                at,
            }])
        }
        (_, C::Accept { generation, receipt }) => accept(rental, *generation, receipt, at),
        // A termination asked before any receipt: the provider's refusal still says nothing
        // was allocated, so there is nothing left to terminate.
        (S::Requested, C::FailProvision { generation, detail })
        | (S::Terminating, C::FailProvision { generation, detail })
            if rental.allocated.is_none() =>
        {
            Ok(vec![RentalEvent::CapacityProvisionFailed {
                generation: *generation,
                detail: detail.clone(),
                at,
            }])
        }
        (S::Terminated, C::Observe { .. } | C::NotFound { .. }) => Ok(Vec::new()),
        (_, C::Observe { observation, .. }) => observe(rental, observation, at),
        (S::Terminating, C::NotFound { .. }) => Ok(not_found_while_terminating(rental, at)),
        (_, C::NotFound { .. }) => Ok(Vec::new()),
        (S::Active, C::Stop { generation, operation }) => stop(rental, *generation, *operation, at),
        (S::Stopping | S::Stopped, C::Stop { .. }) => Ok(Vec::new()),
        (S::Stopped, C::Resume { generation, node, operation }) => {
            resume(rental, *generation, *node, *operation, at)
        }
        (
            S::Requested | S::Starting | S::Active | S::Stopping | S::Stopped,
            C::Terminate { generation, cause, operation },
        ) => Ok(terminate(*generation, *cause, *operation, at)),
        (S::Terminating | S::Terminated, C::Terminate { .. }) => Ok(Vec::new()),
        (S::Active, C::Book { booking, .. }) => book(rental, *booking, at),
        (_, C::ReleaseBooking { booking }) => Ok(release_booking(rental, *booking, at)),
        (S::Active, C::AdmitAttempt { booking, node, attempt, .. }) => {
            admit_attempt(rental, *booking, *node, *attempt, at)
        }
        (status, command) => {
            Err(RentalError::InvalidState { status: status.name(), command: name(command) })
        }
    }
}

/// A resume of the generation before the rental's, to the node it resumed to: that resume,
/// sent again (its node is minted from the rental and the generation it starts).
fn is_recorded_resume(rental: &Rental, command: &RentalCommand) -> bool {
    matches!(command, RentalCommand::Resume { generation, node, .. }
        if rental.node == Some(*node) && generation.checked_add(1) == Some(rental.generation))
}

/// The generation a command names must be the rental's: a command decided under an earlier
/// generation (before a resume) acts on capacity that is no longer there.
fn fence(rental: &Rental, command: &RentalCommand) -> Result<(), RentalError> {
    use RentalCommand as C;
    let given = match command {
        C::Accept { generation, .. }
        | C::FailProvision { generation, .. }
        | C::NotFound { generation }
        | C::Observe { generation, .. }
        | C::Stop { generation, .. }
        | C::Terminate { generation, .. }
        | C::Book { generation, .. } => *generation,
        C::Resume { generation, .. } => *generation,
        // An attempt is fenced by its node, the generation's own (see `admit_attempt`).
        C::Provision { .. } | C::ReleaseBooking { .. } | C::AdmitAttempt { .. } => return Ok(()),
    };
    if given == rental.generation {
        Ok(())
    } else {
        Err(RentalError::Fenced { given, current: rental.generation })
    }
}

fn accept(
    rental: &Rental,
    generation: u64,
    receipt: &CapacityReceipt,
    at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    use RentalStatus as S;
    let accepted = |status| {
        Ok(vec![RentalEvent::CapacityAccepted { generation, receipt: receipt.clone(), status, at }])
    };
    match (rental.status, &rental.allocated) {
        (S::Requested, _) => accepted(follow(S::Starting, receipt.state)),
        (S::Terminated, _) => Ok(Vec::new()),
        (_, Some(allocated)) if allocated.native_ref == receipt.native_ref => Ok(Vec::new()),
        (_, Some(_)) => Err(RentalError::OtherMachine),
        // A termination asked before any receipt: the receipt still tells which machine.
        (status, None) => accepted(status),
    }
}

fn observe(
    rental: &Rental,
    observation: &CapacityObservation,
    received_at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    let Some(allocated) = &rental.allocated else {
        return Err(RentalError::NotAccepted);
    };
    if allocated.native_ref != observation.native_ref {
        return Err(RentalError::OtherMachine);
    }
    if let Some(last) = &rental.observed {
        let older = observation.observed_at < last.observation.observed_at;
        let same_look = observation.state == last.observation.state
            && observation.state_since == last.observation.state_since
            && observation.interrupted == last.observation.interrupted;
        let every = TimeDelta::seconds(RENTAL_OBSERVATION_RECORD_SECONDS);
        if older || (same_look && received_at < last.received_at + every) {
            return Ok(Vec::new());
        }
    }
    let last_stopped = rental
        .observed
        .as_ref()
        .is_some_and(|last| last.observation.state == CapacityState::Stopped);
    let still_stopped = observation.state == CapacityState::Stopped
        && !observation.interrupted
        && last_stopped
        && !stopped_since_recorded_stop(rental, observation);
    let status = if resuming(rental) && still_stopped {
        // The provider has not acted on the resume yet: still the machine from before it. (A
        // reclaim is a fact whenever it comes, and so is a stop dated after the recorded one,
        // or one after a look that showed the machine moving again.)
        rental.status
    } else {
        follow(rental.status, observation.state)
    };
    let observation = observation.clone();
    let event = match status {
        RentalStatus::Terminated if !observation.interrupted => RentalEvent::CapacityTerminated {
            by: Termination::Observed,
            observation: Some(observation),
            received_at,
        },
        RentalStatus::Stopped | RentalStatus::Terminated
            if observation.interrupted && status != rental.status =>
        {
            RentalEvent::CapacityInterrupted { observation, status, received_at }
        }
        RentalStatus::Stopped if rental.status == RentalStatus::Stopping => {
            RentalEvent::CapacityStopped { observation, received_at }
        }
        _ => RentalEvent::CapacityObserved { observation, status, received_at },
    };
    Ok(vec![event])
}

/// A stopped look dated after the stop the rental recorded (kept across the resume, whatever
/// looks came since): the machine stopped again. Both dates are the provider's own clock
/// (`state_since`), so they compare; an undated look, or no dated stop to compare with,
/// proves nothing new.
fn stopped_since_recorded_stop(rental: &Rental, observation: &CapacityObservation) -> bool {
    match (rental.stopped_since, observation.state_since) {
        (Some(recorded), Some(since)) => since > recorded,
        _ => false,
    }
}

/// Starting again after a resume (a first generation starts from a provision).
fn resuming(rental: &Rental) -> bool {
    rental.status == RentalStatus::Starting && rental.generation > 1
}

/// The rental's status after an observation of `state` (the second table of `rental.rs`).
pub(super) fn follow(status: RentalStatus, state: CapacityState) -> RentalStatus {
    use CapacityState as O;
    use RentalStatus as S;
    match (state, status) {
        (O::Terminated, _) => S::Terminated,
        (O::Requested | O::Starting, S::Requested) => S::Starting,
        (O::Active, S::Requested | S::Starting | S::Stopped) => S::Active,
        (O::Stopping, S::Active) => S::Stopping,
        (O::Stopped, S::Requested | S::Starting | S::Active | S::Stopping) => S::Stopped,
        _ => status,
    }
}

fn not_found_while_terminating(rental: &Rental, received_at: DateTime<Utc>) -> Vec<RentalEvent> {
    let unobservable =
        rental.terms.as_ref().is_some_and(|terms| !terms.support.observe_after_terminate);
    // Without a receipt no machine is known: a provision may still be in flight, and its
    // absence proves nothing (rules 9, 10).
    if unobservable && rental.allocated.is_some() {
        vec![RentalEvent::CapacityTerminated {
            by: Termination::NotFound,
            observation: None,
            received_at,
        }]
    } else {
        // Terminated capacity stays observable at this provider: not-found is ambiguous.
        Vec::new()
    }
}

fn stop(
    rental: &Rental,
    generation: u64,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    if !rental.terms.as_ref().is_some_and(|terms| terms.support.stop) {
        return Err(RentalError::Unsupported { operation: "stop" });
    }
    Ok(vec![RentalEvent::CapacityStopRequested { generation, operation, at }])
}

fn resume(
    rental: &Rental,
    generation: u64,
    node: NodeId,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    if !rental.terms.as_ref().is_some_and(|terms| terms.support.resume) {
        return Err(RentalError::Unsupported { operation: "resume" });
    }
    let next = generation
        .checked_add(1)
        .ok_or(RentalError::Fenced { given: generation, current: rental.generation })?;
    Ok(vec![RentalEvent::CapacityResumed { generation: next, node, operation, at }])
}

fn terminate(
    generation: u64,
    cause: TerminateCause,
    operation: OperationId,
    at: DateTime<Utc>,
) -> Vec<RentalEvent> {
    vec![RentalEvent::CapacityTerminationRequested { generation, cause, operation, at }]
}

fn book(
    rental: &Rental,
    booking: Booking,
    at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    let schedule = &rental.schedule;
    if schedule.holds(booking.booking) {
        return Ok(Vec::new());
    }
    if schedule.running.is_none() {
        return Ok(vec![RentalEvent::RentalBooked { booking, running: true, at }]);
    }
    // Interruptible capacity may be reclaimed at any moment: nothing waits behind it.
    let interruptible = rental.allocated.as_ref().is_some_and(|allocated| allocated.interruptible);
    if interruptible || schedule.queued.len() >= SCHEDULE_QUEUED_MAX {
        return Err(RentalError::ScheduleFull);
    }
    Ok(vec![RentalEvent::RentalBooked { booking, running: false, at }])
}

fn release_booking(rental: &Rental, booking: BookingId, at: DateTime<Utc>) -> Vec<RentalEvent> {
    let schedule = &rental.schedule;
    if !schedule.holds(booking) {
        return Vec::new();
    }
    let mut events = vec![RentalEvent::RentalBookingReleased { booking, at }];
    let was_running = schedule.running.is_some_and(|held| held.booking == booking);
    let still_active = !matches!(rental.status, RentalStatus::Terminated);
    if let (true, true, Some(next)) = (was_running, still_active, schedule.queued.first()) {
        events.push(RentalEvent::RentalBookingStarted { booking: next.booking, at });
    }
    events
}

fn admit_attempt(
    rental: &Rental,
    booking: BookingId,
    node: NodeId,
    attempt: AttemptId,
    at: DateTime<Utc>,
) -> Result<Vec<RentalEvent>, RentalError> {
    let running = rental.schedule.running.is_some_and(|held| held.booking == booking);
    if !running || rental.node != Some(node) {
        return Err(RentalError::InvalidState {
            status: rental.status.name(),
            command: "admit an attempt of a booking not running on its node",
        });
    }
    Ok(vec![RentalEvent::RentalAttemptAdmitted { booking, node, attempt, at }])
}

fn name(command: &RentalCommand) -> &'static str {
    match command {
        RentalCommand::Provision { .. } => "provision",
        RentalCommand::Accept { .. } => "accept a receipt",
        RentalCommand::FailProvision { .. } => "fail its provision",
        RentalCommand::Observe { .. } => "be observed",
        RentalCommand::NotFound { .. } => "be not found",
        RentalCommand::Stop { .. } => "stop",
        RentalCommand::Resume { .. } => "resume",
        RentalCommand::Terminate { .. } => "terminate",
        RentalCommand::Book { .. } => "book a run",
        RentalCommand::ReleaseBooking { .. } => "release a booking",
        RentalCommand::AdmitAttempt { .. } => "admit an attempt",
    }
}
