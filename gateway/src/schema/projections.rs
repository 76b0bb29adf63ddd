//! `projections`: how far each read model and each reconciler has got (operators).

use async_graphql::{Context, Enum, SimpleObject};
use chrono::{DateTime, Utc};

use super::{require, shared};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::ApiResult;

/// What reads the log: a projection (writes read models) or a reconciler (acts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum LogReaderKind {
    /// Folds events into read models.
    Projection,
    /// Acts on events and on ticks: issues commands, calls outside systems.
    Reconciler,
}

/// One projection's progress, or one reconciler's.
#[derive(Debug, Clone, SimpleObject)]
pub struct ProjectionStatus {
    /// Its name.
    pub name: String,
    /// A projection or a reconciler.
    pub kind: LogReaderKind,
    /// Its version.
    pub version: u32,
    /// The last event it applied (an `events` cursor).
    pub cursor: String,
    /// Events applied over its life.
    pub events_applied: u64,
    /// Readable events it has not applied yet (counted up to 1,000,000).
    pub events_behind: u64,
    /// How long ago the oldest event it has not applied was recorded.
    pub seconds_behind: f64,
    /// How long the oldest open transaction has held back every reader of the log.
    pub horizon_lag_seconds: f64,
    /// When it last committed.
    pub updated_at: DateTime<Utc>,
}

/// `projections`.
pub(crate) async fn statuses(ctx: &Context<'_>) -> ApiResult<Vec<ProjectionStatus>> {
    let principal = require(ctx, &[Role::Operator], "read projection status")?;
    let state = shared(ctx);
    let horizon = state.read_models.horizon_lag_seconds().await?;
    let scope = principal.cursor_scope();
    Ok(state
        .read_models
        .projection_status()
        .await?
        .into_iter()
        .map(|status| ProjectionStatus {
            cursor: state.cursors.seal(CursorKind::Log, &scope, &status.cursor.to_string()),
            kind: match status.kind.as_str() {
                "reconciler" => LogReaderKind::Reconciler,
                _ => LogReaderKind::Projection,
            },
            name: status.name,
            version: status.version,
            events_applied: status.events_applied,
            events_behind: status.events_behind,
            seconds_behind: status.seconds_behind,
            horizon_lag_seconds: horizon,
            updated_at: status.updated_at,
        })
        .collect())
}
