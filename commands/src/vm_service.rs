//! The VM's application service: a tenant creates, drains, destroys and completes its VMs; a
//! host's agent reports on the VMs of its own host; the fleet's reconcilers strike and
//! recover them.
//!
//! Create places the VM (`host::placement`, over the hosts its [`HostCatalog`] lists) and runs
//! the VM's creation with a link, the chosen host's Reserve, owned by the fleet: both streams
//! are appended at once with an expected version on each, so concurrent creates can never
//! take more than a host has. A lost race on the host's version is decided again by the
//! pipeline, on the host as stored; a host whose own Reserve refuses (placement read it stale)
//! is read again and placement runs again, at most [`PLACEMENT_TRIES_MAX`] times. A boot
//! failure and a confirmed removal give the room back the same way (the host's Release).
//!
//! A VM's credentials (the auth token minted for it, its tenant's secrets) go to a
//! [`CredentialVault`] before the VM is created; its events carry only their reference. A
//! failed boot's report is redacted of every one of those values before it is recorded.
//!
//! Ids a retry must see again are minted from the tenant and the task or operation key: the
//! VM (one per task), its credentials' reference, its boot and destroy operations. A retry of
//! a create hashes the caller's request (task and spec), not the placement it was decided
//! with, so it answers the first outcome even if the fleet has moved since.

use std::collections::BTreeSet;
use std::future::Future;

use leasehold_domain::host::placement::{PlacementRequest, place};
use leasehold_domain::host::{Host, HostCommand};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{HostId, TaskId, VmId, fleet_tenant};
use leasehold_domain::vm::{
    BootFailure, CredentialRef, Found, PlacementPolicy, StrikeReason, Vm, VmCommand, VmError,
    VmFacts, VmSpec, VmUrl,
};
use leasehold_domain::{RefusalKind, StoreError, TenantId};
use serde::Serialize;
use uuid::Uuid;

mod moves;
mod picture;

use picture::{FleetPicture, View};

pub use moves::MigrateOptions;

use crate::lease_service::{Caller, minted_id};
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand, caller_hash,
};

type Result<T> = std::result::Result<T, CommandError<VmError>>;

/// How many times one create is placed before it gives up on hosts that keep refusing.
pub const PLACEMENT_TRIES_MAX: u32 = 5;

/// Where placement reads the fleet's hosts from: a read model kept by a projection in
/// production (it may lag: the host's Reserve decides on its stored state), or the hosts'
/// own streams.
pub trait HostCatalog: Send + Sync {
    /// Every host of the fleet, as last known.
    fn hosts(&self) -> impl Future<Output = std::result::Result<Vec<Host>, StoreError>> + Send;

    /// The copies of `tenant`'s artifact `seed` on the fleet's hosts: the seed itself and its
    /// tenant's other ready snapshots of the same digest (the artifact index). None known by
    /// default.
    fn seed_copies(
        &self,
        _tenant: &TenantId,
        _seed: &leasehold_domain::vm::SnapshotRef,
    ) -> impl Future<Output = std::result::Result<Vec<SeedCopy>, StoreError>> + Send {
        async { Ok(Vec::new()) }
    }

    /// The hosts already holding the bytes of `tenant`'s artifact `seed` (placement's
    /// locality tie-break).
    fn artifact_hosts(
        &self,
        tenant: &TenantId,
        seed: &leasehold_domain::vm::SnapshotRef,
    ) -> impl Future<Output = std::result::Result<BTreeSet<HostId>, StoreError>> + Send {
        let copies = self.seed_copies(tenant, seed);
        async move { Ok(copies.await?.into_iter().map(|copy| copy.host).collect()) }
    }
}

