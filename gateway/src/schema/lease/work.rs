//! `work`: the backend work of leases placed on a backend that cannot be called (behind NAT),
//! for that backend's agent to take instead of waiting for a request. Each item is the request
//! the dispatcher would have sent (the backends' own JSON: fred's fields, the per-operation
//! callback URL, the manifest as `payload`), and the agent answers as any backend does: by
//! signed callback on that URL. A release, which fred's protocol confirms by its `200`, carries
//! a callback URL too: its agent reports `deprovisioned` there. The dispatcher counts such work
//! as handed out, so its callback deadline runs as for work it sends.
//!
//! Agents only, scoped to the provider their token names (an all-providers agent: every
//! provider); the backend is named by the subscriber and must not be one the dispatcher calls.
//! Items come in log order from a cursor (without one, from the start of the log: an agent
//! connecting for the first time learns the work requested before it came), resuming with no
//! gap and no duplicate (the same feed as `lifecycleEvents`); only work its lease still awaits
//! is delivered, so a subscriber resuming from an old cursor never sees settled work.

use std::sync::Arc;

use async_graphql::{Context, ID, SimpleObject, Subscription};
use futures_util::Stream;
use leasehold_adapters::backends::wire::{ProvisionRequest, UpdateRequest};
use leasehold_adapters::dispatch::lease::{awaits, started_work, work_request};
use leasehold_domain::lease::{Lease, LeaseEvent, OperationId};
use leasehold_domain::{Cursor, DomainEvent as _, RecordedEvent};

use crate::auth::{Principal, Role};
use crate::cursor::CursorKind;
use crate::errors::{ApiError, ApiResult, Code};
use crate::live::feed::{Feed, Scope};
use crate::schema::events::after_of;
use crate::schema::{require_lease, shared};
use crate::state::Inner;

/// The lease events that start backend work.
const STARTING: [&str; 5] = [
    "LeaseProvisionRequested",
    "LeaseRestoreStarted",
    "LeaseRestartStarted",
    "LeaseUpdateStarted",
    "LeaseDeprovisionRequested",
];

/// The lease's subscriptions.
#[derive(Debug, Default, Clone, Copy)]
pub struct LeaseSubscription;

/// One piece of backend work.
#[derive(Debug, Clone, SimpleObject)]
pub struct WorkItem {
    /// Where it is in the log: pass it as `after` to resume after it.
    pub cursor: String,
    /// The lease.
    pub lease_id: ID,
    /// `provision`, `restore`, `restart`, `update` or `deprovision`.
    pub action: String,
    /// The work's generation on the lease.
    pub generation: u64,
    /// The request, as the backends' protocol sends it to `POST /{action}`, with the callback
    /// URL to report on (signed with the backend's own secret).
    pub request: async_graphql::Json<serde_json::Value>,
}

#[Subscription]
impl LeaseSubscription {
    /// The work of leases placed on `backend` (agents: your provider's leases only), in log
    /// order, then live. With `after` (a cursor this subscription gave you), from after it;
    /// without it, from the start of the log. Either way only work still awaited is
    /// delivered.
    async fn work(
        &self,
        ctx: &Context<'_>,
        #[graphql(desc = "The backend you are: a name from the backends file that subscribes \
                          to its work, or any name when the server calls no backend.")]
        backend: String,
        after: Option<String>,
    ) -> Result<impl Stream<Item = Result<WorkItem, ApiError>> + use<>, ApiError> {
        let principal = require_lease(ctx, &[Role::Agent], "subscribe to backend work")?.clone();
        let state = shared(ctx);
        let called = state.router.as_ref().is_some_and(|router| {
            router.backends().iter().any(|b| b.name() == backend && !b.config().subscribes)
        });
        if called {
            return Err(ApiError::bad_input(format!(
                "backend: {backend} is called by the dispatcher; only a backend that subscribes \
                 to its work may take it here"
            )));
        }
        if state.callback_urls.is_none() {
            return Err(ApiError::new(Code::Unavailable, "this server hands out no callback URLs"));
        }
        let scope = Scope {
            stream_types: vec!["lease".into()],
            event_types: STARTING.iter().map(ToString::to_string).collect(),
            ..Scope::default()
        };
        // Subscribed to the hub before the start is fixed, so nothing falls between.
        let live = state.hub.subscribe();
        // Without a cursor, from the start: an agent connecting for the first time must learn
        // the work requested before it came (only what is still awaited is delivered).
        let start = after_of(ctx, after.as_deref())?.unwrap_or(Cursor::START);
        let feed = Feed::new(state.store.clone(), live, scope, start);
        let app = ctx.data_unchecked::<crate::AppState>().clone();
        let subscriber = (principal, backend);
        let item = |app: crate::AppState, subscriber, event| async move {
            item_of(&app.inner, &subscriber, event).await
        };
        Ok(crate::schema::work_feed::items(feed, app, subscriber, item))
    }
}

