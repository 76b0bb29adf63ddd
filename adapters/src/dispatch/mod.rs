//! Dispatch: the outbox on the log. A command that needs an outside system records its intent
//! as an event (a lease's `LeaseProvisionRequested`, …); a dispatcher — a reconciler — reads
//! those events, keeps the work still to send in the `dispatch_outbox` table, sends it, and
//! records each attempt's answer as an event on the work's stream.
//!
//! What holds, whatever crashes when:
//! - **At least once.** Intake (event → outbox row) is idempotent and happens before the
//!   reconciler's checkpoint passes the event, so an intent is never skipped; a row stays
//!   pending until an answer is recorded, so work claimed and not answered (a crash between
//!   claiming and recording) is sent again once its claim's hold runs out; a kind's actions
//!   whose receiver refuses a repeat atomically (`RESENT_AT_ONCE`: a lease's provision and
//!   deprovision, a VM's boot and destroy, a runner's launch) are sent again at once by the next instance to
//!   take the dispatcher's lock at its first call (a claim names its instance). The
//!   receiver's duplicate must be harmless; the protocols make it so (a repeated provision is
//!   `409 already provisioned`, a repeated boot `409` and read back, a provider's listing
//!   holds what it made).
//! - **Attempt numbers are never reused.** An attempt is claimed (its number written) before
//!   it is sent, so the event recording its answer is keyed by a number no other answer
//!   has; a crash after the claim leaves a gap, never a second answer under one key.
//! - **Backoff.** A failed attempt waits `first × 2^(n-1)`, at most `max`; work the target
//!   refused without trying gives its attempt number back and waits as its kind says (the
//!   lease's: the breaker's open time while it is open, the longest backoff while the backend
//!   is fenced or unknown), never less than `first`.
//! - **Taken work is settled in time.** Work whose target must settle it by callback has a
//!   deadline from when it was taken (the lease's: 10 minutes, as fred's control plane);
//!   past it, still awaited, the kind records the lapse as the work's failure.
//! - **Nothing stale is sent.** Newer work on the same stream supersedes pending older work,
//!   and a kind checks, before sending, that its aggregate still awaits the work (a
//!   dispatcher reading old history never re-sends settled work).
//!
//! A kind of work ([`DispatchKind`]) says which events start work and how one attempt is
//! sent and recorded; `lease.rs` is the lease backends' kind. Every later kind that reaches
//! an outside system (host agents, rental providers, runner providers) is one more.

pub mod lease;
mod manifests;
mod outbox;
pub mod rental;
pub mod runner;
pub mod snapshot;
pub mod vm;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_domain::{EventId, RecordedEvent, StreamId, TenantId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

pub(crate) use lease::wire_items;
pub use lease::{Backends, CALLBACK_DEADLINE, CallbackUrls, LeaseDispatch};
pub use manifests::ManifestVault;
pub use outbox::{OutboxRow, PgOutbox};
pub use rental::{Providers, RentalDispatch};
pub use runner::{RunnerDispatch, RunnerNodes};
pub use snapshot::SnapshotDispatch;
pub use vm::VmDispatch;

use crate::limits::{
    DISPATCH_CLAIM_ROWS_MAX, DISPATCH_CONCURRENCY_MAX, DISPATCH_RETRY_FIRST_MILLISECONDS,
    DISPATCH_RETRY_MAX_MILLISECONDS,
};

/// How soon a dispatcher looks at its outbox again while sends run.
const SETTLE_LOOK_MILLISECONDS: i64 = 50;

/// Work an event started, as its kind describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Intent {
    /// The stream whose event started it.
    pub stream: StreamId,
    /// The work's generation on that stream (its name there).
    pub generation: u64,
    /// The event that started it.
    pub event_id: EventId,
    /// The stream's tenant.
    pub tenant: TenantId,
    /// Who is called (a backend's name).
    pub target: String,
    /// What is asked of it (`provision`, `restart`, …).
    pub action: &'static str,
    /// What the kind needs to make the call; never a secret.
    pub request: serde_json::Value,
}

