//! The VM kind of dispatcher work: a VM's scheduling starts its boot, its destroy starts the
//! removal, and each goes to its host's agent over fuse's contract (`crate::hosts`). fuse's
//! agent answers a boot once the VM booted and a delete once it is gone, so the answer is the
//! report: a boot's answer is recorded as `ReportBooted` (or `ReportBootFailed`, redacted by
//! the VM service, which gives the room back), a delete's as `ConfirmRemoved`.
//!
//! A copy's boot (`copies.rs`) is a fork or a migration: a snapshot of the source first, then
//! the copy booted from it, on the source's host (a fork) or on the target after the target's
//! agent pulled the snapshot from the source's (a migration). A seeded VM boots from its
//! host's copy of the seed, pulled there first from a holder when the host has none.
//!
//! At least once: a boot sent again after a lost answer finds the VM there (409) and reads it
//! back; a delete sent again finds it gone (404), which is done. Work the VM no longer awaits
//! (another operation started, or it settled) is never sent. An agent that does not answer
//! is tried again with backoff; one with no registered token waits.

use std::time::Duration;

use chrono::{DateTime, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::vm_service::{CredentialVault, HostCatalog, VmService};
use leasehold_domain::host::Host;
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{BootFailure, Vm, VmEvent, VmOrigin, VmStatus, VmUrl};
use leasehold_domain::{Actor, DomainEvent, RecordedEvent};
use leasehold_projections::ReconcileError;

mod copies;
pub mod seeds;

use super::{DispatchKind, Intent, Sent, Work};
use crate::hosts::wire::{AgentVm, CreateVmRequest, agent_name};
use crate::hosts::{AgentError, AgentTarget, HostAgentClient};
use crate::vault::PgCredentialVault;

/// How long work waits for an operator when its host has no registered token.
pub(crate) const NO_TOKEN_WAIT: Duration =
    Duration::from_millis(crate::limits::DISPATCH_RETRY_MAX_MILLISECONDS);

/// The VM kind's dispatch: boots and destroys sent to host agents.
#[derive(Debug, Clone)]
pub struct VmDispatch<S, C, V> {
    vms: VmService<S, C, V>,
    agents: HostAgentClient,
    tokens: PgCredentialVault,
    timeout: Duration,
}

impl<S, C, V> VmDispatch<S, C, V> {
    /// Sends the work of `vms`'s VMs with `agents` (whose exchanges take at most `timeout`),
    /// finding each host's token in `tokens`.
    pub fn new(
        vms: VmService<S, C, V>,
        (agents, timeout): (HostAgentClient, Duration),
        tokens: PgCredentialVault,
    ) -> Self {
        Self { vms, agents, tokens, timeout }
    }
}

/// The work an event of a VM starts: its action and generation.
pub fn started_work(event: &VmEvent) -> Option<(&'static str, u64)> {
    match event {
        VmEvent::VmScheduled { generation, .. } => Some(("boot", *generation)),
        VmEvent::VmDestroying { generation, .. } => Some(("destroy", *generation)),
        _ => None,
    }
}

/// A piece of a VM's work for its host's agent: what the dispatcher sends, and what a host's
/// agent that takes its work (`vmWork`) is handed.
#[derive(Debug, Clone, PartialEq)]
pub struct VmWork {
    /// The host whose agent carries it out.
    pub host: HostId,
    /// `boot`, `fork`, `migrate` or `destroy`.
    pub action: &'static str,
    /// The work's generation on the VM.
    pub generation: u64,
    /// The operation its report names.
    pub operation: OperationId,
    /// `operation`, `agent` (the boot's `POST /v1/vm` body, as fuse's client sends it) and
    /// `source` (a fork's or migration's source VM, else null). Never a credential.
    pub request: serde_json::Value,
}

/// The work `event` of `vm` started, if `stored` (the VM as stored now) still awaits it: a
/// reader of old history is handed nothing settled.
pub fn work_of(vm: VmId, event: &VmEvent, stored: &Vm) -> Option<VmWork> {
    let (action, generation) = started_work(event)?;
    let operation = match event {
        VmEvent::VmScheduled { operation, .. } | VmEvent::VmDestroying { operation, .. } => {
            *operation
        }
        _ => return None,
    };
    if !awaits(stored, generation, action) {
        return None;
    }
    let (Some(terms), Some(host)) = (&stored.terms, stored.host()) else { return None };
    let (action, source) = match (action, stored.origin) {
        ("boot", Some(VmOrigin::Fork { source })) => ("fork", Some(source)),
        ("boot", Some(VmOrigin::Migration { source, .. })) => ("migrate", Some(source)),
        (action, _) => (action, None),
    };
    let spec = &terms.spec;
    let agent = CreateVmRequest {
        name: agent_name(vm),
        cpus: spec.cpus,
        memory_mb: spec.ram_mb,
        storage_gb: spec.storage_gb,
        region: spec.region.as_ref().map(ToString::to_string).unwrap_or_default(),
        image: spec.image.as_ref().map(ToString::to_string),
        seed_snapshot: spec.seed.as_ref().map(ToString::to_string),
    };
    let request = serde_json::json!({
        "operation": operation.0,
        "agent": agent,
        "source": source.map(|source| source.0),
    });
    Some(VmWork { host: host.clone(), action, generation, operation, request })
}

/// What a boot's exchanges (a plain boot's, a fork's, a migration's) came to.
#[derive(Debug)]
enum BootAnswer {
    /// The VM booted.
    Booted(AgentVm),
    /// It never will: the agent failed the boot and rolled it back, or refused it.
    Failed(String),
    /// Nothing is known: tried again.
    NoAnswer(String),
}

impl BootAnswer {
    /// fuse's agent answers 500 when a boot failed and was rolled back, and refuses what it
    /// cannot take (4xx, a missing source or snapshot among them): either is a definite
    /// failure. A 502, 503 or 504 (a proxy, an overloaded agent) or no answer says nothing of
    /// the VM.
    fn of(answer: Result<AgentVm, AgentError>) -> Self {
        match answer {
            Ok(vm) => Self::Booted(vm),
            Err(error) => Self::of_error(error),
        }
    }

    fn of_error(error: AgentError) -> Self {
        match error {
            AgentError::Failed { status: 500, message } | AgentError::Refused { message, .. } => {
                Self::Failed(message)
            }
            AgentError::NotFound => Self::Failed(error.to_string()),
            error => Self::NoAnswer(error.to_string()),
        }
    }
}

/// The dispatcher as a caller of the VM service (its own key namespace).
fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "vm-dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

/// Whether `vm` still awaits the work of `generation` named `action`.
fn awaits(vm: &Vm, generation: u64, action: &str) -> bool {
    let status = match action {
        "boot" | "fork" | "migrate" => VmStatus::Provisioning,
        "destroy" => VmStatus::Destroying,
        _ => return false,
    };
    vm.status == status && vm.generation == generation
}

/// Where `host`'s agent is (its registration, read through `pipeline`) and its token (in
/// `tokens`); `None` when no token was registered.
pub(crate) async fn host_target<S: CommandStore + Clone + Send + Sync + 'static>(
    pipeline: &leasehold_commands::CommandPipeline<S>,
    tokens: &PgCredentialVault,
    host: &HostId,
) -> Result<Option<AgentTarget>, ReconcileError> {
    let stored = pipeline.state::<Host>(&host.stream_id()).await;
    let stored = stored.map_err(|error| retry("read a host", &error))?;
    let Some(spec) = stored.and_then(|(_, _, host)| host.spec) else { return Ok(None) };
    let token = tokens.host_token(host).await.map_err(|e| retry("read a host token", &e))?;
    Ok(token.map(|token| AgentTarget { url: spec.url.to_string(), token }))
}

