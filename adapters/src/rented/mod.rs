//! Rented capacity's reconcilers: `run_dispatch.rs` starts runs' attempts when their booking
//! runs and their rental's node is ready.

pub mod run_dispatch;

pub use run_dispatch::RunDispatcher;
