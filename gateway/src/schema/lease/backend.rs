//! The lease data that lives at its backend, read through to it: how to reach the lease
//! (`GET /info/{lease}`) and its logs (`GET /logs/{lease}?tail=N`), for the owner only, with
//! the protocol's size caps; and what Leasehold keeps about it besides the lease itself: the
//! tenant's retained leases, and the operators' diagnostics.
//!
//! The backend a lease is on comes from the operator-only diagnostics row and is never shown.
//! What a tenant sees of a backend's answer is declared here field by field; anything else it
//! sends (container ids, free-form metadata) is not passed on. A backend that cannot be
//! reached is `UNAVAILABLE` (retry later) with a generic message; its own words are logged.

use async_graphql::{Context, ID, Object, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::backends::wire::{LeaseInfo, LeaseInstance, PortBinding};
use leasehold_adapters::backends::{BackendClient, BackendError, CallError};
use leasehold_adapters::read_models::PAGE_ROWS_MAX;
use leasehold_domain::TenantId;
use leasehold_domain::lease::LeaseId;

use crate::auth::Role;
use crate::errors::{ApiError, ApiResult, Code};
use crate::schema::query::uuid_arg;
use crate::schema::{require, shared, tenant_of};

/// Most log lines per instance one read asks for.
const LOG_TAIL_MAX: i32 = 10_000;

/// The lease's backend reads, merged into the `Query` root.
#[derive(Debug, Default, Clone, Copy)]
pub struct LeaseBackendQuery;

/// A published port.
#[derive(Debug, Clone, SimpleObject)]
pub struct PortView {
    /// `port/protocol`, as published (`80/tcp`).
    pub port: String,
    /// The address it is bound on.
    pub host_ip: String,
    /// The port on that address.
    pub host_port: String,
}

/// One running instance.
#[derive(Debug, Clone, SimpleObject)]
pub struct InstanceView {
    /// Its index within its service.
    pub index: u32,
    /// Its image.
    pub image: Option<String>,
    /// Its status, in the backend's words.
    pub status: Option<String>,
    /// Its host name.
    pub fqdn: Option<String>,
    /// Its ports.
    pub ports: Vec<PortView>,
}

/// One service of a stack lease.
#[derive(Debug, Clone, SimpleObject)]
pub struct ServiceConnectionView {
    /// Its name.
    pub name: String,
    /// Its host name.
    pub fqdn: Option<String>,
    /// Its instances.
    pub instances: Vec<InstanceView>,
}

/// How to reach a lease, as its backend says.
#[derive(Debug, Clone, SimpleObject)]
pub struct LeaseConnectionView {
    /// The host.
    pub host: Option<String>,
    /// The host name.
    pub fqdn: Option<String>,
    /// The protocol.
    pub protocol: Option<String>,
    /// Its ports.
    pub ports: Vec<PortView>,
    /// Its instances.
    pub instances: Vec<InstanceView>,
    /// Its services (stack leases).
    pub services: Vec<ServiceConnectionView>,
}

/// One instance's log tail.
#[derive(Debug, Clone, SimpleObject)]
pub struct InstanceLogView {
    /// The instance, as the backend keys it.
    pub instance: String,
    /// Its last lines.
    pub text: String,
}

/// A retained lease: released, its data kept for a restore.
#[derive(Debug, Clone, SimpleObject)]
pub struct RetainedLeaseView {
    /// The lease.
    pub id: ID,
    /// Its provider.
    pub provider_id: ID,
    /// `active` (restorable), `restoring` or `reaping` (being destroyed; not restorable).
    pub status: String,
    /// When its grace ends and it is reaped (none: no deadline).
    pub retained_until: Option<DateTime<Utc>>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

/// A lease's failure budget, from the last complete inventory.
#[derive(Debug, Clone, SimpleObject)]
pub struct BudgetView {
    /// `available` or `exhausted`.
    pub verdict: String,
    /// Failures in a row.
    pub consecutive_failures: Option<u32>,
}

/// What operators may know of a lease beyond what its tenant sees.
#[derive(Debug, Clone, SimpleObject)]
pub struct LeaseDiagnosticsView {
    /// The lease.
    pub id: ID,
    /// Its tenant.
    pub tenant: String,
    /// The backend it is placed on.
    pub backend: Option<String>,
    /// The last failure's full detail.
    pub last_error: Option<String>,
    /// Failures over its life (diagnostic only: it never decides anything).
    pub fail_count: u32,
    /// Its work generation.
    pub generation: u64,
    /// Its failure budget, when a complete inventory reported one.
    pub budget: Option<BudgetView>,
}

#[Object]
impl LeaseBackendQuery {
    /// How to reach one of your leases, from its backend: `NOT_PROVISIONED` until it is
    /// ready (distinct from `NOT_FOUND`: you have no such lease), `UNAVAILABLE` while its
    /// backend cannot be reached.
    async fn lease_connection(&self, ctx: &Context<'_>, id: ID) -> ApiResult<LeaseConnectionView> {
        let tenant = tenant_of(ctx, "read leases")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let client = backend_of(ctx, tenant, lease, &["ready"]).await?;
        let info = client.info(lease.0).await.map_err(|error| backend_failed(&error))?;
        Ok(connection_of(info))
    }

    /// The last `tail` lines (1 to 10,000; default 100) of each instance's log of one of your
    /// leases, from its backend: `NOT_PROVISIONED` while nothing runs.
    async fn lease_logs(
        &self,
        ctx: &Context<'_>,
        id: ID,
        tail: Option<i32>,
    ) -> ApiResult<Vec<InstanceLogView>> {
        let tenant = tenant_of(ctx, "read leases")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let tail = tail.unwrap_or(100);
        let tail = u32::try_from(tail)
            .ok()
            .filter(|tail| (1..=LOG_TAIL_MAX.unsigned_abs()).contains(tail))
            .ok_or_else(|| ApiError::bad_input(format!("tail: 1 to {LOG_TAIL_MAX}")))?;
        let running = &["ready", "failing", "failed", "restarting", "updating"];
        let client = backend_of(ctx, tenant, lease, running).await?;
        let logs = client.logs(lease.0, tail).await.map_err(|error| backend_failed(&error))?;
        Ok(logs.into_iter().map(|(instance, text)| InstanceLogView { instance, text }).collect())
    }

    /// Your retained leases (released with their data kept), soonest reaped first.
    async fn retained_leases(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Records wanted, 1 to 100 (default 100).")] first: Option<i32>,
    ) -> ApiResult<Vec<RetainedLeaseView>> {
        let tenant = tenant_of(ctx, "read retained leases")?;
        let first =
            first.map_or(Ok(PAGE_ROWS_MAX), |n| crate::schema::query::page_rows(Some(n)))?;
        let rows = shared(ctx).read_models.retained_leases(tenant, first).await?;
        Ok(rows
            .into_iter()
            .map(|row| RetainedLeaseView {
                id: ID(row.lease_id.0.to_string()),
                provider_id: ID(row.provider_id.to_string()),
                status: row.status,
                retained_until: row.retained_until,
                updated_at: row.updated_at,
            })
            .collect())
    }

    /// A lease's diagnostics (operators): its tenant, backend, last full error and failure
    /// budget. Never served to tenants.
    async fn lease_diagnostics(
        &self,
        ctx: &Context<'_>,
        id: ID,
    ) -> ApiResult<LeaseDiagnosticsView> {
        require(ctx, &[Role::Operator], "read lease diagnostics")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let found = shared(ctx).read_models.lease_diagnostics(lease).await?;
        let row = found.ok_or_else(|| ApiError::not_found("lease"))?;
        Ok(LeaseDiagnosticsView {
            id,
            tenant: row.tenant_id,
            backend: row.backend_name,
            last_error: row.last_error,
            fail_count: row.fail_count,
            generation: row.generation,
            budget: row.budget_verdict.map(|verdict| BudgetView {
                verdict,
                consecutive_failures: row.consecutive_failures,
            }),
        })
    }
}

/// How long a release listing's read-through may take before the images are left out.
const RELEASE_IMAGES_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Each release's image by version, as the lease's backend lists them (`GET /releases`):
/// empty when it cannot be asked, does not answer in time, or fails. The listing itself comes
/// from the log; only the image is the backend's to say.
pub(crate) async fn release_images(
    ctx: &Context<'_>,
    lease: LeaseId,
) -> std::collections::HashMap<u32, String> {
    let state = shared(ctx);
    let Ok(Some(diagnostics)) = state.read_models.lease_diagnostics(lease).await else {
        return std::collections::HashMap::new();
    };
    let client = state.router.as_ref().and_then(|router| {
        let placed = diagnostics.backend_name.as_deref();
        router.backends().iter().find(|c| Some(c.name()) == placed && !c.config().subscribes)
    });
    let Some(client) = client else { return std::collections::HashMap::new() };
    match tokio::time::timeout(RELEASE_IMAGES_WAIT, client.releases(lease.0)).await {
        Ok(Ok(releases)) => releases.into_iter().map(|r| (r.version, r.image)).collect(),
        Ok(Err(error)) => {
            tracing::debug!(%error, "release images unavailable");
            std::collections::HashMap::new()
        }
        Err(_) => std::collections::HashMap::new(),
    }
}

/// The client of the backend the tenant's lease is on, if the lease is in one of `statuses`.
async fn backend_of<'a>(
    ctx: &Context<'a>,
    tenant: &TenantId,
    lease: LeaseId,
    statuses: &[&str],
) -> ApiResult<&'a BackendClient> {
    let state = shared(ctx);
    let found = state.read_models.lease(tenant, lease).await?;
    let summary = found.ok_or_else(|| ApiError::not_found("lease"))?;
    if !statuses.contains(&summary.status.as_str()) {
        return Err(not_provisioned(&summary.status));
    }
    let placed = state.read_models.lease_diagnostics(lease).await?.and_then(|d| d.backend_name);
    let client = state.router.as_ref().and_then(|router| {
        router.backends().iter().find(|client| Some(client.name()) == placed.as_deref())
    });
    match client {
        // A backend behind NAT is never called: nothing can be read through to it.
        Some(client) if !client.config().subscribes => Ok(client),
        _ => Err(ApiError::new(
            Code::Unavailable,
            "this lease's backend cannot be reached from here",
        )),
    }
}