/// One host's copy of a seed artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedCopy {
    /// The host holding it.
    pub host: HostId,
    /// Its reference in that host's store.
    pub store_ref: leasehold_domain::vm::SnapshotRef,
    /// Its sha256 (what a pull asks for and checks), when the agent hashed it.
    pub digest: Option<leasehold_domain::snapshot::Digest>,
    /// Whether another host can boot from it once pulled: written as a disk snapshot (a live
    /// one's pull carries its disk half only, which does not boot on its own).
    pub movable: bool,
    /// Whether it is the seed itself (else another of the tenant's artifacts with its digest).
    pub is_seed: bool,
}

impl SeedCopy {
    /// The digest a pull of it asks for, when it can move.
    pub fn pullable(&self) -> Option<&leasehold_domain::snapshot::Digest> {
        self.digest.as_ref().filter(|_| self.movable)
    }

    /// Whether a VM seeded from it boots from this copy on its own host: the seed itself, or
    /// a disk artifact of the same bytes (its digest: content addressing, as a pull is).
    pub fn bootable_here(&self) -> bool {
        self.is_seed || self.pullable().is_some()
    }
}

/// A VM's credentials, as the vault gives them back. Its `Debug` shows none of them.
#[derive(Clone, PartialEq, Eq)]
pub struct VmCredentials {
    /// The token callers present to reach the VM (minted for it).
    pub auth_token: String,
    /// Its tenant's secrets, by name.
    pub secrets: std::collections::BTreeMap<String, String>,
}

impl std::fmt::Debug for VmCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmCredentials")
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

impl VmCredentials {
    /// `text` with every credential value in it replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        let mut values: Vec<&str> = self.secrets.values().map(String::as_str).collect();
        values.push(&self.auth_token);
        // Longer values first, so that a value containing another is redacted whole.
        values.sort_by_key(|value| std::cmp::Reverse(value.len()));
        values
            .into_iter()
            .filter(|value| !value.is_empty())
            .fold(text.to_owned(), |text, value| text.replace(value, "[redacted]"))
    }
}

/// Where VMs' credentials are kept: sealed, apart from the log (`adapters::vault`).
pub trait CredentialVault: Send + Sync {
    /// Keeps the credentials of `reference` (minting the VM's auth token), replacing what a
    /// refused create under the same key kept; never called once the VM exists, so a retry of
    /// a create that succeeded keeps its first token and secrets.
    fn keep(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
        secrets: &std::collections::BTreeMap<String, String>,
    ) -> impl Future<Output = std::result::Result<(), StoreError>> + Send;

    /// The hosts whose agents Leasehold calls (a token was registered for them); the others
    /// take their work by subscription.
    fn called_hosts(
        &self,
    ) -> impl Future<Output = std::result::Result<BTreeSet<HostId>, StoreError>> + Send;

    /// As [`CredentialVault::keep`], unless the stream `vm` exists (the VM was created): then
    /// nothing is kept, and the answer is false. One look for a create, which otherwise reads
    /// the VM's stream first.
    fn keep_new(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
        secrets: &std::collections::BTreeMap<String, String>,
        vm: &leasehold_domain::StreamId,
    ) -> impl Future<Output = std::result::Result<bool, StoreError>> + Send;

    /// The credentials of `reference`, if its tenant kept any.
    fn open(
        &self,
        reference: CredentialRef,
        tenant: &TenantId,
    ) -> impl Future<Output = std::result::Result<Option<VmCredentials>, StoreError>> + Send;
}

/// What one VM's placement asks for.
struct Ask {
    demand: leasehold_domain::values::fleet::Demand,
    pin: Option<HostId>,
    /// Hosts it may not go on (a migration's source host).
    excluded: BTreeSet<HostId>,
    /// Hosts already holding its seed's bytes (equal hosts are broken in their favour).
    artifact_hosts: BTreeSet<HostId>,
    vm: VmId,
}

/// A VM command's result, with the VM it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmOutcome {
    /// The VM.
    pub vm: VmId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
    /// Placements decided again because a host refused (creates only).
    pub replacements: u32,
}

