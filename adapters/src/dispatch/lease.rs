//! The lease backends' work: provision, restore, restart, update and release requests, sent
//! over the backends' own protocol (`crate::backends`) with a callback URL per operation, and
//! each answer recorded on the lease as `RecordDispatch`.
//!
//! How an answer is read (fred's client semantics, `docs/issue-10-research.md` §3 and §5):
//! - `202` (`200` for a release) is **accepted**: the backend's callback settles the work. A
//!   release has no callback: its `200` is the release, and the dispatcher reads the
//!   provision back (`GET /provisions/{lease}`: `retained`, or gone) to confirm it.
//! - A refusal the backend meant (validation, no capacity, no retained data, a demote that
//!   does not fit, not provisioned, invalid state) is **refused**: the work fails with a
//!   reason the tenant may read. On a later attempt, "already provisioned" and "invalid state"
//!   may mean an earlier attempt of this same work landed (its answer was lost): the
//!   backend's record of the lease (`GET /provisions/{lease}`) decides — doing the work:
//!   **accepted**; anything else: refused; no answer: failed, tried again.
//! - Everything else (unreachable, timed out, a server error, a malformed error body, an
//!   answer too large or undecodable) **failed**: tried again later. A malformed body is never
//!   read as a refusal, so it never fails a lease.
//! - A call the backend's breaker refused was **not sent**.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::{Caller, LeaseService};
use leasehold_domain::lease::{
    DispatchAnswer, KIND, Lease, LeaseCommand, LeaseEvent, LeaseId, LeaseItems, LeaseStatus,
    MaintenanceId, OperationId, OperatorDetail, Reason, TenantMessage,
};
use leasehold_domain::{Actor, DomainEvent as _, RecordedEvent};
use leasehold_projections::ReconcileError;
use uuid::Uuid;

use super::{DispatchKind, Intent, Sent, Work};
use crate::backends::wire::{
    LeaseItem, ProvisionRequest, RestartRequest, RestoreRequest, UpdateRequest,
};
use crate::backends::{BackendClient, BackendError, BreakerState, CallError, ValidationCode};

/// How long work waits while its backend is fenced or has no connection settings (an
/// operator's change, then a restart, lets it go).
const LONG_WAIT: std::time::Duration =
    std::time::Duration::from_millis(crate::limits::DISPATCH_RETRY_MAX_MILLISECONDS);

/// The callback URLs the backends are handed: one per operation, under `base`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackUrls {
    base: String,
}

impl CallbackUrls {
    /// URLs under `base` (`https://leasehold.example.com`; a trailing `/` is cut).
    pub fn new(base: &str) -> Self {
        Self { base: base.trim_end_matches('/').to_string() }
    }

    /// Where a provision's or a restore's reports go.
    pub fn operation(&self, lease: LeaseId, operation: OperationId) -> String {
        format!("{}/callbacks/leases/{}/operations/{}", self.base, lease.0, operation.0)
    }

    /// Where a restart's or an update's completion goes.
    pub fn maintenance(&self, lease: LeaseId, maintenance: MaintenanceId) -> String {
        format!("{}/callbacks/leases/{}/maintenance/{}", self.base, lease.0, maintenance.0)
    }
}

/// The backends a dispatcher may call, by name.
#[derive(Debug, Clone, Default)]
pub struct Backends(Arc<HashMap<String, BackendClient>>);

impl Backends {
    /// These clients, by their names.
    pub fn new(clients: impl IntoIterator<Item = BackendClient>) -> Self {
        Self(Arc::new(clients.into_iter().map(|c| (c.name().to_string(), c)).collect()))
    }

    /// The client of `name`.
    pub fn get(&self, name: &str) -> Option<&BackendClient> {
        self.0.get(name)
    }

    /// Every client, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &BackendClient)> {
        self.0.iter()
    }
}

