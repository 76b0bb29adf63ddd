//! The log as GraphQL serves it: the `events` query and the `lifecycleEvents` subscription
//! deliver the same `LifecycleEvent`, each with its signed cursor. Tenants see their own
//! streams only, without the operator-only payload fields and metadata.

use async_graphql::{Context, InputObject, Json, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::PgReadModels;
use leasehold_adapters::read_models::Entity;
use leasehold_domain::{Cursor, EventStore as _, RecordedEvent, StreamType};

use super::{caller, shared};
use crate::auth::{Principal, Role};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::live::feed::Scope;
use crate::reads::Reads;

/// Most entries one filter list may hold.
const FILTER_ENTRIES_MAX: usize = 100;

/// Which events to deliver; each list, when given, must contain the event's value.
#[derive(Debug, Clone, Default, InputObject)]
pub struct EventFilter {
    /// Stream types (`lease`, ...).
    pub stream_types: Option<Vec<String>>,
    /// Stream ids (`lease-<uuid>`).
    pub stream_ids: Option<Vec<String>>,
    /// Event types (`LeaseProvisioned`, ...).
    pub event_types: Option<Vec<String>>,
}

/// One event of the log.
#[derive(Debug, Clone, SimpleObject)]
pub struct LifecycleEvent {
    /// Its position: resume after it with `after`.
    pub cursor: String,
    /// Its stream.
    pub stream_id: String,
    /// Its stream's type.
    pub stream_type: String,
    /// Its version in its stream (from 1).
    pub version: u64,
    /// Its type.
    #[graphql(name = "type")]
    pub event_type: String,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
    /// Its payload (for tenants, without operator-only fields).
    pub payload: Json<serde_json::Value>,
    /// Its id (operators and auditors only; null for tenants).
    pub event_id: Option<String>,
    /// Its tenant (operators and auditors only).
    pub tenant_id: Option<String>,
    /// Who caused it, correlation and operation key (operators and auditors only).
    pub metadata: Option<Json<serde_json::Value>>,
    /// Its hash-chain link, hex (operators and auditors only).
    pub hash: Option<String>,
}

/// What a caller may read of the log, narrowed by `filter`.
pub(crate) fn scope_of(principal: &Principal, filter: Option<EventFilter>) -> ApiResult<Scope> {
    let tenant = match principal.role {
        Role::Tenant => principal.tenant.clone(),
        Role::Operator | Role::Auditor => None,
        Role::Agent => return Err(ApiError::forbidden("read the log")),
    };
    let filter = filter.unwrap_or_default();
    let list = |field: &str, list: Option<Vec<String>>| {
        let list = list.unwrap_or_default();
        if list.len() > FILTER_ENTRIES_MAX {
            return Err(ApiError::bad_input(format!(
                "filter.{field}: at most {FILTER_ENTRIES_MAX} entries"
            )));
        }
        Ok(list)
    };
    let stream_types = list("streamTypes", filter.stream_types)?;
    if let Some(bad) = stream_types.iter().find(|t| StreamType::parse(t.as_str()).is_err()) {
        return Err(ApiError::bad_input(format!(
            "filter.streamTypes: {bad:?} is not a stream type"
        )));
    }
    Ok(Scope {
        tenant,
        stream_types,
        stream_ids: list("streamIds", filter.stream_ids)?,
        event_types: list("eventTypes", filter.event_types)?,
    })
}

/// The cursor an `after` argument names, or `None`.
pub(crate) fn after_of(ctx: &Context<'_>, after: Option<&str>) -> ApiResult<Option<Cursor>> {
    cursor_arg(ctx, "after", after)
}

/// The log cursor argument `field` names (one this caller was given), or `None`.
pub(crate) fn cursor_arg(
    ctx: &Context<'_>,
    field: &str,
    given: Option<&str>,
) -> ApiResult<Option<Cursor>> {
    let Some(text) = given else { return Ok(None) };
    let scope = caller(ctx)?.cursor_scope();
    let text: String = shared(ctx).cursors.open(CursorKind::Log, &scope, field, text)?;
    text.parse().map(Some).map_err(|_| ApiError::bad_input(format!("{field}: malformed cursor")))
}

/// The read models a single-entity query reads: the live ones, or with `asOf` (a log cursor
/// this caller was given) `entity`'s as its projection had written them when it reached that
/// cursor ([`PgReadModels::as_of`]); `what` names it in a `NOT_FOUND`. `owner` is the caller's
/// tenant (`None` for an operator's query of any tenant's): another tenant's entity is not
/// found before anything is folded.
pub(crate) async fn read_models_as_of(
    ctx: &Context<'_>,
    as_of: Option<&str>,
    (entity, what): (Entity, &str),
    owner: Option<&str>,
) -> ApiResult<PgReadModels> {
    let state = shared(ctx);
    let Some(at) = cursor_arg(ctx, "asOf", as_of)? else { return Ok(state.read_models.clone()) };
    // A mutation's cursor is handed out at its commit, perhaps before the log's readers can
    // read up to it (an earlier transaction still open): until they can, the past there may
    // still change. Wait as a `minCursor` on the log does.
    let stores = (&state.store, &state.read_models);
    let wait = state.config.consistency_wait;
    state.projections.reached(stores, at, wait, &Reads::Some(Vec::new())).await?;
    match state.read_models.as_of(at, entity, owner).await? {
        Some(past) => Ok(past),
        None => Err(ApiError::not_found(what)),
    }
}

/// The event as `principal` may see it, with a cursor sealed for it.
pub(crate) fn view_of(
    cursors: &crate::cursor::CursorKey,
    principal: &Principal,
    event: RecordedEvent,
) -> LifecycleEvent {
    let scope = principal.cursor_scope();
    let cursor = cursors.seal(CursorKind::Log, &scope, &event.cursor.to_string());
    let privileged = principal.role != Role::Tenant;
    let payload = if privileged {
        event.payload
    } else {
        // Deny by default: only the fields the event type's registered view lists.
        leasehold_domain::registry::tenant_view(
            event.stream_type.as_str(),
            event.event_type.as_str(),
            &event.payload,
        )
    };
    LifecycleEvent {
        cursor,
        stream_id: event.stream_id.as_str().to_string(),
        stream_type: event.stream_type.as_str().to_string(),
        version: event.version,
        event_type: event.event_type.as_str().to_string(),
        recorded_at: event.recorded_at,
        payload: Json(payload),
        event_id: privileged.then(|| event.event_id.as_uuid().to_string()),
        tenant_id: privileged.then(|| event.tenant_id.as_str().to_string()),
        metadata: privileged
            .then(|| Json(serde_json::to_value(&event.metadata).unwrap_or_default())),
        hash: privileged.then(|| hex::encode(event.hash)),
    }
}

/// Events one `events` page scans per event asked for (`first`) before it answers with what
/// it found (a filter or a tenant's view may match few): a request's cost follows what it
/// asks for, and its complexity is charged for it (see `QueryRoot::events`).
pub(crate) const SCAN_EVENTS_PER_WANTED: usize = 50;

/// What scanning for one wanted event adds to a query's complexity (10 events scanned per
/// point, the cost of a small field).
pub(crate) const SCAN_COMPLEXITY: usize = SCAN_EVENTS_PER_WANTED / 10;

/// A page of the log.
#[derive(Debug, Clone, SimpleObject)]
pub struct EventConnection {
    /// The events, each with its cursor.
    pub edges: Vec<EventEdge>,
    /// `endCursor` is where the next page starts: past the last event scanned, even when
    /// none matched, so a sparse filter does not rescan.
    pub page_info: EventPageInfo,
}

/// Where a page of the log stands.
#[derive(Debug, Clone, SimpleObject)]
pub struct EventPageInfo {
    /// Whether the page started after a cursor.
    pub has_previous_page: bool,
    /// Whether more events may follow now (a page that reached the end of the log says
    /// false; ask again from `endCursor` later).
    pub has_next_page: bool,
    /// The first event's cursor.
    pub start_cursor: Option<String>,
    /// Where the next page starts.
    pub end_cursor: Option<String>,
}

/// One event and its cursor.
#[derive(Debug, Clone, SimpleObject)]
pub struct EventEdge {
    /// The event's cursor.
    pub cursor: String,
    /// The event.
    pub node: LifecycleEvent,
}

/// Where an `events` page starts and where it may go: `after` and `until`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Bounds {
    /// Events after this cursor.
    pub after: Option<String>,
    /// Events up to and including this cursor (the log as it stood then).
    pub until: Option<String>,
}

