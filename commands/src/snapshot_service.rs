//! The snapshot's application service: a tenant creates, restores, deletes and exports the
//! snapshots of its VMs; a host's agent reports on the snapshots of its own host
//! (`snapshot_service/reports.rs`); retention GC and the layer cache delete and use them.
//!
//! Every command runs with its quota consequence derived from its decision
//! ([`CommandPipeline::execute_following`] with [`quota_effect`]): a creation's reservation, a
//! confirmation's settlement, a release when the snapshot stops counting, all on the
//! tenant's quota stream in the same append as the snapshot's events, with an expected version
//! on both. Concurrent creates can never take more than the quota allows, and a quota effect
//! is derived again whenever the snapshot's command is decided again: it never comes from a
//! stale read of the snapshot.
//!
//! Facts are looked up before deciding: the VM (its owner, status, GPUs and host) and the
//! host's architecture from their streams, as stored now; what only the listing of a VM's
//! snapshots knows (its last live snapshot, its latest, a snapshot's children) from a
//! [`SnapshotListing`], a read model in production, which may lag the log by the projection's
//! delay: a diff asked for right after its parent was confirmed may be refused until the
//! listing shows the parent. What must not lag is linked instead: a diff's creation links its
//! adoption on the parent's stream (refused unless the parent, as stored, is a ready live
//! snapshot of the VM), and its confirmed deletion (or failed creation) links the release, so a
//! parent's deletion is decided on its own children.
//!
//! A create's snapshot id and operation are minted from the tenant and the operation key, and
//! its request hash covers what the caller asked (not the terms decided from it, whose
//! retention is computed from the time): a retry answers the first outcome.

use chrono::{DateTime, Utc};
use leasehold_domain::host::Host;
use leasehold_domain::quota::{QuotaCommand, QuotaError, QuotaLimits, SnapshotQuota};
use leasehold_domain::snapshot::{
    DeleteCause, ExportDestination, LayerKey, RequestedKind, Snapshot, SnapshotCommand,
    SnapshotError, SnapshotEvent, SnapshotFacts, SnapshotId, SnapshotMode, SnapshotName,
    SnapshotTerms, quota_effect,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::VmId;
use leasehold_domain::vm::{Vm, VmStatus};
use leasehold_domain::{StoreError, TenantId};
use serde::Serialize;
use std::future::Future;
use uuid::Uuid;

mod reports;

pub use reports::AgentReport;

use crate::lease_service::{Caller, minted_id};
use crate::quota::quota_of;
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand, caller_hash,
};

type Result<T> = std::result::Result<T, CommandError<SnapshotError>>;

/// What only the listing of a tenant's snapshots knows (the snapshot read model in
/// production; it may lag the log). The tenant is part of every question.
pub trait SnapshotListing: Send + Sync {
    /// `vm`'s last live snapshot (as its agent wrote it, ready or restoring).
    fn last_live(
        &self,
        tenant: &TenantId,
        vm: VmId,
    ) -> impl Future<Output = std::result::Result<Option<SnapshotId>, StoreError>> + Send;

    /// `vm`'s latest snapshot that is not deleted.
    fn latest_of(
        &self,
        tenant: &TenantId,
        vm: VmId,
    ) -> impl Future<Output = std::result::Result<Option<SnapshotId>, StoreError>> + Send;

    /// How many of `snapshot`'s children are not being deleted.
    fn live_children(
        &self,
        tenant: &TenantId,
        snapshot: SnapshotId,
    ) -> impl Future<Output = std::result::Result<usize, StoreError>> + Send;
}

/// Takes a VM's credentials out of an agent's failure text before it is recorded (the VM
/// service's vault holds them). Object-safe, so the snapshot service keeps one without
/// naming the VM service's types.
pub trait DetailRedactor: Send + Sync + std::fmt::Debug {
    /// `detail` with `vm`'s credential values (of `tenant`'s) replaced by `[redacted]`.
    fn redact<'a>(
        &'a self,
        tenant: &'a TenantId,
        vm: VmId,
        detail: &'a leasehold_domain::values::OperatorDetail,
    ) -> Redacted<'a>;
}

/// What a [`DetailRedactor`] answers: the redacted text, in time.
pub type Redacted<'a> = std::pin::Pin<
    Box<
        dyn Future<
                Output = std::result::Result<leasehold_domain::values::OperatorDetail, StoreError>,
            > + Send
            + 'a,
    >,
