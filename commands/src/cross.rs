//! Commands that link aggregates of different kinds: a VM's placement and its host's
//! reservation, a snapshot and its tenant's quota. The command service that runs the primary
//! command hands the pipeline its links ([`CommandPipeline::execute_linked`]); each link is
//! decided on its own stream as stored now, by the primary command's tenant, and every stream
//! is appended in one atomic multi-stream append with an expected version on each. A refusal
//! of any link refuses the whole command, and a lost race on any stream decides everything
//! again.
//!
//! Links are consequences of the primary command's events: a primary command that changes
//! nothing decides no link. A link that decides no events is not part of the append, so its
//! stream's version is not checked: a link that guards an invariant must record its decision
//! as an event (a reservation, not a mere look at the quota).
//!
//! A link acts on a stream of the primary command's tenant, unless the service names another
//! owner: a VM's tenant reserves room on a host the fleet owns. Only a service that knows the
//! linked kind is shared (hosts) names one; the stored stream must still be that owner's.
//!
//! Links of the same kind that an aggregate derives from its own decision stay with
//! `Aggregate::linked` (`linked.rs`); these are the ones only an application service knows.

use std::future::Future;
use std::pin::Pin;

use chrono::{DateTime, Utc};
use leasehold_domain::{
    Actor, Aggregate, Context, Refusal, RefusalKind, StoreError, StreamAppend, StreamId, TenantId,
};
use serde::Serialize;

use crate::cache::{Cached, StateCache};
use crate::charges::{Charged, charged};
use crate::pipeline::{CommandPipeline, MetadataBase, stream_append};
use crate::port::CommandStore;

/// A command on an aggregate of kind `B`, to commit with another command's events.
#[derive(Debug, Clone)]
pub struct LinkedCommand<B: Aggregate> {
    /// The linked aggregate's stream.
    pub stream: StreamId,
    /// What is asked of it.
    pub command: B::Command,
    /// Facts it is decided with.
    pub facts: B::Facts,
    /// Who owns the linked stream, when it is not the primary command's tenant (a fleet's
    /// host). The link is decided and appended as that owner's.
    pub owner: Option<TenantId>,
}

impl<B: Aggregate> LinkedCommand<B> {
    /// A link on a stream of the primary command's own tenant.
    pub fn new(stream: StreamId, command: B::Command, facts: B::Facts) -> Self {
        Self { stream, command, facts, owner: None }
    }

    /// The same link, on a stream `owner` owns.
    #[must_use]
    pub fn owned_by(mut self, owner: TenantId) -> Self {
        self.owner = Some(owner);
        self
    }
}

/// What a link inherits from the primary command (built by the pipeline only).
#[derive(Debug)]
pub struct Origin<'a> {
    pub(crate) tenant: &'a TenantId,
    pub(crate) actor: &'a Actor,
    pub(crate) metadata: &'a MetadataBase,
    pub(crate) now: DateTime<Utc>,
}

/// A link's decision, ready to append.
pub struct LinkDecision {
    pub(crate) append: StreamAppend,
    /// Remembers the linked state once the append committed.
    pub(crate) remember: Box<dyn FnOnce(&StateCache) + Send>,
    /// What the linked workload holds of its owner's quota from now on, when that changes.
    pub(crate) charged: Option<Charged>,
}

impl std::fmt::Debug for LinkDecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinkDecision").field("append", &self.append).finish_non_exhaustive()
    }
}

/// Why a link was not decided.
#[derive(Debug)]
pub enum LinkError {
    /// The linked aggregate refused.
    Refused {
        /// Its stream.
        stream: StreamId,
        /// What the refusal means.
        kind: RefusalKind,
        /// Its message.
        reason: String,
    },
    /// The linked stream belongs to another tenant or kind, or does not exist.
    NotFound,
    /// The store failed.
    Store(StoreError),
}

type Decided<'a> =
    Pin<Box<dyn Future<Output = Result<Option<LinkDecision>, LinkError>> + Send + 'a>>;

/// A link of any kind, as the pipeline over `S` decides it.
pub trait Link<S>: Send + Sync {
    /// The linked stream.
    fn stream(&self) -> &StreamId;

    /// What the request hash covers of it (the linked aggregate, stream and command).
    fn hashed(&self) -> serde_json::Value;

    /// Decides it on its stream as stored now; `None` when it changes nothing.
    #[doc(hidden)]
    fn decide<'a>(
        &'a self,
        pipeline: &'a CommandPipeline<S>,
        origin: &'a Origin<'a>,
    ) -> Decided<'a>;
}