/// The lease backends' dispatcher kind.
#[derive(Debug, Clone)]
pub struct LeaseDispatch<S> {
    service: LeaseService<S>,
    backends: Backends,
    callbacks: CallbackUrls,
    manifests: Option<super::ManifestVault>,
    callback_deadline: TimeDelta,
}

/// How long a backend has to call back after taking work (fred's control plane: 10 minutes).
pub const CALLBACK_DEADLINE: TimeDelta = TimeDelta::minutes(10);

impl<S: CommandStore + Clone + Send + Sync + 'static> LeaseDispatch<S> {
    /// Sends leases' work to `backends`, recording answers through `service`.
    pub fn new(service: LeaseService<S>, backends: Backends, callbacks: CallbackUrls) -> Self {
        Self { service, backends, callbacks, manifests: None, callback_deadline: CALLBACK_DEADLINE }
    }

    /// The same dispatcher giving backends `deadline` to call back after taking work.
    #[must_use]
    pub fn with_callback_deadline(mut self, deadline: TimeDelta) -> Self {
        self.callback_deadline = deadline;
        self
    }

    /// The same dispatcher sending the manifests `vault` keeps with provisions and updates.
    #[must_use]
    pub fn with_manifests(mut self, vault: super::ManifestVault) -> Self {
        self.manifests = Some(vault);
        self
    }

    /// The manifest the work names by `hash`, if the vault keeps it.
    async fn manifest(
        &self,
        work: &Work,
        hash: Option<&str>,
    ) -> Result<Option<Vec<u8>>, ReconcileError> {
        let (Some(vault), Some(hash)) = (&self.manifests, hash) else { return Ok(None) };
        Ok(vault.get(&work.tenant, hash).await?)
    }

    /// The lease on `stream`, if it exists.
    async fn lease(
        &self,
        stream: &leasehold_domain::StreamId,
    ) -> Result<Option<Lease>, ReconcileError> {
        let found = self.service.pipeline().state::<Lease>(stream).await.map_err(|error| {
            ReconcileError::Retry { action: "load a lease".into(), reason: error.to_string() }
        })?;
        Ok(found.map(|(_, _, lease)| lease))
    }

    /// Sends one attempt; `Ok(None)` when the breaker refused it before it left.
    async fn call(
        &self,
        client: &BackendClient,
        work: &Work,
    ) -> Result<Option<DispatchAnswer>, ReconcileError> {
        let bad = |error: serde_json::Error| ReconcileError::Retry {
            action: format!("decode an outbox {} request", work.action),
            reason: error.to_string(),
        };
        let request = work.request.clone();
        let result = match work.action.as_str() {
            "provision" => {
                let mut request: ProvisionRequest = serde_json::from_value(request).map_err(bad)?;
                request.payload = self.manifest(work, request.payload_hash.as_deref()).await?;
                if request.payload.is_none() {
                    request.payload_hash = None;
                }
                client.provision(&request).await.map(drop)
            }
            "restore" => client.restore(&serde_json::from_value(request).map_err(bad)?).await,
            "restart" => client.restart(&serde_json::from_value(request).map_err(bad)?).await,
            "update" => {
                let mut request: UpdateRequest = serde_json::from_value(request).map_err(bad)?;
                let manifest = self.manifest(work, request.payload_hash.as_deref()).await?;
                request.payload = manifest.unwrap_or_default();
                client.update(&request).await
            }
            "deprovision" => client.deprovision(lease_of(work)?.0).await,
            other => {
                return Err(ReconcileError::Retry {
                    action: "dispatch".into(),
                    reason: format!("unknown action {other}"),
                });
            }
        };
        Ok(match result {
            Ok(()) => Some(DispatchAnswer::Accepted),
            Err(CallError::CircuitOpen(_)) => None,
            Err(CallError::Backend(
                BackendError::AlreadyProvisioned | BackendError::InvalidState,
            )) if work.attempt > 1 => Some(self.taken_before(client, work).await),
            Err(error) => Some(answer_of(work, &error)),
        })
    }

    /// On a later attempt, "already provisioned" or "invalid state" may mean an earlier attempt
    /// of this work landed and its answer was lost, or that the backend really refuses it:
    /// the backend's own record says which.
    async fn taken_before(&self, client: &BackendClient, work: &Work) -> DispatchAnswer {
        let Ok(lease) = lease_of(work) else {
            return DispatchAnswer::Failed {
                detail: OperatorDetail::new("no lease in the request"),
            };
        };
        let taken: &[&str] = match work.action.as_str() {
            "provision" | "restore" => &["provisioning", "ready", "restarting"],
            _ => &["restarting", "updating"],
        };
        match client.provision_info(lease.0).await {
            Ok(info) if taken.contains(&info.status.as_str()) => DispatchAnswer::Accepted,
            Ok(info) => answer_of(
                &Work { attempt: 1, ..work.clone() },
                &CallError::Backend(if work.action == "provision" {
                    BackendError::AlreadyProvisioned
                } else {
                    BackendError::InvalidState
                }),
            )
            .with_detail(&format!("the backend lists the lease as {}", info.status)),
            Err(error) => DispatchAnswer::Failed {
                detail: OperatorDetail::new(&format!("reading the lease back: {error}")),
            },
        }
    }

    /// Records `command` on the work's lease, keyed by the work and `what`.
    async fn record(
        &self,
        work: &Work,
        what: &str,
        command: LeaseCommand,
    ) -> Result<(), ReconcileError> {
        let lease = lease_of(work)?;
        let key = format!("dispatch:{}:{}:{what}", lease.0, work.generation);
        self.service.for_owner(&dispatcher(), &key, lease, command).await.map_err(|error| {
            ReconcileError::Retry {
                action: format!("record a {} dispatch", work.action),
                reason: error.to_string(),
            }
        })?;
        Ok(())
    }

    /// After a release's `200`: whether the backend kept the data, read back from it.
    async fn confirm_release(
        &self,
        client: &BackendClient,
        work: &Work,
    ) -> Result<Sent, ReconcileError> {
        let lease = lease_of(work)?;
        let retained = match client.provision_info(lease.0).await {
            Ok(info) if info.status == "retained" => true,
            Err(CallError::Backend(BackendError::NotProvisioned)) => false,
            Ok(info) => {
                let detail = format!("released, yet the backend lists it as {}", info.status);
                return Ok(Sent::Failed { detail });
            }
            Err(error) => {
                return Ok(Sent::Failed { detail: format!("reading the release back: {error}") });
            }
        };
        let what = format!("{}:released:{retained}", work.attempt);
        self.record(work, &what, LeaseCommand::ConfirmDeprovisioned { retained }).await?;
        Ok(Sent::Delivered)
    }
}

