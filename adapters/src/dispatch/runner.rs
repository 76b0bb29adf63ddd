//! The runner lease kind of dispatcher work: an assigned lease is launched on a runner node's
//! provider agent, and a released or quarantined lease's instance is destroyed (the protocol
//! of `docs/billet-protocol.md` §1), each answer recorded on the lease under its epoch.
//!
//! | event | action | sent | answer recorded |
//! |---|---|---|---|
//! | RunnerJobAssigned | `launch` | a node whose backend accepts the lease's trust class (`GET /accepts`) is bound (`Launch`, decided on its current policy); then `GET /instances?name=` whenever an earlier attempt may have launched, else a registration minted and `POST /instances` | the instance (`RecordInstance`); a launch refused for good releases the lease `failed` (`LaunchRefused`) |
//! | RunnerReleased into teardown, RunnerReaped into quarantine | `destroy` | `DELETE /instances/{id}` (the instance recorded, or found by name) | `RecordTeardown`: `requested` (tried again until confirmed) or `stopped` |
//!
//! The registration (JIT config) is minted only after the backend accepted the trust class,
//! travels in the launch's body only and is never kept: not in the outbox, an event, a log
//! line or an error (an agent's refusal is kept by status and code only). A launch that
//! failed is not proof that nothing started: every attempt after the first, and every
//! attempt on a lease already bound, asks `Find` by the instance's name before anything else
//! and records what it finds; one lease is never launched twice. An instance-less lease is
//! never declared gone on the strength of an absence: it stays charged until its reap and
//! its node's inventory prove it (`runners/`).

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::runner_service::{HolderReport, RunnerService};
use leasehold_commands::{CommandError, CommandStore};
use leasehold_domain::runner::{
    InstanceRef, Outcome, Phase, RunnerError, RunnerEvent, RunnerLease, RunnerLeaseId,
    RunnerNodeName, Teardown,
};
use leasehold_domain::values::Reason;
use leasehold_domain::{Actor, DomainEvent as _, RecordedEvent, TenantId};
use leasehold_projections::ReconcileError;

use super::{DispatchKind, Intent, Sent, Work};
use crate::providers::ProviderError;
use crate::runner_providers::wire::{InstanceWire, LaunchSpec};
use crate::runner_providers::{JitIssuer, RunnerProviderClient};

/// How long a launch waits when no node can take it now (none registered, none accepting).
const NO_NODE_WAIT: Duration = Duration::from_secs(5);

/// The runner nodes' agents, in the order they are tried, and the registration issuer.
#[derive(Debug, Clone)]
pub struct RunnerNodes {
    clients: Arc<Vec<RunnerProviderClient>>,
    issuer: JitIssuer,
}

impl RunnerNodes {
    /// `clients`, tried in this order, and `issuer`.
    pub fn new(clients: Vec<RunnerProviderClient>, issuer: JitIssuer) -> Self {
        Self { clients: Arc::new(clients), issuer }
    }

    /// `node`'s client.
    pub fn get(&self, node: &RunnerNodeName) -> Option<&RunnerProviderClient> {
        self.clients.iter().find(|client| &client.config().node == node)
    }

    /// Every client, in order.
    pub fn all(&self) -> impl Iterator<Item = &RunnerProviderClient> {
        self.clients.iter()
    }
}

/// The runner lease kind's dispatch.
#[derive(Debug, Clone)]
pub struct RunnerDispatch<S> {
    runners: RunnerService<S>,
    nodes: RunnerNodes,
}

impl<S> RunnerDispatch<S> {
    /// Sends the work of `runners`'s leases to `nodes`.
    pub fn new(runners: RunnerService<S>, nodes: RunnerNodes) -> Self {
        Self { runners, nodes }
    }
}

/// The action an event of a lease starts.
pub fn started_work(event: &RunnerEvent) -> Option<&'static str> {
    match event {
        RunnerEvent::RunnerJobAssigned { .. } => Some("launch"),
        RunnerEvent::RunnerReleased { phase: Phase::Teardown, .. }
        | RunnerEvent::RunnerReaped { phase: Phase::Quarantine, .. } => Some("destroy"),
        _ => None,
    }
}

/// Whether `lease` still awaits `action`.
pub fn awaits(lease: &RunnerLease, action: &str) -> bool {
    match action {
        "launch" => {
            lease.phase == Phase::Assigned
                || (lease.phase == Phase::Launching && lease.instance.is_none())
        }
        "destroy" => {
            matches!(lease.phase, Phase::Teardown | Phase::Quarantine)
                && lease.teardown != Some(Teardown::Stopped)
        }
        _ => false,
    }
}

/// The dispatcher as a caller of the runner service (its own key namespace).
fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "runner-dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}

