//! The runner: one per projection (the lock makes sure of it), reading the gap-safe log from
//! its checkpoint in bounded batches, each committed with its read-model changes in one
//! transaction. It wakes when this process appends, polls for other processes' appends, and
//! after losing its connection starts again from the committed checkpoint.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_domain::{Cursor, StoreError};
use tokio::sync::watch;

use crate::limits::{
    BATCH_EVENTS_DEFAULT, POLL_INTERVAL_MILLISECONDS, RETRY_INTERVAL_MILLISECONDS,
};
use crate::port::{ProjectionSession, ProjectionStore};
use crate::projection::{Projection, ProjectionError, apply_batch, keys_of};

/// Settings of a runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunnerConfig {
    /// Most events per batch.
    pub batch_events: usize,
    /// How often to look for other processes' appends.
    pub poll_interval: Duration,
    /// How long to wait after a failure or while another runner holds the lock.
    pub retry_interval: Duration,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        Self {
            batch_events: BATCH_EVENTS_DEFAULT,
            poll_interval: Duration::from_millis(POLL_INTERVAL_MILLISECONDS),
            retry_interval: Duration::from_millis(RETRY_INTERVAL_MILLISECONDS),
        }
    }
}

/// What went wrong in one session; the runner logs it and starts again.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Projection(#[from] ProjectionError),
}

/// Counters a runner keeps for status and metrics.
#[derive(Debug, Default)]
pub struct RunnerStats {
    /// Events applied (or skipped as not the projection's) since start.
    pub events: AtomicU64,
    /// Batches committed since start.
    pub batches: AtomicU64,
    /// Sessions that ended in an error.
    pub failures: AtomicU64,
    /// Notified whenever a session ends in an error.
    pub failed: tokio::sync::Notify,
    /// The error the last failed session ended in.
    pub last_error: std::sync::Mutex<Option<String>>,
    /// Times its lock was held by another instance when it tried to take it.
    pub lock_misses: AtomicU64,
    /// Notified whenever it finds its lock held by another instance.
    pub lock_missed: tokio::sync::Notify,
}

impl RunnerStats {
    /// Counts a failed session and remembers its error.
    pub(crate) fn record_failure(&self, error: &dyn std::fmt::Display) {
        let mut last = self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *last = Some(error.to_string());
        drop(last);
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.failed.notify_waiters();
    }

    /// Counts a lock found held by another instance.
    pub(crate) fn record_lock_miss(&self) {
        self.lock_misses.fetch_add(1, Ordering::Relaxed);
        self.lock_missed.notify_waiters();
    }

    /// Waits until its lock has been found held by another instance at least `count` times.
    pub async fn wait_for_lock_misses(&self, count: u64) {
        loop {
            let missed = self.lock_missed.notified();
            tokio::pin!(missed);
            missed.as_mut().enable();
            if self.lock_misses.load(Ordering::Relaxed) >= count {
                return;
            }
            missed.await;
        }
    }

    /// The error the last failed session ended in, if any did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Waits until at least `count` sessions have ended in an error.
    pub async fn wait_for_failures(&self, count: u64) {
        loop {
            // Register before checking, so a failure between the check and the wait is seen.
            let failed = self.failed.notified();
            tokio::pin!(failed);
            failed.as_mut().enable();
            if self.failures.load(Ordering::Relaxed) >= count {
                return;
            }
            failed.await;
        }
    }
}

/// What ends every session of a runner (a projection's or a reconciler's): a lock found held
/// is counted, a failure counted and logged, then the retry interval waited out. `false` when
/// the runner must stop: shutdown, or its sender dropped (never spun on).
pub(crate) async fn end_session<E: std::fmt::Display>(
    stats: &RunnerStats,
    (kind, name): (&'static str, &'static str),
    outcome: Result<bool, E>,
    retry_interval: Duration,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    match outcome {
        Ok(true) => {}
        Ok(false) => stats.record_lock_miss(),
        Err(error) => {
            stats.record_failure(&error);
            tracing::warn!(kind, name, %error, "runner restarts");
        }
    }
    if *shutdown.borrow() {
        return false;
    }
    !matches!(tokio::time::timeout(retry_interval, shutdown.changed()).await, Ok(Err(_)))
}

