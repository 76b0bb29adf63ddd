//! `vmWork`: the work of a host Leasehold does not call (no agent token registered for it: it
//! is behind NAT, or its agent prefers to pull), for that host's agent to take. Each item is
//! what the dispatcher would have sent — the action (`boot`, `fork`, `migrate`, `destroy`), the
//! operation its report names, and the boot's `POST /v1/vm` body as fuse's client sends it,
//! with a fork's or migration's source — and the agent answers with the reports every host
//! agent makes (`reportVmBoot`, `confirmVmRemoved`), fenced by that operation.
//!
//! Host agents only (the token names the host), their host's VMs only; a host whose agent
//! the dispatcher calls cannot take its work here. Items come in log order from a cursor
//! (without one, from the start of the log), resuming with no gap and no duplicate (the same
//! feed as `lifecycleEvents`); only work its VM still awaits is delivered.

use std::sync::Arc;

use async_graphql::{Context, ID, SimpleObject, Subscription};
use futures_util::Stream;
use leasehold_adapters::dispatch::vm::{started_work, work_of};
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::vm::{Vm, VmEvent};
use leasehold_domain::{Cursor, DomainEvent as _, RecordedEvent};

use crate::auth::{Principal, Role};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult};
use crate::live::feed::{Feed, Scope};
use crate::schema::events::after_of;
use crate::schema::{require, shared};
use crate::state::Inner;

/// The VM's subscriptions.
#[derive(Debug, Default, Clone, Copy)]
pub struct VmSubscription;

/// One piece of a host's VM work.
#[derive(Debug, Clone, SimpleObject)]
pub struct VmWorkItem {
    /// Where it is in the log: pass it as `after` to resume after it.
    pub cursor: String,
    /// The VM.
    pub vm_id: ID,
    /// `boot`, `fork`, `migrate` or `destroy`.
    pub action: String,
    /// The work's generation on the VM.
    pub generation: u64,
    /// The operation to name in the report.
    pub operation_id: ID,
    /// `agent`: the boot's body (`name`, `cpus`, `memory_mb`, `storage_gb`, `region`, `image`,
    /// `seed_snapshot`: the id of the host's copy of the seed); `seed_pull`: when the host has
    /// no copy, the pull to make first (`digest`, `peer_url`, `grant`, `snapshot_id`: fuse's
    /// artifact pull); `source`: a fork's or migration's source VM. Never a credential (a
    /// grant reads one blob, for minutes).
    pub request: async_graphql::Json<serde_json::Value>,
}

#[Subscription]
impl VmSubscription {
    /// The VM work of your host (host agents whose host the dispatcher does not call), in
    /// log order, then live. With `after` (a cursor this subscription gave you), from after
    /// it; without it, from the start of the log. Either way only work still awaited is
    /// delivered.
    async fn vm_work(
        &self,
        ctx: &Context<'_>,
        after: Option<String>,
    ) -> Result<impl Stream<Item = Result<VmWorkItem, ApiError>> + use<>, ApiError> {
        let principal = require(ctx, &[Role::Agent], "subscribe to VM work")?.clone();
        let host = principal.host.clone().ok_or_else(|| ApiError::forbidden("take VM work"))?;
        let state = shared(ctx);
        if state.vault.host_token(&host).await?.is_some() {
            return Err(ApiError::bad_input(format!(
                "host {host} has an agent token: the dispatcher calls its agent, which takes \
                 no work here"
            )));
        }
        let scope = Scope {
            stream_types: vec!["vm".into()],
            event_types: vec!["VmScheduled".into(), "VmDestroying".into()],
            ..Scope::default()
        };
        // Subscribed to the hub before the start is fixed, so nothing falls between.
        let live = state.hub.subscribe();
        let start = after_of(ctx, after.as_deref())?.unwrap_or(Cursor::START);
        let feed = Feed::new(state.store.clone(), live, scope, start);
        let app = ctx.data_unchecked::<crate::AppState>().clone();
        let subscriber = (principal, host);
        let item = |app: crate::AppState, subscriber, event| async move {
            item_of(&app.inner, &subscriber, event).await
        };
        Ok(crate::schema::work_feed::items(feed, app, subscriber, item))
    }
}

/// The work `event` started, if it is for this subscriber's host and still awaited.
async fn item_of(
    state: &Inner,
    (principal, host): &(Principal, HostId),
    event: Arc<RecordedEvent>,
) -> ApiResult<Option<VmWorkItem>> {
    let Ok(decoded) = VmEvent::from_stored(event.event_type.as_str(), &event.payload) else {
        return Ok(None);
    };
    if started_work(&decoded).is_none() {
        return Ok(None);
    }
    let Some(vm) = VmId::of_stream(&event.stream_id) else { return Ok(None) };
    let Some((_, _, stored)) = state.vms.pipeline().state::<Vm>(&event.stream_id).await? else {
        return Ok(None);
    };
    let Some(work) = work_of(vm, &decoded, &stored) else { return Ok(None) };
    if &work.host != host {
        return Ok(None);
    }
    let mut request = work.request;
    if work.action == "boot" {
        seed_for(state, (&event.tenant_id, host), &mut request).await?;
    }
    let scope = principal.cursor_scope();
    Ok(Some(VmWorkItem {
        cursor: state.cursors.seal(CursorKind::Log, &scope, &event.cursor.to_string()),
        vm_id: ID(vm.0.to_string()),
        action: work.action.to_string(),
        generation: work.generation,
        operation_id: ID(work.operation.0.to_string()),
        request: async_graphql::Json(request),
    }))
}

/// A seeded boot's seed for `host`, as the dispatcher would get it there: `seed_snapshot`
/// becomes the host's own copy's store id, or, when the host holds none, `seed_pull` is the
/// pull its agent makes first (fuse's `POST /v1/artifacts/{digest}/pull` body, with a grant
/// minted with a holder's token: it reads that one blob, nothing else) and `seed_snapshot` the
/// id the pull files it under. A seed that cannot reach the host is left as named (the boot
/// fails at the agent, reported as any failed boot).
async fn seed_for(
    state: &Inner,
    (tenant, host): (&leasehold_domain::TenantId, &HostId),
    request: &mut serde_json::Value,
) -> ApiResult<()> {
    use leasehold_adapters::dispatch::vm::seeds::{SeedPlan, seed_plan};
    let Some(seed) = request["agent"]["seed_snapshot"].as_str().map(str::to_owned) else {
        return Ok(());
    };
    let plan = seed_plan((&state.vms, &state.vault), (tenant, host), &seed).await;
    match plan.map_err(|error| ApiError::internal(&error))? {
        SeedPlan::Local(local) => request["agent"]["seed_snapshot"] = local.into(),
        SeedPlan::Pull { digest, from } => {
            let mut pull = serde_json::to_value(&from[0]).map_err(|e| ApiError::internal(&e))?;
            pull["digest"] = digest.into();
            request["seed_pull"] = pull;
        }
        SeedPlan::Unavailable(_) => {}
    }
    Ok(())
}
