//! The port that places a new lease on a backend: the lease's application service asks it,
//! and `decide` records the answer (or refuses with `NoBackend` when there is none). The
//! routing rules (SKU lists, a default, least-loaded, fenced backends never chosen) live with
//! the backends' connections in `adapters`.

use std::future::Future;
use std::pin::Pin;

use leasehold_domain::lease::{BackendName, LeaseItems, Sku};

/// The future a router answers with.
pub type Routed<'a> = Pin<Box<dyn Future<Output = Option<BackendName>> + Send + 'a>>;

/// Chooses the backend a new lease is placed on.
pub trait BackendRouter: std::fmt::Debug + Send + Sync {
    /// The backend for a lease of `items`, if any may take it.
    fn route<'a>(&'a self, items: &'a LeaseItems) -> Routed<'a>;

    /// Whether `backend` serves `sku` (a restore into another tier stays on its backend,
    /// which must serve the new SKU). Without routing rules, every backend serves everything.
    fn serves(&self, _backend: &BackendName, _sku: &Sku) -> bool {
        true
    }
}