impl<S: CommandStore + Clone + Send + Sync + 'static> DispatchKind for LeaseDispatch<S> {
    const NAME: &'static str = "lease-dispatcher";
    // A backend answers a provision of a lease it holds `409 already provisioned`, and a
    // deprovision of one it no longer holds as done; a restore, restart or update repeated
    // while the first runs could act twice, so those wait out the hold.
    const RESENT_AT_ONCE: &'static [&'static str] = &["provision", "deprovision"];
    const VERSION: u32 = 1;

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != KIND.stream_type {
            return Ok(None);
        }
        let Ok(decoded) = LeaseEvent::from_stored(event.event_type.as_str(), &event.payload) else {
            return Ok(None);
        };
        let Some(generation) = started_work(&decoded) else { return Ok(None) };
        // Only work the lease still awaits: a dispatcher reading old history sends nothing
        // that was settled before it started.
        let Some(lease) = self.lease(&event.stream_id).await? else { return Ok(None) };
        if !awaits(&lease, generation) {
            return Ok(None);
        }
        let Some((action, target, request)) =
            work_request(&self.callbacks, event, &decoded, &lease)
        else {
            return Ok(None);
        };
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            generation,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target,
            action,
            request,
        }))
    }

    async fn send(&self, work: &Work, _now: DateTime<Utc>) -> Result<Sent, ReconcileError> {
        // Checked before anything is read: work that cannot go out waits without cost.
        let Some(client) = self.backends.get(&work.target) else {
            let detail = format!("no connection settings for backend {}", work.target);
            return Ok(Sent::NotSent { detail, wait: LONG_WAIT });
        };
        // A backend that cannot be called takes its work from the `work` subscription: it is
        // handed out, never sent, and still must be settled by its deadline.
        if client.config().subscribes {
            return Ok(match self.lease(&work.stream).await? {
                Some(lease) if awaits(&lease, work.generation) => Sent::Delivered,
                _ => Sent::Moot,
            });
        }
        // A fenced backend is never called: its work waits until an operator lifts the fence.
        if client.config().fenced {
            let detail = format!("backend {} is fenced by an operator", work.target);
            return Ok(Sent::NotSent { detail, wait: LONG_WAIT });
        }
        if client.breaker_state() == BreakerState::Open {
            let detail = format!("the circuit of {} is open", work.target);
            return Ok(Sent::NotSent { detail, wait: client.config().breaker_open });
        }
        match self.lease(&work.stream).await? {
            Some(lease) if awaits(&lease, work.generation) => {}
            _ => return Ok(Sent::Moot),
        }
        let Some(answer) = self.call(client, work).await? else {
            // Refused at the door: a half-open breaker's one trial is out. Soon again.
            let detail = format!("the circuit of {} is open", work.target);
            return Ok(Sent::NotSent { detail, wait: std::time::Duration::ZERO });
        };
        let command = LeaseCommand::RecordDispatch {
            generation: work.generation,
            attempt: work.attempt,
            answer: answer.clone(),
        };
        self.record(work, &work.attempt.to_string(), command).await?;
        Ok(match answer {
            DispatchAnswer::Accepted if work.action == "deprovision" => {
                self.confirm_release(client, work).await?
            }
            DispatchAnswer::Accepted => Sent::Delivered,
            DispatchAnswer::Refused { .. } => Sent::Refused,
            DispatchAnswer::Failed { detail } => {
                Sent::Failed { detail: detail.as_str().to_string() }
            }
        })
    }

    /// A send is at most two exchanges with its backend (the call, then a read-back) and the
    /// recording of the answer: held for twice the longest backend timeout, and 10 s more.
    fn claim_hold(&self) -> std::time::Duration {
        let longest = self.backends.iter().map(|(_, c)| c.config().timeout).max();
        longest.unwrap_or_default() * 2 + std::time::Duration::from_secs(10)
    }

    /// Work settled by callback has the callback deadline; a release is confirmed by reading
    /// it back instead.
    fn answer_within(&self, action: &str) -> Option<TimeDelta> {
        (action != "deprovision").then_some(self.callback_deadline)
    }

    async fn lapsed(&self, work: &Work, _now: DateTime<Utc>) -> Result<bool, ReconcileError> {
        match self.lease(&work.stream).await? {
            Some(lease) if awaits(&lease, work.generation) => {}
            _ => return Ok(false),
        }
        let command = LeaseCommand::RecordDispatch {
            generation: work.generation,
            attempt: work.attempt,
            answer: lapse_answer(self.callback_deadline),
        };
        self.record(work, "lapsed", command).await?;
        Ok(true)
    }
}