/// `events(after, until, first, filter)`.
pub(crate) async fn page(
    ctx: &Context<'_>,
    bounds: Bounds,
    first: usize,
    filter: Option<EventFilter>,
) -> ApiResult<EventConnection> {
    let principal = caller(ctx)?;
    let scope = scope_of(principal, filter)?;
    let state = shared(ctx);
    let started = after_of(ctx, bounds.after.as_deref())?;
    let until = cursor_arg(ctx, "until", bounds.until.as_deref())?;
    let mut position = started.unwrap_or(Cursor::START);
    let (mut found, mut scanned, mut has_next) = (Vec::new(), 0, false);
    let budget = first.max(1) * SCAN_EVENTS_PER_WANTED;
    loop {
        let want = crate::live::hub::PAGE_EVENTS.min(budget - scanned);
        let page = state.store.read_log(position, want).await?;
        let full = page.events.len() == want;
        scanned += page.events.len();
        let mut ended = false;
        for event in page.events {
            if until.is_some_and(|until| event.cursor > until) {
                ended = true;
                break;
            }
            if found.len() == first {
                has_next = true;
                break;
            }
            position = event.cursor;
            if scope.admits(&event) {
                found.push(event);
            }
        }
        if has_next || ended {
            break;
        }
        position = position.max(page.next);
        if !full {
            break;
        }
        if scanned >= budget {
            has_next = true;
            break;
        }
    }
    let sealed =
        state.cursors.seal(CursorKind::Log, &principal.cursor_scope(), &position.to_string());
    let edges: Vec<EventEdge> = found
        .into_iter()
        .map(|event| {
            let node = view_of(&state.cursors, principal, event);
            EventEdge { cursor: node.cursor.clone(), node }
        })
        .collect();
    let page_info = EventPageInfo {
        has_previous_page: started.is_some(),
        has_next_page: has_next,
        start_cursor: edges.first().map(|edge| edge.cursor.clone()),
        end_cursor: Some(sealed),
    };
    Ok(EventConnection { edges, page_info })
}
