//! The runner lease's application service: a tenant requests runner leases, assigns their
//! jobs and releases them; the dispatcher launches them on a node and records what the
//! provider answered; a node agent reports their phases, heartbeats and teardowns; the expiry
//! reaper and the inventory reconciler reap and settle them; an operator forces a quarantine
//! exit and sets a tenant's runner capacity.
//!
//! Every lease command runs with the consequences its decision carries, each on its own
//! stream in the same append with an expected version on every stream
//! ([`runner_follows`]): an assignment reserves on the tenant's runner capacity
//! ([`capacity_effect`]) and claims its job ([`job_effect`]: one lease per job, another
//! lease's claim is `CONFLICT`); an end releases the capacity and finishes the job. So
//! concurrent assignments can never take more than the capacity allows.
//!
//! A launch and a holder's `online` or `busy` are decided on the node's **current** policy,
//! read from its stream as stored now ([`RunnerNode::policy`]). A node's registration is the
//! fleet's; every registration after the first bumps the epoch of each lease bound to it
//! (`node_reregistered`, by the inventory reconciler, which knows which leases those are).
//!
//! No runner registration (JIT config) passes through here: the dispatcher mints it at
//! launch and hands it to the provider only.

use std::sync::Arc;

use leasehold_domain::runner::{GuestOs, InstanceRef, ProviderKind};
use leasehold_domain::runner::{
    JobRef, NodePolicy, Outcome, Phase, QuarantineProof, RunnerCommand, RunnerError, RunnerEvent,
    RunnerFacts, RunnerLease, RunnerLeaseId, RunnerNodeName, RunnerResources, RunnerTerms,
    StartCommand, Teardown, Tier, TrustClass,
};
use leasehold_domain::runner_capacity::{
    RunnerCapacity, RunnerCapacityError, RunnerCapacityId, RunnerLimits, capacity_effect,
};
use leasehold_domain::runner_job::{RunnerJob, RunnerJobId, job_effect};
use leasehold_domain::runner_node::{
    Registration, RunnerNode, RunnerNodeCommand, RunnerNodeError, RunnerNodeId,
};
use leasehold_domain::values::fleet::fleet_tenant;
use leasehold_domain::values::{OperatorDetail, Reason};
use leasehold_domain::{StreamId, TenantId};
use serde::Serialize;

use crate::lanes::Lanes;
use crate::lease_service::{Caller, minted_id};
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand, caller_hash,
};

type Result<T> = std::result::Result<T, CommandError<RunnerError>>;

/// `tenant`'s runner capacity.
pub fn capacity_of(tenant: &TenantId) -> RunnerCapacityId {
    RunnerCapacityId(minted_id("runner-capacity", tenant, ""))
}

/// `tenant`'s job `job` (another tenant's job of the same request is another job).
pub fn job_of(tenant: &TenantId, job: JobRef) -> RunnerJobId {
    RunnerJobId(minted_id("runner-job", tenant, &job.request.to_string()))
}

/// The runner node named `node` (the fleet's).
pub fn node_of(node: &RunnerNodeName) -> RunnerNodeId {
    RunnerNodeId(minted_id("runner-node", &fleet_tenant(), node.as_str()))
}

/// What a tenant asks of a new runner lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RequestRunner {
    /// The tier it runs under.
    pub tier: Tier,
    /// Whose code its job runs.
    pub trust: TrustClass,
    /// The guest OS it needs.
    pub guest_os: GuestOs,
    /// What it is charged.
    pub resources: RunnerResources,
    /// The provider kinds it may be launched by.
    pub providers: Vec<ProviderKind>,
    /// What starts the runner inside the instance.
    pub command: StartCommand,
    /// How long it lives without a report of its holder, in seconds.
    pub ttl_seconds: u32,
}

/// A runner lease command's result, with the lease it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerOutcome {
    /// The lease.
    pub lease: RunnerLeaseId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// Runs runner lease, runner node and runner capacity commands.