/// A lease command's result: a refusal of the lease (it moved on: fenced, reaped, ...) is
/// moot; a store failure is tried again.
fn recorded(
    what: &str,
    result: Result<impl Sized, CommandError<RunnerError>>,
) -> Result<bool, ReconcileError> {
    match result {
        Ok(_) => Ok(true),
        Err(CommandError::Refused(_) | CommandError::NotFound) => Ok(false),
        Err(error) => Err(retry(what, &error)),
    }
}

impl<S> RunnerDispatch<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn lease(
        &self,
        lease: RunnerLeaseId,
    ) -> Result<Option<(TenantId, RunnerLease)>, ReconcileError> {
        match self.runners.owned(lease).await {
            Ok(found) => Ok(Some(found)),
            Err(CommandError::NotFound) => Ok(None),
            Err(error) => Err(retry("read a runner lease", &error)),
        }
    }

    /// Binds the lease to the first node, in the file's order, that is registered, whose
    /// backend accepts its trust class and whose current policy admits it. `None`: no node
    /// can take it now.
    async fn bind(
        &self,
        work: &Work,
        (owner, lease, stored): (&TenantId, RunnerLeaseId, &RunnerLease),
    ) -> Result<Option<RunnerNodeName>, ReconcileError> {
        let Some(terms) = stored.terms.as_ref() else { return Ok(None) };
        for client in self.nodes.all() {
            let node = &client.config().node;
            match client.accepts(terms.trust).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => {
                    tracing::debug!(dispatcher = "runner-dispatcher", %node, %error, "a runner node did not answer");
                    continue;
                }
            }
            let key = format!("runner-dispatch:{}:{}:bind:{node}", lease.0, work.generation);
            let bound = self
                .runners
                .launch(&dispatcher(), &key, (owner.clone(), lease, stored.epoch), node.clone())
                .await;
            match bound {
                Ok(_) => return Ok(Some(node.clone())),
                // Not registered, or its policy refuses the lease: the next node.
                Err(CommandError::Refused(_) | CommandError::NotFound) => continue,
                Err(error) => return Err(retry("bind a runner lease", &error)),
            }
        }
        Ok(None)
    }

    async fn launch(
        &self,
        work: &Work,
        (owner, lease): (&TenantId, RunnerLeaseId),
    ) -> Result<Sent, ReconcileError> {
        let Some((_, mut stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
        let mut bound_before = true;
        if stored.phase == Phase::Assigned {
            bound_before = false;
            if self.bind(work, (owner, lease, &stored)).await?.is_none() {
                let detail = "no runner node can take the lease now".into();
                return Ok(Sent::NotSent { detail, wait: NO_NODE_WAIT });
            }
            let Some((_, now_stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
            stored = now_stored;
        }
        let (Some(node), Some(terms)) = (stored.node.clone(), stored.terms.clone()) else {
            return Ok(Sent::Moot);
        };
        let Some(client) = self.nodes.get(&node) else {
            let detail = format!("no settings for runner node {node}");
            return Ok(Sent::NotSent { detail, wait: NO_NODE_WAIT });
        };
        let name = lease.instance_name();
        // An earlier attempt, or a process that bound the lease and died, may have launched
        // it: what the backend has under its name comes first.
        if bound_before || work.attempt > 1 {
            match client.find(&name).await {
                Ok(Some(found)) => {
                    return self.record_instance(work, (owner, lease, &stored), &found).await;
                }
                Ok(None) => {}
                Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
            }
        }
        match client.accepts(terms.trust).await {
            Ok(true) => {}
            Ok(false) => return self.refuse(work, (owner, lease, &stored), "TrustRefused").await,
            Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
        }
        let jit_config = match self.nodes.issuer.mint(&name, terms.tier.as_str()).await {
            Ok(registration) => registration,
            Err(error) => {
                return Ok(Sent::Failed { detail: format!("minting a registration: {error}") });
            }
        };
        let spec = LaunchSpec {
            name,
            lease: lease.0,
            tier: terms.tier.to_string(),
            trust: terms.trust.to_string(),
            guest_os: terms.guest_os.to_string(),
            vcpu: terms.resources.vcpu,
            memory_mb: terms.resources.memory_mb,
            command: terms.command.args().to_vec(),
            jit_config,
        };
        match client.launch(&spec).await {
            Ok(instance) => self.record_instance(work, (owner, lease, &stored), &instance).await,
            Err(ProviderError::Refused { status, code }) => {
                tracing::warn!(dispatcher = "runner-dispatcher", lease = %lease.0, status, %code, "the runner provider refused the launch");
                self.refuse(work, (owner, lease, &stored), "LaunchRefused").await
            }
            Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
        }
    }

    async fn record_instance(
        &self,
        work: &Work,
        (owner, lease, stored): (&TenantId, RunnerLeaseId, &RunnerLease),
        found: &InstanceWire,
    ) -> Result<Sent, ReconcileError> {
        let Ok(instance) = InstanceRef::parse("instance", found.id.as_str()) else {
            return Ok(Sent::Failed { detail: "an instance id out of the protocol".into() });
        };
        let key = format!("runner-dispatch:{}:{}:instance", lease.0, work.generation);
        let report = HolderReport::Instance { epoch: stored.epoch, instance };
        let done = self.runners.report(&dispatcher(), &key, (owner.clone(), lease), report).await;
        Ok(if recorded("record an instance", done)? { Sent::Delivered } else { Sent::Moot })
    }

    /// The launch cannot be done on this lease: it is released `failed` with `reason`.
    async fn refuse(
        &self,
        work: &Work,
        (owner, lease, stored): (&TenantId, RunnerLeaseId, &RunnerLease),
        reason: &str,
    ) -> Result<Sent, ReconcileError> {
        let key = format!("runner-dispatch:{}:{}:refused", lease.0, work.generation);
        let reason = Reason::parse("reason", reason).ok();
        let released = self
            .runners
            .release(
                &dispatcher(),
                &key,
                (owner.clone(), lease, stored.epoch),
                (Outcome::Failed, reason),
            )
            .await;
        recorded("release a refused launch", released)?;
        Ok(Sent::Refused)
    }

    async fn destroy(
        &self,
        work: &Work,
        (owner, lease): (&TenantId, RunnerLeaseId),
    ) -> Result<Sent, ReconcileError> {
        let Some((_, stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
        let Some(node) = stored.node.clone() else { return Ok(Sent::Moot) };
        let Some(client) = self.nodes.get(&node) else {
            let detail = format!("no settings for runner node {node}");
            return Ok(Sent::NotSent { detail, wait: NO_NODE_WAIT });
        };
        let id = match &stored.instance {
            Some(instance) => instance.to_string(),
            None => match client.find(&lease.instance_name()).await {
                Ok(Some(found)) => found.id,
                // Absence is not proof: the reap and the node's inventory settle it.
                Ok(None) => return Ok(Sent::Delivered),
                Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
            },
        };
        let teardown = match client.destroy(&id).await {
            Ok(teardown) => teardown,
            Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
        };
        // A quarantined lease records only the proof; a requested teardown is its phase's.
        if teardown == Teardown::Stopped || stored.phase == Phase::Teardown {
            let key = format!("runner-dispatch:{}:{}:{teardown}", lease.0, work.generation);
            let report = HolderReport::Teardown { epoch: stored.epoch, teardown };
            let done =
                self.runners.report(&dispatcher(), &key, (owner.clone(), lease), report).await;
            if !recorded("record a teardown", done)? {
                return Ok(Sent::Moot);
            }
        }
        Ok(match teardown {
            Teardown::Stopped => Sent::Delivered,
            // Still charged: asked again (destroy is idempotent) until confirmed.
            Teardown::Requested => {
                Sent::Failed { detail: "the teardown is not confirmed yet".into() }
            }
        })
    }
}

impl<S> DispatchKind for RunnerDispatch<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "runner-dispatcher";
    const VERSION: u32 = 1;

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != leasehold_domain::runner::KIND.stream_type {
            return Ok(None);
        }
        let Ok(decoded) = RunnerEvent::from_stored(event.event_type.as_str(), &event.payload)
        else {
            return Ok(None);
        };
        let Some(action) = started_work(&decoded) else { return Ok(None) };
        let Some(lease) = RunnerLeaseId::of_stream(&event.stream_id) else { return Ok(None) };
        let Some((_, stored)) = self.lease(lease).await? else { return Ok(None) };
        if !awaits(&stored, action) {
            return Ok(None);
        }
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            generation: event.version,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target: "runner-nodes".into(),
            action,
            request: serde_json::json!({}),
        }))
    }

    async fn send(&self, work: &Work, _now: DateTime<Utc>) -> Result<Sent, ReconcileError> {
        let lease = RunnerLeaseId::of_stream(&work.stream)
            .ok_or_else(|| retry("read a runner lease's id", &"not a runner lease stream"))?;
        let Some((owner, stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
        if !awaits(&stored, &work.action) {
            return Ok(Sent::Moot);
        }
        match work.action.as_str() {
            "launch" => self.launch(work, (&owner, lease)).await,
            _ => self.destroy(work, (&owner, lease)).await,
        }
    }

    /// A send is at most every node's acceptance, a find, a registration and a launch.
    fn claim_hold(&self) -> Duration {
        let longest = self.nodes.all().map(|c| c.config().timeout).max();
        let nodes = u32::try_from(self.nodes.all().count()).unwrap_or(u32::MAX);
        longest.unwrap_or(Duration::from_secs(30)) * (nodes + 4) + Duration::from_secs(10)
    }
}
