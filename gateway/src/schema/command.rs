//! Running a lease command for a caller, and what a mutation answers.

use async_graphql::{Context, ID, SimpleObject};
use leasehold_commands::{CommandOutcome, CommandRequest, lease_input};
use leasehold_domain::lease::{Lease, LeaseCommand, LeaseFacts, LeaseId};
use leasehold_domain::{Actor, KeyNamespace, TenantId};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::{caller, shared};
use crate::auth::Principal;
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::state::Inner;

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

/// A lease command on its way to the pipeline.
pub(crate) struct LeaseCall<'a> {
    /// For whom: the caller's tenant, or the lease's owner for agents and operators.
    pub tenant: TenantId,
    /// The lease.
    pub lease: LeaseId,
    /// The caller's operation key, unparsed.
    pub operation_key: &'a str,
    /// The command.
    pub command: LeaseCommand,
    /// Facts looked up for it.
    pub facts: LeaseFacts,
}

/// Runs `call` as the caller and answers its result.
pub(crate) async fn run(ctx: &Context<'_>, call: LeaseCall<'_>) -> ApiResult<CommandResult> {
    let principal = caller(ctx)?;
    let lease = call.lease.0;
    let outcome = execute(shared(ctx), principal, call).await?;
    Ok(result_of(ctx, principal, lease, outcome))
}

/// Runs `call` for `principal` through the pipeline, its operation key in the caller's own
/// namespace.
pub(crate) async fn execute(
    state: &Inner,
    principal: &Principal,
    call: LeaseCall<'_>,
) -> ApiResult<CommandOutcome> {
    execute_in(state, principal, call, None).await
}

/// Runs `call` with its operation key in `namespace` (default: the caller's own).
pub(crate) async fn execute_in(
    state: &Inner,
    principal: &Principal,
    call: LeaseCall<'_>,
    namespace: Option<KeyNamespace>,
) -> ApiResult<CommandOutcome> {
    let key = lease_input::operation_key(Some(call.operation_key))
        .map_err(|error| ApiError::bad_input(error.to_string()))?;
    let actor = Actor { subject: principal.subject.clone(), role: principal.role.as_str().into() };
    let mut request = CommandRequest::<Lease>::new(
        call.tenant,
        actor,
        call.lease.stream_id(),
        key,
        call.command,
        call.facts,
    );
    if let Some(namespace) = namespace {
        request.namespace = namespace;
    }
    request.correlation_id = Some(Uuid::now_v7());
    Ok(state.pipeline.execute(request).await?)
}

/// The lease's owner, for a caller who acts for it (agents, operators, callbacks). An agent
/// bound to a provider finds only that provider's leases.
pub(crate) async fn owner_of(
    state: &Inner,
    principal: &Principal,
    lease: LeaseId,
) -> ApiResult<TenantId> {
    let found = state.pipeline.state::<Lease>(&lease.stream_id()).await?;
    let (owner, _, stored) = found.ok_or_else(|| ApiError::not_found("lease"))?;
    let provider = stored.terms.as_ref().map(|terms| terms.provider);
    match principal.provider {
        Some(bound) if provider != Some(bound) => Err(ApiError::not_found("lease")),
        _ => Ok(owner),
    }
}

fn result_of(
    ctx: &Context<'_>,
    principal: &Principal,
    id: Uuid,
    outcome: CommandOutcome,
) -> CommandResult {
    let cursors = &shared(ctx).cursors;
    let scope = principal.cursor_scope();
    CommandResult {
        id: ID(id.to_string()),
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

/// An id minted from the tenant and the operation key, so that a retry of the same request
/// names the same lease (or maintenance) and hashes the same.
pub(crate) fn minted_id(purpose: &str, tenant: &TenantId, operation_key: &str) -> Uuid {
    let mut hash = Sha256::new();
    for part in ["leasehold", purpose, tenant.as_str(), operation_key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

/// The SHA-256 of a manifest, hex: the manifest itself may hold secrets and is not stored.
pub(crate) fn payload_hash(payload: &str) -> String {
    hex::encode(Sha256::digest(payload.as_bytes()))
}