/// What a lapsed callback deadline tells the tenant.
fn lapse_answer(deadline: TimeDelta) -> DispatchAnswer {
    DispatchAnswer::Refused {
        reason: Reason::parse("reason", "CallbackTimeout").unwrap_or_else(|_| Reason::unknown()),
        message: TenantMessage::parse(
            "message",
            "the backend did not report how the work went in time",
        )
        .unwrap_or_else(|_| generic_refusal()),
        detail: OperatorDetail::new(&format!(
            "no callback within {} s of the backend taking the work",
            deadline.num_seconds()
        )),
    }
}

/// The wire request of the backend work `event` started on `lease` (as the dispatcher sends
/// it, and as the `work` subscription hands it to a backend that cannot be called): its
/// action, the backend it goes to, and the body, without the manifest (added when it leaves,
/// from the vault). `None` for an event that starts no work.
pub fn work_request(
    callbacks: &CallbackUrls,
    event: &RecordedEvent,
    decoded: &LeaseEvent,
    lease: &Lease,
) -> Option<(&'static str, String, serde_json::Value)> {
    let terms = lease.terms.as_ref()?;
    let id = terms.id;
    let to_json = |value: serde_json::Result<serde_json::Value>| value.ok();
    let (action, request) = match decoded {
        LeaseEvent::LeaseProvisionRequested {
            provider, items, operation, payload_hash, ..
        } => {
            let request = ProvisionRequest {
                lease_uuid: id.0,
                tenant: event.tenant_id.as_str().to_string(),
                provider_uuid: provider.0,
                items: wire_items(items),
                callback_url: callbacks.operation(id, (*operation)?),
                // The manifest itself is added when sending, from the vault (never
                // stored here); without it, no hash is sent either.
                payload: None,
                payload_hash: Some(payload_hash.as_str().to_string()),
                lifecycle_callback_url: None,
            };
            ("provision", to_json(serde_json::to_value(request))?)
        }
        LeaseEvent::LeaseRestoreStarted { from, provider, items, operation, .. } => {
            let request = RestoreRequest {
                lease_uuid: id.0,
                from_lease_uuid: from.0,
                tenant: event.tenant_id.as_str().to_string(),
                provider_uuid: provider.0,
                items: wire_items(items),
                callback_url: callbacks.operation(id, (*operation)?),
                lifecycle_callback_url: None,
            };
            ("restore", to_json(serde_json::to_value(request))?)
        }
        LeaseEvent::LeaseRestartStarted { maintenance_id, admitted_at, .. } => {
            let request = RestartRequest {
                lease_uuid: id.0,
                callback_url: callbacks.maintenance(id, *maintenance_id),
                maintenance_id: Some(maintenance_id.0.to_string()),
                admitted_at: Some(stamp(*admitted_at)),
            };
            ("restart", to_json(serde_json::to_value(request))?)
        }
        LeaseEvent::LeaseUpdateStarted { maintenance_id, admitted_at, payload_hash, .. } => {
            // The manifest itself is added when sending, from the vault; a backend that
            // needs it and gets none refuses the update.
            let request = UpdateRequest {
                lease_uuid: id.0,
                callback_url: callbacks.maintenance(id, *maintenance_id),
                payload: Vec::new(),
                payload_hash: Some(payload_hash.as_str().to_string()),
                maintenance_id: Some(maintenance_id.0.to_string()),
                admitted_at: Some(stamp(*admitted_at)),
            };
            ("update", to_json(serde_json::to_value(request))?)
        }
        LeaseEvent::LeaseDeprovisionRequested { .. } => {
            ("deprovision", serde_json::json!({ "lease_uuid": id.0 }))
        }
        _ => return None,
    };
    Some((action, terms.backend.as_str().to_string(), request))
}

