//! The system clock: what `serve` and every caller that does not control time hands the
//! pipeline and the reconcilers.

use chrono::{DateTime, Utc};
use leasehold_domain::{Clock, to_micros};

/// The machine's clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        to_micros(Utc::now())
    }
}