/// The link's stream as stored now.
async fn stored<S, B>(
    pipeline: &CommandPipeline<S>,
    stream: &StreamId,
) -> Result<Cached<B>, LinkError>
where
    S: CommandStore + Send + Sync,
    B: Aggregate + Send + Sync + 'static,
{
    pipeline.load::<B>(stream).await.map_err(|error| match error {
        crate::CommandError::Store(error) => LinkError::Store(error),
        _ => LinkError::NotFound,
    })
}

impl<B: Aggregate> LinkedCommand<B>
where
    B::Facts: Clone,
{
    /// The link's events decided on `before`, as `owner`'s; the owner check first.
    fn decide_on(
        &self,
        before: &Cached<B>,
        owner: &TenantId,
        origin: &Origin<'_>,
    ) -> Result<Vec<B::Event>, LinkError> {
        match &before.tenant {
            Some(stored) if stored != owner => return Err(LinkError::NotFound),
            None if !B::may_open(&self.command) => return Err(LinkError::NotFound),
            _ => {}
        }
        let ctx = Context {
            now: origin.now,
            tenant: owner.clone(),
            actor: origin.actor.clone(),
            new_ids: (0..B::NEW_IDS_PER_COMMAND).map(|_| uuid::Uuid::now_v7()).collect(),
            facts: self.facts.clone(),
        };
        before.state.decide(&self.command, &ctx).map_err(|refusal| LinkError::Refused {
            stream: self.stream.clone(),
            kind: refusal.kind(),
            reason: refusal.to_string(),
        })
    }
}

impl<S, B> Link<S> for LinkedCommand<B>
where
    S: CommandStore + Send + Sync,
    B: Aggregate + Send + Sync + 'static,
    B::Command: Serialize + Send + Sync,
    B::Facts: Clone + Send + Sync,
    B::Event: Send + Sync,
{
    fn stream(&self) -> &StreamId {
        &self.stream
    }

    fn hashed(&self) -> serde_json::Value {
        let mut hashed = serde_json::json!({
            "aggregate": B::STREAM_TYPE,
            "command": &self.command,
            "stream": self.stream.as_str(),
        });
        // Only when named, so that a link's hash is what it was before owners existed.
        if let Some(owner) = &self.owner {
            hashed["owner"] = owner.as_str().into();
        }
        hashed
    }

    fn decide<'a>(
        &'a self,
        pipeline: &'a CommandPipeline<S>,
        origin: &'a Origin<'a>,
    ) -> Decided<'a> {
        Box::pin(async move {
            // A stream of another kind is not found (its events would not even decode as B's).
            let is_kind = self
                .stream
                .as_str()
                .strip_prefix(B::STREAM_TYPE)
                .is_some_and(|rest| rest.starts_with('-'));
            if !is_kind {
                return Err(LinkError::NotFound);
            }
            // Decided on what this process remembers of the stream, if anything: the append's
            // expected version checks that belief. A refusal or a no-op must not come from a
            // stale belief, so either is decided again on the stored state.
            let owner = self.owner.as_ref().unwrap_or(origin.tenant);
            let remembered = pipeline.cache.get::<B>(&self.stream);
            let believed = remembered.is_some();
            let mut before = match remembered {
                Some(cached) => cached,
                None => stored(pipeline, &self.stream).await?,
            };
            let mut decided = self.decide_on(&before, owner, origin);
            if believed && !matches!(&decided, Ok(events) if !events.is_empty()) {
                before = stored(pipeline, &self.stream).await?;
                decided = self.decide_on(&before, owner, origin);
            }
            let events = decided?;
            if events.is_empty() {
                return Ok(None);
            }
            let after =
                events.iter().fold(before.state.clone(), |state, event| state.evolve(event));
            let admission = B::is_creation(&self.command);
            let charged = charged(owner, (&self.stream, admission), &before.state, &after);
            let append = stream_append(
                origin.metadata,
                owner,
                &self.stream,
                before.version,
                &after,
                &events,
            );
            let version = before.version + events.len() as u64;
            let remembered = Cached { tenant: Some(owner.clone()), version, state: after };
            let stream = self.stream.clone();
            Ok(Some(LinkDecision {
                append,
                remember: Box::new(move |cache: &StateCache| cache.put(&stream, remembered)),
                charged,
            }))
        })
    }
}
