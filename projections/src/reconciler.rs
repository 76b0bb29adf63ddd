//! Reconcilers: the log's other readers, which act instead of projecting. Each reads the
//! gap-safe log from its own checkpoint, in bounded batches, and is also woken on a tick it
//! asks for; it acts by issuing commands through the pipeline and by calling outside systems.
//!
//! What keeps acting safe:
//! - **Never twice.** The checkpoint moves only after a batch's actions are done, so a
//!   reconciler that stops mid-batch sees the batch again; every command it issues carries an
//!   operation key derived from what it saw ([`operation_key`]), so the pipeline answers a
//!   repeated command with its recorded outcome instead of acting again. Outside calls are
//!   at-least-once; the reconciler records them as events keyed the same way.
//! - **One instance.** A session advisory lock per reconciler: a second instance (another
//!   process, or a restart overlapping the old one) waits until the first lets go.
//! - **Time comes from the clock it is given.** The runner asks the clock what time it is and
//!   hands that to the reconciler, which passes it on; the pipeline decides at the same clock
//!   (`CommandPipeline::with_clock`). Tests hand both a [`crate::ManualClock`] and advance it.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_domain::{Clock, Cursor, OperationKey, RecordedEvent, StoreError};
use tokio::sync::{Notify, watch};

use crate::limits::{
    BATCH_EVENTS_DEFAULT, POLL_INTERVAL_MILLISECONDS, RETRY_INTERVAL_MILLISECONDS,
};
use crate::port::{ReconcilerSession, ReconcilerStore};
use crate::runtime::{RunnerStats, end_session};

/// What a reconciler is shown on one call: the events after its checkpoint (none on a tick)
/// and the time.
#[derive(Debug, Clone, Copy)]
pub struct Seen<'a> {
    /// The next events of the log, in commit order (empty when only a tick is due).
    pub events: &'a [RecordedEvent],
    /// The clock's time when the call began.
    pub now: DateTime<Utc>,
}

/// Why a reconciler's call did not finish: the runner starts again from the checkpoint.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The log or the database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An action failed in a way worth trying again: an outside system did not answer, a
    /// command lost its race too often. The batch is seen again.
    #[error("{action}: {reason}")]
    Retry {
        /// What the reconciler was doing.
        action: String,
        /// Why it failed, for the log (never a secret).
        reason: String,
    },
}

/// One reconciler: a name, a version, and what it does with what it saw.
pub trait Reconciler: Send + Sync + 'static {
    /// Its name: its lock, its checkpoint row and its line in `projections status`.
    const NAME: &'static str;
    /// The version of what its checkpoint means; a checkpoint of another version is refused.
    const VERSION: u32;

    /// Acts on `seen` and says when it next wants a tick with no new event (`None`: only
    /// when events arrive). Called with the events after the checkpoint, and with none when
    /// a tick is due; every call is also a tick (whatever is due at `seen.now` is due then).
    /// Every action must be safe to repeat (see the module's doc).
    fn reconcile(
        &self,
        seen: Seen<'_>,
    ) -> impl Future<Output = Result<Option<DateTime<Utc>>, ReconcileError>> + Send;
}

/// The operation key of `action` taken because the reconciler saw `event`: the same on every
/// pass over the same event, so a repeated command is recognised as the same command.
pub fn operation_key(reconciler: &str, action: &str, event: &RecordedEvent) -> OperationKey {
    let key = format!("{reconciler}:{action}:{}", event.event_id);
    OperationKey::parse(&key).expect("reconciler and action names are names, an event id is hex")
}

/// Settings of a reconciler runner.
#[derive(Debug, Clone)]
pub struct ReconcilerConfig {
    /// The clock handed to the reconciler.
    pub clock: Arc<dyn Clock>,
    /// Notified when `clock` moves by other means than time passing (a test's
    /// [`crate::ManualClock`]); `None` for the system clock.
    pub clock_moved: Option<Arc<Notify>>,
    /// Most events per call.
    pub batch_events: usize,
    /// How often to look for other processes' appends.
    pub poll_interval: Duration,
    /// How long to wait after a failure or while another instance holds the lock.
    pub retry_interval: Duration,
}

impl ReconcilerConfig {
    /// The default settings over `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            clock_moved: None,
            batch_events: BATCH_EVENTS_DEFAULT,
            poll_interval: Duration::from_millis(POLL_INTERVAL_MILLISECONDS),
            retry_interval: Duration::from_millis(RETRY_INTERVAL_MILLISECONDS),
        }
    }
}