>;

/// The fleet's snapshot settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// The retention of a snapshot created without one (none: kept until deleted).
    pub default_retention: Option<chrono::Duration>,
    /// GC deletions failed in a row that make a dead letter (0: the default, 5).
    pub gc_dead_letter_after: u32,
}

/// What a tenant asks of a new snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CreateSnapshot {
    /// The VM to take it of.
    pub vm: VmId,
    /// What to capture.
    pub requested: RequestedKind,
    /// Who takes it and what for.
    pub mode: SnapshotMode,
    /// A diff's parent (default: the VM's last live snapshot).
    pub parent: Option<SnapshotId>,
    /// A build artifact's cache key.
    pub layer_key: Option<LayerKey>,
    /// The tenant's name for it.
    pub name: Option<SnapshotName>,
    /// When GC may delete it (default: the fleet's default retention from now).
    pub retention_until: Option<DateTime<Utc>>,
}

/// A snapshot command's result, with the snapshot it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotOutcome {
    /// The snapshot.
    pub snapshot: SnapshotId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// Runs snapshot commands.
#[derive(Debug, Clone)]
pub struct SnapshotService<S, L> {
    pipeline: CommandPipeline<S>,
    listing: L,
    pub(crate) config: SnapshotConfig,
    /// One lane per tenant's quota stream, shared by the service's clones (`lanes.rs`).
    lanes: std::sync::Arc<crate::lanes::Lanes<leasehold_domain::StreamId>>,
    /// Redacts agents' failure texts of the VM's credentials (none: recorded as given).
    pub(crate) redactor: Option<std::sync::Arc<dyn DetailRedactor>>,
}

/// Bytes in a GiB and a MiB.
const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