impl Intent {
    /// The work `event` starts on its stream: `action` on `target`, asking `request`. One
    /// piece of work per event: its version names it on the stream.
    pub fn of(
        event: &RecordedEvent,
        (target, action): (String, &'static str),
        request: serde_json::Value,
    ) -> Self {
        Self {
            stream: event.stream_id.clone(),
            generation: event.version,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target,
            action,
            request,
        }
    }
}

/// Work due, with the attempt number claimed for this send.
#[derive(Debug, Clone, PartialEq)]
pub struct Work {
    /// The stream.
    pub stream: StreamId,
    /// The work's generation.
    pub generation: u64,
    /// The stream's tenant.
    pub tenant: TenantId,
    /// Who is called.
    pub target: String,
    /// What is asked.
    pub action: String,
    /// The kind's request.
    pub request: serde_json::Value,
    /// This attempt's number, from 1.
    pub attempt: u32,
}

/// How one attempt ended, as the kind recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// The target took the work: it is not sent again.
    Delivered,
    /// The target refused it for good (recorded on the stream): it is not sent again.
    Refused,
    /// The stream no longer awaits this work (settled, or newer work started): dropped.
    Moot,
    /// No usable answer (recorded on the stream): sent again after a backoff.
    Failed {
        /// Operator-only detail.
        detail: String,
    },
    /// Not sent at all (the target's breaker is open, it is fenced, or it is unknown): the
    /// attempt number is given back and the work waits `wait` (at least the backoff's first).
    NotSent {
        /// Operator-only detail.
        detail: String,
        /// How long to wait before trying again.
        wait: Duration,
    },
}

/// A kind of work a dispatcher sends.
pub trait DispatchKind: Send + Sync + 'static {
    /// The dispatcher's name (its reconciler name: lock, checkpoint, outbox rows).
    const NAME: &'static str;
    /// The version of what its checkpoint means.
    const VERSION: u32;
    /// Actions whose work runs beside its stream's other work, superseding nothing and
    /// superseded by nothing (each is its own request, not a newer state of the stream's).
    const BESIDE: &'static [&'static str] = &[];

    /// The actions whose work a gone instance left claimed mid-send is sent again at once by
    /// the next instance to take the lock, rather than after the claim's hold. Only actions
    /// whose receiver refuses a repeat of the same work as one atomic check (the same name or
    /// lease answered 409, a delete of what is gone): the first send may still be running at
    /// the receiver (the process that made it lost its session but lives, or was killed while
    /// its request was being handled), and a repeat racing it must change nothing. A receiver
    /// that looks first and then acts (a listing, then a provision) would act twice.
    const RESENT_AT_ONCE: &'static [&'static str] = &[];

    /// The work `event` starts, if it starts any that is still awaited.
    fn intent(
        &self,
        event: &RecordedEvent,
    ) -> impl Future<Output = Result<Option<Intent>, ReconcileError>> + Send;

    /// Sends one attempt of `work` and records its answer on the work's stream.
    fn send(
        &self,
        work: &Work,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Sent, ReconcileError>> + Send;

    /// How long the target has to settle work `action` after taking it (by callback), if it
    /// must settle it at all.
    fn answer_within(&self, _action: &str) -> Option<TimeDelta> {
        None
    }

    /// How long a claimed piece of work is held (not due again) while its send runs: longer
    /// than any send takes. A process that dies mid-send leaves it to be sent after that.
    fn claim_hold(&self) -> Duration {
        Duration::from_millis(DISPATCH_RETRY_MAX_MILLISECONDS)
    }

    /// `work` was taken and not settled by its deadline: records the lapse as the work's
    /// failure if its aggregate still awaits it, and says whether it did.
    fn lapsed(
        &self,
        _work: &Work,
        _now: DateTime<Utc>,
    ) -> impl Future<Output = Result<bool, ReconcileError>> + Send {
        std::future::ready(Ok(false))
    }
}

/// Retry timings of a dispatcher.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    /// The wait after a first failure, and after a send the target refused to try.
    pub first: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(DISPATCH_RETRY_FIRST_MILLISECONDS),
            max: Duration::from_millis(DISPATCH_RETRY_MAX_MILLISECONDS),
        }
    }
}

impl Backoff {
    /// The wait after failed attempt `attempt` (from 1).
    pub fn after(&self, attempt: u32) -> TimeDelta {
        let doublings = attempt.saturating_sub(1).min(20);
        let wait = self.first.saturating_mul(1 << doublings).min(self.max);
        TimeDelta::from_std(wait).unwrap_or(TimeDelta::MAX)
    }
}