pub(crate) fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}

fn vm_of(work: &Work) -> Result<VmId, ReconcileError> {
    VmId::of_stream(&work.stream).ok_or_else(|| retry("read a VM's id", &"not a VM stream"))
}

impl<S, C, V> VmDispatch<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// Where `host`'s agent is and its token; `None` when no token was registered.
    async fn target(&self, host: &HostId) -> Result<Option<AgentTarget>, ReconcileError> {
        host_target(self.vms.pipeline(), &self.tokens, host).await
    }

    async fn boot(
        &self,
        work: &Work,
        named: (VmId, HostId, OperationId),
        agent: &AgentTarget,
    ) -> Result<Sent, ReconcileError> {
        let mut request: CreateVmRequest = serde_json::from_value(work.request["agent"].clone())
            .map_err(|error| retry("decode a boot request", &error))?;
        if let Some(seed) = request.seed_snapshot.clone() {
            let name = request.name.clone();
            match self.seed_on(work, (&named.1, agent), (&seed, &name)).await? {
                Ok(local) => request.seed_snapshot = Some(local),
                Err(answer) => return self.record_boot(work, named, answer).await,
            }
        }
        let created = self.agents.create(agent, &request).await;
        let answer = self.read_back(agent, &request.name, created).await;
        self.record_boot(work, named, answer).await
    }

    /// What a boot's exchange means: a VM of that name already there (sent before, its
    /// answer lost) is read back; anything but the VM itself from that read is no answer (the
    /// VM may well be running): tried again later.
    async fn read_back(
        &self,
        agent: &AgentTarget,
        name: &str,
        answer: Result<AgentVm, AgentError>,
    ) -> BootAnswer {
        match answer {
            Err(AgentError::Exists) => match self.agents.get(agent, name).await {
                Ok(Some(found)) => BootAnswer::Booted(found),
                Ok(None) => BootAnswer::NoAnswer("the agent had the VM, then not".into()),
                Err(error) => BootAnswer::NoAnswer(error.to_string()),
            },
            other => BootAnswer::of(other),
        }
    }

    /// Records a boot's answer on the VM: booted, or failed for good (the VM service redacts
    /// the detail and gives the room back), or nothing (tried again).
    async fn record_boot(
        &self,
        work: &Work,
        (vm, host, operation): (VmId, HostId, OperationId),
        answer: BootAnswer,
    ) -> Result<Sent, ReconcileError> {
        let key = |what: &str| format!("vm-dispatch:{}:{}:{what}", vm.0, work.generation);
        let caller = dispatcher();
        match answer {
            BootAnswer::Booted(booted) => {
                let url = VmUrl::parse("url", booted.url.as_str())
                    .or_else(|_| VmUrl::parse("url", format!("fc://{}", booted.vm_id)))
                    .map_err(|error| retry("read a boot's URL", &error))?;
                let key = key("booted");
                let recorded = self.vms.report_booted(&caller, &host, &key, vm, (operation, url));
                recorded.await.map_err(|error| retry("record a boot", &error))?;
                Ok(Sent::Delivered)
            }
            BootAnswer::Failed(detail) => {
                let failure = BootFailure {
                    reason: Reason::parse("reason", "BootFailed").expect("a valid reason"),
                    message: TenantMessage::parse("message", "the host could not boot the VM")
                        .expect("a valid message"),
                    detail: OperatorDetail::new(&detail),
                };
                let key = key("failed");
                let recorded =
                    self.vms.report_boot_failed(&caller, &host, &key, vm, (operation, failure));
                recorded.await.map_err(|error| retry("record a failed boot", &error))?;
                Ok(Sent::Refused)
            }
            BootAnswer::NoAnswer(detail) => Ok(Sent::Failed { detail }),
        }
    }

    async fn destroy(
        &self,
        work: &Work,
        (vm, host, operation): (VmId, HostId, OperationId),
        agent: &AgentTarget,
    ) -> Result<Sent, ReconcileError> {
        match self.agents.delete(agent, &agent_name(vm)).await {
            Ok(_) => {
                let key = format!("vm-dispatch:{}:{}:removed", vm.0, work.generation);
                let caller = dispatcher();
                let recorded = self.vms.confirm_removed(&caller, &host, &key, (vm, operation));
                recorded.await.map_err(|error| retry("record a removal", &error))?;
                Ok(Sent::Delivered)
            }
            Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
        }
    }
}