fn not_provisioned(status: &str) -> ApiError {
    ApiError::new(Code::NotProvisioned, format!("the lease is not provisioned (it is {status})"))
}

/// What a client is told of a failed read-through.
fn backend_failed(error: &CallError) -> ApiError {
    match error {
        CallError::Backend(BackendError::NotProvisioned) => not_provisioned("not ready there"),
        CallError::TooLarge { limit_bytes } => ApiError::bad_input(format!(
            "tail: the answer is larger than {} MiB; ask for fewer lines",
            limit_bytes >> 20
        )),
        other => {
            tracing::warn!(error = %other, "a read through to a lease backend failed");
            ApiError::new(Code::Unavailable, "the lease's backend did not answer; try again")
        }
    }
}

fn ports_of(ports: Option<std::collections::BTreeMap<String, PortBinding>>) -> Vec<PortView> {
    ports
        .unwrap_or_default()
        .into_iter()
        .map(|(port, binding)| PortView {
            port,
            host_ip: binding.host_ip,
            host_port: binding.host_port,
        })
        .collect()
}

fn instances_of(instances: Option<Vec<LeaseInstance>>) -> Vec<InstanceView> {
    instances
        .unwrap_or_default()
        .into_iter()
        .map(|instance| InstanceView {
            index: instance.instance_index,
            image: instance.image,
            status: instance.status,
            fqdn: instance.fqdn,
            ports: ports_of(instance.ports),
        })
        .collect()
}

fn connection_of(info: LeaseInfo) -> LeaseConnectionView {
    LeaseConnectionView {
        host: info.host,
        fqdn: info.fqdn,
        protocol: info.protocol,
        ports: ports_of(info.ports),
        instances: instances_of(info.instances),
        services: info
            .services
            .unwrap_or_default()
            .into_iter()
            .map(|(name, service)| ServiceConnectionView {
                name,
                fqdn: service.fqdn,
                instances: instances_of(service.instances),
            })
            .collect(),
    }
}
