//! The runner lease kind of dispatcher work: an assigned lease is launched on a runner node's
//! provider agent, and a released or quarantined lease's instance is destroyed (the protocol
//! of `docs/billet-protocol.md` §1), each answer recorded on the lease under its epoch.
//!
//! | event | action | sent | answer recorded |
//! |---|---|---|---|
//! | RunnerJobAssigned | `launch` | a node whose backend accepts the lease's trust class (`GET /accepts`) is bound (`Launch`, decided on its current policy); then `GET /instances?name=` whenever an earlier attempt may have launched, else a registration minted and `POST /instances` | the instance (`RecordInstance`); a launch refused for good releases the lease `failed` (`LaunchRefused`) |
//! | RunnerReleased into teardown, RunnerReaped into quarantine, an instance recorded on a lease in either | `destroy` | `DELETE /instances/{id}` (the instance recorded, or found by name) | `RecordTeardown`: `requested` (tried again until confirmed) or `stopped` |
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
    /// What each node is charged now (`runner_usage`), for its headroom.
    usage: Option<crate::PgReadModels>,
}

impl<S> RunnerDispatch<S> {
    /// Sends the work of `runners`'s leases to `nodes`, each taken as having room.
    pub fn new(runners: RunnerService<S>, nodes: RunnerNodes) -> Self {
        Self { runners, nodes, usage: None }
    }

    /// The same dispatch, binding a lease only to a node whose registered vCPUs and memory
    /// hold it beside what `runner_usage` shows charged there (the projection may lag by a
    /// batch: a node's own backend refuses what it cannot hold).
    #[must_use]
    pub fn with_headroom(self, usage: crate::PgReadModels) -> Self {
        Self { usage: Some(usage), ..self }
    }
}

