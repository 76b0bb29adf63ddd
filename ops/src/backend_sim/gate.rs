//! What every simulated agent does at its door: wants one bearer token, and counts each
//! request per route (its `GET /sim/requests`), allowed or not.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::http::HeaderMap;

/// An agent's door.
#[derive(Debug, Clone)]
pub struct Gate {
    token: Arc<String>,
    requests: Arc<Mutex<BTreeMap<String, u64>>>,
}

impl Gate {
    /// A door wanting `token`.
    pub fn new(token: &str) -> Self {
        Self { token: Arc::new(token.to_owned()), requests: Arc::default() }
    }

    /// Counts the request under `route` and says whether it carries the token.
    pub fn allows(&self, headers: &HeaderMap, route: &str) -> bool {
        *self
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(route.into())
            .or_default() += 1;
        let expected = format!("Bearer {}", self.token);
        headers.get("authorization").and_then(|value| value.to_str().ok())
            == Some(expected.as_str())
    }

    /// The requests counted so far, per route.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}
