//! The command pipeline: load the aggregate, decide, append with the ledger row.
//!
//! The checks run in the order of DOMAIN.md §0: the idempotency ledger, the stream version,
//! then the aggregate's own fence and state guards inside `decide`. The ledger is not read
//! before every command: the append itself records the key and refuses it if another command
//! took it first, so a fresh command costs no extra read. Whenever the pipeline is about to
//! answer anything but a new outcome (a refusal, a version conflict, a no-op), it reads the
//! ledger first, so a retry always gets its recorded outcome, never a refusal.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use leasehold_domain::workload_quota::WorkloadQuotaId;
use leasehold_domain::{
    Actor, Aggregate, AppendOutcome, Clock, Context, DomainEvent, EventId, EventType,
    ExpectedVersion, LedgerEntry, Metadata, NewEvent, RequestHash, StoreError, StreamAppend,
    StreamId, StreamType, TenantId,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::cache::{Cached, StateCache};
use crate::charges::{charged, quota_links};
use crate::clock::SystemClock;
use crate::cross::{Link, LinkDecision, LinkError, Origin};
use crate::lanes::Lanes;
use crate::limits::{COMMAND_RETRIES_MAX, SNAPSHOT_EVERY_EVENTS_DEFAULT, STATE_CACHE_STREAMS_MAX};
use crate::load::Loaded;
use crate::outcome::{CommandError, CommandOutcome};
use crate::port::{CommandStore, Recorded};
use crate::quota::workload_quota_of;
use crate::request::CommandRequest;

/// Settings of the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineConfig {
    /// Events between two snapshots of one aggregate (0: never snapshot).
    pub snapshot_every_events: u64,
    /// Most times a command without an expected version is decided again after losing a race.
    pub retries_max: usize,
    /// Most aggregate states kept in memory (0: always read the stream).
    pub cache_streams_max: usize,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        Self {
            snapshot_every_events: SNAPSHOT_EVERY_EVENTS_DEFAULT,
            retries_max: COMMAND_RETRIES_MAX,
            cache_streams_max: STATE_CACHE_STREAMS_MAX,
        }
    }
}

/// Runs commands against aggregates stored in `S`.
#[derive(Debug, Clone)]
pub struct CommandPipeline<S> {
    pub(crate) store: S,
    config: PipelineConfig,
    pub(crate) cache: Arc<StateCache>,
    /// The time every command is decided at (the system clock unless a test controls it).
    clock: Arc<dyn Clock>,
    /// Commands decided again, by every clone of this pipeline: a race lost, or a belief
    /// the stored state contradicted.
    decided_again: Arc<std::sync::atomic::AtomicU64>,
    /// One lane per workload quota stream, taken by a creation and by a command that lost a
    /// race there (`charges.rs`).
    quota_lanes: Arc<Lanes<StreamId>>,
}

/// What one attempt came to.
enum Attempt<A> {
    Done(CommandOutcome),
    /// Lost a race, or decided on a belief that may be stale: decide again on this state.
    Again(Cached<A>),
    /// Lost a race on a workload quota's stream: decide again once it is this command's turn
    /// there (`charges.rs`).
    AfterQuotaRace(Cached<A>),
}

type Result<T, A> = std::result::Result<T, CommandError<<A as Aggregate>::Error>>;

impl<S: CommandStore> CommandPipeline<S> {
    /// A pipeline over `store`.
    pub fn new(store: S, config: PipelineConfig) -> Self {
        let cache = Arc::new(StateCache::new(config.cache_streams_max));
        let decided_again = Arc::default();
        let quota_lanes = Arc::default();
        Self { store, config, cache, clock: Arc::new(SystemClock), decided_again, quota_lanes }
    }

