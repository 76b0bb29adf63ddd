//! Failures in a row, counted per thing (an orphan's destroys, by host or node and name): the
//! Nth in a row is a dead letter (rule 35). Kept in memory: after a restart the count starts
//! again, so a dead letter comes later, never sooner.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

/// Failures in a row by key.
#[derive(Debug)]
pub(crate) struct InARow<K>(Mutex<HashMap<K, u32>>);

impl<K> Default for InARow<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: Hash + Eq> InARow<K> {
    /// Counts one more failure of `key`; how many in a row now.
    pub(crate) fn failed(&self, key: K) -> u32 {
        let mut counts = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(key).or_default();
        *count += 1;
        *count
    }

    /// `key` succeeded: its row is over.
    pub(crate) fn succeeded(&self, key: &K) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).remove(key);
    }

    /// Forgets every key `keep` says is gone.
    pub(crate) fn retain(&self, keep: impl FnMut(&K) -> bool) {
        let mut keep = keep;
        self.0.lock().unwrap_or_else(PoisonError::into_inner).retain(|key, _| keep(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_success_ends_a_row_and_a_forgotten_key_starts_again() {
        let rows = InARow::default();
        assert_eq!((rows.failed("a"), rows.failed("a"), rows.failed("b")), (1, 2, 1));
        rows.succeeded(&"a");
        assert_eq!(rows.failed("a"), 1);
        rows.retain(|key| *key != "b");
        assert_eq!(rows.failed("b"), 1);
    }
}