/// Runs VM commands.
#[derive(Debug, Clone)]
pub struct VmService<S, C, V> {
    pipeline: CommandPipeline<S>,
    catalog: C,
    vault: V,
    policy: PlacementPolicy,
    facts: VmFacts,
    reserving: Reserving,
    fleet: FleetPicture,
}

/// The hosts this process's creates are reserving room on right now (shared by the clones of
/// one service), with how many each.
#[derive(Debug, Clone, Default)]
struct Reserving(std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<HostId, u32>>>);

impl Reserving {
    fn hosts(&self) -> BTreeSet<HostId> {
        let held = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        held.keys().cloned().collect()
    }

    /// Marks `host` taken by one more create until the answer is dropped.
    fn hold(&self, host: &HostId) -> ReservingHold {
        let mut held = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *held.entry(host.clone()).or_default() += 1;
        ReservingHold { reserving: self.clone(), host: host.clone() }
    }
}

/// One create's mark on a host, removed when it is dropped (the create answered or failed).
struct ReservingHold {
    reserving: Reserving,
    host: HostId,
}

impl Drop for ReservingHold {
    fn drop(&mut self) {
        let mut held = self.reserving.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.host) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.host);
            }
        }
    }
}

/// What a create's retry must repeat to be one.
#[derive(Serialize)]
struct CreateRequest<'a> {
    task: &'a TaskId,
    spec: &'a VmSpec,
}