impl<S, C, V> DispatchKind for VmDispatch<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog + 'static,
    V: CredentialVault + 'static,
{
    const NAME: &'static str = "vm-dispatcher";
    // An agent answers a create of a name it holds 409 (read back), and a delete of what it
    // does not hold 404 (done); a fork or migration takes a snapshot first, which a repeat
    // would take again, so those wait out the hold.
    const RESENT_AT_ONCE: &'static [&'static str] = &["boot", "destroy"];
    const VERSION: u32 = 1;

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != "vm" {
            return Ok(None);
        }
        let Ok(decoded) = VmEvent::from_stored(event.event_type.as_str(), &event.payload) else {
            return Ok(None);
        };
        let Some((_, generation)) = started_work(&decoded) else { return Ok(None) };
        let Some(vm) = VmId::of_stream(&event.stream_id) else { return Ok(None) };
        let (_, stored) = match self.vms.owned(vm).await {
            Ok(found) => found,
            Err(leasehold_commands::CommandError::NotFound) => return Ok(None),
            Err(error) => return Err(retry("read a VM", &error)),
        };
        let Some(work) = work_of(vm, &decoded, &stored) else { return Ok(None) };
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            generation,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target: work.host.to_string(),
            action: work.action,
            request: work.request,
        }))
    }

    async fn send(&self, work: &Work, _now: DateTime<Utc>) -> Result<Sent, ReconcileError> {
        let vm = vm_of(work)?;
        let host = HostId::parse("host", work.target.as_str())
            .map_err(|error| retry("read a host's id", &error))?;
        let operation: uuid::Uuid = serde_json::from_value(work.request["operation"].clone())
            .map_err(|error| retry("decode an operation", &error))?;
        let Some(agent) = self.target(&host).await? else {
            let detail = format!("host {host} has no registered agent token");
            return Ok(Sent::NotSent { detail, wait: NO_TOKEN_WAIT });
        };
        match self.vms.owned(vm).await {
            Ok((_, stored)) if awaits(&stored, work.generation, &work.action) => {}
            Ok(_) | Err(leasehold_commands::CommandError::NotFound) => return Ok(Sent::Moot),
            Err(error) => return Err(retry("read a VM", &error)),
        }
        let named = (vm, host, OperationId(operation));
        match work.action.as_str() {
            "boot" => self.boot(work, named, &agent).await,
            "fork" => self.fork(work, named, &agent).await,
            "migrate" => self.migrate(work, named, &agent).await,
            "destroy" => self.destroy(work, named, &agent).await,
            _ => Ok(Sent::Moot),
        }
    }

    /// A send is at most four exchanges with agents (a migration's snapshot, pull, boot and
    /// read-back, the first two with their own longer limits) and the recording of the
    /// answer. (One hold for every action: work claimed by a process that died mid-send waits
    /// this long, about 45 minutes, before it is sent again.)
    fn claim_hold(&self) -> Duration {
        let snapshot = Duration::from_secs(crate::limits::HOST_AGENT_SNAPSHOT_SECONDS);
        let pull = Duration::from_secs(crate::limits::HOST_AGENT_ARTIFACT_PULL_SECONDS);
        snapshot + pull + self.timeout * 2 + Duration::from_secs(10)
    }
}
