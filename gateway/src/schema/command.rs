//! What a mutation answers, and the caller a resolver hands the lease command service
//! (`leasehold_commands::lease_service`), which does the rest.

use async_graphql::{Context, ID, SimpleObject};
use leasehold_commands::lease_service::{Caller, LeaseOutcome};
use leasehold_commands::{CommandError, CommandOutcome};
use leasehold_domain::lease::LeaseError;
use leasehold_domain::{Actor, KeyNamespace};
use uuid::Uuid;

use super::{caller, shared};
use crate::auth::Principal;
use crate::cursor::CursorKind;
use crate::errors::ApiResult;

/// One event a command appended.
#[derive(Debug, Clone, SimpleObject)]
pub struct CommandEvent {
    /// The event's type.
    #[graphql(name = "type")]
    pub event_type: String,
}

/// What every mutation answers, the same for the first call and every retry of it.
#[derive(Debug, Clone, SimpleObject)]
pub struct CommandResult {
    /// The aggregate's id.
    pub id: ID,
    /// The aggregate's stream.
    pub stream_id: String,
    /// The stream's version after the command.
    pub version: u64,
    /// The position of the command's last event: pass it as the `minCursor` request
    /// extension of a query to read your own write.
    pub cursor: Option<String>,
    /// True when the operation key was seen before: nothing was appended now.
    pub duplicate: bool,
    /// The events the command appended (for a duplicate, those of the first call; none for
    /// a no-op).
    pub events: Vec<CommandEvent>,
}

/// The command service's view of `principal`: its actor, tenant and provider binding, its
/// keys in its own namespace unless `namespace` says otherwise.
pub(crate) fn caller_of(principal: &Principal, namespace: Option<KeyNamespace>) -> Caller {
    Caller {
        actor: Actor { subject: principal.subject.clone(), role: principal.role.as_str().into() },
        tenant: principal.tenant.clone(),
        provider: principal.provider,
        namespace,
    }
}

/// Answers a lease command's result to the caller.
pub(crate) async fn answer(
    ctx: &Context<'_>,
    run: impl std::future::Future<Output = Result<LeaseOutcome, CommandError<LeaseError>>>,
) -> ApiResult<CommandResult> {
    let principal = caller(ctx)?;
    let LeaseOutcome { lease, outcome } = run.await?;
    Ok(result_of(ctx, principal, lease.0, outcome))
}

/// Answers a command's result on the aggregate `id` to the caller, whatever its kind.
pub(crate) async fn answer_on<E: leasehold_domain::Refusal>(
    ctx: &Context<'_>,
    id: String,
    run: impl std::future::Future<Output = Result<CommandOutcome, CommandError<E>>>,
) -> ApiResult<CommandResult> {
    let principal = caller(ctx)?;
    let outcome = run.await?;
    Ok(result_with_id(ctx, principal, id, outcome))
}

fn result_of(
    ctx: &Context<'_>,
    principal: &Principal,
    id: Uuid,
    outcome: CommandOutcome,
) -> CommandResult {
    result_with_id(ctx, principal, id.to_string(), outcome)
}

fn result_with_id(
    ctx: &Context<'_>,
    principal: &Principal,
    id: String,
    outcome: CommandOutcome,
) -> CommandResult {
    let cursors = &shared(ctx).cursors;
    let scope = principal.cursor_scope();
    CommandResult {
        id: ID(id),
        stream_id: outcome.stream_id.as_str().to_string(),
        version: outcome.version,
        cursor: outcome.cursor.map(|at| cursors.seal(CursorKind::Log, &scope, &at.to_string())),
        duplicate: outcome.duplicate,
        events: outcome
            .event_types
            .into_iter()
            .map(|event_type| CommandEvent { event_type })
            .collect(),
    }
}
