//! Rented capacity's reconcilers: `run_dispatch.rs` starts runs' attempts when their booking
//! runs and their rental's node is ready; `expiry.rs` loses nodes whose lease passed and
//! terminates rentals past their max lifetime.

pub mod expiry;
pub mod run_dispatch;

pub use expiry::RentedExpiry;
pub use run_dispatch::RunDispatcher;