impl<S, C, V> VmService<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    C: HostCatalog,
    V: CredentialVault,
{
    /// A service placing VMs by `policy` over the hosts of `catalog`, keeping their
    /// credentials in `vault`.
    pub fn new(
        pipeline: CommandPipeline<S>,
        (catalog, vault): (C, V),
        policy: PlacementPolicy,
    ) -> Self {
        Self {
            pipeline,
            catalog,
            vault,
            policy,
            facts: VmFacts::default(),
            reserving: Reserving::default(),
            fleet: FleetPicture::default(),
        }
    }

    /// The same service reading its catalog at most once per `max_age` (none by default): a
    /// create places over the catalog's last answer with this process's own appends over it,
    /// and a create no host fits is placed again over a fresh read before it is refused. A
    /// host another process filled meanwhile refuses its Reserve, and the create is placed
    /// again; correctness never rests on the picture.
    #[must_use]
    pub fn with_catalog_max_age(mut self, max_age: std::time::Duration) -> Self {
        self.fleet.max_age = max_age;
        self
    }

    /// The same service with the fleet's configuration `facts`.
    #[must_use]
    pub fn with_facts(mut self, facts: VmFacts) -> Self {
        self.facts = facts;
        self
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// Where placement reads the fleet's hosts from.
    pub fn catalog(&self) -> &C {
        &self.catalog
    }

    /// A tenant creates a VM for `task`, placed on a host of the fleet, with `secrets` kept
    /// in the vault. The secrets are not part of the request's identity: a retry of a create
    /// that succeeded answers the first outcome and keeps the first secrets (they are never
    /// hashed into the ledger, where a short one could be guessed back).
    ///
    /// # Errors
    /// [`CommandError`]: no host fits (`NoHostFits`, naming the gate), the VM's refusal, a
    /// host's, or the pipeline's.
    pub async fn create(
        &self,
        caller: &Caller,
        key: &str,
        (task, spec): (&TaskId, VmSpec),
        secrets: &std::collections::BTreeMap<String, String>,
    ) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?;
        let vm = vm_of(tenant, task);
        let hash = caller_hash("vm", &vm.stream_id(), &CreateRequest { task, spec: &spec });
        // One reference per VM (not per key): a key reused for another task can never reach
        // this VM's credentials.
        let credentials = credentials_of(tenant, vm);
        let operation = OperationId(minted_id("vm-boot", tenant, key));
        let make = |placement| VmCommand::Create {
            vm,
            task: task.clone(),
            spec: Box::new(spec.clone()),
            credentials,
            placement,
            operation,
            origin: None,
        };
        // No VM yet: its credentials are kept (again: a create refused before, retried with
        // other secrets, keeps the latest). A VM already made for the task keeps its own, and
        // answers with its own placement (a retry its first outcome, another key that the task
        // has its VM), whatever the fleet is now.
        if !self.vault.keep_new(credentials, tenant, secrets, &vm.stream_id()).await? {
            let found = self.pipeline.state::<Vm>(&vm.stream_id()).await?;
            let placement = found.and_then(|(_, _, existing)| existing.placement);
            let placement = placement.ok_or(CommandError::Refused(VmError::TaskAlreadyAssigned))?;
            let request = self.request(caller, tenant.clone(), vm, key, make(placement))?;
            let outcome = Box::pin(self.pipeline.execute(request.hashed_as(hash))).await?;
            return Ok(VmOutcome { vm, outcome, replacements: 0 });
        }
        let artifact_hosts = self.seed_holders(tenant, &spec).await?;
        let ask = Ask {
            demand: spec.demand(),
            pin: spec.pin.clone(),
            excluded: BTreeSet::new(),
            artifact_hosts,
            vm,
        };
        let (outcome, replacements) = self
            .place_over_fleet(&ask, |placement| {
                let host = placement.host.clone();
                let request = self.request(caller, tenant.clone(), vm, key, make(placement))?;
                let reserve = HostCommand::Reserve { vm, demand: ask.demand.clone() };
                let links: Vec<Box<dyn Link<S>>> = vec![Box::new(host_link(&host, reserve))];
                Ok((request.hashed_as(hash), links))
            })
            .await?;
        Ok(VmOutcome { vm, outcome, replacements })
    }

    /// The hosts holding `spec`'s seed (placement's tie-break). A seed must be one of the
    /// tenant's ready snapshots, pinned or not (an artifact carries whatever its build baked
    /// in: another tenant's is never booted, nor is a name the index does not know sent on);
    /// unpinned, it must be movable too (hashed, written as disk): the chosen host's agent may
    /// have to pull it by its digest.
    async fn seed_holders(&self, tenant: &TenantId, spec: &VmSpec) -> Result<BTreeSet<HostId>> {
        use leasehold_domain::values::{FieldError, Problem};
        let Some(seed) = &spec.seed else { return Ok(BTreeSet::new()) };
        let copies = self.catalog.seed_copies(tenant, seed).await?;
        let refused = |field, expected| {
            let problem = Problem::BadFormat { expected };
            Err(CommandError::Refused(VmError::BadSpec(FieldError::new(field, problem))))
        };
        if copies.is_empty() {
            return refused("seedSnapshotId", "one of your ready snapshots");
        }
        if spec.pin.is_none() && copies.iter().all(|copy| copy.pullable().is_none()) {
            return refused("hostId", "set: the seed cannot move (no digest, or a live snapshot)");
        }
        Ok(copies.into_iter().map(|copy| copy.host).collect())
    }

    /// The fleet's hosts as placement sees them: the catalog, with what this process appended
    /// last (fresher than the catalog, which lags the log) over it.
    async fn fresh_hosts(&self) -> Result<Vec<View>> {
        Ok(self.fleet_hosts(true).await?.0)
    }

    /// As [`Self::fresh_hosts`], over the catalog's kept answer unless `fresh` or it is older
    /// than the max age; whether it was the kept one.
    async fn fleet_hosts(&self, fresh: bool) -> Result<(Vec<View>, bool)> {
        let cache = &self.pipeline.cache;
        if !fresh && let Some(hosts) = self.fleet.over_kept(cache) {
            return Ok((hosts, true));
        }
        let read = self.catalog.hosts().await?;
        Ok((self.fleet.over_read(&read, cache), false))
    }

    /// Places over the fleet as [`Self::place_and_run`] does, over the kept picture first and
    /// over a fresh read before a refusal for want of a host.
    async fn place_over_fleet<F>(&self, ask: &Ask, run: F) -> Result<(CommandOutcome, u32)>
    where
        F: Fn(
            leasehold_domain::vm::Placement,
        ) -> Result<(CommandRequest<Vm>, Vec<Box<dyn Link<S>>>)>,
    {
        let (hosts, kept) = self.fleet_hosts(false).await?;
        match self.place_and_run(hosts, ask, &run).await {
            Err(CommandError::Refused(VmError::NoHostFits { .. })) if kept => {
                let (hosts, _) = self.fleet_hosts(true).await?;
                self.place_and_run(hosts, ask, &run).await
            }
            placed => placed,
        }
    }

    /// Places `ask` over `hosts` and runs what `run` makes of the placement (a VM's creation
    /// linked to its host's Reserve, or a copy's), placing again on a host that refused its
    /// Reserve (placement read it stale) or kept losing races, at most
    /// [`PLACEMENT_TRIES_MAX`] times. Answers the outcome and the placements decided again.
    async fn place_and_run<F>(
        &self,
        mut hosts: Vec<View>,
        ask: &Ask,
        run: F,
    ) -> Result<(CommandOutcome, u32)>
    where
        F: Fn(
            leasehold_domain::vm::Placement,
        ) -> Result<(CommandRequest<Vm>, Vec<Box<dyn Link<S>>>)>,
    {
        let artifact_hosts = &ask.artifact_hosts;
        let policy = self.policy;
        fn placing<'a>(
            (ask, policy, artifact_hosts): (&'a Ask, PlacementPolicy, &'a BTreeSet<HostId>),
            retries: u32,
            excluded: &'a BTreeSet<HostId>,
        ) -> PlacementRequest<'a> {
            PlacementRequest {
                demand: &ask.demand,
                pin: ask.pin.as_ref(),
                policy,
                artifact_hosts,
                excluded,
                retries,
                tie_break: tie_break(ask.vm),
            }
        }
        let given = (ask, policy, artifact_hosts);
        for retries in 0..PLACEMENT_TRIES_MAX {
            // Spread keeps off a host another create of this process is reserving on right
            // now, while any other host fits: two creates placed on one picture of the fleet
            // would otherwise pick the same roomiest host, and one of them lose the race.
            // (Pack wants the fullest host whatever: its creates contend by design.)
            let busy: BTreeSet<HostId> = match self.policy {
                PlacementPolicy::Spread => {
                    ask.excluded.union(&self.reserving.hosts()).cloned().collect()
                }
                PlacementPolicy::Pack => BTreeSet::new(),
            };
            let placement = match place(&hosts, &placing(given, retries, &busy)) {
                Ok(placement) => Ok(placement),
                Err(_) => place(&hosts, &placing(given, retries, &ask.excluded)),
            }
            .map_err(|gate| CommandError::Refused(VmError::NoHostFits { gate }))?;
            let host = placement.host.clone();
            let _hold = self.reserving.hold(&host);
            let (request, links) = run(placement)?;
            // Boxed: a linked execution's future is large, and a create's nests it in a
            // resolver's on a runtime worker's stack.
            match Box::pin(self.pipeline.execute_linked(request, &links)).await {
                Ok(outcome) => return Ok((outcome, retries)),
                // Placement read the host stale (its Reserve refused), or kept losing races on
                // it: read it as stored and place again.
                Err(CommandError::LinkedRefused {
                    kind: RefusalKind::InvalidState,
                    stream,
                    ..
                }) if stream == host.stream_id() => {
                    refresh(&self.pipeline, &mut hosts, &host).await?;
                }
                Err(CommandError::RetriesExhausted { .. }) => {
                    refresh(&self.pipeline, &mut hosts, &host).await?;
                }
                Err(error) => return Err(error),
            }
        }
        let gate = place(&hosts, &placing(given, PLACEMENT_TRIES_MAX, &ask.excluded))
            .err()
            .unwrap_or(leasehold_domain::host::Gate::HostActive);
        Err(CommandError::Refused(VmError::NoHostFits { gate }))
    }

    /// A tenant drains its VM.
    ///
    /// # Errors
    /// [`CommandError`]: the VM's refusal, or the pipeline's.
    pub async fn drain(&self, caller: &Caller, key: &str, vm: VmId) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?.clone();
        self.run(caller, tenant, vm, key, VmCommand::Drain, Vec::new()).await
    }

    /// A tenant destroys its VM. Its host's room stays held until the agent confirms.
    ///
    /// # Errors
    /// [`CommandError`]: the VM's refusal, or the pipeline's.
    pub async fn destroy(&self, caller: &Caller, key: &str, vm: VmId) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?.clone();
        let operation = OperationId(minted_id("vm-destroy", &tenant, key));
        let command = VmCommand::Destroy { operation };
        self.run(caller, tenant, vm, key, command, Vec::new()).await
    }

    /// A tenant's task is done: its VM is destroyed.
    ///
    /// # Errors
    /// [`CommandError`]: the VM's refusal, or the pipeline's.
    pub async fn complete_task(&self, caller: &Caller, key: &str, vm: VmId) -> Result<VmOutcome> {
        let tenant = own_tenant(caller)?.clone();
        let operation = OperationId(minted_id("vm-destroy", &tenant, key));
        let command = VmCommand::CompleteTask { operation };
        self.run(caller, tenant, vm, key, command, Vec::new()).await
    }

    /// A host's agent reports its boot of `vm` done.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a VM not on `host`; otherwise as the pipeline.
    pub async fn report_booted(
        &self,
        caller: &Caller,
        host: &HostId,
        key: &str,
        vm: VmId,
        (operation, url): (OperationId, VmUrl),
    ) -> Result<VmOutcome> {
        let (owner, stored) = self.on_host(host, vm).await?;
        let command = VmCommand::ReportBooted { operation, url };
        let links = moves::to_source(vm, &stored, &owner, true);
        self.run(caller, owner, vm, key, command, links).await
    }

    /// A host's agent reports its boot of `vm` failed: the VM's room is given back.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a VM not on `host`; otherwise as the pipeline.
    pub async fn report_boot_failed(
        &self,
        caller: &Caller,
        host: &HostId,
        key: &str,
        vm: VmId,
        (operation, failure): (OperationId, BootFailure),
    ) -> Result<VmOutcome> {
        let (owner, stored) = self.on_host(host, vm).await?;
        let failure = self.redacted(&owner, vm, failure).await?;
        let command = VmCommand::ReportBootFailed { operation, failure };
        let mut links = release_on(host, vm);
        links.extend(moves::to_source(vm, &stored, &owner, false));
        self.run(caller, owner, vm, key, command, links).await
    }

    /// A host's agent confirms `vm` gone after its destroy: its room is given back.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a VM not on `host`; otherwise as the pipeline.
    pub async fn confirm_removed(
        &self,
        caller: &Caller,
        host: &HostId,
        key: &str,
        (vm, operation): (VmId, OperationId),
    ) -> Result<VmOutcome> {
        let (owner, _) = self.on_host(host, vm).await?;
        let command = VmCommand::ConfirmRemoved { operation };
        self.run(caller, owner, vm, key, command, release_on(host, vm)).await
    }

    /// A recovery lookup at `vm`'s host found it running, or missing.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a VM not on `host`; otherwise as the pipeline.
    pub async fn recover(
        &self,
        caller: &Caller,
        host: &HostId,
        key: &str,
        vm: VmId,
        (operation, found): (OperationId, Found),
    ) -> Result<VmOutcome> {
        let (owner, stored) = self.on_host(host, vm).await?;
        // A copy found booted finishes its migration; one found gone abandons it.
        let links = moves::to_source(vm, &stored, &owner, matches!(found, Found::Running { .. }));
        let command = VmCommand::Recover { operation, found };
        self.run(caller, owner, vm, key, command, links).await
    }

    /// A host's agent reports `vm` used (an exec, an attach): the idle reaper counts from
    /// it. Recorded at most once a minute.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a VM not on `host`; otherwise as the pipeline.
    pub async fn record_activity(
        &self,
        caller: &Caller,
        host: &HostId,
        key: &str,
        vm: VmId,
    ) -> Result<VmOutcome> {
        let (owner, _) = self.on_host(host, vm).await?;
        self.run(caller, owner, vm, key, VmCommand::RecordActivity, Vec::new()).await
    }

    /// A reconciler's strike on `vm` (stuck or idle), or its clearing (`None`).
    ///
    /// # Errors
    /// [`CommandError`]: the VM's refusal, or the pipeline's.
    pub async fn strike(
        &self,
        caller: &Caller,
        key: &str,
        vm: VmId,
        reason: Option<StrikeReason>,
    ) -> Result<VmOutcome> {
        let (owner, _) = self.owned(vm).await?;
        let command = match reason {
            Some(reason) => VmCommand::Strike { reason },
            None => VmCommand::ClearStrikes,
        };
        self.run(caller, owner, vm, key, command, Vec::new()).await
    }

    /// The VM as stored now and its owner, for machine actors and operators.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such VM; a store failure.
    pub async fn owned(&self, vm: VmId) -> Result<(TenantId, Vm)> {
        let found = self.pipeline.state::<Vm>(&vm.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    /// `failure` with the VM's credential values redacted from its text.
    async fn redacted(
        &self,
        owner: &TenantId,
        vm: VmId,
        failure: BootFailure,
    ) -> Result<BootFailure> {
        let (_, stored) = self.owned(vm).await?;
        let Some(terms) = stored.terms else { return Ok(failure) };
        let Some(credentials) = self.vault.open(terms.credentials, owner).await? else {
            return Ok(failure);
        };
        let message = credentials.redact(failure.message.as_str());
        Ok(BootFailure {
            reason: failure.reason,
            message: leasehold_domain::values::TenantMessage::parse("message", message)?,
            detail: leasehold_domain::values::OperatorDetail::new(
                &credentials.redact(failure.detail.as_str()),
            ),
        })
    }

    /// The owner of `vm` and the VM as stored, if it is placed on `host` (an agent sees only
    /// its own host's VMs).
    async fn on_host(&self, host: &HostId, vm: VmId) -> Result<(TenantId, Vm)> {
        let (owner, stored) = self.owned(vm).await?;
        if stored.host() != Some(host) {
            return Err(CommandError::NotFound);
        }
        Ok((owner, stored))
    }

    fn request(
        &self,
        caller: &Caller,
        tenant: TenantId,
        vm: VmId,
        key: &str,
        command: VmCommand,
    ) -> Result<CommandRequest<Vm>> {
        let key = crate::lease_input::operation_key(Some(key))?;
        let stream = vm.stream_id();
        let mut request = CommandRequest::<Vm>::new(
            tenant,
            caller.actor.clone(),
            stream,
            key,
            command,
            self.facts,
        );
        if let Some(namespace) = &caller.namespace {
            request.namespace = namespace.clone();
        }
        request.correlation_id = Some(Uuid::now_v7());
        Ok(request)
    }

    async fn run(
        &self,
        caller: &Caller,
        tenant: TenantId,
        vm: VmId,
        key: &str,
        command: VmCommand,
        links: Vec<Box<dyn Link<S>>>,
    ) -> Result<VmOutcome> {
        let request = self.request(caller, tenant, vm, key, command)?;
        let outcome = Box::pin(self.pipeline.execute_linked(request, &links)).await?;
        Ok(VmOutcome { vm, outcome, replacements: 0 })
    }
}

impl<S, C, V> crate::snapshot_service::DetailRedactor for VmService<S, C, V>
where
    S: CommandStore + Clone + Send + Sync + std::fmt::Debug + 'static,
    C: HostCatalog + std::fmt::Debug,
    V: CredentialVault + std::fmt::Debug,
{
    fn redact<'a>(
        &'a self,
        tenant: &'a TenantId,
        vm: VmId,
        detail: &'a leasehold_domain::values::OperatorDetail,
    ) -> crate::snapshot_service::Redacted<'a> {
        Box::pin(async move {
            let found =
                self.pipeline.state::<Vm>(&vm.stream_id()).await.map_err(|error| match error {
                    CommandError::Store(error) => error,
                    other => StoreError::Database { reason: other.to_string() },
                })?;
            let Some(terms) = found.and_then(|(_, _, stored)| stored.terms) else {
                return Ok(detail.clone());
            };
            let Some(credentials) = self.vault.open(terms.credentials, tenant).await? else {
                return Ok(detail.clone());
            };
            Ok(leasehold_domain::values::OperatorDetail::new(&credentials.redact(detail.as_str())))
        })
    }
}

