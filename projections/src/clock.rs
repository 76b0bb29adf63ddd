//! A clock a test moves by hand. Reconcilers wake when it moves, so a test drives time-based
//! work (grace expiry, retries, reaping) by advancing it, never by sleeping.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_domain::{Clock, to_micros};
use tokio::sync::Notify;

/// A clock that stands still until [`ManualClock::advance`] moves it.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
    moved: Arc<Notify>,
}

impl ManualClock {
    /// A clock standing at `start` (cut to the microsecond).
    pub fn at(start: DateTime<Utc>) -> Arc<Self> {
        Arc::new(Self { now: Mutex::new(to_micros(start)), moved: Arc::default() })
    }

    /// Moves the clock forward by `by` and wakes every reconciler waiting on it.
    pub fn advance(&self, by: TimeDelta) {
        {
            let mut now = self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *now += by;
        }
        self.moved.notify_waiters();
    }

    /// Notified whenever the clock moves: hand it to a reconciler runner
    /// ([`crate::ReconcilerConfig::clock_moved`]).
    pub fn moved(&self) -> Arc<Notify> {
        Arc::clone(&self.moved)
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
