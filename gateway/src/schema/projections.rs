//! `projections`: how far each read model and each reconciler has got, each projection's
//! builds, and `rebuildProjection` (operators).

use async_graphql::{Context, Enum, Object, SimpleObject};
use chrono::{DateTime, Utc};
use leasehold_adapters::PgProjectionStore;
use leasehold_adapters::projections::BuildStatus;

use super::{require, shared};
use crate::auth::Role;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult, Code};

/// Where a projection stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum ProjectionState {
    /// Applying the log to its active tables.
    Running,
    /// A new build is being written beside the active tables (which keep serving).
    Rebuilding,
    /// Its runner's last session failed after its last commit: `error` says why and
    /// `errorPosition` at which event.
    Failed,
}

/// One build of a projection's read models.
#[derive(Debug, Clone, SimpleObject)]
pub struct ProjectionBuild {
    /// Its number (0: the tables from before the first rebuild).
    pub build_no: u32,
    /// The projection's code version that built it.
    pub version: u32,
    /// `building`, `active`, `retired` (kept for `projections activate`) or `failed`.
    pub state: String,
    /// Events it applied.
    pub events_applied: u64,
    /// Events the log held when it began.
    pub events_total: u64,
    /// Why it failed.
    pub error: Option<String>,
    /// The position of the event it failed at.
    pub error_position: Option<u64>,
    /// When it began.
    pub started_at: DateTime<Utc>,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
    /// When it was last switched in.
    pub switched_at: Option<DateTime<Utc>>,
}

impl From<&BuildStatus> for ProjectionBuild {
    fn from(build: &BuildStatus) -> Self {
        Self {
            build_no: build.build_no,
            version: build.version,
            state: build.state.clone(),
            events_applied: build.events_applied,
            events_total: build.events_total,
            error: build.error.as_ref().map(|(error, _)| error.clone()),
            error_position: build.error.as_ref().and_then(|(_, position)| *position),
            started_at: build.started_at,
            updated_at: build.updated_at,
            switched_at: build.switched_at,
        }
    }
}

/// Starts projection rebuilds in this process: the binary provides it, knowing every
/// projection (`AppState::with_rebuilds`).
pub trait Rebuilds: std::fmt::Debug + Send + Sync + 'static {
    /// Starts rebuilding `name` in the background (watch it with `projections`).
    ///
    /// # Errors
    /// When no projection has that name, or this process is rebuilding it already.
    fn start(&self, name: &str) -> Result<(), RebuildRefused>;
}

/// Why a rebuild was not started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebuildRefused {
    /// No projection has that name; these do.
    Unknown(Vec<&'static str>),
    /// This process is rebuilding it already.
    Running,
}

/// Operators' control of the projections.
#[derive(Debug, Default)]
pub struct ProjectionMutation;

#[Object]
impl ProjectionMutation {
    /// Starts rebuilding a projection's read models beside the active ones, which keep
    /// serving; when caught up, readers are switched to it in one transaction (operators).
    /// Watch it with `projections { state builds { state eventsApplied eventsTotal } }`.
    async fn rebuild_projection(&self, ctx: &Context<'_>, name: String) -> ApiResult<bool> {
        require(ctx, &[Role::Operator], "rebuild projections")?;
        let Some(rebuilds) = shared(ctx).rebuilds.as_ref() else {
            return Err(ApiError::new(Code::Unavailable, "this server does not run projections"));
        };
        match rebuilds.start(&name) {
            Ok(()) => Ok(true),
            Err(RebuildRefused::Unknown(names)) => Err(ApiError::bad_input(format!(
                "name: no projection is named {name:?}; they are: {}",
                names.join(", ")
            ))),
            Err(RebuildRefused::Running) => {
                Err(ApiError::new(Code::Conflict, format!("{name} is being rebuilt already")))
            }
        }
    }
}

/// What reads the log: a projection (writes read models) or a reconciler (acts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Enum)]
pub enum LogReaderKind {
    /// Folds events into read models.
    Projection,
    /// Acts on events and on ticks: issues commands, calls outside systems.
    Reconciler,
    /// Publishes the log to an outside system (Kafka): its events applied are those the
    /// broker acknowledged.
    Relay,
}

/// One projection's progress, or one reconciler's, or one relay's.
#[derive(Debug, Clone, SimpleObject)]
pub struct ProjectionStatus {
    /// Its name.
    pub name: String,
    /// A projection, a reconciler or a relay.
    pub kind: LogReaderKind,
    /// Its version.
    pub version: u32,
    /// The last event it applied (an `events` cursor).
    pub cursor: String,
    /// Events applied over its life (a relay's: published, acknowledged by the broker).
    pub events_applied: u64,
    /// Readable events it has not applied yet (counted up to 1,000,000).
    pub events_behind: u64,
    /// How long ago the oldest event it has not applied was recorded.
    pub seconds_behind: f64,
    /// How long the oldest open transaction has held back every reader of the log.
    pub horizon_lag_seconds: f64,
    /// When it last committed.
    pub updated_at: DateTime<Utc>,
    /// Running, rebuilding, or failed.
    pub state: ProjectionState,
    /// Why it is failing (while `state` is `FAILED`).
    pub error: Option<String>,
    /// The position of the event it is failing at, when an event could not be applied.
    pub error_position: Option<u64>,
    /// Its builds (a projection's; none for a reconciler or before its first rebuild).
    pub builds: Vec<ProjectionBuild>,
}

/// `projections`.
pub(crate) async fn statuses(ctx: &Context<'_>) -> ApiResult<Vec<ProjectionStatus>> {
    let principal = require(ctx, &[Role::Operator], "read projection status")?;
    let state = shared(ctx);
    let horizon = state.read_models.horizon_lag_seconds().await?;
    let builds = PgProjectionStore::new(state.store.clone()).builds().await?;
    let scope = principal.cursor_scope();
    Ok(state
        .read_models
        .projection_status()
        .await?
        .into_iter()
        .map(|status| {
            let own: Vec<ProjectionBuild> = builds
                .iter()
                .filter(|build| build.projection == status.name)
                .map(ProjectionBuild::from)
                .collect();
            let state = if status.failure.is_some() {
                ProjectionState::Failed
            } else if own.iter().any(|build| build.state == "building") {
                ProjectionState::Rebuilding
            } else {
                ProjectionState::Running
            };
            (status, own, state)
        })
        .map(|(status, builds, projection_state)| ProjectionStatus {
            state: projection_state,
            error: status.failure.as_ref().map(|(error, _)| error.clone()),
            error_position: status.failure.as_ref().and_then(|(_, position)| *position),
            builds,
            cursor: state.cursors.seal(CursorKind::Log, &scope, &status.cursor.to_string()),
            kind: match status.kind.as_str() {
                "reconciler" => LogReaderKind::Reconciler,
                "relay" => LogReaderKind::Relay,
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