/// The reconciler that sends kind `K`'s work.
///
/// Its calls take work in and start sends; they never wait for a send. Each send runs on its
/// own task and settles its outbox row when its answer is recorded, so a lease requested
/// while others are being sent is taken in and sent at once, not after them. A claimed row is
/// held (not due) for the kind's `claim_hold`, so this instance never sends a row twice at
/// once; a process that dies mid-send leaves it to the next instance, which sends it again
/// after the hold, or at its first call for a `RESENT_AT_ONCE` action.
#[derive(Debug)]
pub struct Dispatcher<K> {
    parts: Arc<Parts<K>>,
    /// When its outbox next has something due, as last read: a call with no new work before
    /// then asks the outbox nothing (most events a dispatcher reads start no work). Only this
    /// instance writes its rows (the reconciler's lock), and its sends mark it stale.
    next_due: std::sync::Mutex<Option<Option<DateTime<Utc>>>>,
    /// Set by every send that settled: the outbox moved since `next_due` was read.
    settled: Arc<AtomicBool>,
    /// Sends running now.
    running: Arc<AtomicUsize>,
    sends: std::sync::Mutex<tokio::task::JoinSet<()>>,
    /// This instance, as its claims name it.
    instance: uuid::Uuid,
    /// Whether it has freed the claims an earlier instance left (at its first call).
    adopted: AtomicBool,
}

/// What a dispatcher's sends share.
#[derive(Debug)]
struct Parts<K> {
    kind: K,
    outbox: PgOutbox,
    backoff: Backoff,
}

impl<K: DispatchKind> Dispatcher<K> {
    /// A dispatcher of `kind`'s work, keeping its outbox in `outbox`.
    pub fn new(kind: K, outbox: PgOutbox, backoff: Backoff) -> Self {
        Self {
            parts: Arc::new(Parts { kind, outbox, backoff }),
            next_due: std::sync::Mutex::new(None),
            settled: Arc::default(),
            running: Arc::default(),
            sends: std::sync::Mutex::new(tokio::task::JoinSet::new()),
            instance: uuid::Uuid::now_v7(),
            adopted: AtomicBool::new(false),
        }
    }

    /// At this instance's first call: frees the work of [`DispatchKind::RESENT_AT_ONCE`]
    /// actions an earlier instance claimed and never settled (it died mid-send, or lost its
    /// session and with it the lock this instance now holds): due at once rather than after
    /// the claim's hold. Sent again, it meets the receiver's atomic duplicate check (a boot's
    /// 409, a provision's `409 already provisioned`). Other actions wait out the hold.
    async fn adopt_orphaned_claims(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        if self.adopted.load(Ordering::SeqCst) {
            return Ok(());
        }
        let outbox = &self.parts.outbox;
        let freed = if K::RESENT_AT_ONCE.is_empty() {
            0
        } else {
            outbox.free_claims_of_others((K::NAME, self.instance), K::RESENT_AT_ONCE, now).await?
        };
        if freed > 0 {
            tracing::info!(
                dispatcher = K::NAME,
                freed,
                "work an earlier instance left mid-send is sent again now"
            );
        }
        self.adopted.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Claims the work due at `now`, as much as the sends running leave room for, and starts
    /// its sends.
    async fn send_due(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        let room = DISPATCH_CONCURRENCY_MAX.saturating_sub(self.running.load(Ordering::SeqCst));
        if room == 0 {
            return Ok(());
        }
        let hold =
            now + TimeDelta::from_std(self.parts.kind.claim_hold()).unwrap_or(TimeDelta::MAX);
        let limit = room.min(DISPATCH_CLAIM_ROWS_MAX);
        let due = self.parts.outbox.claim_due((K::NAME, self.instance), now, limit, hold).await?;
        let mut sends = self.sends.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        while sends.try_join_next().is_some() {}
        for work in due {
            self.running.fetch_add(1, Ordering::SeqCst);
            let (parts, running, settled) =
                (Arc::clone(&self.parts), Arc::clone(&self.running), Arc::clone(&self.settled));
            sends.spawn(async move {
                if let Err(error) = parts.send_one(&work, now).await {
                    tracing::warn!(dispatcher = K::NAME, stream = %work.stream, %error, "a send did not settle; it is sent again after its hold");
                }
                settled.store(true, Ordering::SeqCst);
                running.fetch_sub(1, Ordering::SeqCst);
            });
        }
        Ok(())
    }
}

impl<K: DispatchKind> Parts<K> {
    /// Handles the deadlines of taken work that passed by `now`: each lapse is recorded by
    /// the kind (if the work is still awaited), then the row is marked so it is not handled
    /// again; a crash in between handles it again under the same key.
    async fn lapse_overdue(&self, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        for work in self.outbox.overdue(K::NAME, now, DISPATCH_CLAIM_ROWS_MAX).await? {
            let lapsed = self.kind.lapsed(&work, now).await?;
            if lapsed {
                tracing::warn!(dispatcher = K::NAME, stream = %work.stream, action = %work.action, "no answer in time: the work failed");
            }
            self.outbox.lapse((&work.stream, work.generation), lapsed).await?;
        }
        Ok(())
    }