/// The action an event of a lease starts.
pub fn started_work(event: &RunnerEvent) -> Option<&'static str> {
    match event {
        RunnerEvent::RunnerJobAssigned { .. } => Some("launch"),
        // An instance recorded after its lease was released or reaped (a late answer) must
        // go too: `awaits` says whether the lease still holds it.
        RunnerEvent::RunnerReleased { phase: Phase::Teardown, .. }
        | RunnerEvent::RunnerReaped { phase: Phase::Quarantine, .. }
        | RunnerEvent::RunnerInstanceLaunched { .. } => Some("destroy"),
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

/// Whether `lease` still needs its instance recorded: it may hold compute and names none.
fn needs_instance(lease: &RunnerLease) -> bool {
    lease.instance.is_none() && (Phase::Launching..=Phase::Quarantine).contains(&lease.phase)
}

/// How a record of a provider's answer went.
enum Recorded {
    /// Recorded (or already so).
    Done,
    /// The lease no longer needs it.
    Moot,
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
            if !self.has_room(node, terms).await? {
                continue;
            }
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

    /// Whether `node` holds a lease of `terms` beside what is charged there now (a node not
    /// registered has none; without a usage source every node has room).
    async fn has_room(
        &self,
        node: &RunnerNodeName,
        terms: &leasehold_domain::runner::RunnerTerms,
    ) -> Result<bool, ReconcileError> {
        let Some(usage) = &self.usage else { return Ok(true) };
        let stored = self.runners.node(node).await.map_err(|e| retry("read a runner node", &e))?;
        let Some(registration) = stored.and_then(|stored| stored.registration) else {
            return Ok(false);
        };
        let rows = usage.runner_usage().await.map_err(|e| retry("read runner usage", &e))?;
        let here = rows.iter().filter(|row| row.node == node.as_str());
        let (vcpu, memory) =
            here.fold((0_i64, 0_i64), |(v, m), row| (v + row.vcpu, m + row.memory_mb));
        let fits = |used: i64, asked: u64, has: u64| {
            u64::try_from(used).unwrap_or(0).saturating_add(asked) <= has
        };
        Ok(fits(vcpu, u64::from(terms.resources.vcpu), u64::from(registration.vcpu))
            && fits(memory, terms.resources.memory_mb, registration.memory_mb))
    }

    async fn launch(
        &self,
        work: &Work,
        (owner, lease): (&TenantId, RunnerLeaseId),
    ) -> Result<Sent, ReconcileError> {
        let Some((_, stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
        let bound_before = stored.phase != Phase::Assigned;
        if !bound_before && self.bind(work, (owner, lease, &stored)).await?.is_none() {
            let detail = "no runner node can take the lease now".into();
            return Ok(Sent::NotSent { detail, wait: NO_NODE_WAIT });
        }
        // Read again: bound now, or released or reaped meanwhile (then nothing is launched).
        let Some((_, stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
        let (Some(node), Some(terms)) = (stored.node.clone(), stored.terms.clone()) else {
            return Ok(Sent::Moot);
        };
        if !awaits(&stored, "launch") {
            return Ok(Sent::Moot);
        }
        let Some(client) = self.nodes.get(&node) else {
            let detail = format!("no settings for runner node {node}");
            return Ok(Sent::NotSent { detail, wait: NO_NODE_WAIT });
        };
        let name = lease.instance_name();
        // An earlier attempt, or a process that bound the lease and died, may have launched
        // it: what the backend has under its name comes first.
        if bound_before || work.attempt > 1 {
            match client.find(&name).await {
                Ok(Some(found)) => return self.record_instance(work, (owner, lease), &found).await,
                // One miss is not proof either (a backend's listing may lag its launches):
                // every other attempt only looks, so a registration is minted again only
                // after two misses a backoff apart.
                Ok(None) if work.attempt.is_multiple_of(2) => {
                    return Ok(Sent::Failed { detail: "not found yet; looking again".into() });
                }
                Ok(None) => {}
                Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
            }
        }
        // The node as it stands now must still admit the lease (a retry may come after it
        // retired or registered otherwise), and its backend must take the trust class: both
        // before a registration is minted.
        if let Some(reason) = self.refusal_of(client, &node, &terms).await? {
            return match reason {
                Ok(reason) => self.refuse(work, (owner, lease), reason).await,
                Err(detail) => Ok(Sent::Failed { detail }),
            };
        }
        // Released or reaped during those exchanges: no registration is minted for nothing.
        match self.lease(lease).await? {
            Some((_, now)) if awaits(&now, "launch") => {}
            _ => return Ok(Sent::Moot),
        }
        let jit_config = match self.nodes.issuer.mint(&name, terms.tier.as_str()).await {
            Ok(registration) => registration,
            Err(error) => {
                return Ok(Sent::Failed { detail: format!("minting a registration: {error}") });
            }
        };
        // Released or reaped while the registration was minted: nothing is launched.
        match self.lease(lease).await? {
            Some((_, now)) if awaits(&now, "launch") => {}
            _ => return Ok(Sent::Moot),
        }
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
            Ok(instance) => self.record_instance(work, (owner, lease), &instance).await,
            // The backend holds an instance of that name: it is this lease's.
            Err(ProviderError::Refused { status: 409, .. }) => {
                match client.find(&spec.name).await {
                    Ok(Some(found)) => self.record_instance(work, (owner, lease), &found).await,
                    Ok(None) => {
                        Ok(Sent::Failed { detail: "a launch found taken, then absent".into() })
                    }
                    Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
                }
            }
            Err(ProviderError::Refused { status, code }) => {
                tracing::warn!(dispatcher = "runner-dispatcher", lease = %lease.0, status, %code, "the runner provider refused the launch");
                self.refuse(work, (owner, lease), "LaunchRefused").await
            }
            Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
        }
    }

    /// Why `node` must not launch a lease of `terms` now: `Ok(reason)` for good (the node's
    /// current policy refuses it, or its backend refuses the trust class), `Err(detail)` when
    /// it could not be asked.
    async fn refusal_of(
        &self,
        client: &RunnerProviderClient,
        node: &RunnerNodeName,
        terms: &leasehold_domain::runner::RunnerTerms,
    ) -> Result<Option<Result<&'static str, String>>, ReconcileError> {
        let stored = self.runners.node(node).await.map_err(|e| retry("read a runner node", &e))?;
        let policy = stored.and_then(|node| node.policy());
        if policy.is_none_or(|policy| policy.refuses(terms).is_some()) {
            return Ok(Some(Ok("PolicyRefused")));
        }
        Ok(match client.accepts(terms.trust).await {
            Ok(true) => None,
            Ok(false) => Some(Ok("TrustRefused")),
            Err(error) => Some(Err(error.to_string())),
        })
    }

    async fn record_instance(
        &self,
        work: &Work,
        (owner, lease): (&TenantId, RunnerLeaseId),
        found: &InstanceWire,
    ) -> Result<Sent, ReconcileError> {
        let Ok(instance) = InstanceRef::parse("instance", found.id.as_str()) else {
            return Ok(Sent::Failed { detail: "an instance id out of the protocol".into() });
        };
        let key = format!("runner-dispatch:{}:{}:instance", lease.0, work.generation);
        let report = |epoch| HolderReport::Instance { epoch, instance: instance.clone() };
        let recorded = self.record((owner, lease), (&key, needs_instance), report).await?;
        Ok(match recorded {
            Recorded::Done => Sent::Delivered,
            Recorded::Moot => Sent::Moot,
        })
    }

    /// Records a provider's answer on the lease under its epoch as it is now: the answer is
    /// the provider's, not a holder's claim, so a reap or a node's re-registration since the
    /// send does not make it stale. Moot once the lease no longer `needs` it.
    async fn record(
        &self,
        (owner, lease): (&TenantId, RunnerLeaseId),
        (key, needs): (&str, fn(&RunnerLease) -> bool),
        report: impl Fn(u64) -> HolderReport,
    ) -> Result<Recorded, ReconcileError> {
        // At most one epoch move between the read and the record is waited out here; another
        // is tried again by the outbox.
        for _ in 0..2 {
            let Some((_, stored)) = self.lease(lease).await? else { return Ok(Recorded::Moot) };
            if !needs(&stored) {
                return Ok(Recorded::Moot);
            }
            let owned = (owner.clone(), lease);
            match self.runners.report(&dispatcher(), key, owned, report(stored.epoch)).await {
                Ok(_) => return Ok(Recorded::Done),
                Err(CommandError::Refused(RunnerError::Fenced { .. })) => continue,
                Err(CommandError::Refused(_) | CommandError::NotFound) => {
                    return Ok(Recorded::Moot);
                }
                Err(error) => return Err(retry("record a provider's answer", &error)),
            }
        }
        Err(retry("record a provider's answer", &"the lease's epoch kept moving"))
    }

    /// The launch cannot be done on this lease: it is released `failed` with `reason`, under
    /// its epoch as it is now (a node's re-registration since the read moves the epoch, not the
    /// refusal).
    async fn refuse(
        &self,
        work: &Work,
        (owner, lease): (&TenantId, RunnerLeaseId),
        reason: &str,
    ) -> Result<Sent, ReconcileError> {
        let key = format!("runner-dispatch:{}:{}:refused", lease.0, work.generation);
        let reason = Reason::parse("reason", reason).ok();
        for _ in 0..2 {
            let Some((_, stored)) = self.lease(lease).await? else { return Ok(Sent::Moot) };
            if !awaits(&stored, "launch") {
                return Ok(Sent::Moot);
            }
            let owned = (owner.clone(), lease, stored.epoch);
            let released = (Outcome::Failed, reason.clone());
            match self.runners.release(&dispatcher(), &key, owned, released).await {
                Ok(_) => return Ok(Sent::Refused),
                Err(CommandError::Refused(RunnerError::Fenced { .. })) => continue,
                // It moved on otherwise (released or reaped): nothing to launch.
                Err(CommandError::Refused(_) | CommandError::NotFound) => return Ok(Sent::Moot),
                Err(error) => return Err(retry("release a refused launch", &error)),
            }
        }
        Err(retry("release a refused launch", &"the lease's epoch kept moving"))
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
                // Absence is not proof (a launch in flight may still make it): looked for
                // again until the lease's reap and its node's inventory settle it.
                Ok(None) => return Ok(Sent::Failed { detail: "no instance found yet".into() }),
                Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
            },
        };
        let teardown = match client.destroy(&id).await {
            Ok(teardown) => teardown,
            Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
        };
        // A quarantined lease records only the proof; a requested teardown is its phase's.
        let key = format!("runner-dispatch:{}:{}:{teardown}", lease.0, work.generation);
        let report = |epoch| HolderReport::Teardown { epoch, teardown };
        let needs: fn(&RunnerLease) -> bool = match teardown {
            Teardown::Stopped => |lease| awaits(lease, "destroy"),
            Teardown::Requested => |lease| {
                lease.phase == Phase::Teardown && lease.teardown != Some(Teardown::Requested)
            },
        };
        let recorded = self.record((owner, lease), (&key, needs), report).await?;
        if matches!(recorded, Recorded::Moot) && teardown == Teardown::Stopped {
            return Ok(Sent::Moot);
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
    // A provider answers a launch of an instance name it holds 409, and that instance is read
    // back as the lease's own; a repeat may mint a second registration first, which no runner
    // is ever given (the issuer lets it lapse). A destroy waits out the hold.
    const RESENT_AT_ONCE: &'static [&'static str] = &["launch"];
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
        Ok(Some(Intent::of(event, ("runner-nodes".into(), action), serde_json::json!({}))))
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

    /// A send is at most every node's acceptance, a find, an acceptance, a registration, a
    /// launch and a find, with the commands recording them.
    fn claim_hold(&self) -> Duration {
        let longest = self.nodes.all().map(|c| c.config().timeout).max();
        let nodes = u32::try_from(self.nodes.all().count()).unwrap_or(u32::MAX);
        let exchanges = longest.unwrap_or(Duration::from_secs(30)) * nodes.saturating_add(4);
        exchanges + self.nodes.issuer.timeout() + Duration::from_secs(30)
    }
}
