//! Health probes: each backend's `GET /health` and `GET /stats`, recorded in `backend_status`
//! for operators. A fenced backend, or one that subscribes to its work (behind NAT), is never
//! called: it is reported unhealthy, saying why.

use chrono::{DateTime, Utc};
use leasehold_domain::StoreError;

use super::BackendClient;
use super::status::{PgBackendStatus, Probe};
use crate::dispatch::Backends;

/// Probes `client` (without calling it when it is fenced).
pub async fn probe(client: &BackendClient) -> Probe {
    let unprobed = Probe {
        healthy: false,
        error: None,
        cpu_load: None,
        active_containers: None,
        disk_withheld: None,
    };
    if client.config().fenced {
        return Probe { error: Some("fenced by an operator: never called".into()), ..unprobed };
    }
    if client.config().subscribes {
        return Probe { error: Some("subscribes to its work: never called".into()), ..unprobed };
    }
    if let Err(error) = client.health().await {
        return Probe { error: Some(error.to_string()), ..unprobed };
    }
    // A backend without stats is healthy with no load figures (routing then round-robins).
    let stats = client.stats().await.ok();
    let load = stats.as_ref().filter(|s| s.total_cpu_cores > 0.0);
    Probe {
        healthy: true,
        error: None,
        cpu_load: load.map(|s| s.allocated_cpu_cores / s.total_cpu_cores),
        active_containers: stats.as_ref().map(|s| s.active_containers),
        disk_withheld: stats.as_ref().and_then(|s| s.disk_withheld),
    }
}

/// Probes every backend of `backends` at once and records each at `now`.
///
/// # Errors
/// A database failure (the probes themselves never fail: a failure is what they record).
pub async fn probe_all(
    backends: &Backends,
    status: &PgBackendStatus,
    now: DateTime<Utc>,
) -> Result<(), StoreError> {
    let probes = backends.iter().map(|(name, client)| async move {
        (name.clone(), client.config().fenced, probe(client).await)
    });
    for (name, fenced, probe) in futures_util::future::join_all(probes).await {
        status.record_probe((&name, fenced), &probe, now).await?;
    }
    Ok(())
}
