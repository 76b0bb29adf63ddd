//! The stream heads this process has seen, so that an append can chain its hashes without
//! first reading the stream. A head that turns out stale costs one more round trip, never a
//! wrong write: `leasehold_append` checks every head under the stream lock.

use std::collections::HashMap;
use std::sync::Mutex;

use super::prepare::Head;
use crate::limits::HEAD_CACHE_STREAMS_MAX;

/// Stream id -> the newest head seen.
#[derive(Debug, Default)]
pub(crate) struct HeadCache {
    heads: Mutex<HashMap<String, Head>>,
}

impl HeadCache {
    /// The newest head seen for `stream`.
    pub fn get(&self, stream: &str) -> Option<Head> {
        self.lock().get(stream).copied()
    }

    /// Records `head` unless a newer one is known.
    pub fn remember(&self, stream: &str, head: Head) {
        let mut heads = self.lock();
        if heads.len() >= HEAD_CACHE_STREAMS_MAX && !heads.contains_key(stream) {
            // A cache, not a record: starting over only costs round trips.
            heads.clear();
        }
        let entry = heads.entry(stream.to_string()).or_insert(head);
        if head.version >= entry.version {
            *entry = head;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Head>> {
        // A panic while holding the lock cannot leave the map inconsistent.
        self.heads.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
