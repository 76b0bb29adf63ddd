//! The `vm-inventory` reconciler: every sweep, for each host with a registered agent token,
//! it lists the agent's VMs (`GET /v1/vm?prefix=lh-`) and squares them with the log, as
//! fuse's fleet reconcile does:
//! - a VM the log has provisioning that the agent lists is recovered as running;
//! - a VM the log has live that the agent does not list is read once more
//!   (`GET /v1/vm/{id}`); only a 404 then makes it `Recover(missing)`, and so destroying. A
//!   provisioning VM whose boot may still be in flight (scheduled within `boot_grace`) is
//!   left alone;
//! - a VM the agent lists that the log does not have live (no stream, or removed) is an
//!   orphan: deleted; after `orphan_tries_max` failures in a row (default 5), a dead letter.
//!
//! An agent that does not answer defers its host: nothing is concluded from a missing list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::host_service::{HostCaller, HostService};
use leasehold_commands::lease_service::Caller;
use leasehold_commands::vm_service::{CredentialVault, HostCatalog, VmService};
use leasehold_commands::{CommandError, CommandStore};
use leasehold_domain::Actor;
use leasehold_domain::host::HostCommand;
use leasehold_domain::values::OperatorDetail;
use leasehold_domain::values::fleet::{HostId, VmId};
use leasehold_domain::vm::{Found, VmError, VmStatus, VmUrl};
use leasehold_projections::vm::VmView;
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use crate::hosts::wire::{AGENT_NAME_PREFIX, AgentVm};
use crate::hosts::{AgentTarget, HostAgentClient};
use crate::store::{PgEventStore, from_driver};
use crate::vault::PgCredentialVault;

/// How the inventory reconciler sweeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmInventoryPolicy {
    /// How often.
    pub sweep_every: TimeDelta,
    /// How long after its scheduling a provisioning VM may be absent (its boot in flight).
    pub boot_grace: TimeDelta,
    /// The same for a fork's or migration's copy, whose boot waits for a snapshot and, for a
    /// migration, its transfer to the target.
    pub copy_grace: TimeDelta,
    /// Failed destroys of one orphan, in a row, before it is dead-lettered.
    pub orphan_tries_max: u32,
}

impl Default for VmInventoryPolicy {
    fn default() -> Self {
        Self {
            sweep_every: TimeDelta::seconds(30),
            boot_grace: TimeDelta::minutes(3),
            copy_grace: TimeDelta::seconds(
                i64::try_from(
                    crate::limits::HOST_AGENT_SNAPSHOT_SECONDS
                        + crate::limits::HOST_AGENT_ARTIFACT_PULL_SECONDS,
                )
                .unwrap_or(i64::MAX),
            ) + TimeDelta::minutes(3),
            orphan_tries_max: 5,
        }
    }
}

/// The reconciler.
#[derive(Debug)]
pub struct VmInventory<S, C, V> {
    vms: VmService<S, C, V>,
    hosts: HostService<S>,
    agents: HostAgentClient,
    tokens: PgCredentialVault,
    policy: VmInventoryPolicy,
    next_sweep: Mutex<Option<DateTime<Utc>>>,
    /// Failed destroys in a row, per host and orphan.
    orphan_failures: crate::in_a_row::InARow<(String, String)>,
}

impl<S, C, V> VmInventory<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// A reconciler acting through `vms` (and its pipeline for hosts), calling agents with
    /// `agents` and finding their tokens in `tokens`.
    pub fn new(
        vms: VmService<S, C, V>,
        (agents, tokens): (HostAgentClient, PgCredentialVault),
        policy: VmInventoryPolicy,
    ) -> Self {
        let hosts = HostService::new(vms.pipeline().clone());
        Self {
            vms,
            hosts,
            agents,
            tokens,
            policy,
            next_sweep: Mutex::new(None),
            orphan_failures: Default::default(),
        }
    }
}

fn actor() -> Actor {
    Actor { subject: "vm-inventory".into(), role: "system".into() }
}

fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}

