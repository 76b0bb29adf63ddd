//! The rental's state after each event: no rules, only what the event records.

use super::{Allocated, Observed, Rental, RentalEvent as E, RentalStatus as S};

pub(super) fn evolve(mut rental: Rental, event: &E) -> Rental {
    match event {
        E::CapacityRequested { terms, ownership, node, generation, operation, at } => {
            rental.status = S::Requested;
            rental.terms = Some(terms.clone());
            rental.ownership = Some(ownership.clone());
            rental.node = Some(*node);
            rental.generation = *generation;
            rental.operation = Some(*operation);
            rental.requested_at = Some(*at);
            rental.updated_at = Some(*at);
        }
        E::CapacityAccepted { receipt, status, at, .. } => {
            rental.status = *status;
            rental.allocated = Some(Allocated {
                native_ref: receipt.native_ref.clone(),
                interruptible: receipt.interruptible,
                pricing: receipt.pricing.clone(),
                accepted_at: receipt.accepted_at,
            });
            rental.updated_at = Some(*at);
        }
        E::CapacityProvisionFailed { detail, at, .. } => {
            rental.status = S::Terminated;
            rental.last_error = Some(detail.clone());
            rental.operation = None;
            rental.updated_at = Some(*at);
        }
        E::CapacityObserved { observation, status, received_at }
        | E::CapacityInterrupted { observation, status, received_at } => {
            if *status == S::Stopped && rental.status != S::Stopped {
                rental.stopped_since = observation.state_since;
            }
            rental.status = *status;
            rental.observed =
                Some(Observed { observation: observation.clone(), received_at: *received_at });
            rental.updated_at = Some(*received_at);
        }
        E::CapacityStopped { observation, received_at } => {
            rental.stopped_since = observation.state_since;
            rental.status = S::Stopped;
            rental.operation = None;
            rental.observed =
                Some(Observed { observation: observation.clone(), received_at: *received_at });
            rental.updated_at = Some(*received_at);
        }
        E::CapacityTerminated { observation, received_at, .. } => {
            rental.status = S::Terminated;
            rental.operation = None;
            if let Some(observation) = observation {
                rental.observed =
                    Some(Observed { observation: observation.clone(), received_at: *received_at });
            }
            rental.updated_at = Some(*received_at);
        }
        E::CapacityStopRequested { operation, at, .. } => {
            rental.status = S::Stopping;
            rental.operation = Some(*operation);
            rental.updated_at = Some(*at);
        }
        E::CapacityResumed { generation, node, operation, at } => {
            rental.status = S::Starting;
            rental.generation = *generation;
            rental.node = Some(*node);
            rental.operation = Some(*operation);
            rental.updated_at = Some(*at);
        }
        E::CapacityTerminationRequested { cause, operation, at, .. } => {
            rental.status = S::Terminating;
            rental.termination = Some(*cause);
            rental.operation = Some(*operation);
            rental.updated_at = Some(*at);
        }
        E::RentalBooked { booking, running, at } => {
            if *running {
                rental.schedule.running = Some(*booking);
            } else {
                rental.schedule.queued.push(*booking);
            }
            rental.updated_at = Some(*at);
        }
        E::RentalBookingStarted { booking, at } => {
            let position = rental.schedule.queued.iter().position(|held| held.booking == *booking);
            if let Some(position) = position {
                rental.schedule.running = Some(rental.schedule.queued.remove(position));
            }
            rental.updated_at = Some(*at);
        }
        E::RentalAttemptAdmitted { at, .. } => rental.updated_at = Some(*at),
        E::RentalBookingReleased { booking, at } => {
            if rental.schedule.running.is_some_and(|held| held.booking == *booking) {
                rental.schedule.running = None;
            }
            rental.schedule.queued.retain(|held| held.booking != *booking);
            rental.updated_at = Some(*at);
        }
    }
    rental
}
