//! Mutations on hosts: operators register (an upsert), cordon, drain, uncordon and remove
//! them; a host's agent beats its heart (its token names the host).

use async_graphql::{Context, Object};
use leasehold_commands::host_service::HostCaller;
use leasehold_commands::vm_input::{self, HostInput};
use leasehold_domain::Actor;
use leasehold_domain::host::{HostCommand, HostError};
use leasehold_domain::values::fleet::HostId;

use super::types::{HostOperationInput, RegisterHostInput};
use crate::auth::{Principal, Role};
use crate::errors::{ApiError, ApiResult};
use crate::schema::command::{CommandResult, answer_on};
use crate::schema::{require, shared};

/// The host's mutations.
#[derive(Debug, Default, Clone, Copy)]
pub struct HostMutation;

fn host_caller(principal: &Principal) -> HostCaller {
    let actor = Actor { subject: principal.subject.clone(), role: principal.role.as_str().into() };
    HostCaller { actor, namespace: None }
}

/// What a result names the host by: its id.
fn result_id(host: &HostId) -> String {
    host.to_string()
}

async fn on_host(
    ctx: &Context<'_>,
    input: HostOperationInput,
    command: HostCommand,
    what: &str,
) -> ApiResult<CommandResult> {
    let principal = require(ctx, &[Role::Operator], what)?;
    let host = HostId::parse("hostId", input.host_id.as_str()).map_err(ApiError::from_field)?;
    let caller = host_caller(principal);
    let run = shared(ctx).hosts.run(&caller, &input.operation_key, &host, command);
    answer_on::<HostError>(ctx, result_id(&host), run).await
}

#[Object]
impl HostMutation {
    /// Registers a host, or refreshes what it declares (an upsert). GPUs and MIG capacity
    /// only on qemu hosts.
    async fn register_host(
        &self,
        ctx: &Context<'_>,
        input: RegisterHostInput,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Operator], "register hosts")?;
        let host_input = HostInput {
            host_id: input.host_id,
            url: input.url,
            region: input.region,
            backend: input.backend,
            labels: input
                .labels
                .unwrap_or_default()
                .into_iter()
                .map(|l| (l.key, l.value))
                .collect(),
            cpus: input.cpus,
            ram_mb: input.ram_mb,
            storage_gb: input.storage_gb,
            vm_count: input.vm_count,
            arch: input.arch,
            gpus: input.gpus.unwrap_or(0),
            gpu_kind: input.gpu_kind,
            mig_profiles: input
                .mig_profiles
                .unwrap_or_default()
                .into_iter()
                .map(|mig| (mig.profile, mig.count))
                .collect(),
        };
        let (host, spec) = vm_input::host(&host_input).map_err(ApiError::from_field)?;
        let token = input.token.clone();
        if let Some(token) = token.as_deref()
            && (token.is_empty() || token.len() > 4096 || token.chars().any(char::is_control))
        {
            return Err(ApiError::bad_input("token: 1 to 4096 characters, none a control"));
        }
        let caller = host_caller(principal);
        let registered = shared(ctx).hosts.register(&caller, &input.operation_key, &host, spec);
        let outcome = registered.await?;
        // Kept only once the registration is decided: a refused one changes nothing.
        if let Some(token) = token.as_deref() {
            shared(ctx).vault.keep_host_token(&host, token).await?;
        }
        answer_on::<HostError>(ctx, result_id(&host), async { Ok(outcome) }).await
    }

    /// Takes no new VMs on the host; those bound keep running.
    async fn cordon_host(
        &self,
        ctx: &Context<'_>,
        input: HostOperationInput,
    ) -> ApiResult<CommandResult> {
        on_host(ctx, input, HostCommand::Cordon, "cordon hosts").await
    }

    /// Takes no new VMs on the host, and marks it to be emptied.
    async fn drain_host(
        &self,
        ctx: &Context<'_>,
        input: HostOperationInput,
    ) -> ApiResult<CommandResult> {
        on_host(ctx, input, HostCommand::Drain, "drain hosts").await
    }

    /// Takes new VMs on the host again.
    async fn uncordon_host(
        &self,
        ctx: &Context<'_>,
        input: HostOperationInput,
    ) -> ApiResult<CommandResult> {
        on_host(ctx, input, HostCommand::Uncordon, "uncordon hosts").await
    }

    /// Removes the host from the fleet (refused while any VM is bound).
    async fn remove_host(
        &self,
        ctx: &Context<'_>,
        input: HostOperationInput,
    ) -> ApiResult<CommandResult> {
        on_host(ctx, input, HostCommand::Remove, "remove hosts").await
    }

    /// A host's agent is alive (recorded at most once a minute; Leasehold stamps the time).
    async fn host_heartbeat(
        &self,
        ctx: &Context<'_>,
        operation_key: String,
    ) -> ApiResult<CommandResult> {
        let principal = require(ctx, &[Role::Agent], "send heartbeats")?;
        let host = principal.host.clone().ok_or_else(|| ApiError::forbidden("send heartbeats"))?;
        let caller = host_caller(principal);
        let run = shared(ctx).hosts.run(&caller, &operation_key, &host, HostCommand::Heartbeat);
        answer_on::<HostError>(ctx, result_id(&host), run).await
    }
}
