//! One subscriber's view of the log: every event after its cursor that its scope admits, in
//! log order, each exactly once.
//!
//! The feed keeps the cursor of the last event it has accounted for (delivered or filtered
//! out). A hub batch that starts at or before that cursor is used for the events after it; a
//! batch that starts later, or a lagged receiver, means events are missing, and the feed reads
//! the log from its cursor until it has caught up. The log's order never changes once read,
//! so whichever source an event comes from, it comes once and in order.

use std::collections::VecDeque;
use std::sync::Arc;

use leasehold_adapters::PgEventStore;
use leasehold_domain::{Cursor, EventStore, RecordedEvent, StoreError, TenantId};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;

use super::hub::{Batch, PAGE_EVENTS};

/// Which events a subscriber may and wants to see.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Only this tenant's events (tenant callers); `None` for operators and auditors.
    pub tenant: Option<TenantId>,
    /// Only these stream types (empty: all).
    pub stream_types: Vec<String>,
    /// Only these streams (empty: all).
    pub stream_ids: Vec<String>,
    /// Only these event types (empty: all).
    pub event_types: Vec<String>,
}

impl Scope {
    /// Whether `event` is for this subscriber.
    pub fn admits(&self, event: &RecordedEvent) -> bool {
        let listed =
            |list: &[String], value: &str| list.is_empty() || list.iter().any(|v| v == value);
        self.tenant.as_ref().is_none_or(|tenant| *tenant == event.tenant_id)
            && listed(&self.stream_types, event.stream_type.as_str())
            && listed(&self.stream_ids, event.stream_id.as_str())
            && listed(&self.event_types, event.event_type.as_str())
    }
}

/// A subscriber's position and what it has read but not yet delivered.
#[derive(Debug)]
pub struct Feed {
    store: PgEventStore,
    live: broadcast::Receiver<Arc<Batch>>,
    scope: Scope,
    /// Every event up to here is delivered or filtered out.
    position: Cursor,
    /// Read, admitted, not yet delivered (shared with the other feeds that admit them).
    ready: VecDeque<Arc<RecordedEvent>>,
    /// Whether the log must be read before trusting the hub again.
    catching_up: bool,
}

impl Feed {
    /// A feed of the events after `position`.
    pub fn new(
        store: PgEventStore,
        live: broadcast::Receiver<Arc<Batch>>,
        scope: Scope,
        position: Cursor,
    ) -> Self {
        Self { store, live, scope, position, ready: VecDeque::new(), catching_up: true }
    }

    /// The next event, waiting for one; `None` when the hub has stopped.
    ///
    /// # Errors
    /// When the log cannot be read.
    pub async fn next(&mut self) -> Result<Option<Arc<RecordedEvent>>, StoreError> {
        loop {
            if let Some(event) = self.ready.pop_front() {
                return Ok(Some(event));
            }
            if self.catching_up {
                self.read_log().await?;
                continue;
            }
            match self.live.recv().await {
                Ok(batch) => self.take(&batch),
                Err(RecvError::Lagged(_)) => self.catching_up = true,
                Err(RecvError::Closed) => return Ok(None),
            }
        }
    }

    /// Reads one page of the log after the position; a short page means it caught up.
    async fn read_log(&mut self) -> Result<(), StoreError> {
        let page = self.store.read_log(self.position, PAGE_EVENTS).await?;
        self.catching_up = page.events.len() == PAGE_EVENTS;
        self.admit(page.events.into_iter().map(Arc::new));
        self.position = self.position.max(page.next);
        Ok(())
    }

    /// Uses a hub batch, or notices that events before it are missing.
    fn take(&mut self, batch: &Batch) {
        if batch.next <= self.position {
            return;
        }
        if batch.from > self.position {
            self.catching_up = true;
            return;
        }
        let position = self.position;
        self.admit(batch.events.iter().filter(|event| event.cursor > position).cloned());
        self.position = batch.next;
    }

    fn admit(&mut self, events: impl IntoIterator<Item = Arc<RecordedEvent>>) {
        let scope = &self.scope;
        self.ready.extend(events.into_iter().filter(|event| scope.admits(event)));
    }
}
