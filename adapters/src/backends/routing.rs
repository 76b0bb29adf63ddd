//! Where a new lease goes, by fred's rules (`docs/issue-10-research.md` §8): the routing SKU is
//! the first item's; the backends listing it exactly are the candidates. None: the default
//! backend (the one marked `default`, else the first). One: it, asked nothing. Several: each
//! one's `GET /stats` at once (2 s at most); a candidate is usable when it reports CPU cores;
//! candidates not withholding disk are preferred (the seed's extension), then the lowest
//! allocated/total CPU ratio (ties within 1e-9), ties taken in turn. No usable answer: the
//! candidates in turn, counted as a routing fallback. A fenced backend is never a candidate,
//! never the default, and never asked for its stats; a SKU only fenced backends list has no
//! backend (`NoBackend`), rather than the default's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use leasehold_commands::{BackendRouter, Routed};
use leasehold_domain::lease::{BackendName, LeaseItems};

use super::BackendClient;
use crate::dispatch::Backends;

/// How long the candidates' stats are waited for (fred's `statsFetchTimeout`).
const STATS_WAIT: Duration = Duration::from_secs(2);

/// CPU ratios closer than this are a tie (fred's `cpuRatioEpsilon`).
const RATIO_EPSILON: f64 = 1e-9;

/// The router over the backends file's backends.
#[derive(Debug)]
pub struct Router {
    /// In the file's order.
    backends: Vec<BackendClient>,
    turn: AtomicUsize,
    fallbacks: AtomicU64,
}

impl Router {
    /// Routes over `backends`, in the order `order` names them (the file's).
    pub fn new(backends: &Backends, order: &[String]) -> Self {
        let backends = order.iter().filter_map(|name| backends.get(name).cloned()).collect();
        Self { backends, turn: AtomicUsize::new(0), fallbacks: AtomicU64::new(0) }
    }

    /// Every backend, in the file's order.
    pub fn backends(&self) -> &[BackendClient] {
        &self.backends
    }

    /// How many times no candidate reported usable stats.
    pub fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    /// The backend's name for a lease whose first SKU is `sku`.
    pub async fn route_sku(&self, sku: &str) -> Option<String> {
        let listing: Vec<&BackendClient> = self
            .backends
            .iter()
            .filter(|b| b.config().skus.iter().any(|listed| listed == sku))
            .collect();
        // A SKU whose only backends are fenced has nowhere to go: never the default, which
        // does not serve it.
        let candidates: Vec<&BackendClient> =
            listing.iter().copied().filter(|b| !b.config().fenced).collect();
        match candidates.as_slice() {
            [] if !listing.is_empty() => None,
            [] => self.default_backend().map(|b| b.name().to_string()),
            [only] => Some(only.name().to_string()),
            several => Some(self.least_loaded(several).await.name().to_string()),
        }
    }

    /// The default backend, unless it is fenced.
    fn default_backend(&self) -> Option<&BackendClient> {
        let marked = self.backends.iter().find(|b| b.config().default);
        marked.or_else(|| self.backends.first()).filter(|b| !b.config().fenced)
    }

    async fn least_loaded<'a>(&self, candidates: &[&'a BackendClient]) -> &'a BackendClient {
        let asked = candidates.iter().map(|backend| async move {
            // One behind NAT cannot be asked: it has no load figures.
            if backend.config().subscribes {
                return None;
            }
            match tokio::time::timeout(STATS_WAIT, backend.stats()).await {
                Ok(Ok(stats)) if stats.total_cpu_cores > 0.0 => Some((
                    *backend,
                    stats.disk_withheld.unwrap_or(false),
                    stats.allocated_cpu_cores / stats.total_cpu_cores,
                )),
                _ => None,
            }
        });
        let usable: Vec<_> =
            futures_util::future::join_all(asked).await.into_iter().flatten().collect();
        if usable.is_empty() {
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            tracing::info!(candidates = candidates.len(), "routing fallback: no usable stats");
            return candidates[self.turn.fetch_add(1, Ordering::Relaxed) % candidates.len()];
        }
        let keeping_disk: Vec<_> = usable.iter().filter(|(_, withheld, _)| !withheld).collect();
        let pool: Vec<_> =
            if keeping_disk.is_empty() { usable.iter().collect() } else { keeping_disk };
        let lowest = pool.iter().map(|(_, _, ratio)| *ratio).fold(f64::INFINITY, f64::min);
        let tied: Vec<_> =
            pool.iter().filter(|(_, _, ratio)| ratio - lowest <= RATIO_EPSILON).collect();
        tied[self.turn.fetch_add(1, Ordering::Relaxed) % tied.len()].0
    }
}