    /// How many times commands run through this pipeline (and its clones) were decided
    /// again: a race lost on a stream's version, or a remembered state found stale.
    pub fn decided_again(&self) -> u64 {
        self.decided_again.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The same pipeline deciding at `clock`'s time (tests hand in a controlled clock, shared
    /// with the reconcilers they drive).
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock commands are decided at.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The aggregate's state as stored now (for looking up facts another command needs):
    /// its owner, version and state, or `None` for an empty stream.
    ///
    /// # Errors
    /// A store failure, or a stored event this code cannot read.
    pub async fn state<A>(
        &self,
        stream: &leasehold_domain::StreamId,
    ) -> Result<Option<(leasehold_domain::TenantId, u64, A)>, A>
    where
        A: Aggregate + Send + Sync + 'static,
    {
        let cached = match self.cache.get::<A>(stream) {
            Some(cached) => self.refresh(stream, cached).await?,
            None => self.load::<A>(stream).await?,
        };
        Ok(cached.tenant.map(|tenant| (tenant, cached.version, cached.state)))
    }

    /// Decides and appends one command; see the module's documentation for the order of
    /// checks. Retries after lost races when the request names no expected version.
    ///
    /// # Errors
    /// [`CommandError`]; nothing was appended.
    pub async fn execute<A>(&self, request: CommandRequest<A>) -> Result<CommandOutcome, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Command: Serialize + Sync,
        A::Facts: Clone + Default + Send + Sync,
        A::Event: Send + Sync,
    {
        self.execute_linked(request, &[]).await
    }

    /// Runs `request` together with `links`, commands on aggregates of other kinds (see
    /// `cross.rs`): all the streams are appended atomically, each at the version it was
    /// decided on, or nothing is. A refused link refuses the whole command
    /// ([`CommandError::LinkedRefused`]). The request hash covers the links too.
    ///
    /// # Errors
    /// [`CommandError`]; nothing was appended.
    pub async fn execute_linked<A>(
        &self,
        request: CommandRequest<A>,
        links: &[Box<dyn Link<S>>],
    ) -> Result<CommandOutcome, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Command: Serialize + Sync,
        A::Facts: Clone + Default + Send + Sync,
        A::Event: Send + Sync,
    {
        self.execute_following(request, links, &no_consequences).await
    }

    /// As [`Self::execute_linked`], with the links `follows` derives from each decision: the
    /// state decided on and the events decided (a snapshot's quota reservation follows its
    /// creation). They are derived again whenever the command is decided again, so they never
    /// come from a stale belief; a decision of no events derives none. Being consequences of
    /// the decision, they are not part of the request hash.
    ///
    /// # Errors
    /// [`CommandError`]; nothing was appended.
    pub async fn execute_following<A>(
        &self,
        request: CommandRequest<A>,
        links: &[Box<dyn Link<S>>],
        follows: &Follows<'_, S, A>,
    ) -> Result<CommandOutcome, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Command: Serialize + Sync,
        A::Facts: Clone + Default + Send + Sync,
        A::Event: Send + Sync,
    {
        let ledger = LedgerEntry {
            tenant: request.tenant.clone(),
            namespace: request.namespace.clone(),
            operation_key: request.operation_key.clone(),
            request_hash: match request.caller_hash {
                Some(caller) => caller,
                None => hash_with_links(request.request_hash(), links),
            },
            stream: request.stream.clone(),
        };
        let mut loaded = match self.cache.get::<A>(&request.stream) {
            Some(cached) => Loaded { cached, fresh: false },
            // A creation is decided on the belief that the stream is empty; a stream that
            // is not fails the append's expected version and is then read.
            None if A::is_creation(&request.command) => {
                let empty = Cached { tenant: None, version: 0, state: A::initial() };
                Loaded { cached: empty, fresh: false }
            }
            None => Loaded { cached: self.load::<A>(&request.stream).await?, fresh: true },
        };
        // A creation of a charged kind takes its quota stream's turn at once (the stream every
        // creation of the tenant's kind appends to); any other command once it lost a race
        // there (a race lost on its own stream or a stale belief waits for no one).
        let mut turn = None;
        if A::is_creation(&request.command) {
            turn = self.quota_turn::<A>(&request.tenant).await;
        }
        for _ in 0..self.config.retries_max.max(1) {
            // Boxed: an attempt's future (links, quota charges, the append) is large, and every
            // command's future embeds it; on the heap it costs one allocation per attempt
            // instead of stack in every caller (a resolver's future overflowed a worker's).
            let attempt = Box::pin(self.attempt(&request, (links, follows), &ledger, loaded));
            match attempt.await? {
                Attempt::Done(outcome) => return Ok(outcome),
                Attempt::Again(cached) => loaded = self.again(&request.stream, cached).await?,
                Attempt::AfterQuotaRace(cached) => {
                    if turn.is_none() {
                        turn = self.quota_turn::<A>(&request.tenant).await;
                    }
                    loaded = self.again(&request.stream, cached).await?;
                }
            }
        }
        Err(CommandError::RetriesExhausted { attempts: self.config.retries_max })
    }

    async fn attempt<A>(
        &self,
        request: &CommandRequest<A>,
        links: Links<'_, S, A>,
        ledger: &LedgerEntry,
        loaded: Loaded<A>,
    ) -> Result<Attempt<A>, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Command: Serialize + Sync,
        A::Facts: Clone + Default + Send + Sync,
        A::Event: Send + Sync,
    {
        let Loaded { cached, fresh } = loaded;
        if cached.tenant.as_ref().is_some_and(|tenant| tenant != &request.tenant) {
            return self.answer_recorded(ledger, CommandError::NotFound).await;
        }
        if let Some(expected) = request.expected_version
            && expected != cached.version
        {
            if !fresh {
                return Ok(Attempt::Again(cached));
            }
            let conflict = CommandError::ConcurrencyConflict { expected, actual: cached.version };
            return self.answer_recorded(ledger, conflict).await;
        }
        // Times are stored to the microsecond; deciding at that precision keeps replays exact,
        // whatever clock was handed in.
        let now = leasehold_domain::to_micros(self.clock.now());
        let ctx = Context {
            now,
            tenant: request.tenant.clone(),
            actor: request.actor.clone(),
            new_ids: (0..A::NEW_IDS_PER_COMMAND).map(|_| Uuid::now_v7()).collect(),
            facts: request.facts.clone(),
        };
        let decided = cached.state.decide(&request.command, &ctx);
        // A refusal or a no-op decided on a remembered state may be the belief's fault; only an
        // append checks a belief by itself (through its expected version).
        if !fresh && !matches!(&decided, Ok(events) if !events.is_empty()) {
            return Ok(Attempt::Again(cached));
        }
        match decided {
            Err(refusal) => self.answer_recorded(ledger, CommandError::Refused(refusal)).await,
            Ok(events) if events.is_empty() => self.unchanged(ledger, cached).await,
            Ok(events) => self.append((request, links), ledger, cached, events, now).await,
        }
    }

    /// A command that changed nothing: recorded, so that its retries answer the same.
    async fn unchanged<A>(&self, ledger: &LedgerEntry, cached: Cached<A>) -> Result<Attempt<A>, A>
    where
        A: Aggregate,
    {
        if !self.store.record_unchanged(ledger.clone(), cached.version).await? {
            return self.recorded_outcome::<A>(ledger).await.map(Attempt::Done);
        }
        let cursor = match cached.version {
            0 => None,
            version => self.store.cursor_at(&ledger.stream, version).await?,
        };
        Ok(Attempt::Done(CommandOutcome {
            stream_id: ledger.stream.clone(),
            version: cached.version,
            cursor,
            duplicate: false,
            event_types: Vec::new(),
        }))
    }

    async fn append<A>(
        &self,
        (request, (links, follows)): (&CommandRequest<A>, Links<'_, S, A>),
        ledger: &LedgerEntry,
        cached: Cached<A>,
        events: Vec<A::Event>,
        now: DateTime<Utc>,
    ) -> Result<Attempt<A>, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Facts: Default,
    {
        let linked = match self.decide_linked(request, &cached.state, &events, now).await {
            Ok(linked) => linked,
            Err(CommandError::Store(error)) => return Err(error.into()),
            Err(refusal) => return self.answer_recorded(ledger, refusal).await,
        };
        let base = MetadataBase::of(request);
        let origin =
            Origin { tenant: &request.tenant, actor: &request.actor, metadata: &base, now };
        let derived = follows(&cached.state, &events);
        let mut elsewhere = match self.decide_links(links.iter().chain(&derived), &origin).await {
            Ok(decisions) => decisions,
            Err(error) => return self.link_failed(ledger, error).await,
        };
        let state = events.iter().fold(cached.state.clone(), |state, event| state.evolve(event));
        let tenant = &request.tenant;
        // Every workload whose charge this append changes, wherever it sits in the append.
        let primary = (&request.stream, A::is_creation(&request.command));
        let mut charges: Vec<_> =
            charged(tenant, primary, &cached.state, &state).into_iter().collect();
        charges.extend(linked.iter().filter_map(|link| {
            charged(tenant, (&link.stream, link.creation), &link.before.state, &link.after)
        }));
        charges.extend(elsewhere.iter().filter_map(|decision| decision.charged.clone()));
        let quotas = quota_links::<S>(charges);
        match self.decide_links(quotas.iter(), &origin).await {
            Ok(decisions) => elsewhere.extend(decisions),
            Err(error) => return self.link_failed(ledger, error).await,
        }
        let mut appends =
            vec![stream_append(&base, tenant, &request.stream, cached.version, &state, &events)];
        for link in &linked {
            let (stream, version) = (&link.stream, link.before.version);
            appends.push(stream_append(&base, tenant, stream, version, &link.after, &link.events));
        }
        let mut remember = Vec::with_capacity(elsewhere.len());
        for decision in elsewhere {
            appends.push(decision.append);
            remember.push(decision.remember);
        }
        match self.store.append_recorded(appends, ledger.clone()).await {
            Ok(outcome) => {
                for remembered in remember {
                    remembered(&self.cache);
                }
                for link in linked {
                    let version = link.before.version + link.events.len() as u64;
                    let tenant = Some(request.tenant.clone());
                    self.cache.put(&link.stream, Cached { tenant, version, state: link.after });
                }
                let done = self.appended(request, &cached, state, &events, &outcome).await;
                Ok(Attempt::Done(done))
            }
            Err(StoreError::WrongExpectedVersion { stream, actual, .. }) => {
                // Whatever this process remembered of that stream is behind it now.
                self.cache.forget(&stream);
                match request.expected_version {
                    Some(expected) if stream == request.stream => {
                        let conflict = CommandError::ConcurrencyConflict { expected, actual };
                        self.answer_recorded(ledger, conflict).await
                    }
                    // Lost a race on this stream or a linked one: decide everything again (on a
                    // workload quota's, after waiting for its turn).
                    _ if WorkloadQuotaId::of_stream(&stream).is_some() => {
                        Ok(Attempt::AfterQuotaRace(cached))
                    }
                    _ => Ok(Attempt::Again(cached)),
                }
            }
            Err(StoreError::TransactionConflict) => Ok(Attempt::Again(cached)),
            Err(StoreError::OperationKeyTaken) => {
                self.recorded_outcome::<A>(ledger).await.map(Attempt::Done)
            }
            Err(StoreError::StreamOwnership { .. }) => {
                self.answer_recorded(ledger, CommandError::NotFound).await
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The stream as stored now, to decide a command again on (counted).
    async fn again<A>(&self, stream: &StreamId, cached: Cached<A>) -> Result<Loaded<A>, A>
    where
        A: Aggregate + Send + Sync + 'static,
    {
        self.decided_again.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Loaded { cached: self.refresh(stream, cached).await?, fresh: true })
    }

    /// The turn on `tenant`'s quota stream of `A`'s kind, for a charged kind (`charges.rs`).
    async fn quota_turn<A: Aggregate>(
        &self,
        tenant: &TenantId,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        let quota = workload_quota_of(tenant, A::WORKLOAD?).stream_id();
        Some(self.quota_lanes.enter(&quota).await)
    }

    /// Each link's decision (those that change something), in order; the first failure.
    async fn decide_links<'l>(
        &self,
        links: impl Iterator<Item = &'l Box<dyn Link<S>>>,
        origin: &Origin<'_>,
    ) -> std::result::Result<Vec<LinkDecision>, LinkError>
    where
        S: 'l,
    {
        let mut decisions = Vec::new();
        for link in links {
            if let Some(decision) = link.decide(self, origin).await? {
                decisions.push(decision);
            }
        }
        Ok(decisions)
    }

    /// The answer to a command one of whose links failed.
    async fn link_failed<A: Aggregate>(
        &self,
        ledger: &LedgerEntry,
        error: LinkError,
    ) -> Result<Attempt<A>, A> {
        match error {
            LinkError::Store(error) => Err(error.into()),
            LinkError::NotFound => self.answer_recorded(ledger, CommandError::NotFound).await,
            LinkError::Refused { stream, kind, reason } => {
                let refused = CommandError::LinkedRefused { stream, kind, reason };
                self.answer_recorded(ledger, refused).await
            }
        }
    }

    /// After a successful append: remember the new state, snapshot if due, answer.
    async fn appended<A>(
        &self,
        request: &CommandRequest<A>,
        before: &Cached<A>,
        state: A,
        events: &[A::Event],
        outcome: &AppendOutcome,
    ) -> CommandOutcome
    where
        A: Aggregate + Send + Sync + 'static,
    {
        let version = before.version + events.len() as u64;
        let every = self.config.snapshot_every_events;
        if every > 0 && version / every > before.version / every {
            let snapshot = (request.tenant.clone(), state.clone());
            // A snapshot is a cache: failing to write one costs a longer load later, nothing more.
            if let Err(error) =
                self.store.save_snapshot(&request.stream, version, A::STATE_SCHEMA, &snapshot).await
            {
                tracing::warn!(stream = %request.stream, %error, "snapshot not saved");
            }
        }
        let cached = Cached { tenant: Some(request.tenant.clone()), version, state };
        self.cache.put(&request.stream, cached);
        CommandOutcome {
            stream_id: request.stream.clone(),
            version,
            cursor: Some(outcome.cursor),
            duplicate: outcome.duplicate,
            event_types: events.iter().map(|e| e.event_type().to_owned()).collect(),
        }
    }

    /// The recorded outcome if the key was used before, else `error`.
    async fn answer_recorded<A: Aggregate>(
        &self,
        ledger: &LedgerEntry,
        error: CommandError<A::Error>,
    ) -> Result<Attempt<A>, A> {
        match self.store.recorded(ledger).await? {
            Some(recorded) => duplicate_of::<A>(ledger, recorded).map(Attempt::Done),
            None => Err(error),
        }
    }

    /// The outcome recorded under the key, which another command just took.
    async fn recorded_outcome<A: Aggregate>(
        &self,
        ledger: &LedgerEntry,
    ) -> Result<CommandOutcome, A> {
        match self.store.recorded(ledger).await? {
            Some(recorded) => duplicate_of::<A>(ledger, recorded),
            None => Err(CommandError::Store(StoreError::Database {
                reason: "the ledger refused a key it does not hold".into(),
            })),
        }
    }
}

/// The links a command's decision brings with it, derived from the state decided on and the
/// events decided ([`CommandPipeline::execute_following`]).
pub type Follows<'a, S, A> =
    dyn Fn(&A, &[<A as Aggregate>::Event]) -> Vec<Box<dyn Link<S>>> + Send + Sync + 'a;

/// The links given with a command, and those its decision brings.
type Links<'a, S, A> = (&'a [Box<dyn Link<S>>], &'a Follows<'a, S, A>);

fn no_consequences<S, A: Aggregate>(_: &A, _: &[A::Event]) -> Vec<Box<dyn Link<S>>> {
    Vec::new()
}

/// A retry's answer: the recorded outcome, or a conflict if the key served another request.
fn duplicate_of<A: Aggregate>(
    ledger: &LedgerEntry,
    recorded: Recorded,
) -> Result<CommandOutcome, A> {
    if recorded.request_hash != ledger.request_hash {
        return Err(CommandError::IdempotencyConflict);
    }
    Ok(CommandOutcome {
        stream_id: recorded.stream,
        version: recorded.version,
        cursor: recorded.cursor,
        duplicate: true,
        event_types: recorded.event_types,
    })
}

/// What every event of one command carries in its metadata, whichever stream it is on.
#[derive(Debug)]
pub(crate) struct MetadataBase {
    actor: Actor,
    correlation_id: Option<Uuid>,
    causation_id: Option<Uuid>,
    operation_key: String,
    trace_id: Option<String>,
}

impl MetadataBase {
    fn of<A: Aggregate>(request: &CommandRequest<A>) -> Self {
        Self {
            actor: request.actor.clone(),
            correlation_id: request.correlation_id,
            causation_id: request.causation_id,
            operation_key: request.operation_key.to_string(),
            trace_id: request.trace_id.clone(),
        }
    }
}

/// The request hash, extended with the links' commands when there are any.
fn hash_with_links<S>(primary: RequestHash, links: &[Box<dyn Link<S>>]) -> RequestHash {
    if links.is_empty() {
        return primary;
    }
    let mut hash = Sha256::new();
    hash.update(primary.0);
    for link in links {
        hash.update(serde_json::to_vec(&link.hashed()).expect("links serialize"));
    }
    RequestHash(hash.finalize().into())
}

/// One stream's part of a command's append, at the version its events were decided on.
pub(crate) fn stream_append<A: Aggregate>(
    base: &MetadataBase,
    tenant: &TenantId,
    stream: &StreamId,
    version: u64,
    after: &A,
    events: &[A::Event],
) -> StreamAppend {
    let metadata = Metadata {
        actor: Some(base.actor.clone()),
        correlation_id: base.correlation_id,
        causation_id: base.causation_id,
        operation_key: Some(base.operation_key.clone()),
        generation: after.generation(),
        trace_id: base.trace_id.clone(),
    };
    StreamAppend {
        stream_id: stream.clone(),
        stream_type: StreamType::parse(A::STREAM_TYPE).expect("aggregate stream types are names"),
        tenant_id: tenant.clone(),
        expected: match version {
            0 => ExpectedVersion::NoStream,
            version => ExpectedVersion::Exact(version),
        },
        events: events.iter().map(|event| new_event(event, &metadata)).collect(),
    }
}

fn new_event<E: DomainEvent>(event: &E, metadata: &Metadata) -> NewEvent {
    NewEvent {
        event_id: EventId::from_uuid(Uuid::now_v7()),
        event_type: EventType::parse(event.event_type()).expect("event types are names"),
        schema_version: 1,
        payload: event.to_payload(),
        metadata: metadata.clone(),
    }
}
