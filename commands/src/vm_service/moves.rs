//! Forks and migrations (`domain::vm` moves): the source's Fork or Migrate, with its copy's
//! creation and the copy's host reservation linked, all in one append.
//!
//! The copy is a VM of its own: its spec is the source's, pinned to the host it is placed on
//! and with no seed or labels of its own (its disk is the snapshot its host's agent takes of
//! the source, and its host is chosen here); its credentials are new (a disk copy must never
//! answer to its source's token), sealed with the source's secrets. A fork lands on its
//! source's host, whose agent forks locally (fuse's `POST /v1/vm/{id}/fork`); a migration
//! goes to the target named, or to a host of the source's backend other than its own.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_domain::TenantId;
use leasehold_domain::host::{Host, HostCommand};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::values::fleet::{HostId, TaskId, VmId};
use leasehold_domain::vm::{
    CredentialRef, MigrateRequest, Placement, Vm, VmCommand, VmError, VmOrigin, VmSpec, copyable,
    migratable,
};
use serde::Serialize;

use super::{
    Ask, CredentialVault, HostCatalog, Result, VmOutcome, VmService, host_link, own_tenant, vm_of,
};
use crate::lease_service::{Caller, minted_id};
use crate::{CommandError, CommandStore, Link, LinkedCommand, caller_hash};

/// What a fork's retry must repeat to be one.
#[derive(Serialize)]
struct ForkRequest<'a> {
    source: VmId,
    task: &'a TaskId,
}

/// What a migration's retry must repeat to be one.
#[derive(Serialize)]
struct MigrateAsk<'a> {
    source: VmId,
    target: Option<&'a HostId>,
    live: bool,
    lazy: bool,
}

/// How a migration is asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateOptions {
    /// The host to move to; `None`: placement picks one of the source's backend, not its own.
    pub target: Option<HostId>,
    /// Carry the guest's memory across.
    pub live: bool,
    /// Resume before the memory has arrived.
    pub lazy: bool,
}

/// The copy of `source` placed on `host`: the source's shape, nothing of its placement.
fn copy_spec(source: &VmSpec, host: &HostId) -> VmSpec {
    let mut spec = source.clone();
    spec.pin = Some(host.clone());
    spec.seed = None;
    spec.labels = leasehold_domain::values::fleet::Labels::default();
    spec
}

