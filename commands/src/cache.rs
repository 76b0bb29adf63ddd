//! Aggregate states kept between commands, so that a command on a stream this process has
//! just written needs no read. A cached state is only a belief: the append's expected version
//! checks it, and a stale one costs one conflict and a read of the missing events.

use std::any::{Any, TypeId};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use leasehold_domain::{StreamId, TenantId};

/// A state as of a stream version, owned by a tenant (`None` while the stream is empty).
#[derive(Debug, Clone)]
pub(crate) struct Cached<A> {
    pub tenant: Option<TenantId>,
    pub version: u64,
    pub state: A,
}

type Key = (TypeId, StreamId);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Key, Arc<dyn Any + Send + Sync>>,
    /// Insertion order, oldest first, for eviction.
    order: VecDeque<Key>,
}

/// A bounded map from (aggregate type, stream) to the latest state this process knows.
#[derive(Debug)]
pub(crate) struct StateCache {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl StateCache {
    pub fn new(capacity: usize) -> Self {
        Self { inner: Mutex::default(), capacity }
    }

    pub fn get<A: Clone + Send + Sync + 'static>(&self, stream: &StreamId) -> Option<Cached<A>> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = inner.entries.get(&(TypeId::of::<A>(), stream.clone()))?;
        entry.downcast_ref::<Cached<A>>().cloned()
    }

    /// What `look` makes of the state kept for `stream` and its version, without copying it
    /// whole.
    pub fn peek<A: Send + Sync + 'static, R>(
        &self,
        stream: &StreamId,
        look: impl FnOnce(u64, &A) -> R,
    ) -> Option<R> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = inner.entries.get(&(TypeId::of::<A>(), stream.clone()))?;
        entry.downcast_ref::<Cached<A>>().map(|cached| look(cached.version, &cached.state))
    }

    /// The version kept of each of `streams` (`None` where nothing is), under one lock: a
    /// caller that keeps what it made of each state redoes only those that moved.
    pub fn versions<A: Send + Sync + 'static>(&self, streams: &[StreamId]) -> Vec<Option<u64>> {
        let inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let kind = TypeId::of::<A>();
        streams
            .iter()
            .map(|stream| {
                let entry = inner.entries.get(&(kind, stream.clone()))?;
                entry.downcast_ref::<Cached<A>>().map(|cached| cached.version)
            })
            .collect()
    }

    /// Keeps `cached` unless a later version of the stream is already kept.
    pub fn put<A: Clone + Send + Sync + 'static>(&self, stream: &StreamId, cached: Cached<A>) {
        if self.capacity == 0 {
            return;
        }
        let key = (TypeId::of::<A>(), stream.clone());
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let newer = inner
            .entries
            .get(&key)
            .and_then(|entry| entry.downcast_ref::<Cached<A>>())
            .is_some_and(|kept| kept.version >= cached.version);
        if newer {
            return;
        }
        if inner.entries.insert(key.clone(), Arc::new(cached)).is_none() {
            inner.order.push_back(key);
        }
        while inner.entries.len() > self.capacity {
            let Some(oldest) = inner.order.pop_front() else { break };
            inner.entries.remove(&oldest);
        }
    }

    /// Forgets what is remembered of `stream` (an append found it moved on: the next
    /// decision reads it as stored).
    pub fn forget(&self, stream: &StreamId) {
        let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        inner.entries.retain(|key, _| &key.1 != stream);
        inner.order.retain(|key| &key.1 != stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(n: u32) -> StreamId {
        StreamId::parse(format!("s-{n}")).expect("valid")
    }

    fn cached(version: u64) -> Cached<u64> {
        Cached { tenant: TenantId::parse("t").ok(), version, state: version * 10 }
    }

    #[test]
    fn keeps_the_latest_version_and_evicts_the_oldest_stream() {
        let cache = StateCache::new(2);
        cache.put(&stream(1), cached(2));
        cache.put(&stream(1), cached(1));
        assert_eq!(cache.get::<u64>(&stream(1)).map(|c| c.state), Some(20));
        assert!(cache.get::<u32>(&stream(1)).is_none(), "another aggregate type is another key");
        cache.put(&stream(2), cached(1));
        cache.put(&stream(3), cached(1));
        assert!(cache.get::<u64>(&stream(1)).is_none());
        assert!(cache.get::<u64>(&stream(3)).is_some());
    }

    #[test]
    fn versions_and_peeks_answer_what_is_kept_of_the_type_asked() {
        let cache = StateCache::new(4);
        cache.put(&stream(1), cached(3));
        cache.put(&stream(2), cached(5));
        assert_eq!(
            cache.versions::<u64>(&[stream(2), stream(9), stream(1)]),
            [Some(5), None, Some(3)]
        );
        assert_eq!(cache.versions::<u32>(&[stream(1)]), [None]);
        assert_eq!(
            cache.peek::<u64, _>(&stream(2), |version, state| (version, *state)),
            Some((5, 50))
        );
    }
}
