//! The hub: one task per process reads the log after its position and broadcasts each page.
//! Pages chain (`from` is the previous page's `next`), so a receiver can tell when it missed
//! one. It wakes on this process's appends and polls for other processes'.

use std::sync::Arc;
use std::time::Duration;

use leasehold_adapters::PgEventStore;
use leasehold_domain::{Cursor, EventStore, RecordedEvent};
use tokio::sync::{broadcast, watch};

/// Events read in one page.
pub const PAGE_EVENTS: usize = 1_000;

/// Pages a receiver may fall behind before it lags (and catches up from the log instead).
const BACKLOG_PAGES: usize = 256;

/// How long a failed read waits before trying again.
const RETRY_WAIT: Duration = Duration::from_millis(500);

/// Consecutive events of the log: everything after `from` up to and including `next`.
#[derive(Debug)]
pub struct Batch {
    /// The cursor the page was read after.
    pub from: Cursor,
    /// The events, in log order (never empty); shared by every subscriber's feed.
    pub events: Vec<Arc<RecordedEvent>>,
    /// The last event's cursor.
    pub next: Cursor,
}

/// The broadcasting side; cheap to clone.
#[derive(Debug, Clone)]
pub struct Hub {
    sender: broadcast::Sender<Arc<Batch>>,
}

impl Hub {
    /// Starts tailing the log from its head, until `stopping` turns true.
    pub fn start(store: PgEventStore, poll: Duration, stopping: watch::Receiver<bool>) -> Self {
        let (sender, _) = broadcast::channel(BACKLOG_PAGES);
        tokio::spawn(tail(store, poll, sender.clone(), stopping));
        Self { sender }
    }

    /// Receives every batch broadcast from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Batch>> {
        self.sender.subscribe()
    }
}

async fn tail(
    store: PgEventStore,
    poll: Duration,
    sender: broadcast::Sender<Arc<Batch>>,
    mut stopping: watch::Receiver<bool>,
) {
    let appended = store.appended();
    let mut position = None;
    while !*stopping.borrow() {
        // Registered before reading, so an append that commits during the read still wakes us.
        let notified = appended.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let wait = match read(&store, &mut position).await {
            Ok(Some(batch)) => {
                // No receivers is fine: nobody is subscribed right now.
                let _ = sender.send(Arc::new(batch));
                continue;
            }
            Ok(None) => poll,
            Err(error) => {
                tracing::warn!(%error, "the live hub could not read the log; retrying");
                RETRY_WAIT
            }
        };
        tokio::select! {
            () = &mut notified => {}
            () = tokio::time::sleep(wait) => {}
            _ = stopping.changed() => {}
        }
    }
}

/// The next page after `position` (starting at the head), if any.
async fn read(
    store: &PgEventStore,
    position: &mut Option<Cursor>,
) -> Result<Option<Batch>, leasehold_domain::StoreError> {
    let from = match *position {
        Some(from) => from,
        None => *position.insert(store.head().await?),
    };
    let page = store.read_log(from, PAGE_EVENTS).await?;
    *position = Some(page.next);
    let events: Vec<_> = page.events.into_iter().map(Arc::new).collect();
    Ok((!events.is_empty()).then_some(Batch { from, events, next: page.next }))
}
