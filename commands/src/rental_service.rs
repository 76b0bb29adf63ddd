//! The rental's application service: a tenant provisions, stops, resumes and terminates
//! rentals through Leasehold's provider connections; a provider's agent (or the dispatcher
//! that called the provider) reports receipts and observations.
//!
//! Every rental command runs with its node consequences derived from its decision
//! ([`node_effects`]): a provision invites its first generation's node, a resume retires the
//! previous generation's node and invites the next one's, a confirmed termination retires the
//! current one, all on the nodes' streams in the same append. The rental's id, its ownership
//! token and its operation keys at the provider are minted from the tenant and the
//! operation key before any provider is called; each node's id is minted from the rental and
//! the generation ([`node_of`]), and its enrollment token from the deployment's key and the
//! node's id ([`EnrollmentKey`]): the log keeps only the token's hash.
//!
//! The provider connections are registered at startup with their declared capabilities,
//! each validated ([`CapacitySupport::validate`]); a provision names one of them.

use std::collections::BTreeMap;
use std::sync::Arc;

use leasehold_domain::TenantId;
use leasehold_domain::node::{Node, NodeCommand, NodeIdentity};
use leasehold_domain::rental::{
    Bootstrap, CapacityObservation, CapacityReceipt, CapacitySupport, ConnectionId, NodeEffect,
    OfferId, Rental, RentalCommand, RentalError, RentalEvent, RentalId, RentalTerms, Resources,
    SupportError, TerminateCause, node_effects,
};
use leasehold_domain::values::{FieldError, OperationId, OperatorDetail, Problem};
use serde::Serialize;

use crate::enrollment::{EnrollmentKey, node_of, token_hash};
use crate::lease_service::{Caller, minted_id};
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand, caller_hash,
};

type Result<T> = std::result::Result<T, CommandError<RentalError>>;

/// The provider connections this deployment rents through, each with its declared and
/// validated capabilities.
#[derive(Debug, Clone, Default)]
pub struct Connections(BTreeMap<ConnectionId, CapacitySupport>);

impl Connections {
    /// Registers `id` with what it declares it can do.
    ///
    /// # Errors
    /// [`SupportError`]: the declaration breaks a rule (a provider without idempotent
    /// provision that cannot list owned capacity; resume or persistent disk without stop).
    pub fn register(
        &mut self,
        id: ConnectionId,
        support: CapacitySupport,
    ) -> std::result::Result<(), SupportError> {
        support.validate()?;
        self.0.insert(id, support);
        Ok(())
    }

    /// What `id` declared, if it is registered.
    pub fn support(&self, id: &ConnectionId) -> Option<CapacitySupport> {
        self.0.get(id).copied()
    }
}

/// What the rental service needs besides the pipeline.
#[derive(Debug, Clone)]
pub struct RentalConfig {
    /// The registered connections.
    pub connections: Connections,
    /// Where node agents enroll (the bootstrap's `control_plane_url`).
    pub control_plane_url: String,
    /// The node agent build bootstraps pin.
    pub agent_version: String,
    /// Derives enrollment tokens and signs node credentials.
    pub key: EnrollmentKey,
}

/// What a tenant asks of a new rental.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProvisionRental {
    /// The connection to rent through.
    pub connection: ConnectionId,
    /// The offer, as the provider listed it.
    pub offer: OfferId,
    /// What to ask of the machine.
    pub resources: Resources,
    /// Interruptible (spot) capacity.
    pub interruptible: bool,
    /// When Leasehold (and a provider that supports one) reclaims it.
    pub max_lifetime_seconds: u64,
}

/// A rental command's result, with the rental it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RentalOutcome {
    /// The rental.
    pub rental: RentalId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// Runs rental commands.
#[derive(Debug, Clone)]
pub struct RentalService<S> {
    pipeline: CommandPipeline<S>,
    config: Arc<RentalConfig>,
}