/// The work `event` started, if it is for this subscriber and still awaited.
async fn item_of(
    state: &Inner,
    (principal, backend): &(Principal, String),
    event: Arc<RecordedEvent>,
) -> ApiResult<Option<WorkItem>> {
    let Ok(decoded) = LeaseEvent::from_stored(event.event_type.as_str(), &event.payload) else {
        return Ok(None);
    };
    let Some(generation) = started_work(&decoded) else { return Ok(None) };
    let found = state.leases.pipeline().state::<Lease>(&event.stream_id).await?;
    let Some((owner, _, lease)) = found else { return Ok(None) };
    let Some(terms) = &lease.terms else { return Ok(None) };
    let for_me = terms.backend.as_str() == backend
        && principal.provider.is_none_or(|bound| bound == terms.provider);
    if !for_me || !awaits(&lease, generation) {
        return Ok(None);
    }
    let Some(callbacks) = &state.callback_urls else { return Ok(None) };
    let Some((action, _, mut request)) = work_request(callbacks, &event, &decoded, &lease) else {
        return Ok(None);
    };
    match action {
        "provision" => with_manifest::<ProvisionRequest>(state, &owner, &mut request).await?,
        "update" => with_manifest::<UpdateRequest>(state, &owner, &mut request).await?,
        "deprovision" => {
            // fred confirms a release by its 200; an agent reports `deprovisioned` here.
            let operation = lease.operation.unwrap_or(OperationId(terms.id.0));
            request["callback_url"] = callbacks.operation(terms.id, operation).into();
        }
        _ => {}
    }
    let scope = principal.cursor_scope();
    Ok(Some(WorkItem {
        cursor: state.cursors.seal(CursorKind::Log, &scope, &event.cursor.to_string()),
        lease_id: ID(terms.id.0.to_string()),
        action: action.to_string(),
        generation,
        request: async_graphql::Json(request),
    }))
}

/// A request that names a manifest by hash, with the manifest as its `payload`.
trait CarriesManifest: serde::Serialize + serde::de::DeserializeOwned {
    fn hash(&self) -> Option<&str>;
    fn carry(&mut self, manifest: Vec<u8>);
}

impl CarriesManifest for ProvisionRequest {
    fn hash(&self) -> Option<&str> {
        self.payload_hash.as_deref()
    }
    fn carry(&mut self, manifest: Vec<u8>) {
        self.payload = Some(manifest);
    }
}

impl CarriesManifest for UpdateRequest {
    fn hash(&self) -> Option<&str> {
        self.payload_hash.as_deref()
    }
    fn carry(&mut self, manifest: Vec<u8>) {
        self.payload = manifest;
    }
}

/// Adds the manifest the vault keeps for `request`'s hash, if it keeps one.
async fn with_manifest<R: CarriesManifest>(
    state: &Inner,
    owner: &leasehold_domain::TenantId,
    request: &mut serde_json::Value,
) -> ApiResult<()> {
    let Some(vault) = &state.manifests else { return Ok(()) };
    let Ok(mut typed) = serde_json::from_value::<R>(request.clone()) else { return Ok(()) };
    let Some(hash) = typed.hash().map(str::to_string) else { return Ok(()) };
    if let Some(manifest) = vault.get(owner, &hash).await? {
        typed.carry(manifest);
        if let Ok(value) = serde_json::to_value(&typed) {
            *request = value;
        }
    }
    Ok(())
}