/// Runs projection `P` over store `S` until shutdown.
#[derive(Debug)]
pub struct Runner<P, S> {
    projection: P,
    store: S,
    config: RunnerConfig,
    stats: Arc<RunnerStats>,
    checkpoint: watch::Sender<Option<Cursor>>,
    /// A failure was recorded and not cleared yet.
    failing: std::sync::atomic::AtomicBool,
}

/// Idle polls between two re-reads of the checkpoint (about 2 s at the default interval).
const IDLE_POLLS_PER_CHECK: u32 = 8;

impl<P: Projection, S: ProjectionStore<P>> Runner<P, S> {
    /// A runner of `projection` over `store`.
    pub fn new(projection: P, store: S, config: RunnerConfig) -> Self {
        let (checkpoint, _) = watch::channel(None);
        Self {
            projection,
            store,
            config,
            stats: Arc::default(),
            checkpoint,
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The checkpoint as this runner last read or committed it: wait on it to know the read
    /// models have reached a cursor (read-your-writes).
    pub fn checkpoints(&self) -> watch::Receiver<Option<Cursor>> {
        self.checkpoint.subscribe()
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<RunnerStats> {
        Arc::clone(&self.stats)
    }

    /// Runs until `shutdown` becomes true. A batch in progress either commits whole or not
    /// at all, so stopping never loses or repeats an event's effect.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let outcome = match self.store.lock().await {
                Ok(Some(session)) => self.drive(session, &mut shutdown).await.map(|()| true),
                Ok(None) => Ok(false),
                Err(error) => Err(error.into()),
            };
            if let Err(error) = &outcome {
                let position = match error {
                    SessionError::Projection(error) => Some(error.position),
                    SessionError::Store(_) => None,
                };
                self.store.record_failure(&error.to_string(), position).await;
                self.failing.store(true, Ordering::Relaxed);
            }
            let what = ("projection", P::NAME);
            if !end_session(&self.stats, what, outcome, self.config.retry_interval, &mut shutdown)
                .await
            {
                break;
            }
        }
    }

    /// Clears a recorded failure once the runner applies (or has caught up with) the log.
    async fn cleared(&self) {
        if self.failing.swap(false, Ordering::Relaxed) {
            self.store.clear_failure().await;
        }
    }

    /// Applies batches on one locked session until shutdown or an error.
    async fn drive(
        &self,
        mut session: S::Session,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Result<(), SessionError> {
        let mut checkpoint = session.checkpoint().await?;
        self.checkpoint.send_replace(checkpoint);
        let appended = self.store.appended();
        let mut idle_polls = 0;
        while !*shutdown.borrow() {
            // Register for the wake-up before reading, so an append committed between the read
            // and the wait is not missed.
            let notified = appended.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let after = checkpoint.unwrap_or(Cursor::START);
            let page = self.store.read_log(after, self.config.batch_events).await?;
            if page.events.is_empty() {
                self.cleared().await;
                tokio::select! {
                    () = &mut notified => {}
                    () = tokio::time::sleep(self.config.poll_interval) => {
                        // Idle: the checkpoint may have been moved under this session (a
                        // rebuild's switch or a rollback to a kept build), now and then
                        // looked at again. A new session starts from wherever it now is.
                        idle_polls += 1;
                        if idle_polls % IDLE_POLLS_PER_CHECK == 0
                            && session.checkpoint().await? != checkpoint
                        {
                            return Ok(());
                        }
                    }
                    changed = shutdown.changed() => if changed.is_err() { break },
                }
                continue;
            }
            let views = session.views(&keys_of(&self.projection, &page.events)).await?;
            // A rebuild switched in (or a rollback) after this page was read would hand it
            // views already past its events, which a fold must never see: looked at once the
            // views are read, the checkpoint says so, and a new session starts from wherever
            // it now is. (A switch after this look is refused at the commit.)
            if session.checkpoint().await? != checkpoint {
                return Ok(());
            }
            let changes = apply_batch(&self.projection, views, &page.events)?;
            let count = page.events.len() as u64;
            session.commit(checkpoint, page.next, count, changes).await?;
            checkpoint = Some(page.next);
            self.cleared().await;
            // Counted before the checkpoint is published: whoever wakes on the checkpoint
            // reads counts that include this batch.
            self.stats.events.fetch_add(count, Ordering::Relaxed);
            self.stats.batches.fetch_add(1, Ordering::Relaxed);
            self.checkpoint.send_replace(checkpoint);
        }
        Ok(())
    }
}
