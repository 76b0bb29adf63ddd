//! The clock port. Nothing in this crate reads it: the pipeline reads it once per command and
//! hands the time to `decide` in the [`crate::Context`], and reconcilers read it to know what
//! is due. Implemented outside (the system clock in `leasehold-commands`, a controlled clock
//! for tests in `leasehold-projections`), so a test decides when time passes.

use std::fmt::Debug;

use chrono::{DateTime, Utc};

/// The time, as the process or a test says it is.
pub trait Clock: Debug + Send + Sync + 'static {
    /// Now, to the microsecond (what the log stores, so decisions replay exactly).
    fn now(&self) -> DateTime<Utc>;
}

/// `at` cut to the microsecond.
pub fn to_micros(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(at.timestamp_micros()).unwrap_or(at)
}
