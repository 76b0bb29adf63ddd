//! `workloads`: every kind of rented compute the tenant holds (leases, VMs, rentals, runs and
//! runner leases), in one Relay list of one shape, each with its kind's own detail behind
//! the `WorkloadDetail` union.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{ComplexObject, Context, ID, InputObject, SimpleObject, Union};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::Scope;
use leasehold_adapters::read_models::{WorkloadListing, WorkloadSummary};
use uuid::Uuid;

use super::{caller, shared, tenant_of};
use crate::cursor::CursorKind;
use crate::errors::ApiResult;

/// What one workload runs.
#[derive(Debug, Clone, SimpleObject)]
pub struct WorkloadItem {
    /// The service, for stacks.
    pub service_name: Option<String>,
    /// The SKU.
    pub sku: String,
    /// How many.
    pub count: u64,
}

/// What a workload holds of one resource.
#[derive(Debug, Clone, SimpleObject)]
pub struct WorkloadResource {
    /// The resource, named as quotas name it (`runner.vcpu`, a lease's SKU, ...).
    pub sku: String,
    /// How much.
    pub quantity: u64,
}

/// A workload's kind-specific detail, as that kind's own query shows it.
#[derive(Union)]
pub enum WorkloadDetail {
    /// A lease.
    Lease(Box<crate::schema::lease::types::LeaseView>),
    /// A VM.
    Vm(Box<crate::schema::vm::types::Vm>),
    /// A rental.
    Rental(Box<crate::schema::rental::types::Rental>),
    /// A run.
    Run(Box<crate::schema::run::types::Run>),
    /// A runner lease.
    RunnerLease(Box<crate::schema::runner::types::RunnerLease>),
}

/// A workload of any kind.
#[derive(Debug, Clone, SimpleObject)]
#[graphql(complex)]
pub struct Workload {
    /// Its id (for leases, the lease id).
    pub id: ID,
    /// Its kind: `lease`, `vm`, `rental`, `run` or `runner`.
    pub kind: String,
    /// Its state, in the kind's own words (`provisioning`, `ready`, `busy`, ...).
    pub state: String,
    /// Its state (the same as `state`).
    #[graphql(deprecation = "Use `state`.")]
    pub status: String,
    /// What it holds, by resource (empty for a run, which runs on its rental's).
    pub resources: Vec<WorkloadResource>,
    /// Where it is placed.
    pub backend_name: Option<String>,
    /// What it runs.
    pub items: Vec<WorkloadItem>,
    /// When it was requested.
    pub created_at: DateTime<Utc>,
    /// When it last changed.
    pub updated_at: DateTime<Utc>,
}

impl From<WorkloadSummary> for Workload {
    fn from(workload: WorkloadSummary) -> Self {
        let resources = resources_of(&workload.items);
        let items = workload.items.into_iter().map(|item| WorkloadItem {
            service_name: item.service_name,
            sku: item.sku,
            count: item.count,
        });
        Self {
            id: ID(workload.workload_id.to_string()),
            kind: workload.kind,
            state: workload.status.clone(),
            status: workload.status,
            resources,
            backend_name: workload.backend_name,
            items: items.collect(),
            created_at: workload.created_at,
            updated_at: workload.updated_at,
        }
    }
}

/// What `items` hold, summed by SKU.
fn resources_of(items: &[leasehold_adapters::read_models::WorkloadItem]) -> Vec<WorkloadResource> {
    let mut resources: Vec<WorkloadResource> = Vec::new();
    for item in items {
        match resources.iter_mut().find(|held| held.sku == item.sku) {
            Some(held) => held.quantity += item.count,
            None => {
                resources.push(WorkloadResource { sku: item.sku.clone(), quantity: item.count })
            }
        }
    }
    resources
}

#[ComplexObject]
impl Workload {
    /// Its kind's own detail (null when that kind's read model has not caught up yet).
    async fn detail(&self, ctx: &Context<'_>) -> ApiResult<Option<WorkloadDetail>> {
        let tenant = tenant_of(ctx, "read workloads")?;
        let id = crate::schema::query::uuid_arg("id", &self.id)?;
        detail_of(ctx, tenant, &self.kind, id).await
    }
}

/// The detail of `tenant`'s workload `id` of `kind`.
async fn detail_of(
    ctx: &Context<'_>,
    tenant: &leasehold_domain::TenantId,
    kind: &str,
    id: Uuid,
) -> ApiResult<Option<WorkloadDetail>> {
    let state = shared(ctx);
    let models = &state.read_models;
    let scope = Scope::Tenant(tenant);
    Ok(match kind {
        "lease" => {
            let found = models.lease(tenant, leasehold_domain::lease::LeaseId(id)).await?;
            found.map(|row| WorkloadDetail::Lease(Box::new(row.into())))
        }
        "vm" => {
            let found = models.vm(tenant, leasehold_domain::values::fleet::VmId(id)).await?;
            found.map(|row| WorkloadDetail::Vm(Box::new(row.into())))
        }
        "rental" => {
            let now = state.rented.rentals.pipeline().clock().now();
            let found = models.rental(scope, id).await?;
            let rental = found.map(|row| crate::schema::rental::types::Rental::of(row, false, now));
            rental.map(|rental| WorkloadDetail::Rental(Box::new(rental)))
        }
        "run" => models.run(scope, id).await?.map(|row| WorkloadDetail::Run(Box::new(row.into()))),
        "runner" => {
            let found = models.runner_lease(scope, id).await?;
            let lease = found.map(|row| crate::schema::runner::types::RunnerLease::of(row, false));
            lease.map(|lease| WorkloadDetail::RunnerLease(Box::new(lease)))
        }
        _ => None,
    })
}

/// Which workloads to list.
#[derive(Debug, Clone, Default, InputObject)]
pub struct WorkloadFilter {
    /// Only this kind: `lease`, `vm`, `rental`, `run` or `runner`.
    pub kind: Option<String>,
    /// Only workloads in this state (`ready`, `busy`, ...).
    pub state: Option<String>,
    /// Only this status (the same as `state`).
    #[graphql(deprecation = "Use `state`.")]
    pub status: Option<String>,
}

/// `workloads(first, after, filter)`.
pub(crate) async fn page(
    ctx: &Context<'_>,
    first: usize,
    after: Option<String>,
    filter: Option<WorkloadFilter>,
) -> ApiResult<Connection<String, Workload>> {
    let tenant = tenant_of(ctx, "read workloads")?;
    let state = shared(ctx);
    let scope = caller(ctx)?.cursor_scope();
    let after = after
        .map(|text| {
            state.cursors.open::<(DateTime<Utc>, Uuid)>(
                CursorKind::Workloads,
                &scope,
                "after",
                &text,
            )
        })
        .transpose()?;
    let filter = filter.unwrap_or_default();
    let status = match (filter.state, filter.status) {
        (Some(state), Some(status)) if state != status => {
            return Err(crate::errors::ApiError::bad_input(
                "filter.status: differs from filter.state (use state alone)",
            ));
        }
        (state, status) => state.or(status),
    };
    let listing = WorkloadListing { kind: filter.kind, status, after, first: first + 1 };
    let mut rows = state.read_models.workloads(tenant, &listing).await?;
    let has_next = rows.len() > first;
    rows.truncate(first);
    let mut connection = Connection::new(after.is_some(), has_next);
    for row in rows {
        let key = (row.created_at, row.workload_id);
        let cursor = state.cursors.seal(CursorKind::Workloads, &scope, &key);
        connection.edges.push(Edge::new(cursor, Workload::from(row)));
    }
    Ok(connection)
}