impl<S, C, V> VmService<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// A tenant forks its running VM `source`: the fork, the VM of `task`, boots from a
    /// snapshot of it on its host; `source` runs on as it was.
    ///
    /// # Errors
    /// [`CommandError`]: not found, the source's refusal (not running, GPUs), the fork's (the
    /// task has a VM), no room on the source's host (`NoHostFits`), or the pipeline's.
    pub async fn fork(
        &self,
        caller: &Caller,
        key: &str,
        source: VmId,
        task: &TaskId,
    ) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?.clone();
        let stored = self.tenants_vm(&tenant, source).await?;
        copyable(&stored, "fork").map_err(CommandError::Refused)?;
        let (Some(terms), Some(host)) = (&stored.terms, stored.host()) else {
            return Err(CommandError::Refused(invalid(&stored, "fork")));
        };
        let fork = vm_of(&tenant, task);
        let hash = caller_hash("vm", &source.stream_id(), &ForkRequest { source, task });
        let copy = Replica {
            vm: fork,
            task: task.clone(),
            credentials: CredentialRef(minted_id("vm-fork-credentials", &tenant, key)),
            operation: OperationId(minted_id("vm-fork-boot", &tenant, key)),
            origin: VmOrigin::Fork { source },
        };
        let spec = copy_spec(&terms.spec, host);
        let placing = self.copy_placing(&tenant, &copy, terms.credentials).await?;
        let ask = Ask {
            demand: spec.demand(),
            pin: spec.pin.clone(),
            excluded: BTreeSet::new(),
            vm: fork,
        };
        let (outcome, replacements) = self
            .place_copy(placing, &ask, |placement| {
                let command = VmCommand::Fork { fork };
                let request = self.request(caller, tenant.clone(), source, key, command)?;
                Ok((request.hashed_as(hash), self.copy_links(&copy, &spec, placement)))
            })
            .await?;
        Ok(VmOutcome { vm: fork, outcome, replacements })
    }

    /// A tenant migrates its running VM `source`: a copy boots on the target from a snapshot of
    /// it, and `source` is destroyed once the copy booted (untouched if the copy fails).
    ///
    /// # Errors
    /// [`CommandError`]: not found, the source's refusal (every guard of the migration), no
    /// host fits (`NoHostFits`), or the pipeline's.
    pub async fn migrate(
        &self,
        caller: &Caller,
        key: &str,
        source: VmId,
        options: &MigrateOptions,
    ) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?.clone();
        let stored = self.tenants_vm(&tenant, source).await?;
        migratable(&stored, options.live, options.lazy).map_err(CommandError::Refused)?;
        let (Some(terms), Some(source_host)) = (&stored.terms, stored.host()) else {
            return Err(CommandError::Refused(invalid(&stored, "migrate")));
        };
        let to = VmId(minted_id("vm-migration", &tenant, key));
        let asked = MigrateAsk {
            source,
            target: options.target.as_ref(),
            live: options.live,
            lazy: options.lazy,
        };
        let hash = caller_hash("vm", &source.stream_id(), &asked);
        let copy = Replica {
            vm: to,
            task: terms.task.clone(),
            credentials: CredentialRef(minted_id("vm-migration-credentials", &tenant, key)),
            operation: OperationId(minted_id("vm-migration-boot", &tenant, key)),
            origin: VmOrigin::Migration { source, live: options.live, lazy: options.lazy },
        };
        let mut placing = self.copy_placing(&tenant, &copy, terms.credentials).await?;
        let fleet = self.fresh_hosts().await?;
        let source_backend = backend_of(&fleet, source_host);
        let mut excluded = BTreeSet::new();
        if let (None, Placing::Fleet(hosts)) = (&options.target, &mut placing) {
            // Placement's choice: another host, of the source's backend.
            excluded.insert(source_host.clone());
            hosts.retain(|host| fleet_backend(host) == Some(source_backend));
        }
        let spec = terms.spec.clone();
        let pin = options.target.clone();
        let ask = Ask { demand: spec.demand(), pin, excluded, vm: to };
        let (outcome, replacements) = self
            .place_copy(placing, &ask, |placement| {
                let request = MigrateRequest {
                    to,
                    target: placement.host.clone(),
                    live: options.live,
                    lazy: options.lazy,
                    source_backend,
                    target_backend: backend_of(&fleet, &placement.host),
                };
                let command = VmCommand::Migrate { request: Box::new(request) };
                let request = self.request(caller, tenant.clone(), source, key, command)?;
                let spec = copy_spec(&spec, &placement.host);
                Ok((request.hashed_as(hash), self.copy_links(&copy, &spec, placement)))
            })
            .await?;
        Ok(VmOutcome { vm: to, outcome, replacements })
    }

    /// `vm` as stored, if `tenant` owns it (another tenant's VM is not found).
    async fn tenants_vm(&self, tenant: &TenantId, vm: VmId) -> Result<Vm> {
        let (owner, stored) = self.owned(vm).await?;
        if &owner != tenant {
            return Err(CommandError::NotFound);
        }
        Ok(stored)
    }

    /// Where a copy is placed from: its own placement if it exists already (a retry answers
    /// its first outcome whatever the fleet is now), else the fleet, once the copy's
    /// credentials are sealed (new ones, with the source's secrets).
    async fn copy_placing(
        &self,
        tenant: &TenantId,
        copy: &Replica,
        source_credentials: CredentialRef,
    ) -> Result<Placing> {
        if let Some((_, _, existing)) = self.pipeline.state::<Vm>(&copy.vm.stream_id()).await?
            && let Some(placement) = existing.placement
        {
            return Ok(Placing::Placed(placement));
        }
        let secrets = match self.vault.open(source_credentials, tenant).await? {
            Some(credentials) => credentials.secrets,
            None => BTreeMap::new(),
        };
        self.vault.keep(copy.credentials, tenant, &secrets).await?;
        Ok(Placing::Fleet(self.fresh_hosts().await?))
    }

    /// Runs what `run` makes of the copy's placement: placed again over the fleet, or as first
    /// placed.
    async fn place_copy<F>(
        &self,
        placing: Placing,
        ask: &Ask,
        run: F,
    ) -> Result<(crate::CommandOutcome, u32)>
    where
        F: Fn(Placement) -> Result<(crate::CommandRequest<Vm>, Vec<Box<dyn Link<S>>>)>,
    {
        match placing {
            Placing::Fleet(hosts) => self.place_and_run(hosts, ask, run).await,
            Placing::Placed(placement) => {
                let (request, links) = run(placement)?;
                Ok((Box::pin(self.pipeline.execute_linked(request, &links)).await?, 0))
            }
        }
    }

    /// The copy's creation on `placement` and its host's Reserve, as links of the source's
    /// command.
    fn copy_links(
        &self,
        copy: &Replica,
        spec: &VmSpec,
        placement: Placement,
    ) -> Vec<Box<dyn Link<S>>> {
        let reserve = HostCommand::Reserve { vm: copy.vm, demand: spec.demand() };
        let host = host_link(&placement.host, reserve);
        let create = VmCommand::Create {
            vm: copy.vm,
            task: copy.task.clone(),
            spec: Box::new(spec.clone()),
            credentials: copy.credentials,
            placement,
            operation: copy.operation,
            origin: Some(copy.origin),
        };
        let create = LinkedCommand::<Vm>::new(copy.vm.stream_id(), create, self.facts);
        vec![Box::new(create), Box::new(host)]
    }
}

