//! The lease's application service: what every caller of a lease command goes through, the
//! GraphQL resolvers and the backend callbacks alike. It mints the ids a retry must see again
//! (lease, maintenance and operation ids, from the tenant and the operation key), looks up
//! what a command is decided with (the lease's owner for machine actors and operators, the
//! retained source of a restore, the backend a request routes to), and runs the command
//! through the pipeline in the caller's key namespace.

use leasehold_domain::lease::{
    BackendName, Lease, LeaseCommand, LeaseError, LeaseFacts, LeaseId, LeaseItems, MaintenanceId,
    OperationId, PayloadHash, ProviderId, RetainedSource,
};
use leasehold_domain::{Actor, KeyNamespace, TenantId};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use crate::lease_input::{self, LeaseInputLimits, RequestLeaseInput};
use crate::{CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore};

type Result<T> = std::result::Result<T, CommandError<LeaseError>>;

/// Who runs a command, as its verified token (or signed callback) says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Who, for the events' metadata.
    pub actor: Actor,
    /// The caller's tenant: set for tenants, never for machine actors or operators.
    pub tenant: Option<TenantId>,
    /// The provider a machine actor is bound to; `None`: every provider (an explicit grant).
    pub provider: Option<ProviderId>,
    /// Whose operation keys these are (default: the actor's own namespace).
    pub namespace: Option<KeyNamespace>,
}

impl Caller {
    /// The caller's own tenant; a caller without one (a machine actor, an operator) cannot
    /// run a tenant's command. The gateway's role checks refuse them first; this keeps every
    /// service safe on its own.
    ///
    /// # Errors
    /// [`CommandError::NotFound`].
    pub fn own_tenant<E: leasehold_domain::Refusal>(
        &self,
    ) -> std::result::Result<&TenantId, CommandError<E>> {
        self.tenant.as_ref().ok_or(CommandError::NotFound)
    }

    /// A request of the caller's on `stream` of `owner`'s: the caller as the actor, in its
    /// key namespace, with a new correlation id.
    ///
    /// # Errors
    /// [`FieldError`](leasehold_domain::values::FieldError) naming `operationKey`.
    pub fn request<A: leasehold_domain::Aggregate>(
        &self,
        owner: TenantId,
        (stream, key): (leasehold_domain::StreamId, &str),
        command: A::Command,
        facts: A::Facts,
    ) -> std::result::Result<CommandRequest<A>, leasehold_domain::values::FieldError> {
        let key = crate::lease_input::operation_key(Some(key))?;
        let mut request =
            CommandRequest::<A>::new(owner, self.actor.clone(), stream, key, command, facts);
        if let Some(namespace) = &self.namespace {
            request.namespace = namespace.clone();
        }
        request.correlation_id = Some(Uuid::now_v7());
        Ok(request)
    }
}

/// A lease command's result, with the lease it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOutcome {
    /// The lease.
    pub lease: LeaseId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// What a lease's backend is carrying out now: the operation its reports must name and, while
/// a restart or update is pending, the fence its completion must echo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentWork {
    /// The lease.
    pub lease: LeaseId,
    /// Its status.
    pub status: leasehold_domain::lease::LeaseStatus,
    /// The operation its reports name (`None` for a lease started before operations had ids).
    pub operation: Option<OperationId>,
    /// The pending restart or update: its id and admission stamp.
    pub maintenance: Option<(MaintenanceId, chrono::DateTime<chrono::Utc>)>,
    /// Whether the pending maintenance is a restart or an update.
    pub maintenance_kind: Option<leasehold_domain::lease::MaintenanceKind>,
    /// The backend it is placed on.
    pub backend: Option<BackendName>,
}

/// Runs lease commands for callers.
#[derive(Debug, Clone)]
pub struct LeaseService<S> {
    pipeline: CommandPipeline<S>,
    backend: Option<BackendName>,
    router: Option<std::sync::Arc<dyn crate::BackendRouter>>,
    limits: LeaseInputLimits,
    retention_max_age: Option<chrono::TimeDelta>,
}

