//! The VM's queries, merged into the `Query` root.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, ID, Object};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::Entity;
use leasehold_adapters::read_models::VmListing;
use leasehold_domain::values::fleet::VmId;
use uuid::Uuid;

use super::types::{DeadLetter, Vm, VmFilter};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::events::read_models_as_of;
use crate::schema::query::{page_rows, uuid_arg};
use crate::schema::{caller, require, shared, tenant_of};

/// The VM's queries.
#[derive(Debug, Default, Clone, Copy)]
pub struct VmQuery;

#[Object]
impl VmQuery {
    /// One of your VMs by id (`NOT_FOUND` when you have none with that id).
    async fn vm(
        &self,
        ctx: &Context<'_>,
        id: ID,
        #[graphql(desc = "A log cursor you were given: the VM as it was when the log \
                          stood there.")]
        as_of: Option<String>,
    ) -> ApiResult<Vm> {
        let tenant = tenant_of(ctx, "read VMs")?;
        let vm = VmId(uuid_arg("id", &id)?);
        let read_models =
            read_models_as_of(ctx, as_of.as_deref(), (Entity::Vm(vm), "VM"), Some(tenant.as_str()))
                .await?;
        let found = read_models.vm(tenant, vm).await?;
        found.map(Vm::from).ok_or_else(|| ApiError::not_found("VM"))
    }

    /// What the fleet's reconcilers gave up on or tore down, newest first (operators).
    async fn dead_letters(&self, ctx: &Context<'_>) -> ApiResult<Vec<DeadLetter>> {
        require(ctx, &[Role::Operator], "read dead letters")?;
        let letters = shared(ctx).read_models.dead_letters().await?;
        Ok(letters.into_iter().map(DeadLetter::from).collect())
    }

    /// Your VMs, newest first.
    #[graphql(complexity = "first.unwrap_or(20).max(1) as usize * child_complexity")]
    async fn vms(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "VMs wanted, 1 to 100 (default 20).")] first: Option<i32>,
        #[graphql(desc = "The `endCursor` of the previous page.")] after: Option<String>,
        filter: Option<VmFilter>,
    ) -> ApiResult<Connection<String, Vm>> {
        let tenant = tenant_of(ctx, "read VMs")?;
        let state = shared(ctx);
        let scope = caller(ctx)?.cursor_scope();
        let first = page_rows(first)?;
        let after = after
            .map(|text| {
                state.cursors.open::<(DateTime<Utc>, Uuid)>(CursorKind::Vms, &scope, "after", &text)
            })
            .transpose()?;
        let listing =
            VmListing { state: filter.and_then(|filter| filter.state), after, first: first + 1 };
        let mut rows = state.read_models.vms(tenant, &listing).await?;
        let has_next = rows.len() > first;
        rows.truncate(first);
        let mut connection = Connection::new(after.is_some(), has_next);
        for row in rows {
            let cursor =
                state.cursors.seal(CursorKind::Vms, &scope, &(row.created_at, row.vm_id.0));
            connection.edges.push(Edge::new(cursor, Vm::from(row)));
        }
        Ok(connection)
    }
}