/// The links a report on a copy's boot carries to its migration's source: finished by a boot,
/// abandoned by a failure. A fork's boot touches its source not at all.
pub(super) fn to_source<T>(
    copy: VmId,
    stored: &Vm,
    owner: &TenantId,
    booted: bool,
) -> Vec<Box<dyn Link<T>>>
where
    T: CommandStore + Send + Sync,
{
    let Some(VmOrigin::Migration { source, .. }) = stored.origin else { return Vec::new() };
    let command = if booted {
        let operation = OperationId(minted_id("vm-migration-destroy", owner, &copy.0.to_string()));
        VmCommand::FinishMigration { to: copy, operation }
    } else {
        VmCommand::AbandonMigration { to: copy }
    };
    vec![Box::new(LinkedCommand::<Vm>::new(source.stream_id(), command, Default::default()))]
}

/// Where a copy goes.
enum Placing {
    /// Placed over these hosts.
    Fleet(Vec<Host>),
    /// Where it was placed already.
    Placed(Placement),
}

/// What a copy is made of, minted from the tenant and the caller's key.
struct Replica {
    vm: VmId,
    task: TaskId,
    credentials: CredentialRef,
    operation: OperationId,
    origin: VmOrigin,
}

/// A VM without terms or host (never created) refuses as its state says.
fn invalid(vm: &Vm, command: &'static str) -> VmError {
    VmError::InvalidState { status: vm.status.name(), command }
}

fn fleet_backend(host: &Host) -> Option<HostBackend> {
    host.spec.as_ref().map(|spec| spec.backend)
}

/// The backend of `host` among `hosts` (firecracker, fuse's default, if not listed).
fn backend_of(hosts: &[Host], host: &HostId) -> HostBackend {
    hosts
        .iter()
        .find(|known| known.id.as_ref() == Some(host))
        .and_then(fleet_backend)
        .unwrap_or(HostBackend::Firecracker)
}