/// Runs reconciler `R` over store `S` until shutdown.
#[derive(Debug)]
pub struct ReconcilerRunner<R, S> {
    reconciler: R,
    store: S,
    config: ReconcilerConfig,
    stats: Arc<RunnerStats>,
    checkpoint: watch::Sender<Option<Cursor>>,
}

impl<R: Reconciler, S: ReconcilerStore> ReconcilerRunner<R, S> {
    /// A runner of `reconciler` over `store`.
    pub fn new(reconciler: R, store: S, config: ReconcilerConfig) -> Self {
        let (checkpoint, _) = watch::channel(None);
        Self { reconciler, store, config, stats: Arc::default(), checkpoint }
    }

    /// The checkpoint as this runner last read or moved it.
    pub fn checkpoints(&self) -> watch::Receiver<Option<Cursor>> {
        self.checkpoint.subscribe()
    }

    /// Its counters (`events` counts events acted on, `batches` calls that finished).
    pub fn stats(&self) -> Arc<RunnerStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `shutdown` becomes true; a call in progress is finished or, if it fails,
    /// seen again by the next session.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let outcome = match self.store.lock_reconciler(R::NAME, R::VERSION).await {
                Ok(Some(session)) => self.drive(session, &mut shutdown).await.map(|()| true),
                Ok(None) => Ok(false),
                Err(error) => Err(error.into()),
            };
            let what = ("reconciler", R::NAME);
            if !end_session(&self.stats, what, outcome, self.config.retry_interval, &mut shutdown)
                .await
            {
                break;
            }
        }
    }

    /// Calls the reconciler on one locked session until shutdown or an error. A session
    /// starts with a tick, so time-based work is looked at again after every restart.
    async fn drive(
        &self,
        mut session: S::Session,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), ReconcileError> {
        let mut checkpoint = session.checkpoint().await?;
        self.checkpoint.send_replace(checkpoint);
        let appended = self.store.appended();
        let never = Arc::new(Notify::new());
        let moved = self.config.clock_moved.clone().unwrap_or(never);
        let mut tick_at = Some(self.config.clock.now());
        while !*shutdown.borrow() {
            // Register for both wake-ups before reading, so an append or a clock move between
            // the read and the wait is not missed.
            let (notified, clock_moved) = (appended.notified(), moved.notified());
            tokio::pin!(notified, clock_moved);
            notified.as_mut().enable();
            clock_moved.as_mut().enable();
            let page = self
                .store
                .read_log(checkpoint.unwrap_or(Cursor::START), self.config.batch_events)
                .await?;
            let now = self.config.clock.now();
            let due = tick_at.is_some_and(|at| at <= now);
            if page.events.is_empty() && !due {
                let until_due = tick_at
                    .and_then(|at| (at - now).to_std().ok())
                    .map_or(self.config.poll_interval, |d| d.min(self.config.poll_interval));
                tokio::select! {
                    () = &mut notified => {}
                    () = &mut clock_moved => {}
                    () = tokio::time::sleep(until_due) => {}
                    changed = shutdown.changed() => if changed.is_err() { break },
                }
                continue;
            }
            tick_at = self.reconciler.reconcile(Seen { events: &page.events, now }).await?;
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            if !page.events.is_empty() {
                let count = page.events.len() as u64;
                session.advance(checkpoint, page.next, count).await?;
                checkpoint = Some(page.next);
                // Counted before the checkpoint is published, as in the projection runner.
                self.stats.events.fetch_add(count, Ordering::Relaxed);
                self.checkpoint.send_replace(checkpoint);
            }
        }
        Ok(())
    }
}

/// When a sweeping reconciler sweeps next: every `every`, and at once the first time. A
/// reconciler is also called for its batches of events; the schedule keeps those calls from
/// sweeping again before the sweep is due.
#[derive(Debug)]
pub struct SweepSchedule {
    every: TimeDelta,
    next: std::sync::Mutex<Option<DateTime<Utc>>>,
}

impl SweepSchedule {
    /// A sweep every `every`.
    pub fn every(every: TimeDelta) -> Self {
        Self { every, next: std::sync::Mutex::new(None) }
    }

    /// `Ok(next)` when a sweep is due at `now` (the next one then scheduled at `next`), or
    /// `Err(scheduled)` when the scheduled one is still ahead.
    ///
    /// # Errors
    /// The sweep scheduled, when it is not due yet.
    pub fn due(&self, now: DateTime<Utc>) -> Result<DateTime<Utc>, DateTime<Utc>> {
        let mut next = self.next.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match *next {
            Some(at) if now < at => Err(at),
            _ => {
                let at = now + self.every;
                *next = Some(at);
                Ok(at)
            }
        }
    }
}