impl<S: CommandStore + Clone + Send + Sync + 'static> LeaseService<S> {
    /// A service that places new leases on `backend` and holds requests to `limits`.
    pub fn new(
        pipeline: CommandPipeline<S>,
        backend: Option<BackendName>,
        limits: LeaseInputLimits,
    ) -> Self {
        Self { pipeline, backend, router: None, limits, retention_max_age: None }
    }

    /// The same service placing new leases where `router` says instead of on one backend.
    #[must_use]
    pub fn with_router(mut self, router: std::sync::Arc<dyn crate::BackendRouter>) -> Self {
        self.router = Some(router);
        self
    }

    /// The same service keeping released leases' data for `max_age` after each lease was
    /// created (`retained_until`, after which the retention reaper reaps it); without it,
    /// retained data has no deadline.
    #[must_use]
    pub fn with_retention_max_age(mut self, max_age: Option<chrono::TimeDelta>) -> Self {
        self.retention_max_age = max_age;
        self
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// A tenant rents compute: the lease's id is `lease`, or minted from the key.
    ///
    /// # Errors
    /// [`CommandError`]: malformed input, the lease's refusal, or the pipeline's.
    pub async fn request(
        &self,
        caller: &Caller,
        key: &str,
        lease: Option<LeaseId>,
        input: &RequestLeaseInput,
    ) -> Result<LeaseOutcome> {
        let tenant = own_tenant(caller)?;
        let lease = lease.unwrap_or_else(|| LeaseId(minted_id("lease", tenant, key)));
        let operation = OperationId(minted_id("provision", tenant, key));
        let command = lease_input::request_provision(lease, operation, input, self.limits)?;
        let backend = match (&self.router, &command) {
            (Some(router), LeaseCommand::RequestProvision { items, .. }) => {
                router.route(items).await
            }
            _ => self.backend.clone(),
        };
        let facts = LeaseFacts { backend, ..LeaseFacts::default() };
        self.run(caller, tenant.clone(), lease, key, command, facts).await
    }

    /// A tenant starts a new lease from a retained one's data.
    ///
    /// # Errors
    /// [`CommandError`]: malformed input, the lease's refusal, or the pipeline's.
    pub async fn restore(
        &self,
        caller: &Caller,
        key: &str,
        (lease, from): (Option<LeaseId>, LeaseId),
        provider: Option<ProviderId>,
        items: &[lease_input::ItemInput],
    ) -> Result<LeaseOutcome> {
        let tenant = own_tenant(caller)?;
        let lease = lease.unwrap_or_else(|| LeaseId(minted_id("lease", tenant, key)));
        let items: LeaseItems = lease_input::items(items, self.limits)?;
        let operation = OperationId(minted_id("restore", tenant, key));
        let command = LeaseCommand::Restore { lease, from, provider, items, operation };
        // Another tenant's retained lease is looked up too: the aggregate answers "not found"
        // for it, never "forbidden".
        let found = self.pipeline.state::<Lease>(&from.stream_id()).await?;
        if let (Some((owner, _, source)), LeaseCommand::Restore { items, .. }) = (&found, &command)
        {
            self.check_tier(owner == tenant, source, items)?;
        }
        let retained_source =
            found.map(|(owner, _, lease)| RetainedSource { same_tenant: &owner == tenant, lease });
        let facts = LeaseFacts { retained_source, ..LeaseFacts::default() };
        self.run(caller, tenant.clone(), lease, key, command, facts).await
    }

    /// A restore into another SKU tier stays on the source's backend, which must serve each
    /// SKU the source did not have (a SKU it had, it served). Only checked for the tenant's own
    /// source: another's is answered "not found" by the aggregate.
    fn check_tier(&self, own: bool, source: &Lease, items: &LeaseItems) -> Result<()> {
        let (Some(router), Some(terms), true) = (&self.router, &source.terms, own) else {
            return Ok(());
        };
        let had = terms.items.skus();
        for item in items.as_slice() {
            if !had.contains(&item.sku) && !router.serves(&terms.backend, &item.sku) {
                return Err(CommandError::Refused(LeaseError::NoBackend { sku: item.sku.clone() }));
            }
        }
        Ok(())
    }

    /// A tenant restarts its lease.
    ///
    /// # Errors
    /// [`CommandError`]: the lease's refusal, or the pipeline's.
    pub async fn restart(
        &self,
        caller: &Caller,
        key: &str,
        lease: LeaseId,
    ) -> Result<LeaseOutcome> {
        let tenant = own_tenant(caller)?;
        let command = lease_input::restart(minted_id("restart", tenant, key));
        self.on_own(caller, key, lease, command).await
    }

    /// A tenant moves its lease to the manifest whose hash is `payload_hash`.
    ///
    /// # Errors
    /// [`CommandError`]: malformed input, the lease's refusal, or the pipeline's.
    pub async fn update(
        &self,
        caller: &Caller,
        key: &str,
        lease: LeaseId,
        payload_hash: &str,
    ) -> Result<LeaseOutcome> {
        let tenant = own_tenant(caller)?;
        let payload_hash = PayloadHash::parse("payload", payload_hash)?;
        let maintenance_id = MaintenanceId(minted_id("update", tenant, key));
        let command = LeaseCommand::Update { maintenance_id, payload_hash };
        self.on_own(caller, key, lease, command).await
    }

    /// A tenant's command on its own lease that needs no minted id or looked-up fact.
    ///
    /// # Errors
    /// [`CommandError`]: the lease's refusal, or the pipeline's.
    pub async fn on_own(
        &self,
        caller: &Caller,
        key: &str,
        lease: LeaseId,
        command: LeaseCommand,
    ) -> Result<LeaseOutcome> {
        let tenant = own_tenant(caller)?.clone();
        self.run(caller, tenant, lease, key, command, LeaseFacts::default()).await
    }

    /// A machine actor's report, or an operator's command, for the lease's owner. An actor
    /// bound to a provider finds only that provider's leases: another's is not found.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a lease it may not act on; otherwise as the pipeline.
    pub async fn for_owner(
        &self,
        caller: &Caller,
        key: &str,
        lease: LeaseId,
        command: LeaseCommand,
    ) -> Result<LeaseOutcome> {
        let owner = self.owner_of(caller, lease).await?;
        self.run(caller, owner, lease, key, command, LeaseFacts::default()).await
    }

    /// The backend work the lease's reports must name now, for a machine actor or an operator
    /// (a provider-bound actor finds only its provider's leases).
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for a lease it may not see; a store failure.
    pub async fn current_work(&self, caller: &Caller, lease: LeaseId) -> Result<CurrentWork> {
        let (_, stored) = self.owned(caller, lease).await?;
        Ok(CurrentWork {
            lease,
            status: stored.status,
            operation: stored.operation,
            maintenance: stored.pending.map(|pending| (pending.id, pending.admitted_at)),
            maintenance_kind: stored.pending.map(|pending| pending.kind),
            backend: stored.terms.as_ref().map(|terms| terms.backend.clone()),
        })
    }

    /// The lease's owner, if `caller` may act on it.
    async fn owner_of(&self, caller: &Caller, lease: LeaseId) -> Result<TenantId> {
        Ok(self.owned(caller, lease).await?.0)
    }

    /// The lease's owner and state, if `caller` may act on it.
    async fn owned(&self, caller: &Caller, lease: LeaseId) -> Result<(TenantId, Lease)> {
        let found = self.pipeline.state::<Lease>(&lease.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        let provider = stored.terms.as_ref().map(|terms| terms.provider);
        match caller.provider {
            Some(bound) if provider != Some(bound) => Err(CommandError::NotFound),
            _ => Ok((owner, stored)),
        }
    }

    async fn run(
        &self,
        caller: &Caller,
        tenant: TenantId,
        lease: LeaseId,
        key: &str,
        command: LeaseCommand,
        mut facts: LeaseFacts,
    ) -> Result<LeaseOutcome> {
        let key = lease_input::operation_key(Some(key))?;
        facts.retention_max_age = facts.retention_max_age.or(self.retention_max_age);
        let stream = lease.stream_id();
        let mut request =
            CommandRequest::<Lease>::new(tenant, caller.actor.clone(), stream, key, command, facts);
        if let Some(namespace) = &caller.namespace {
            request.namespace = namespace.clone();
        }
        request.correlation_id = Some(Uuid::now_v7());
        let outcome = self.pipeline.execute(request).await?;
        Ok(LeaseOutcome { lease, outcome })
    }
}

/// The caller's own tenant; a caller without one (a machine actor, an operator) cannot run a
/// tenant's command. The gateway's role checks refuse them first; this keeps the service
/// safe on its own.
fn own_tenant(caller: &Caller) -> Result<&TenantId> {
    caller.own_tenant()
}

/// An id minted from the tenant and the operation key, so that a retry of the same request
/// names the same lease (or maintenance, or operation) and hashes the same.
pub fn minted_id(purpose: &str, tenant: &TenantId, operation_key: &str) -> Uuid {
    let mut hash = Sha256::new();
    for part in ["leasehold", purpose, tenant.as_str(), operation_key] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

/// The SHA-256 of a manifest, hex: the manifest itself may hold secrets and is never stored.
pub fn payload_hash(payload: &str) -> String {
    hex_lower(&Sha256::digest(payload.as_bytes()))
}

fn hex_lower(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}
