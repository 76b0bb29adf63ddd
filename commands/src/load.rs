//! Loading an aggregate: the latest snapshot, then the events after it.

use leasehold_domain::{Aggregate, DomainEvent, StoreError, StreamId, TenantId};

use crate::cache::Cached;
use crate::limits::LOAD_PAGE_EVENTS;
use crate::outcome::CommandError;
use crate::pipeline::CommandPipeline;
use crate::port::CommandStore;

/// A state to decide on, and whether it was just read from the store (else remembered).
pub(crate) struct Loaded<A> {
    pub cached: Cached<A>,
    pub fresh: bool,
}

type Result<T, A> = std::result::Result<T, CommandError<<A as Aggregate>::Error>>;

impl<S: CommandStore> CommandPipeline<S> {
    /// The aggregate's state as stored now: its snapshot plus the events after it.
    ///
    /// # Errors
    /// A store failure, or a stored event this code cannot read.
    pub(crate) async fn load<A>(&self, stream: &StreamId) -> Result<Cached<A>, A>
    where
        A: Aggregate + Send + Sync + 'static,
    {
        let snapshot = self.store.snapshot::<(TenantId, A)>(stream, A::STATE_SCHEMA).await?;
        let start = match snapshot {
            Some((version, (tenant, state))) => Cached { tenant: Some(tenant), version, state },
            None => Cached { tenant: None, version: 0, state: A::initial() },
        };
        self.refresh(stream, start).await
    }

    /// `cached` brought up to date with the events stored after its version.
    pub(crate) async fn refresh<A>(
        &self,
        stream: &StreamId,
        mut cached: Cached<A>,
    ) -> Result<Cached<A>, A>
    where
        A: Aggregate + Send + Sync + 'static,
    {
        loop {
            let page = self.store.read_stream(stream, cached.version + 1, LOAD_PAGE_EVENTS).await?;
            let full = page.len() == LOAD_PAGE_EVENTS;
            for recorded in page {
                let event = A::Event::from_stored(recorded.event_type.as_str(), &recorded.payload)
                    .map_err(|error| StoreError::Corrupt {
                        position: recorded.cursor.position,
                        reason: error.to_string(),
                    })?;
                cached.state = cached.state.evolve(&event);
                cached.version = recorded.version;
                cached.tenant = Some(recorded.tenant_id);
            }
            if !full {
                break;
            }
        }
        self.cache.put(stream, cached.clone());
        Ok(cached)
    }
}