/// The dispatcher as a caller: its own key namespace (`system:dispatcher`), which no token
/// can take, and every provider.
fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

/// The generation of the backend work `event` starts, if it starts any.
pub fn started_work(event: &LeaseEvent) -> Option<u64> {
    match event {
        LeaseEvent::LeaseProvisionRequested { generation, .. }
        | LeaseEvent::LeaseRestoreStarted { generation, .. }
        | LeaseEvent::LeaseRestartStarted { generation, .. }
        | LeaseEvent::LeaseUpdateStarted { generation, .. }
        | LeaseEvent::LeaseDeprovisionRequested { generation, .. } => Some(*generation),
        _ => None,
    }
}

/// Whether the lease still waits for its backend to take the work of `generation`.
/// Whether `lease` still awaits its backend work of `generation`.
pub fn awaits(lease: &Lease, generation: u64) -> bool {
    lease.generation == generation
        && matches!(
            lease.status,
            LeaseStatus::Provisioning
                | LeaseStatus::Restarting
                | LeaseStatus::Updating
                | LeaseStatus::Deprovisioning
        )
}

fn lease_of(work: &Work) -> Result<LeaseId, ReconcileError> {
    work.request["lease_uuid"]
        .as_str()
        .and_then(|text| Uuid::parse_str(text).ok())
        .map(LeaseId)
        .ok_or_else(|| ReconcileError::Retry {
            action: "dispatch".into(),
            reason: "an outbox request names no lease".into(),
        })
}