impl<S> RentalService<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// A service over `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>, config: RentalConfig) -> Self {
        Self { pipeline, config: Arc::new(config) }
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// The service's settings (the enrollment key among them).
    pub fn config(&self) -> &RentalConfig {
        &self.config
    }

    /// A tenant rents capacity: the rental, its ownership token and its first node are
    /// minted now, and the node is invited in the same append.
    ///
    /// # Errors
    /// [`CommandError`]: `Invalid` naming `connection` for an unregistered connection or
    /// `maxLifetimeSeconds` out of range; the pipeline's.
    pub async fn provision(
        &self,
        caller: &Caller,
        key: &str,
        ask: &ProvisionRental,
    ) -> Result<RentalOutcome> {
        let tenant = own_tenant(caller)?;
        let support = self.config.connections.support(&ask.connection).ok_or_else(|| {
            FieldError::new(
                "connection",
                Problem::BadFormat { expected: "a registered provider connection" },
            )
        })?;
        leasehold_domain::rental::values::check_max_lifetime(
            "maxLifetimeSeconds",
            ask.max_lifetime_seconds,
        )?;
        let rental = RentalId(minted_id("rental", tenant, key));
        let terms = RentalTerms {
            rental,
            connection: ask.connection.clone(),
            offer: ask.offer.clone(),
            resources: ask.resources,
            interruptible: ask.interruptible,
            max_lifetime_seconds: ask.max_lifetime_seconds,
            support,
            bootstrap: Bootstrap {
                control_plane_url: self.config.control_plane_url.clone(),
                agent_version: self.config.agent_version.clone(),
            },
        };
        let command = RentalCommand::Provision {
            terms,
            ownership: self.config.key.ownership_token(rental),
            node: node_of(rental, 1),
            operation: OperationId(minted_id("rental-provision", tenant, key)),
        };
        let hash = caller_hash("rental", &rental.stream_id(), ask);
        let request = self.request(caller, tenant.clone(), rental, key, command)?;
        self.run(request.hashed_as(hash), rental).await
    }

    /// A tenant stops its rental (the connection must support stop).
    ///
    /// # Errors
    /// [`CommandError`]: `FENCED` for a generation that is not the rental's; `UNSUPPORTED`;
    /// the rental's refusal; the pipeline's.
    pub async fn stop(
        &self,
        caller: &Caller,
        key: &str,
        (rental, generation): (RentalId, u64),
    ) -> Result<RentalOutcome> {
        let tenant = own_tenant(caller)?;
        let operation = OperationId(minted_id("rental-stop", tenant, key));
        let command = RentalCommand::Stop { generation, operation };
        let request = self.request(caller, tenant.clone(), rental, key, command)?;
        self.run(request, rental).await
    }

    /// A tenant resumes its stopped rental: a new generation, whose node is invited while the
    /// previous one is retired.
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub async fn resume(
        &self,
        caller: &Caller,
        key: &str,
        (rental, generation): (RentalId, u64),
    ) -> Result<RentalOutcome> {
        let tenant = own_tenant(caller)?;
        let operation = OperationId(minted_id("rental-resume", tenant, key));
        let node = node_of(rental, generation.saturating_add(1));
        let command = RentalCommand::Resume { generation, node, operation };
        let request = self.request(caller, tenant.clone(), rental, key, command)?;
        self.run(request, rental).await
    }

    /// A tenant terminates its rental (idempotent); it stays charged until confirmed gone.
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub async fn terminate(
        &self,
        caller: &Caller,
        key: &str,
        (rental, generation): (RentalId, u64),
    ) -> Result<RentalOutcome> {
        let tenant = own_tenant(caller)?.clone();
        self.terminate_as(caller, key, (tenant, rental, generation), TerminateCause::Tenant).await
    }

    /// Terminates `owner`'s rental as `cause` (its tenant, an operator, its max lifetime).
    ///
    /// # Errors
    /// As [`Self::stop`].
    pub async fn terminate_as(
        &self,
        caller: &Caller,
        key: &str,
        (owner, rental, generation): (TenantId, RentalId, u64),
        cause: TerminateCause,
    ) -> Result<RentalOutcome> {
        let operation = OperationId(minted_id("rental-terminate", &owner, key));
        let command = RentalCommand::Terminate { generation, cause, operation };
        let request = self.request(caller, owner, rental, key, command)?;
        self.run(request, rental).await
    }

    /// The provider's receipt for a rental's provision, reported by `connection`'s agent.
    ///
    /// # Errors
    /// `NotFound` for a rental of another connection; the rental's refusal; the pipeline's.
    pub async fn accept(
        &self,
        caller: &Caller,
        key: &str,
        connection: &ConnectionId,
        (rental, generation, receipt): (RentalId, u64, CapacityReceipt),
    ) -> Result<RentalOutcome> {
        self.report(caller, key, connection, rental, RentalCommand::Accept { generation, receipt })
            .await
    }

    /// The provider refused a rental's provision for good.
    ///
    /// # Errors
    /// As [`Self::accept`].
    pub async fn fail_provision(
        &self,
        caller: &Caller,
        key: &str,
        connection: &ConnectionId,
        (rental, generation, detail): (RentalId, u64, &str),
    ) -> Result<RentalOutcome> {
        let detail = OperatorDetail::new(detail);
        self.report(
            caller,
            key,
            connection,
            rental,
            RentalCommand::FailProvision { generation, detail },
        )
        .await
    }

    /// The provider's look at a rental's machine, asked under `generation`.
    ///
    /// # Errors
    /// As [`Self::accept`]; `FENCED` when the rental resumed since the look was asked.
    pub async fn observe(
        &self,
        caller: &Caller,
        key: &str,
        connection: &ConnectionId,
        (rental, generation, observation): (RentalId, u64, CapacityObservation),
    ) -> Result<RentalOutcome> {
        let command = RentalCommand::Observe { generation, observation };
        self.report(caller, key, connection, rental, command).await
    }

    /// The provider does not know a rental's machine.
    ///
    /// # Errors
    /// As [`Self::accept`].
    pub async fn not_found(
        &self,
        caller: &Caller,
        key: &str,
        connection: &ConnectionId,
        (rental, generation): (RentalId, u64),
    ) -> Result<RentalOutcome> {
        self.report(caller, key, connection, rental, RentalCommand::NotFound { generation }).await
    }

    /// The rental as stored now and its owner.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such rental; a store failure.
    pub async fn owned(&self, rental: RentalId) -> Result<(TenantId, Rental)> {
        let found = self.pipeline.state::<Rental>(&rental.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    /// A report by `connection`'s agent on `rental`, as the rental's owner: a rental of
    /// another connection is not found to it.
    async fn report(
        &self,
        caller: &Caller,
        key: &str,
        connection: &ConnectionId,
        rental: RentalId,
        command: RentalCommand,
    ) -> Result<RentalOutcome> {
        let (owner, stored) = self.owned(rental).await?;
        let theirs = stored.terms.as_ref().is_some_and(|terms| &terms.connection == connection);
        if !theirs {
            return Err(CommandError::NotFound);
        }
        let request = self.request(caller, owner, rental, key, command)?;
        self.run(request, rental).await
    }

    fn request(
        &self,
        caller: &Caller,
        tenant: TenantId,
        rental: RentalId,
        key: &str,
        command: RentalCommand,
    ) -> Result<CommandRequest<Rental>> {
        Ok(caller.request(tenant, (rental.stream_id(), key), command, ())?)
    }

    async fn run(
        &self,
        request: CommandRequest<Rental>,
        rental: RentalId,
    ) -> Result<RentalOutcome> {
        let follows = node_follows::<S>(self.config.key.clone(), rental);
        let outcome = Box::pin(self.pipeline.execute_following(request, &[], &follows)).await?;
        Ok(RentalOutcome { rental, outcome })
    }
}

/// The node commands a rental command's decision carries ([`node_effects`]), linked on the
/// nodes' streams.
pub fn node_follows<S: CommandStore + Send + Sync + 'static>(
    key: EnrollmentKey,
    rental: RentalId,
) -> impl Fn(&Rental, &[RentalEvent]) -> Vec<Box<dyn Link<S>>> + Send + Sync {
    move |before, events| {
        node_effects(before, events)
            .into_iter()
            .map(|effect| {
                let (node, command) = match effect {
                    NodeEffect::Invite { node, generation } => {
                        let identity = NodeIdentity { node, rental, generation };
                        let token_hash = token_hash(&key.enrollment_token(node));
                        (node, NodeCommand::Invite { identity, token_hash })
                    }
                    NodeEffect::Retire { node, .. } => (node, NodeCommand::Retire),
                };
                Box::new(LinkedCommand::<Node>::new(node.stream_id(), command, ()))
                    as Box<dyn Link<S>>
            })
            .collect()
    }
}

fn own_tenant(caller: &Caller) -> Result<&TenantId> {
    caller.own_tenant()
}