impl BackendRouter for Router {
    fn route<'a>(&'a self, items: &'a LeaseItems) -> Routed<'a> {
        Box::pin(async move {
            let sku = items.as_slice().first()?.sku.as_str();
            let name = self.route_sku(sku).await?;
            BackendName::parse("backend", name).ok()
        })
    }

    /// It lists the SKU, or it is the default and no backend lists it.
    fn serves(&self, backend: &BackendName, sku: &leasehold_domain::lease::Sku) -> bool {
        let sku = sku.as_str();
        let Some(named) = self.backends.iter().find(|b| b.name() == backend.as_str()) else {
            return false;
        };
        if named.config().skus.iter().any(|listed| listed == sku) {
            return true;
        }
        let listed_anywhere =
            self.backends.iter().any(|b| b.config().skus.iter().any(|listed| listed == sku));
        !listed_anywhere && self.default_backend().is_some_and(|d| d.name() == named.name())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backends::{BackendConfig, SigningSecret};

    fn backend(name: &str, skus: &[&str], default: bool, fenced: bool) -> BackendClient {
        let secret = SigningSecret::new(&[7u8; 32]).expect("long enough");
        // Nothing listens there: these cases must be decided without asking anyone.
        let mut config = BackendConfig::new(name, "http://127.0.0.1:9", secret);
        config.skus = skus.iter().map(ToString::to_string).collect();
        config.default = default;
        config.fenced = fenced;
        BackendClient::new(config, Arc::new(leasehold_commands::SystemClock)).expect("a client")
    }

    fn router(backends: Vec<BackendClient>) -> Router {
        let order: Vec<String> = backends.iter().map(|b| b.name().to_string()).collect();
        Router::new(&Backends::new(backends), &order)
    }

    #[tokio::test]
    async fn one_candidate_takes_it_and_the_default_takes_what_nobody_lists() {
        let router = router(vec![
            backend("gpu", &["gpu.h100.1x"], false, false),
            backend("general", &[], true, false),
        ]);
        assert_eq!(router.route_sku("gpu.h100.1x").await.as_deref(), Some("gpu"));
        assert_eq!(router.route_sku("cpu.small").await.as_deref(), Some("general"));
        // Without a marked default, the first backend is it.
        let router = router_of_two_unmarked();
        assert_eq!(router.route_sku("cpu.small").await.as_deref(), Some("first"));
    }

    fn router_of_two_unmarked() -> Router {
        router(vec![backend("first", &[], false, false), backend("second", &[], false, false)])
    }

    #[tokio::test]
    async fn a_fenced_backend_is_never_chosen_and_never_stands_in_for_the_default() {
        let router = router(vec![
            backend("gpu", &["gpu.h100.1x"], false, true),
            backend("general", &[], true, false),
        ]);
        // Only a fenced backend serves the SKU: no backend, never the default's.
        assert_eq!(router.route_sku("gpu.h100.1x").await, None);
        let router = router_fenced_default();
        assert_eq!(router.route_sku("cpu.small").await, None);
    }

    #[test]
    fn a_backend_serves_what_it_lists_and_the_default_what_nobody_lists() {
        let router = router(vec![
            backend("gpu", &["gpu.h100.1x"], false, false),
            backend("general", &[], true, false),
        ]);
        let name = |n: &str| BackendName::parse("backend", n).expect("a name");
        let sku = |s: &str| leasehold_domain::lease::Sku::parse("sku", s).expect("a SKU");
        assert!(router.serves(&name("gpu"), &sku("gpu.h100.1x")));
        assert!(!router.serves(&name("gpu"), &sku("cpu.small")));
        assert!(router.serves(&name("general"), &sku("cpu.small")));
        assert!(!router.serves(&name("general"), &sku("gpu.h100.1x")), "listed elsewhere");
        assert!(!router.serves(&name("unknown"), &sku("cpu.small")));
    }

    fn router_fenced_default() -> Router {
        router(vec![backend("general", &[], true, true), backend("other", &[], false, false)])
    }
}
