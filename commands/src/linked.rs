//! Linked commands: decisions on other streams that must commit with a command's events
//! (`Aggregate::linked`), such as a restore moving its source's retained record. Each is
//! decided on its stream as stored now, by the same tenant, and appended in the same atomic
//! multi-stream append, with that stream's version as its expected version.

use chrono::{DateTime, Utc};
use leasehold_domain::{Aggregate, Context, StreamId};

use crate::cache::Cached;
use crate::outcome::CommandError;
use crate::pipeline::CommandPipeline;
use crate::port::CommandStore;
use crate::request::CommandRequest;

/// One linked stream's decision.
pub(crate) struct Linked<A: Aggregate> {
    pub stream: StreamId,
    /// The state decided on (its version is the append's expected version).
    pub before: Cached<A>,
    /// The state after the events.
    pub after: A,
    pub events: Vec<A::Event>,
    /// Whether its command creates it.
    pub creation: bool,
}

type Result<T, A> = std::result::Result<T, CommandError<<A as Aggregate>::Error>>;

impl<S: CommandStore> CommandPipeline<S> {
    /// Decides the commands linked to `events` (decided on `state` for `request`). Another
    /// tenant's stream, or a missing one, is not found; a refusal refuses the whole command.
    pub(crate) async fn decide_linked<A>(
        &self,
        request: &CommandRequest<A>,
        state: &A,
        events: &[A::Event],
        now: DateTime<Utc>,
    ) -> Result<Vec<Linked<A>>, A>
    where
        A: Aggregate + Send + Sync + 'static,
        A::Facts: Default,
    {
        let mut linked = Vec::new();
        for (stream, command) in state.linked(&request.command, events) {
            // Always the stored state: a refusal here must not come from a stale belief.
            let before = match self.cache.get::<A>(&stream) {
                Some(cached) => self.refresh(&stream, cached).await?,
                None => self.load::<A>(&stream).await?,
            };
            if before.tenant.as_ref() != Some(&request.tenant) {
                return Err(CommandError::NotFound);
            }
            let ctx = Context {
                now,
                tenant: request.tenant.clone(),
                actor: request.actor.clone(),
                new_ids: Vec::new(),
                facts: A::Facts::default(),
            };
            let events = before.state.decide(&command, &ctx).map_err(CommandError::Refused)?;
            if events.is_empty() {
                continue;
            }
            let after =
                events.iter().fold(before.state.clone(), |state, event| state.evolve(event));
            let creation = A::is_creation(&command);
            linked.push(Linked { stream, before, after, events, creation });
        }
        Ok(linked)
    }
}
