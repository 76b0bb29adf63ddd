//! The lease's queries, merged into the `Query` root.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::LeaseListing;
use leasehold_domain::lease::LeaseId;
use uuid::Uuid;

use super::types::{LeaseFilter, LeaseView, LeaseWork, ReleaseView};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::caller_of;
use crate::schema::events::read_models_as_of;
use crate::schema::query::{page_rows, uuid_arg};
use crate::schema::{caller, require_lease, shared, tenant_of};

/// The lease's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct LeaseReadQuery;

#[Object]
impl LeaseReadQuery {
    /// What the lease's backend is carrying out now (agents and operators): the operation its
    /// reports must name, with the callback path for it, and a pending restart or update's
    /// fence. An agent bound to a provider finds only that provider's leases.
    async fn lease_work(&self, ctx: &Context<'_>, id: ID) -> ApiResult<LeaseWork> {
        let principal = require_lease(ctx, &[Role::Agent, Role::Operator], "read lease work")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let caller = caller_of(principal, None);
        let work = shared(ctx).leases.current_work(&caller, lease).await?;
        Ok(LeaseWork::from(work))
    }

    /// One of your leases by id (`NOT_FOUND` when you have none with that id).
    async fn lease(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(desc = "A log cursor you were given: the lease as it was when the log \
                          stood there.")]
        as_of: Option<String>,
    ) -> ApiResult<LeaseView> {
        let tenant = tenant_of(ctx, "read leases")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let read_models = read_models_as_of(
            ctx,
            as_of.as_deref(),
            (Entity::Lease(lease), "lease"),
            Some(tenant.as_str()),
        )
        .await?;
        let found = read_models.lease(tenant, lease).await?;
        found.map(LeaseView::from).ok_or_else(|| ApiError::not_found("lease"))
    }

    /// The releases of one of your leases, oldest first (`NOT_FOUND` when you have no lease
    /// with that id), each with its image when the lease's backend says it within 2 s.
    async fn lease_releases(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(desc = "A log cursor you were given: the releases as they were when the \
                          log stood there.")]
        as_of: Option<String>,
    ) -> ApiResult<Vec<ReleaseView>> {
        let tenant = tenant_of(ctx, "read leases")?;
        let lease = LeaseId(uuid_arg("id", &id)?);
        let entity = (Entity::Lease(lease), "lease");
        let read_models =
            read_models_as_of(ctx, as_of.as_deref(), entity, Some(tenant.as_str())).await?;
        if read_models.lease(tenant, lease).await?.is_none() {
            return Err(ApiError::not_found("lease"));
        }
        let releases = read_models.releases(tenant, lease).await?;
        let images = super::backend::release_images(ctx, lease).await;
        Ok(releases
            .into_iter()
            .map(|release| {
                let image = images.get(&release.version).cloned();
                ReleaseView { image, ..ReleaseView::from(release) }
            })
            .collect())
    }

    /// Your leases, newest first; or, with `ids`, those of them you have (at most 100 ids,
    /// repeated ones once, unknown ones simply absent; one page, no `first` or `after`).
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn leases(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "Leases wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<LeaseFilter>,
        #[graphql(desc = "Look these leases up instead of listing (1 to 100 ids).")] ids: Option<
            Vec<ID>,
        >,
    ) -> ApiResult<Connection<String, LeaseView>> {
        let tenant = tenant_of(ctx, "read leases")?;
        let state = shared(ctx);
        if let Some(ids) = ids {
            if first.is_some() || after.is_some() || filter.is_some() {
                return Err(ApiError::bad_input("ids: a lookup takes no first, after or filter"));
            }
            let ids = lookup_ids(&ids)?;
            let rows = state.read_models.leases_by_id(tenant, &ids).await?;
            let mut connection = Connection::new(false, false);
            let scope = caller(ctx)?.cursor_scope();
            for row in rows {
                let key = (row.created_at, row.lease_id.0);
                let cursor = state.cursors.seal(CursorKind::Leases, &scope, &key);
                connection.edges.push(Edge::new(cursor, LeaseView::from(row)));
            }
            return Ok(connection);
        }
        let scope = caller(ctx)?.cursor_scope();
        let first = page_rows(first)?;
        let after = after
            .map(|text| {
                state.cursors.open::<(DateTime<Utc>, Uuid)>(
                    CursorKind::Leases,
                    &scope,
                    "after",
                    &text,
                )
            })
            .transpose()?;
        // `Unknown` names no stored status: it matches nothing.
        let status = filter.and_then(|filter| filter.status).map(|status| {
            status
                .domain()
                .map_or("unknown", leasehold_domain::lease::LeaseStatus::name)
                .to_string()
        });
        // One row more than asked says whether there is a next page.
        let listing = LeaseListing { status, after, first: first + 1 };
        let mut rows = state.read_models.leases(tenant, &listing).await?;
        let has_next = rows.len() > first;
        rows.truncate(first);
        let mut connection = Connection::new(after.is_some(), has_next);
        for row in rows {
            let key = (row.created_at, row.lease_id.0);
            let cursor = state.cursors.seal(CursorKind::Leases, &scope, &key);
            connection.edges.push(Edge::new(cursor, LeaseView::from(row)));
        }
        Ok(connection)
    }
}

/// Most ids one lookup takes (rule 30).
const LOOKUP_IDS_MAX: usize = 100;

/// The ids of a lookup: 1 to 100 UUIDs, each once, in the order first given.
fn lookup_ids(ids: &[ID]) -> ApiResult<Vec<Uuid>> {
    if ids.is_empty() || ids.len() > LOOKUP_IDS_MAX {
        return Err(ApiError::bad_input(format!("ids: 1 to {LOOKUP_IDS_MAX} lease ids")));
    }
    let mut seen = Vec::with_capacity(ids.len());
    for (index, id) in ids.iter().enumerate() {
        let id = Uuid::parse_str(id)
            .map_err(|_| ApiError::bad_input(format!("ids[{index}]: not a UUID")))?;
        if !seen.contains(&id) {
            seen.push(id);
        }
    }
    Ok(seen)
}
