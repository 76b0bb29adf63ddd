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
    migratable, moves_memory_between_hosts,
};
use serde::Serialize;

use super::{
    Ask, CredentialVault, HostCatalog, Result, View, VmOutcome, VmService, host_link, own_tenant,
    vm_of,
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

/// A copy's spec: its source's (shape, pin and label selectors alike), without its seed: a
/// copy boots from the snapshot its host's agent takes of the source.
fn copy_spec(source: &VmSpec) -> VmSpec {
    let mut spec = source.clone();
    spec.seed = None;
    spec.resume_seed = false;
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
        let fork = vm_of(&tenant, task);
        let hash = caller_hash("vm", &source.stream_id(), &ForkRequest { source, task });
        let copy = Replica {
            vm: fork,
            task: task.clone(),
            credentials: super::credentials_of(&tenant, fork),
            operation: OperationId(minted_id("vm-fork-boot", &tenant, key)),
            origin: VmOrigin::Fork { source },
        };
        let run = |placement: Placement, spec: &VmSpec| {
            let request =
                self.request(caller, tenant.clone(), source, key, VmCommand::Fork { fork })?;
            Ok((request.hashed_as(hash), self.copy_links(&copy, spec, placement)))
        };
        // A fork made already (a retry, or the task's VM): as it was placed, whatever the source
        // is now, so that a retry answers its first outcome.
        if let Some((placement, spec)) = self.existing_copy(fork).await? {
            let (request, links) = run(placement, &spec)?;
            return self.run_placed(request, &links, fork).await;
        }
        copyable(&stored, "fork").map_err(CommandError::Refused)?;
        let (Some(terms), Some(host)) = (&stored.terms, stored.host()) else {
            return Err(CommandError::Refused(invalid(&stored, "fork")));
        };
        let spec = copy_spec(&terms.spec);
        self.seal_copy(&tenant, &copy, terms.credentials).await?;
        let ask = Ask {
            demand: spec.demand(),
            pin: Some(host.clone()),
            excluded: BTreeSet::new(),
            artifact_hosts: BTreeSet::new(),
            vm: fork,
        };
        let (outcome, replacements) =
            self.place_over_fleet(&ask, |placement| run(placement, &spec)).await?;
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
        let to = VmId(minted_id("vm-migration", &tenant, key));
        let asked = MigrateAsk {
            source,
            target: options.target.as_ref(),
            live: options.live,
            lazy: options.lazy,
        };
        let hash = caller_hash("vm", &source.stream_id(), &asked);
        let fleet = self.fresh_hosts().await?;
        let source_backend = stored.host().map(|host| backend_of(&fleet, host));
        let source_backend = source_backend.unwrap_or(HostBackend::Firecracker);
        let running_since = stored.running_since;
        // Every VM created has its terms: a stream without is not found.
        let Some(terms) = stored.terms.clone() else { return Err(CommandError::NotFound) };
        let copy = Replica {
            vm: to,
            task: terms.task.clone(),
            credentials: super::credentials_of(&tenant, to),
            operation: OperationId(minted_id("vm-migration-boot", &tenant, key)),
            origin: VmOrigin::Migration {
                source,
                live: options.live,
                lazy: options.lazy,
                running_since,
            },
        };
        let run = |placement: Placement, spec: &VmSpec| {
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
            Ok((request.hashed_as(hash), self.copy_links(&copy, spec, placement)))
        };
        // A migration started already (a retry): as it was placed, whatever the source is now.
        if let Some((placement, spec)) = self.existing_copy(to).await? {
            let (request, links) = run(placement, &spec)?;
            return self.run_placed(request, &links, to).await;
        }
        let Some(source_host) = stored.host() else {
            return Err(CommandError::Refused(invalid(&stored, "migrate")));
        };
        let called = self.vault.called_hosts().await?;
        let guards = Guards { source_host, source_backend, called: &called, fleet: &fleet };
        guards.check(&stored, options).map_err(CommandError::Refused)?;
        let spec = copy_spec(&terms.spec);
        self.seal_copy(&tenant, &copy, terms.credentials).await?;
        let ask = guards.ask(&spec, options, to);
        let hosts = guards.candidates(options);
        let (outcome, replacements) =
            self.place_and_run(hosts, &ask, |placement| run(placement, &spec)).await?;
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

    /// The copy `vm` as it was created, if it was: its placement and spec.
    async fn existing_copy(&self, vm: VmId) -> Result<Option<(Placement, VmSpec)>> {
        let Some((_, _, existing)) = self.pipeline.state::<Vm>(&vm.stream_id()).await? else {
            return Ok(None);
        };
        Ok(existing.placement.zip(existing.terms.map(|terms| terms.spec)))
    }

    /// Seals the copy's own credentials: a new auth token, the source's secrets.
    async fn seal_copy(
        &self,
        tenant: &TenantId,
        copy: &Replica,
        source_credentials: CredentialRef,
    ) -> Result<()> {
        let secrets = match self.vault.open(source_credentials, tenant).await? {
            Some(credentials) => credentials.secrets,
            None => BTreeMap::new(),
        };
        self.vault.keep(copy.credentials, tenant, &secrets).await?;
        Ok(())
    }

    /// Runs a copy's command as first placed (its ledger answers a retry).
    async fn run_placed(
        &self,
        request: crate::CommandRequest<Vm>,
        links: &[Box<dyn Link<S>>],
        copy: VmId,
    ) -> Result<VmOutcome> {
        let outcome = Box::pin(self.pipeline.execute_linked(request, links)).await?;
        Ok(VmOutcome { vm: copy, outcome, replacements: 0 })
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

/// What a migration's guards know before placement: the source's host and backend, the hosts
/// Leasehold calls, the fleet.
struct Guards<'a> {
    source_host: &'a HostId,
    source_backend: HostBackend,
    called: &'a BTreeSet<HostId>,
    fleet: &'a [View],
}

impl Guards<'_> {
    /// Every guard that can be decided before placement, in the domain's order, so that a
    /// migration that can never happen is told so rather than that no host has room: the
    /// source's own; with a target named, all of the target's; without, a live migration
    /// where the backend cannot move memory. Then the hosts' agents must be called, and a
    /// pinned VM stays on its pin.
    fn check(&self, source: &Vm, options: &MigrateOptions) -> std::result::Result<(), VmError> {
        migratable(source, options.live, options.lazy)?;
        if let Some(target) = &options.target {
            let request = MigrateRequest {
                to: VmId(uuid::Uuid::nil()),
                target: target.clone(),
                live: options.live,
                lazy: options.lazy,
                source_backend: self.source_backend,
                target_backend: backend_of(self.fleet, target),
            };
            leasehold_domain::vm::check_migration(source, &request)?;
        } else if options.live && !moves_memory_between_hosts(self.source_backend) {
            return Err(VmError::LiveUnsupported { backend: self.source_backend.name() });
        }
        for host in std::iter::once(self.source_host).chain(options.target.as_ref()) {
            if !self.called.contains(host) {
                return Err(VmError::HostNotCalled { host: host.clone() });
            }
        }
        let pin = source.terms.as_ref().and_then(|terms| terms.spec.pin.as_ref());
        if pin.is_some_and(|pin| options.target.as_ref() != Some(pin)) {
            return Err(VmError::PinMismatch);
        }
        Ok(())
    }

    /// Where placement looks: the target named, or another host of the source's backend.
    fn ask(&self, spec: &VmSpec, options: &MigrateOptions, to: VmId) -> Ask {
        let mut excluded = BTreeSet::new();
        if options.target.is_none() {
            excluded.insert(self.source_host.clone());
        }
        let artifact_hosts = BTreeSet::new();
        Ask { demand: spec.demand(), pin: options.target.clone(), excluded, artifact_hosts, vm: to }
    }

    /// The hosts placement may choose from: with no target, those of the source's backend whose
    /// agents Leasehold calls.
    fn candidates(&self, options: &MigrateOptions) -> Vec<View> {
        let usable = |host: &&View| {
            options.target.is_some()
                || (fleet_backend(host) == Some(self.source_backend)
                    && host.id.as_ref().is_some_and(|id| self.called.contains(id)))
        };
        self.fleet.iter().filter(usable).cloned().collect()
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
fn backend_of(hosts: &[View], host: &HostId) -> HostBackend {
    hosts
        .iter()
        .find(|known| known.id.as_ref() == Some(host))
        .and_then(|known| fleet_backend(known))
        .unwrap_or(HostBackend::Firecracker)
}
