//! In-process lanes: one async mutex per contended stream, so that the commands of one
//! process that all append to one stream (every snapshot create of a tenant reserves on its
//! one quota stream) take turns instead of racing. Optimistic concurrency stays what keeps
//! the stream right, across processes too; a lane only spares this process's commands the
//! races they would lose to each other (with 16 clients on one quota stream, seven decisions
//! per create without it; `BENCHMARKS.md`). A lane lives while anyone holds or awaits it;
//! the map forgets dead ones once it grows past [`LANES_KEPT_MAX`].

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Lanes remembered before the dead ones are swept from the map.
pub const LANES_KEPT_MAX: usize = 4_096;

/// One async mutex per key.
#[derive(Debug)]
pub(crate) struct Lanes<K>(Mutex<HashMap<K, Weak<tokio::sync::Mutex<()>>>>);

impl<K> Default for Lanes<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: Hash + Eq + Clone> Lanes<K> {
    /// Waits for `key`'s turn; the turn lasts until the guard is dropped.
    pub(crate) async fn enter(&self, key: &K) -> tokio::sync::OwnedMutexGuard<()> {
        let lane = {
            let mut lanes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            if lanes.len() > LANES_KEPT_MAX {
                lanes.retain(|_, lane| lane.strong_count() > 0);
            }
            match lanes.get(key).and_then(Weak::upgrade) {
                Some(lane) => lane,
                None => {
                    let lane = Arc::new(tokio::sync::Mutex::new(()));
                    lanes.insert(key.clone(), Arc::downgrade(&lane));
                    lane
                }
            }
        };
        lane.lock_owned().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_is_forgotten_once_nobody_holds_it() {
        let lanes = Lanes::<u32>::default();
        let runtime = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
        runtime.block_on(async {
            let held = lanes.enter(&1).await;
            // The same key waits for the holder; another key does not.
            let other = lanes.enter(&2).await;
            drop(other);
            let blocked = tokio::sync::Mutex::try_lock(
                &lanes.0.lock().expect("the map")[&1].upgrade().expect("held"),
            )
            .is_err();
            assert!(blocked, "a held lane is taken");
            drop(held);
            assert!(lanes.0.lock().expect("the map")[&1].upgrade().is_none(), "forgotten");
        });
    }
}
