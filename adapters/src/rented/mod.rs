//! Rented capacity's reconcilers: `run_dispatch.rs` starts runs' attempts when their booking
//! runs and their rental's node is ready; `expiry.rs` loses nodes whose lease passed and
//! terminates rentals past their max lifetime; `observer.rs` asks providers for a look at
//! each rental's machine and records it; `launches.rs` settles launches whose answer was lost
//! by asking their node for its reconciliation.

pub mod expiry;
pub mod launches;
pub mod observer;
pub mod run_dispatch;

pub use expiry::RentedExpiry;
pub use launches::LaunchReconciler;
pub use observer::RentalObserver;
pub use run_dispatch::RunDispatcher;

use leasehold_commands::CommandError;
use leasehold_projections::ReconcileError;

/// A reconciler's command result: a refusal (the aggregate decided; permanent conflicts
/// included) leaves it for a later look, while a lost race or a store failure is tried
/// again (the batch is seen again: retrying a permanent refusal would block every rental).
pub(crate) fn settled<T, E: leasehold_domain::Refusal>(
    action: &str,
    done: Result<T, CommandError<E>>,
) -> Result<(), ReconcileError> {
    match done {
        Ok(_) => Ok(()),
        Err(
            error @ (CommandError::ConcurrencyConflict { .. }
            | CommandError::RetriesExhausted { .. }
            | CommandError::Store(_)),
        ) => Err(retry(action, &error)),
        Err(error) => {
            tracing::debug!(%error, "{action}: not now");
            Ok(())
        }
    }
}

/// A failure worth trying again.
pub(crate) fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}
