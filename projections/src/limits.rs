//! The runtime's limits, with units in the names.

/// Events per batch: one read, one transaction.
pub const BATCH_EVENTS_DEFAULT: usize = 1_000;

/// How often a runner looks for events appended by other processes.
pub const POLL_INTERVAL_MILLISECONDS: u64 = 250;

/// How long a runner waits before trying again after losing its connection, or while another
/// runner holds the lock.
pub const RETRY_INTERVAL_MILLISECONDS: u64 = 500;