impl<S, C, V> VmInventory<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// The live VMs the VM projection has on `host`.
    async fn known(&self, host: &HostId) -> Result<Vec<(VmId, VmView)>, ReconcileError> {
        let store: &PgEventStore = self.tokens.store();
        let client = store.client().await.map_err(|error| retry("read a host's VMs", &error))?;
        let rows = client
            .query(
                "SELECT s.vm_id, s.state FROM vm_view_states s JOIN vms v USING (vm_id) \
                 WHERE v.host_id = $1 AND v.state IN ('provisioning', 'running', 'draining')",
                &[&host.as_str()],
            )
            .await
            .map_err(|error| retry("read a host's VMs", &from_driver(error, store.endpoint())))?;
        let mut known = Vec::with_capacity(rows.len());
        for row in rows {
            let view: VmView = postcard::from_bytes(row.get(1))
                .map_err(|error| retry("read a host's VMs", &error))?;
            known.push((VmId(row.get(0)), view));
        }
        Ok(known)
    }

    /// Whether the log has `vm` live (or being destroyed: its own destroy deletes it).
    async fn tracked(&self, vm: VmId) -> Result<bool, ReconcileError> {
        match self.vms.owned(vm).await {
            Ok((_, stored)) => Ok(stored.status != VmStatus::Removed),
            Err(CommandError::NotFound) => Ok(false),
            Err(error) => Err(retry("read a VM", &error)),
        }
    }

    async fn sweep_host(
        &self,
        host: &HostId,
        agent: &AgentTarget,
        now: DateTime<Utc>,
    ) -> Result<(), ReconcileError> {
        // An agent that does not answer defers its host: nothing follows from no list.
        let listed = match self.agents.list(agent, AGENT_NAME_PREFIX).await {
            Ok(listed) => listed,
            Err(error) => {
                tracing::warn!(%host, %error, "a host agent's listing failed; its host is deferred");
                return Ok(());
            }
        };
        let by_name: BTreeMap<&str, &AgentVm> =
            listed.iter().map(|vm| (vm.vm_id.as_str(), vm)).collect();
        let mut known_names = BTreeSet::new();
        for (vm, view) in self.known(host).await? {
            let name = crate::hosts::wire::agent_name(vm);
            known_names.insert(name.clone());
            self.square(host, agent, (vm, &view), by_name.get(name.as_str()).copied(), now).await?;
        }
        for listed in &listed {
            if known_names.contains(&listed.vm_id) {
                continue;
            }
            let vm = listed
                .vm_id
                .strip_prefix(AGENT_NAME_PREFIX)
                .and_then(|id| uuid::Uuid::parse_str(id).ok());
            // Known after all (the projection lags): not an orphan.
            if let Some(vm) = vm
                && self.tracked(VmId(vm)).await?
            {
                continue;
            }
            self.destroy_orphan(host, agent, &listed.vm_id).await?;
        }
        Ok(())
    }

    /// One VM the log has live, against what the agent listed of it.
    async fn square(
        &self,
        host: &HostId,
        agent: &AgentTarget,
        (vm, view): (VmId, &VmView),
        listed: Option<&AgentVm>,
        now: DateTime<Utc>,
    ) -> Result<(), ReconcileError> {
        let state = &view.vm;
        let Some(operation) = state.operation else { return Ok(()) };
        let found = match listed {
            Some(found) if state.status == VmStatus::Provisioning => {
                let Ok(url) = VmUrl::parse("url", found.url.as_str()) else { return Ok(()) };
                Found::Running { url }
            }
            Some(_) => return Ok(()),
            None => {
                let grace = match state.origin {
                    Some(_) => self.policy.copy_grace,
                    None => self.policy.boot_grace,
                };
                let in_flight = state.status == VmStatus::Provisioning
                    && state.updated_at.is_some_and(|at| at + grace > now);
                if in_flight {
                    return Ok(());
                }
                // Absent from a list is not yet gone: read it once more.
                match self.agents.get(agent, &crate::hosts::wire::agent_name(vm)).await {
                    Ok(None) => Found::Missing,
                    Ok(Some(_)) | Err(_) => return Ok(()),
                }
            }
        };
        let caller = Caller { actor: actor(), tenant: None, provider: None, namespace: None };
        let decided_on = state.updated_at.map_or(0, |at| at.timestamp_micros());
        let key = format!("vm-inventory:{}:{decided_on}", vm.0);
        match self.vms.recover(&caller, host, &key, vm, (operation, found)).await {
            Ok(_)
            | Err(
                CommandError::Refused(VmError::Fenced | VmError::InvalidState { .. })
                | CommandError::NotFound,
            ) => Ok(()),
            Err(error) => Err(retry("record a recovery lookup", &error)),
        }
    }

    async fn destroy_orphan(
        &self,
        host: &HostId,
        agent: &AgentTarget,
        name: &str,
    ) -> Result<(), ReconcileError> {
        let key = (host.to_string(), name.to_owned());
        let failure = match self.agents.delete(agent, name).await {
            Ok(_) => {
                tracing::info!(%host, orphan = name, "an orphan VM was destroyed");
                self.orphan_failures.succeeded(&key);
                return Ok(());
            }
            Err(error) => error.to_string(),
        };
        let attempts = self.orphan_failures.failed(key);
        tracing::warn!(%host, orphan = name, attempts, error = %failure, "an orphan VM's destroy failed");
        if attempts == self.policy.orphan_tries_max {
            let command = HostCommand::DeadLetterOrphan {
                name: name.to_owned(),
                attempts,
                detail: OperatorDetail::new(&failure),
            };
            let caller = HostCaller { actor: actor(), namespace: None };
            let op_key = format!("vm-inventory:orphan:{host}:{name}:{attempts}");
            self.hosts
                .run(&caller, &op_key, host, command)
                .await
                .map_err(|e| retry("dead-letter an orphan", &e))?;
        }
        Ok(())
    }
}

impl<S, C, V> Reconciler for VmInventory<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog + 'static,
    V: CredentialVault + 'static,
{
    const NAME: &'static str = "vm-inventory";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let next = seen.now + self.policy.sweep_every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        let hosts =
            self.vms.catalog().hosts().await.map_err(|error| retry("read the hosts", &error))?;
        for host in hosts.iter().filter(|host| host.status.is_member()) {
            let (Some(id), Some(spec)) = (&host.id, &host.spec) else { continue };
            let token = self
                .tokens
                .host_token(id)
                .await
                .map_err(|error| retry("read a host token", &error))?;
            let Some(token) = token else { continue };
            let agent = AgentTarget { url: spec.url.to_string(), token };
            // One host's failure never holds the others back.
            if let Err(error) = self.sweep_host(id, &agent, seen.now).await {
                tracing::warn!(host = %id, %error, "a host's inventory sweep failed");
            }
        }
        Ok(Some(next))
    }
}