#[derive(Debug, Clone)]
pub struct RunnerService<S> {
    pipeline: CommandPipeline<S>,
    /// One lane per tenant's capacity stream: this process's assignments of one tenant take
    /// turns there instead of losing races to each other (`lanes.rs`).
    lanes: Arc<Lanes<StreamId>>,
}

impl<S> RunnerService<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// A service over `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>) -> Self {
        Self { pipeline, lanes: Arc::default() }
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// A tenant requests a runner lease (its id minted from the tenant and the key).
    ///
    /// # Errors
    /// [`CommandError`]: `Invalid` naming the field (no provider, a time to live out of
    /// range); the pipeline's.
    pub async fn request(
        &self,
        caller: &Caller,
        key: &str,
        ask: &RequestRunner,
    ) -> Result<RunnerOutcome> {
        let tenant = caller.own_tenant()?;
        let terms = terms_of(RunnerLeaseId(minted_id("runner-lease", tenant, key)), ask)?;
        let lease = terms.lease;
        let hash = caller_hash("runner-lease", &lease.stream_id(), ask);
        let request = self.lease_request(
            caller,
            tenant.clone(),
            lease,
            key,
            RunnerCommand::Request { terms },
        )?;
        self.run(request.hashed_as(hash), lease).await
    }

    /// A tenant assigns its lease's job: its capacity reserved and its job claimed in the
    /// same append.
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED`; `CONFLICT` for another job, or a job another lease
    /// holds; `QUOTA_EXCEEDED` from the capacity; the pipeline's.
    pub async fn assign(
        &self,
        caller: &Caller,
        key: &str,
        (lease, epoch, job): (RunnerLeaseId, u64, JobRef),
    ) -> Result<RunnerOutcome> {
        let tenant = caller.own_tenant()?.clone();
        self.tenant_command(caller, key, (tenant, lease), RunnerCommand::Assign { epoch, job })
            .await
    }

    /// Releases `owner`'s lease with an outcome (its tenant, its node, or the dispatcher
    /// after a failed launch).
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED`; `CONFLICT` for another outcome than the one recorded;
    /// the pipeline's.
    pub async fn release(
        &self,
        caller: &Caller,
        key: &str,
        (owner, lease, epoch): (TenantId, RunnerLeaseId, u64),
        (outcome, reason): (Outcome, Option<Reason>),
    ) -> Result<RunnerOutcome> {
        let command = RunnerCommand::Release { epoch, outcome, reason };
        self.tenant_command(caller, key, (owner, lease), command).await
    }

    /// Binds `owner`'s lease to `node` and starts its launch there, decided on the node's
    /// current policy.
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED`; `INVALID_STATE` when the node's policy refuses; the
    /// pipeline's.
    pub async fn launch(
        &self,
        caller: &Caller,
        key: &str,
        (owner, lease, epoch): (TenantId, RunnerLeaseId, u64),
        node: RunnerNodeName,
    ) -> Result<RunnerOutcome> {
        let facts = RunnerFacts { policy: self.policy(&node).await? };
        let command = RunnerCommand::Launch { epoch, node };
        let mut request = self.lease_request(caller, owner, lease, key, command)?;
        request.facts = facts;
        self.run(request, lease).await
    }

    /// A machine actor's report on `owner`'s lease under `epoch`: its instance, its phase,
    /// a heartbeat or a teardown. An `online` or `busy` is decided on its bound node's
    /// current policy.
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED` for another epoch; the lease's refusal; the pipeline's.
    pub async fn report(
        &self,
        caller: &Caller,
        key: &str,
        (owner, lease): (TenantId, RunnerLeaseId),
        report: HolderReport,
    ) -> Result<RunnerOutcome> {
        let (command, needs_policy) = report.command();
        let mut facts = RunnerFacts::default();
        if needs_policy {
            let (_, stored) = self.owned(lease).await?;
            if let Some(node) = stored.node {
                facts.policy = self.policy(&node).await?;
            }
        }
        let mut request = self.lease_request(caller, owner, lease, key, command)?;
        request.facts = facts;
        self.run(request, lease).await
    }

    /// Runs one of the unfenced commands of the reconcilers and operators on `owner`'s
    /// lease: a reap, a quarantine's proof, an operator's force, its node's re-registration.
    ///
    /// # Errors
    /// [`CommandError`]: the lease's refusal; the pipeline's.
    pub async fn settle(
        &self,
        caller: &Caller,
        key: &str,
        (owner, lease): (TenantId, RunnerLeaseId),
        settlement: Settlement,
    ) -> Result<RunnerOutcome> {
        let command = match settlement {
            Settlement::Reap => RunnerCommand::Reap,
            Settlement::InventoryAbsent { node, node_epoch } => RunnerCommand::ResolveQuarantine {
                proof: QuarantineProof::InventoryAbsent { node, node_epoch },
            },
            Settlement::Force { detail } => {
                RunnerCommand::ForceRelease { detail: OperatorDetail::new(&detail) }
            }
            Settlement::NodeReregistered { node } => RunnerCommand::NodeReregistered { node },
        };
        self.tenant_command(caller, key, (owner, lease), command).await
    }

    /// A node registers (again): a new node epoch, its inventory recorded when it knows it.
    ///
    /// # Errors
    /// [`CommandError`]: `INVALID_STATE` for a retired node; the pipeline's.
    pub async fn register_node(
        &self,
        caller: &Caller,
        key: &str,
        (registration, inventory): (Registration, Option<Vec<RunnerLeaseId>>),
    ) -> std::result::Result<CommandOutcome, CommandError<RunnerNodeError>> {
        let stream = node_of(&registration.node).stream_id();
        let command = RunnerNodeCommand::Register { registration, inventory };
        let request: CommandRequest<RunnerNode> =
            caller.request(fleet_tenant(), (stream, key), command, ())?;
        self.pipeline.execute(request).await
    }

    /// The orphan sweep gives up destroying instance `name` on `node` after `attempts` tries
    /// in a row: a dead letter for operators (rule 35), under an operation key of its own.
    ///
    /// # Errors
    /// [`CommandError`]: `NOT_FOUND` for a node never registered; the pipeline's.
    pub async fn dead_letter_orphan(
        &self,
        caller: &Caller,
        node: &RunnerNodeName,
        (name, attempts, detail): (&str, u32, leasehold_domain::values::OperatorDetail),
    ) -> std::result::Result<CommandOutcome, CommandError<RunnerNodeError>> {
        let stream = node_of(node).stream_id();
        let key = format!("runner-orphans:{node}:{name}:{attempts}");
        let command =
            RunnerNodeCommand::DeadLetterOrphan { name: name.to_owned(), attempts, detail };
        let request: CommandRequest<RunnerNode> =
            caller.request(fleet_tenant(), (stream, key.as_str()), command, ())?;
        self.pipeline.execute(request).await
    }

    /// A node's inventory from a sweep, under the registration it names.
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED` for an earlier registration; the pipeline's.
    pub async fn report_inventory(
        &self,
        caller: &Caller,
        key: &str,
        (node, node_epoch, leases): (&RunnerNodeName, u64, Vec<RunnerLeaseId>),
    ) -> std::result::Result<CommandOutcome, CommandError<RunnerNodeError>> {
        let stream = node_of(node).stream_id();
        let command = RunnerNodeCommand::ReportInventory { node_epoch, leases };
        let request: CommandRequest<RunnerNode> =
            caller.request(fleet_tenant(), (stream, key), command, ())?;
        self.pipeline.execute(request).await
    }

    /// An operator sets `tenant`'s runner capacity (an event; 0 disables a limit).
    ///
    /// # Errors
    /// [`CommandError`]: the pipeline's.
    pub async fn set_limits(
        &self,
        caller: &Caller,
        key: &str,
        (tenant, limits): (&TenantId, RunnerLimits),
    ) -> std::result::Result<CommandOutcome, CommandError<RunnerCapacityError>> {
        let stream = capacity_of(tenant).stream_id();
        let command =
            leasehold_domain::runner_capacity::RunnerCapacityCommand::SetLimits { limits };
        let request: CommandRequest<RunnerCapacity> =
            caller.request(tenant.clone(), (stream, key), command, ())?;
        self.pipeline.execute(request).await
    }

    /// `tenant`'s runner capacity as stored now (none until its first assignment or limits).
    ///
    /// # Errors
    /// A store failure.
    pub async fn capacity(
        &self,
        tenant: &TenantId,
    ) -> std::result::Result<Option<RunnerCapacity>, CommandError<RunnerCapacityError>> {
        let found = self.pipeline.state::<RunnerCapacity>(&capacity_of(tenant).stream_id()).await?;
        Ok(found.filter(|(owner, _, _)| owner == tenant).map(|(_, _, capacity)| capacity))
    }

    /// The lease as stored now and its owner.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such lease; a store failure.
    pub async fn owned(&self, lease: RunnerLeaseId) -> Result<(TenantId, RunnerLease)> {
        let found = self.pipeline.state::<RunnerLease>(&lease.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    /// The node as stored now (none before its first registration).
    ///
    /// # Errors
    /// A store failure.
    pub async fn node(&self, node: &RunnerNodeName) -> Result<Option<RunnerNode>> {
        let stream = node_of(node).stream_id();
        let found =
            self.pipeline.state::<RunnerNode>(&stream).await.map_err(CommandError::as_lookup)?;
        Ok(found.map(|(_, _, stored)| stored))
    }

    /// `job` of `tenant` as stored now.
    ///
    /// # Errors
    /// A store failure.
    pub async fn job(&self, tenant: &TenantId, job: JobRef) -> Result<Option<RunnerJob>> {
        let stream = job_of(tenant, job).stream_id();
        let found =
            self.pipeline.state::<RunnerJob>(&stream).await.map_err(CommandError::as_lookup)?;
        Ok(found.filter(|(owner, _, _)| owner == tenant).map(|(_, _, stored)| stored))
    }

    async fn policy(&self, node: &RunnerNodeName) -> Result<Option<NodePolicy>> {
        Ok(self.node(node).await?.and_then(|stored| stored.policy()))
    }

    async fn tenant_command(
        &self,
        caller: &Caller,
        key: &str,
        (owner, lease): (TenantId, RunnerLeaseId),
        command: RunnerCommand,
    ) -> Result<RunnerOutcome> {
        let request = self.lease_request(caller, owner, lease, key, command)?;
        self.run(request, lease).await
    }

    fn lease_request(
        &self,
        caller: &Caller,
        owner: TenantId,
        lease: RunnerLeaseId,
        key: &str,
        command: RunnerCommand,
    ) -> Result<CommandRequest<RunnerLease>> {
        Ok(caller.request(owner, (lease.stream_id(), key), command, RunnerFacts::default())?)
    }

    async fn run(
        &self,
        request: CommandRequest<RunnerLease>,
        lease: RunnerLeaseId,
    ) -> Result<RunnerOutcome> {
        let follows = runner_follows::<S>(&request.tenant);
        let _turn = self.lanes.enter(&capacity_of(&request.tenant).stream_id()).await;
        let outcome = Box::pin(self.pipeline.execute_following(request, &[], &follows)).await?;
        Ok(RunnerOutcome { lease, outcome })
    }
}

/// What a lease's holder reports under its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderReport {
    /// The provider created its instance.
    Instance {
        /// The epoch.
        epoch: u64,
        /// The provider's handle.
        instance: InstanceRef,
    },
    /// Its phase (online, busy, custody).
    Phase {
        /// The epoch.
        epoch: u64,
        /// The phase.
        phase: Phase,
    },
    /// A sign of life.
    Heartbeat {
        /// The epoch.
        epoch: u64,
    },
    /// What a destroy proved.
    Teardown {
        /// The epoch.
        epoch: u64,
        /// Requested or stopped.
        teardown: Teardown,
    },
}

impl HolderReport {
    /// The lease command, and whether it is decided on the bound node's current policy.
    fn command(self) -> (RunnerCommand, bool) {
        match self {
            Self::Instance { epoch, instance } => {
                (RunnerCommand::RecordInstance { epoch, instance }, false)
            }
            Self::Phase { epoch, phase } => {
                let needs = matches!(phase, Phase::Online | Phase::Busy);
                (RunnerCommand::Advance { epoch, phase }, needs)
            }
            Self::Heartbeat { epoch } => (RunnerCommand::Heartbeat { epoch }, false),
            Self::Teardown { epoch, teardown } => {
                (RunnerCommand::RecordTeardown { epoch, teardown }, false)
            }
        }
    }
}

/// What a reconciler or an operator settles on a lease, unfenced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// The expiry reaper's reap.
    Reap,
    /// The node's inventory lacked the lease.
    InventoryAbsent {
        /// The node.
        node: RunnerNodeName,
        /// Its registration the inventory came from.
        node_epoch: u64,
    },
    /// An operator's word that its compute is gone.
    Force {
        /// What the operator said (operators only).
        detail: String,
    },
    /// Its node registered again.
    NodeReregistered {
        /// The node.
        node: RunnerNodeName,
    },
}

/// The lease's terms from what a tenant asked.
fn terms_of(lease: RunnerLeaseId, ask: &RequestRunner) -> Result<RunnerTerms> {
    use leasehold_domain::limits::{RUNNER_LEASE_TTL_SECONDS_MAX, RUNNER_PROVIDERS_MAX};
    use leasehold_domain::values::{FieldError, Problem};
    if ask.providers.is_empty() {
        return Err(FieldError::new("providers", Problem::Missing).into());
    }
    if ask.providers.len() > RUNNER_PROVIDERS_MAX {
        let problem = Problem::TooLong { max: RUNNER_PROVIDERS_MAX };
        return Err(FieldError::new("providers", problem).into());
    }
    let mut providers = ask.providers.clone();
    providers.sort_unstable();
    providers.dedup();
    if !(30..=RUNNER_LEASE_TTL_SECONDS_MAX).contains(&ask.ttl_seconds) {
        let max = u64::from(RUNNER_LEASE_TTL_SECONDS_MAX);
        return Err(FieldError::new("ttlSeconds", Problem::OutOfRange { min: 30, max }).into());
    }
    Ok(RunnerTerms {
        lease,
        tier: ask.tier.clone(),
        trust: ask.trust,
        guest_os: ask.guest_os,
        resources: ask.resources,
        providers,
        command: ask.command.clone(),
        ttl_seconds: ask.ttl_seconds,
    })
}

/// The consequences of a runner lease command of `tenant`'s: the capacity command and the
/// job command its decision carries, each linked on its stream.
pub fn runner_follows<S: CommandStore + Send + Sync + 'static>(
    tenant: &TenantId,
) -> impl Fn(&RunnerLease, &[RunnerEvent]) -> Vec<Box<dyn Link<S>>> + Send + Sync + use<S> {
    let tenant = tenant.clone();
    move |before, events| {
        let mut links: Vec<Box<dyn Link<S>>> = Vec::new();
        if let Some(effect) = capacity_effect(before, events) {
            let stream = capacity_of(&tenant).stream_id();
            links.push(Box::new(LinkedCommand::<RunnerCapacity>::new(stream, effect, ())));
        }
        if let Some((job, effect)) = job_effect(before, events) {
            let stream = job_of(&tenant, job).stream_id();
            links.push(Box::new(LinkedCommand::<RunnerJob>::new(stream, effect, ())));
        }
        links
    }
}
