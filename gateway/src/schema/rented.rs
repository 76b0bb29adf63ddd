//! What the rented kinds' modules (`rental/`, `run/`) share: whose rows a caller reads, and a
//! page of a newest-first list under a sealed cursor.

use async_graphql::connection::{Connection, Edge};
use async_graphql::{Context, OutputType};
use chrono::{DateTime, Utc};
use leasehold_adapters::read_models::{RentedListing, Scope};
use uuid::Uuid;

use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::schema::query::page_rows;
use crate::schema::{caller, shared};

/// Whose rows the caller reads, and whether it reads them as an operator: a tenant its own,
/// an operator every tenant's; nobody else reads rented capacity's read models.
pub(crate) fn reader_scope<'a>(ctx: &Context<'a>, what: &str) -> ApiResult<(Scope<'a>, bool)> {
    let principal = caller(ctx)?;
    match (principal.role, &principal.tenant) {
        (Role::Tenant, Some(tenant)) => Ok((Scope::Tenant(tenant), false)),
        (Role::Operator, _) => Ok((Scope::Every, true)),
        _ => Err(ApiError::forbidden(what)),
    }
}

/// One page of a newest-first list, positioned by `(created_at, id)`.
pub(crate) struct Page {
    kind: CursorKind,
    scope: String,
    first: usize,
    after: Option<(DateTime<Utc>, Uuid)>,
}

impl Page {
    /// The page `first` and `after` ask for (`after` a cursor of this list, sealed to the
    /// caller).
    pub(crate) fn open(
        ctx: &Context<'_>,
        kind: CursorKind,
        (first, after): (Option<i32>, Option<String>),
    ) -> ApiResult<Self> {
        let scope = caller(ctx)?.cursor_scope();
        let first = page_rows(first)?;
        let cursors = &shared(ctx).cursors;
        let after = after.map(|text| cursors.open(kind, &scope, "after", &text)).transpose()?;
        Ok(Self { kind, scope, first, after })
    }

    /// The listing to read: one row more than the page, to know whether another follows.
    pub(crate) fn listing(&self) -> RentedListing {
        RentedListing { after: self.after, first: self.first + 1, ..RentedListing::default() }
    }

    /// The page of `rows`, each with its position.
    pub(crate) fn connection<R, T: OutputType>(
        &self,
        ctx: &Context<'_>,
        mut rows: Vec<R>,
        mut node: impl FnMut(R) -> ((DateTime<Utc>, Uuid), T),
    ) -> ApiResult<Connection<String, T>> {
        let has_next = rows.len() > self.first;
        rows.truncate(self.first);
        let cursors = &shared(ctx).cursors;
        let mut connection = Connection::new(self.after.is_some(), has_next);
        for row in rows {
            let (position, item) = node(row);
            let cursor = cursors.seal(self.kind, &self.scope, &position);
            connection.edges.push(Edge::new(cursor, item));
        }
        Ok(connection)
    }
}
