//! Waiting for the log to grow: in-process wake-ups after commit, with polling as the fallback
//! for appends made by other processes.

use std::time::Duration;

use leasehold_domain::{Cursor, EventStore, LogPage, StoreError};

use super::PgEventStore;
use crate::limits::TAIL_POLL_INTERVAL_MILLISECONDS;

impl PgEventStore {
    /// Reads the events after `after`, waiting up to `wait_max` for at least one to become
    /// readable. An empty page means none did in time.
    pub async fn wait_for_log(
        &self,
        after: Cursor,
        limit: usize,
        wait_max: Duration,
    ) -> Result<LogPage, StoreError> {
        let deadline = tokio::time::Instant::now() + wait_max;
        let poll = Duration::from_millis(TAIL_POLL_INTERVAL_MILLISECONDS);
        let appended = self.appended();
        loop {
            // Register for the wake-up before reading, so an append that commits between the
            // read and the wait is not missed.
            let notified = appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let page = self.read_log(after, limit).await?;
            let now = tokio::time::Instant::now();
            if !page.events.is_empty() || now >= deadline {
                return Ok(page);
            }
            let wake = (now + poll).min(deadline);
            tokio::select! {
                () = &mut notified => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}
