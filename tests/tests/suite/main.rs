//! Leasehold's integration tests: one binary, each test on a database of its own.

mod commands;
mod dispatch;
mod fleet;
mod hammer;
mod late_retries;
mod log;
mod migrations;
mod projections;
mod reaping;
mod reconcilers;
mod rented;
mod runners;
mod support;