impl<S, L> SnapshotService<S, L>
where
    S: CommandStore + Clone + Send + Sync + 'static,
    L: SnapshotListing,
{
    /// A service over `pipeline`, reading listing facts from `listing`.
    pub fn new(pipeline: CommandPipeline<S>, listing: L, config: SnapshotConfig) -> Self {
        Self { pipeline, listing, config, lanes: std::sync::Arc::default(), redactor: None }
    }

    /// The same service redacting agents' failure texts with `redactor` (the VM service).
    #[must_use]
    pub fn with_redactor(mut self, redactor: std::sync::Arc<dyn DetailRedactor>) -> Self {
        self.redactor = Some(redactor);
        self
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// Where listing facts are read from.
    pub fn listing(&self) -> &L {
        &self.listing
    }

    /// A tenant asks for a snapshot of its running VM, reserving its estimate on its quota in
    /// the same append. The estimate is the VM's disk, and its memory for a live or diff
    /// snapshot; the agent's confirmation settles it to the honest size.
    ///
    /// # Errors
    /// [`CommandError`]: `NotFound` for a VM that is not the tenant's; the snapshot's
    /// refusal; `QUOTA_EXCEEDED` from the quota; the pipeline's.
    pub async fn create(
        &self,
        caller: &Caller,
        key: &str,
        ask: &CreateSnapshot,
    ) -> Result<SnapshotOutcome> {
        let tenant = own_tenant(caller)?;
        let snapshot = SnapshotId(minted_id("snapshot", tenant, key));
        let (vm, mut facts) = self.vm_facts(tenant, ask.vm).await?;
        // Only a diff's guard needs the listing (one query fewer for every other create).
        if ask.requested == RequestedKind::Diff {
            facts.last_live = self.listing.last_live(tenant, ask.vm).await?;
        }
        let host = vm.host().cloned().ok_or(CommandError::Refused(SnapshotError::VmNotRunning))?;
        let arch = self.arch_of(&host).await?;
        let parent = match ask.requested {
            RequestedKind::Diff => ask.parent.or(facts.last_live),
            RequestedKind::Disk | RequestedKind::Live => None,
        };
        let terms = SnapshotTerms {
            snapshot,
            vm: ask.vm,
            task: vm
                .terms
                .as_ref()
                .map(|terms| terms.task.clone())
                .ok_or(CommandError::NotFound)?,
            host,
            arch,
            mode: ask.mode,
            requested: ask.requested,
            parent,
            layer_key: ask.layer_key.clone(),
            name: ask.name.clone(),
            retention_until: self.retention(ask.retention_until)?,
            estimate_bytes: estimate(&vm, ask.requested),
        };
        let operation = OperationId(minted_id("snapshot-create", tenant, key));
        let command = SnapshotCommand::Create { terms: Box::new(terms), operation };
        let hash = caller_hash("snapshot", &snapshot.stream_id(), ask);
        let request = self.request(caller, tenant.clone(), snapshot, key, command, facts)?;
        // A diff is adopted by its parent in the same append: the parent, as stored, must be a
        // ready live snapshot of the VM, and is then kept while the diff lives.
        let adoption: Vec<Box<dyn Link<S>>> = parent
            .map(|parent| {
                let adopt = SnapshotCommand::AdoptChild { child: snapshot, vm: ask.vm };
                let facts = SnapshotFacts::default();
                Box::new(LinkedCommand::<Snapshot>::new(parent.stream_id(), adopt, facts))
                    as Box<dyn Link<S>>
            })
            .into_iter()
            .collect();
        self.run_linked(request.hashed_as(hash), snapshot, &adoption).await
    }

    /// A tenant restores its snapshot onto its VM (the snapshot's own).
    ///
    /// # Errors
    /// [`CommandError`]: `NotFound` for another tenant's snapshot or another VM; the
    /// snapshot's refusal; the pipeline's.
    pub async fn restore(
        &self,
        caller: &Caller,
        key: &str,
        (snapshot, vm): (SnapshotId, VmId),
    ) -> Result<SnapshotOutcome> {
        let tenant = own_tenant(caller)?;
        let operation = OperationId(minted_id("snapshot-restore", tenant, key));
        let (_, facts) = self.vm_facts(tenant, vm).await?;
        let command = SnapshotCommand::Restore { vm, operation };
        let request = self.request(caller, tenant.clone(), snapshot, key, command, facts)?;
        self.run(request, snapshot).await
    }

    /// A tenant deletes its snapshot: refused while a child is alive; a second delete
    /// succeeds with nothing recorded.
    ///
    /// # Errors
    /// [`CommandError`]: the snapshot's refusal, or the pipeline's.
    pub async fn delete(
        &self,
        caller: &Caller,
        key: &str,
        snapshot: SnapshotId,
    ) -> Result<SnapshotOutcome> {
        let tenant = own_tenant(caller)?.clone();
        self.delete_as(caller, key, (tenant, snapshot), DeleteCause::Tenant).await
    }

    /// A tenant asks for an export of its snapshot to `destination`.
    ///
    /// # Errors
    /// [`CommandError`]: the snapshot's refusal, or the pipeline's.
    pub async fn request_export(
        &self,
        caller: &Caller,
        key: &str,
        (snapshot, destination): (SnapshotId, ExportDestination),
    ) -> Result<SnapshotOutcome> {
        let tenant = own_tenant(caller)?.clone();
        let operation = OperationId(minted_id("snapshot-export", &tenant, key));
        let command = SnapshotCommand::RequestExport { destination, operation };
        let request =
            self.request(caller, tenant, snapshot, key, command, SnapshotFacts::default())?;
        self.run(request, snapshot).await
    }

    /// An operator sets `tenant`'s snapshot quota (an event on its quota stream; 0 disables a
    /// limit). Lowering a limit below the usage refuses no snapshot that exists: new creates
    /// are refused until usage falls under it.
    ///
    /// # Errors
    /// [`CommandError`]: the pipeline's.
    pub async fn set_limits(
        &self,
        caller: &Caller,
        key: &str,
        (tenant, limits): (&TenantId, QuotaLimits),
    ) -> std::result::Result<CommandOutcome, CommandError<QuotaError>> {
        let operation_key = crate::lease_input::operation_key(Some(key))?;
        let command = QuotaCommand::SetLimits { limits };
        let stream = quota_of(tenant).stream_id();
        let mut request = CommandRequest::<SnapshotQuota>::new(
            tenant.clone(),
            caller.actor.clone(),
            stream,
            operation_key,
            command,
            (),
        );
        if let Some(namespace) = &caller.namespace {
            request.namespace = namespace.clone();
        }
        self.pipeline.execute(request).await
    }

    /// `tenant`'s quota as stored now (none until its first snapshot or limits).
    ///
    /// # Errors
    /// A store failure.
    pub async fn quota(
        &self,
        tenant: &TenantId,
    ) -> std::result::Result<Option<SnapshotQuota>, CommandError<QuotaError>> {
        let found = self.pipeline.state::<SnapshotQuota>(&quota_of(tenant).stream_id()).await?;
        Ok(found.filter(|(owner, _, _)| owner == tenant).map(|(_, _, quota)| quota))
    }

    /// The snapshot as stored now and its owner, for machine actors and operators.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such snapshot; a store failure.
    pub async fn owned(&self, snapshot: SnapshotId) -> Result<(TenantId, Snapshot)> {
        let found = self.pipeline.state::<Snapshot>(&snapshot.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    /// Deletes `snapshot` of `owner`'s as `cause` (its tenant, GC or the layer cache), on
    /// the facts its guards need.
    async fn delete_as(
        &self,
        caller: &Caller,
        key: &str,
        (owner, snapshot): (TenantId, SnapshotId),
        cause: DeleteCause,
    ) -> Result<SnapshotOutcome> {
        let operation = OperationId(minted_id("snapshot-delete", &owner, key));
        let mut facts = SnapshotFacts {
            live_children: self.listing.live_children(&owner, snapshot).await?,
            gc_dead_letter_after: self.config.gc_dead_letter_after,
            ..SnapshotFacts::default()
        };
        let mut links: Vec<Box<dyn Link<S>>> = Vec::new();
        if cause == DeleteCause::Gc {
            let (_, stored) = self.owned(snapshot).await?;
            if let Some(terms) = &stored.terms {
                let latest = self.listing.latest_of(&owner, terms.vm).await?;
                facts.latest_of_vm = latest == Some(snapshot);
                // The latest is read from the projection, which lags: the deletion is linked
                // to the latest still standing in the log, so a latest deleted meanwhile
                // refuses it (and the VM keeps this one).
                if let Some(latest) = latest.filter(|latest| *latest != snapshot) {
                    let stand = SnapshotCommand::StandAsLatest { collected: snapshot };
                    let facts = SnapshotFacts::default();
                    let link = LinkedCommand::<Snapshot>::new(latest.stream_id(), stand, facts);
                    links.push(Box::new(link));
                }
            }
        }
        let command = SnapshotCommand::Delete { operation, cause };
        let request = self.request(caller, owner, snapshot, key, command, facts)?;
        self.run_linked(request, snapshot, &links).await
    }

    /// `vm` as stored, if it is `tenant`'s, and the facts a create or restore reads of it.
    async fn vm_facts(&self, tenant: &TenantId, vm: VmId) -> Result<(Vm, SnapshotFacts)> {
        let found =
            self.pipeline.state::<Vm>(&vm.stream_id()).await.map_err(CommandError::as_lookup)?;
        let Some((owner, _, stored)) = found else { return Err(CommandError::NotFound) };
        if &owner != tenant {
            return Err(CommandError::NotFound);
        }
        let facts = SnapshotFacts {
            vm_running: stored.status == VmStatus::Running,
            // A MIG slice is a GPU passthrough too, whatever whole GPUs it asks for.
            vm_gpus: stored
                .terms
                .as_ref()
                .map_or(0, |terms| terms.spec.gpus + u32::from(terms.spec.gpu_profile.is_some())),
            gc_dead_letter_after: self.config.gc_dead_letter_after,
            ..SnapshotFacts::default()
        };
        Ok((stored, facts))
    }

    /// The architecture `host` registered (the building host's, never the caller's); a host
    /// never registered is not found.
    async fn arch_of(
        &self,
        host: &leasehold_domain::values::fleet::HostId,
    ) -> Result<leasehold_domain::values::fleet::Arch> {
        let found = self
            .pipeline
            .state::<Host>(&host.stream_id())
            .await
            .map_err(CommandError::as_lookup)?;
        let spec = found.and_then(|(_, _, host)| host.spec);
        // A VM placed on a host that is not registered: nothing to take the snapshot.
        let spec = spec.ok_or(CommandError::NotFound)?;
        Ok(spec.capacity.arch)
    }

    /// The retention asked for, else the default from now; one in the past is refused.
    fn retention(&self, asked: Option<DateTime<Utc>>) -> Result<Option<DateTime<Utc>>> {
        let now = self.pipeline.clock().now();
        match asked {
            Some(until) if until <= now => {
                Err(CommandError::Invalid(leasehold_domain::values::FieldError::new(
                    "retentionUntil",
                    leasehold_domain::values::Problem::BadFormat {
                        expected: "a time in the future",
                    },
                )))
            }
            Some(until) => Ok(Some(leasehold_domain::to_micros(until))),
            None => Ok(self
                .config
                .default_retention
                .map(|keep| leasehold_domain::to_micros(now + keep))),
        }
    }

    pub(crate) fn request(
        &self,
        caller: &Caller,
        tenant: TenantId,
        snapshot: SnapshotId,
        key: &str,
        command: SnapshotCommand,
        facts: SnapshotFacts,
    ) -> Result<CommandRequest<Snapshot>> {
        let key = crate::lease_input::operation_key(Some(key))?;
        let stream = snapshot.stream_id();
        let mut request = CommandRequest::<Snapshot>::new(
            tenant,
            caller.actor.clone(),
            stream,
            key,
            command,
            facts,
        );
        if let Some(namespace) = &caller.namespace {
            request.namespace = namespace.clone();
        }
        request.correlation_id = Some(Uuid::now_v7());
        Ok(request)
    }

    /// Runs `request` with its consequences: on its tenant's quota stream, and on a diff's
    /// parent when the diff stops being alive.
    pub(crate) async fn run(
        &self,
        request: CommandRequest<Snapshot>,
        snapshot: SnapshotId,
    ) -> Result<SnapshotOutcome> {
        self.run_linked(request, snapshot, &[]).await
    }

    /// As [`Self::run`], with `links` given too.
    async fn run_linked(
        &self,
        request: CommandRequest<Snapshot>,
        snapshot: SnapshotId,
        links: &[Box<dyn Link<S>>],
    ) -> Result<SnapshotOutcome> {
        let quota = quota_of(&request.tenant).stream_id();
        let follows = quota_follows::<S>(&request.tenant);
        // This process's commands on one tenant's snapshots take turns on its quota stream,
        // rather than lose races to each other there.
        let _turn = self.lanes.enter(&quota).await;
        let outcome = Box::pin(self.pipeline.execute_following(request, links, &follows)).await?;
        Ok(SnapshotOutcome { snapshot, outcome })
    }
}

/// The consequences of a snapshot command of `tenant`'s: the quota command its decision
/// carries (`quota_effect`), linked on the tenant's quota stream, and a diff's release by its
/// parent once the diff is gone or failed.
pub fn quota_follows<S: CommandStore + Send + Sync + 'static>(
    tenant: &TenantId,
) -> impl Fn(&Snapshot, &[SnapshotEvent]) -> Vec<Box<dyn Link<S>>> + Send + Sync + use<S> {
    let quota = quota_of(tenant).stream_id();
    move |before, events| {
        let mut links: Vec<Box<dyn Link<S>>> = Vec::new();
        if let Some(effect) = quota_effect(before, events) {
            links.push(Box::new(LinkedCommand::<SnapshotQuota>::new(quota.clone(), effect, ())));
        }
        if let Some(release) = released_by_parent(before, events) {
            links.push(Box::new(release));
        }
        links
    }
}

/// The release a diff's parent records when `events` end the diff: its deletion confirmed
/// (not merely asked for: a deletion that fails leaves the diff alive), or its creation
/// failed (a diff never written depends on nothing).
fn released_by_parent(
    before: &Snapshot,
    events: &[SnapshotEvent],
) -> Option<LinkedCommand<Snapshot>> {
    let deleting = events.iter().any(|event| {
        matches!(
            event,
            SnapshotEvent::SnapshotDeleted { .. } | SnapshotEvent::SnapshotFailed { .. }
        )
    });
    let terms = before.terms.as_ref()?;
    let parent = terms.parent.filter(|_| deleting)?;
    let release = SnapshotCommand::ReleaseChild { child: terms.snapshot };
    Some(LinkedCommand::new(parent.stream_id(), release, SnapshotFacts::default()))
}

/// The bytes a create reserves before the agent reports the honest size: the VM's disk, and
/// its memory for a snapshot that captures it.
fn estimate(vm: &Vm, requested: RequestedKind) -> u64 {
    let Some(spec) = vm.terms.as_ref().map(|terms| &terms.spec) else { return 0 };
    let disk = spec.storage_gb.saturating_mul(GIB);
    match requested {
        RequestedKind::Disk => disk,
        RequestedKind::Live | RequestedKind::Diff => {
            disk.saturating_add(spec.ram_mb.saturating_mul(MIB))
        }
    }
}

fn own_tenant(caller: &Caller) -> Result<&TenantId> {
    caller.own_tenant()
}