/// `command` on `host`'s stream, which the fleet owns.
fn host_link(host: &HostId, command: HostCommand) -> LinkedCommand<Host> {
    LinkedCommand::new(host.stream_id(), command, ()).owned_by(fleet_tenant())
}

fn release_on<S: CommandStore + Send + Sync>(host: &HostId, vm: VmId) -> Vec<Box<dyn Link<S>>> {
    vec![Box::new(host_link(host, HostCommand::Release { vm }))]
}

/// Replaces `host` in `hosts` with its stored state.
async fn refresh<S: CommandStore + Clone + Send + Sync + 'static>(
    pipeline: &CommandPipeline<S>,
    hosts: &mut Vec<View>,
    host: &HostId,
) -> std::result::Result<(), CommandError<VmError>> {
    let stored = pipeline.state::<Host>(&host.stream_id()).await.map_err(|error| match error {
        CommandError::Store(error) => CommandError::Store(error),
        _ => CommandError::NotFound,
    })?;
    hosts.retain(|known| known.id.as_ref() != Some(host));
    if let Some((_, _, stored)) = stored {
        hosts.push(std::sync::Arc::new(stored));
    }
    Ok(())
}

/// The VM's own order of equal hosts (its id's low bits).
fn tie_break(vm: VmId) -> u64 {
    let bytes = vm.0.as_bytes();
    u64::from_le_bytes(bytes[8..16].try_into().expect("eight bytes"))
}