pub(crate) fn wire_items(items: &LeaseItems) -> Vec<LeaseItem> {
    items
        .as_slice()
        .iter()
        .map(|item| LeaseItem {
            sku: item.sku.as_str().to_string(),
            quantity: item.quantity,
            service_name: item.service_name.as_ref().map(|name| name.as_str().to_string()),
            custom_domain: item.custom_domain.as_ref().map(|domain| domain.as_str().to_string()),
        })
        .collect()
}

/// An admission stamp as the backends echo it: RFC 3339 UTC, whole seconds (how it is issued).
fn stamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// What a backend's answer other than success means for the work.
fn answer_of(work: &Work, error: &CallError) -> DispatchAnswer {
    use BackendError as B;
    let detail = OperatorDetail::new(&error.to_string());
    let refused = |reason: &str, message: &str| DispatchAnswer::Refused {
        reason: Reason::parse("reason", reason).unwrap_or_else(|_| Reason::unknown()),
        message: TenantMessage::parse("message", crate::backends::tenant_detail(message))
            .unwrap_or_else(|_| generic_refusal()),
        detail: detail.clone(),
    };
    let CallError::Backend(backend) = error else {
        return DispatchAnswer::Failed { detail };
    };
    match backend {
        B::Validation { code, message } => refused(validation_reason(*code), message),
        B::InsufficientResources => {
            refused("InsufficientResources", "the provider has no capacity for this lease now")
        }
        B::AlreadyProvisioned => {
            refused("AlreadyProvisioned", "the backend already holds this lease")
        }
        B::InvalidState => {
            refused("InvalidState", "the backend cannot do this in the lease's current state")
        }
        B::NotProvisioned if matches!(work.action.as_str(), "restart" | "update") => {
            refused("NotProvisioned", "the backend does not hold this lease")
        }
        B::NotRetained => refused("NotRetained", "no retained data found for that lease"),
        B::DemoteExceedsTier { message } => refused("DemoteExceedsTier", message),
        B::RestoreRefused { message } => refused("RestoreRefused", message),
        _ => DispatchAnswer::Failed { detail },
    }
}

fn validation_reason(code: Option<ValidationCode>) -> &'static str {
    match code {
        Some(ValidationCode::UnknownSku) => "UnknownSku",
        Some(ValidationCode::InvalidManifest) => "InvalidManifest",
        Some(ValidationCode::ImageNotAllowed) => "ImageNotAllowed",
        None => "ValidationFailed",
    }
}

fn generic_refusal() -> TenantMessage {
    TenantMessage::parse("message", "the backend refused the request").expect("a valid message")
}

trait WithDetail {
    fn with_detail(self, detail: &str) -> Self;
}

impl WithDetail for DispatchAnswer {
    /// The same answer with operator detail appended.
    fn with_detail(self, more: &str) -> Self {
        match self {
            DispatchAnswer::Refused { reason, message, detail } => DispatchAnswer::Refused {
                reason,
                message,
                detail: OperatorDetail::new(&format!("{}; {more}", detail.as_str())),
            },
            other => other,
        }
    }
}
