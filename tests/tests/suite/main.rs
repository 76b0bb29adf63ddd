//! Leasehold's integration tests: one binary, each test on a database of its own.

mod log;
mod migrations;
mod support;