/// The reference of `vm`'s credentials: one per VM.
fn credentials_of(tenant: &TenantId, vm: VmId) -> CredentialRef {
    CredentialRef(minted_id("vm-credentials", tenant, &vm.0.to_string()))
}

/// The VM a tenant's task runs on (one per task).
pub fn vm_of(tenant: &TenantId, task: &TaskId) -> VmId {
    VmId(minted_id("vm", tenant, task.as_str()))
}

fn own_tenant(caller: &Caller) -> Result<&TenantId> {
    caller.own_tenant()
}

/// A catalog that reads each listed host's own stream (exact, one read per host: for small
/// fleets and tests; production reads the hosts read model).
#[derive(Debug, Clone)]
pub struct StreamCatalog<S> {
    pipeline: CommandPipeline<S>,
    hosts: Vec<HostId>,
}

impl<S> StreamCatalog<S> {
    /// A catalog of `hosts`, read through `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>, hosts: Vec<HostId>) -> Self {
        Self { pipeline, hosts }
    }
}

impl<S: CommandStore + Clone + Send + Sync + 'static> HostCatalog for StreamCatalog<S> {
    async fn hosts(&self) -> std::result::Result<Vec<Host>, StoreError> {
        let mut found = Vec::with_capacity(self.hosts.len());
        for host in &self.hosts {
            match self.pipeline.state::<Host>(&host.stream_id()).await {
                Ok(Some((_, _, host))) => found.push(host),
                Ok(None) => {}
                Err(CommandError::Store(error)) => return Err(error),
                Err(error) => return Err(StoreError::Database { reason: error.to_string() }),
            }
        }
        Ok(found)
    }
}
