//! The VM kind of dispatcher work: a VM's scheduling starts its boot, its destroy starts the
//! removal, and each goes to its host's agent over fuse's contract (`crate::hosts`). fuse's
//! agent answers a boot once the VM booted and a delete once it is gone, so the answer is the
//! report: a boot's answer is recorded as `ReportBooted` (or `ReportBootFailed`, redacted by
//! the VM service, which gives the room back), a delete's as `ConfirmRemoved`.
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
use leasehold_domain::vm::{BootFailure, Vm, VmEvent, VmStatus, VmUrl};
use leasehold_domain::{Actor, DomainEvent, RecordedEvent};
use leasehold_projections::ReconcileError;

use super::{DispatchKind, Intent, Sent, Work};
use crate::hosts::wire::{CreateVmRequest, agent_name};
use crate::hosts::{AgentError, AgentTarget, HostAgentClient};
use crate::vault::PgCredentialVault;

/// How long work waits for an operator when its host has no registered token.
const NO_TOKEN_WAIT: Duration =
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
        "boot" => VmStatus::Provisioning,
        "destroy" => VmStatus::Destroying,
        _ => return false,
    };
    vm.status == status && vm.generation == generation
}

fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
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
        let stored = self.vms.pipeline().state::<Host>(&host.stream_id()).await;
        let stored = stored.map_err(|error| retry("read a host", &error))?;
        let Some(spec) = stored.and_then(|(_, _, host)| host.spec) else { return Ok(None) };
        let token =
            self.tokens.host_token(host).await.map_err(|e| retry("read a host token", &e))?;
        Ok(token.map(|token| AgentTarget { url: spec.url.to_string(), token }))
    }

    async fn boot(
        &self,
        work: &Work,
        (vm, host, operation): (VmId, HostId, OperationId),
        agent: &AgentTarget,
    ) -> Result<Sent, ReconcileError> {
        let request: CreateVmRequest = serde_json::from_value(work.request["agent"].clone())
            .map_err(|error| retry("decode a boot request", &error))?;
        let answer = match self.agents.create(agent, &request).await {
            // Sent before, its answer lost: the VM is there, read it back. Anything but the
            // VM itself is no answer (the VM may well be running): tried again later.
            Err(AgentError::Exists) => match self.agents.get(agent, &request.name).await {
                Ok(Some(found)) => Ok(found),
                Ok(None) => {
                    return Ok(Sent::Failed { detail: "the agent had the VM, then not".into() });
                }
                Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
            },
            other => other,
        };
        let key = |what: &str| format!("vm-dispatch:{}:{}:{what}", vm.0, work.generation);
        let caller = dispatcher();
        match answer {
            Ok(booted) => {
                let url = VmUrl::parse("url", booted.url.as_str())
                    .or_else(|_| VmUrl::parse("url", format!("fc://{}", booted.vm_id)))
                    .map_err(|error| retry("read a boot's URL", &error))?;
                let key = key("booted");
                let recorded = self.vms.report_booted(&caller, &host, &key, vm, (operation, url));
                recorded.await.map_err(|error| retry("record a boot", &error))?;
                Ok(Sent::Delivered)
            }
            // fuse's agent answers 500 when the boot failed and was rolled back, and refuses a
            // request it cannot take (4xx): either is a definite failure. A 502, 503 or 504
            // (a proxy, an overloaded agent) says nothing of the VM: tried again.
            Err(
                AgentError::Failed { status: 500, message } | AgentError::Refused { message, .. },
            ) => {
                let failure = BootFailure {
                    reason: Reason::parse("reason", "BootFailed").expect("a valid reason"),
                    message: TenantMessage::parse("message", "the host could not boot the VM")
                        .expect("a valid message"),
                    detail: OperatorDetail::new(&message),
                };
                let key = key("failed");
                let recorded =
                    self.vms.report_boot_failed(&caller, &host, &key, vm, (operation, failure));
                recorded.await.map_err(|error| retry("record a failed boot", &error))?;
                Ok(Sent::Refused)
            }
            Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
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
    const VERSION: u32 = 1;

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != "vm" {
            return Ok(None);
        }
        let Ok(decoded) = VmEvent::from_stored(event.event_type.as_str(), &event.payload) else {
            return Ok(None);
        };
        let (action, generation, operation) = match &decoded {
            VmEvent::VmScheduled { operation, generation, .. } => ("boot", *generation, *operation),
            VmEvent::VmDestroying { operation, generation, .. } => {
                ("destroy", *generation, *operation)
            }
            _ => return Ok(None),
        };
        let Some(vm) = VmId::of_stream(&event.stream_id) else { return Ok(None) };
        let (_, stored) = match self.vms.owned(vm).await {
            Ok(found) => found,
            Err(leasehold_commands::CommandError::NotFound) => return Ok(None),
            Err(error) => return Err(retry("read a VM", &error)),
        };
        // Only work the VM still awaits: a dispatcher reading old history sends nothing.
        if !awaits(&stored, generation, action) {
            return Ok(None);
        }
        let (Some(terms), Some(host)) = (&stored.terms, stored.host()) else { return Ok(None) };
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
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            generation,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target: host.to_string(),
            action,
            request: serde_json::json!({ "operation": operation.0, "agent": agent }),
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
            "destroy" => self.destroy(work, named, &agent).await,
            _ => Ok(Sent::Moot),
        }
    }

    /// A send is one or two exchanges with the agent and the recording of the answer.
    fn claim_hold(&self) -> Duration {
        self.timeout * 2 + Duration::from_secs(10)
    }
}