    async fn send_one(&self, work: &Work, now: DateTime<Utc>) -> Result<(), ReconcileError> {
        match self.kind.send(work, now).await {
            Ok(sent) => self.settle(work, sent, now).await,
            // One piece of work that cannot be recorded waits like a failed attempt; it never
            // holds the dispatcher's checkpoint (and every other intake) back.
            Err(ReconcileError::Retry { action, reason }) => {
                tracing::warn!(dispatcher = K::NAME, stream = %work.stream, %action, %reason, "dispatch not recorded");
                let detail = format!("{action}: {reason}");
                self.settle(work, Sent::Failed { detail }, now).await
            }
            Err(error) => Err(error),
        }
    }

    async fn settle(
        &self,
        work: &Work,
        sent: Sent,
        now: DateTime<Utc>,
    ) -> Result<(), ReconcileError> {
        let key = (&work.stream, work.generation);
        match sent {
            Sent::Delivered => {
                let answer_by = self.kind.answer_within(&work.action).map(|within| now + within);
                self.outbox.deliver(key, now, answer_by).await?;
            }
            Sent::Refused => self.outbox.finish(key, "refused", now).await?,
            Sent::Moot => self.outbox.finish(key, "superseded", now).await?,
            Sent::Failed { detail } => {
                let next = now + self.backoff.after(work.attempt);
                self.outbox.retry(key, work.attempt, next, &detail).await?;
            }
            Sent::NotSent { detail, wait } => {
                let wait = TimeDelta::from_std(wait).unwrap_or(TimeDelta::MAX);
                let next = now + self.backoff.after(1).max(wait);
                self.outbox.give_back(key, work.attempt, next, &detail).await?;
            }
        }
        Ok(())
    }
}

impl<K: DispatchKind> Reconciler for Dispatcher<K> {
    const NAME: &'static str = K::NAME;
    const VERSION: u32 = K::VERSION;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        // Each intake may read its aggregate: all of a batch's are read at once (the pool
        // bounds how many run), keeping the log's order.
        let mut intakes = Vec::with_capacity(seen.events.len());
        for event in seen.events {
            intakes.push(self.parts.kind.intent(event));
        }
        let intents: Vec<Intent> =
            futures_util::future::try_join_all(intakes).await?.into_iter().flatten().collect();
        let settled = self.settled.swap(false, Ordering::SeqCst);
        let known = *self.next_due.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(next) = known.filter(|_| intents.is_empty() && !settled)
            && next.is_none_or(|next| seen.now < next)
        {
            return Ok(self.while_sending(next, seen.now));
        }
        // Until it is read again, unknown: a failure below leaves the next call to ask.
        *self.next_due.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let outbox = &self.parts.outbox;
        outbox.enqueue_beside(K::NAME, (&intents, K::BESIDE), seen.now).await?;
        self.adopt_orphaned_claims(seen.now).await?;
        self.send_due(seen.now).await?;
        let mut times = self.parts.outbox.next_times(K::NAME).await?;
        // Deadlines are rare: looked at only when one has passed.
        if times.1.is_some_and(|deadline| deadline <= seen.now) {
            self.parts.lapse_overdue(seen.now).await?;
            times = self.parts.outbox.next_times(K::NAME).await?;
        }
        let next = outbox::earliest(times);
        *self.next_due.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        Ok(self.while_sending(next, seen.now))
    }
}

impl<K: DispatchKind> Dispatcher<K> {
    /// The next call: `next`, or sooner while sends run, since a send that settles moves the
    /// outbox without an event to wake the runner (a send not made, work handed out).
    fn while_sending(
        &self,
        next: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        if self.running.load(Ordering::SeqCst) == 0 && !self.settled.load(Ordering::SeqCst) {
            return next;
        }
        let soon = now + TimeDelta::milliseconds(SETTLE_LOOK_MILLISECONDS);
        Some(next.map_or(soon, |next| next.min(soon)))
    }
}
