//! The rental kind of dispatcher work: a rental's provision, stop, resume and termination
//! go to its connection's provider agent (`crate::providers`, the protocol of
//! `docs/mercator-protocol.md` §1), and each answer is recorded on the rental.
//!
//! | event | action | sent | answer recorded |
//! |---|---|---|---|
//! | CapacityRequested | `provision` | `POST /v1/capacity/provision` with the bootstrap | the receipt (`Accept`), or a refusal for good (`FailProvision`) |
//! | CapacityStopRequested | `stop` | `POST /v1/capacity/stop` | a look right after (`Observe`) |
//! | CapacityResumed | `resume` | `POST /v1/capacity/start` with the new generation's bootstrap | a look right after |
//! | CapacityTerminationRequested | `terminate` | `POST /v1/capacity/terminate` | a look right after, or the provider's not-found (`NotFound`, which the rental takes as proof only where the provider declares terminated capacity unobservable) |
//!
//! Later looks are the observer's (`crate::rented::observer`). A provision is its own work
//! beside the rental's others (a termination asked before its receipt does not cancel it: the
//! provider may have the machine already, and only its receipt says which one); a termination
//! waits for that receipt. Newer work supersedes an older stop, resume or termination.
//!
//! At least once: the provider deduplicates on the operation key (the provision's own,
//! whatever was asked of the rental since), and where it lists owned capacity (which one that
//! does not deduplicate must) every attempt after the first lists it and adopts the machine
//! marked with the rental's id and ownership token instead of making a second one, so a send
//! after a lost answer is harmless. A provider's own text is never kept: a refusal is
//! recorded by its status and code only (a provider may echo the request, bootstrap
//! included). An
//! operation the connection does not declare is refused before it is sent and never retried;
//! a connection with no settings here waits for an operator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::rental_service::RentalService;
use leasehold_domain::rental::{
    CapacityReceipt, ConnectionId, Pricing, Rental, RentalEvent, RentalId, RentalStatus,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::{Actor, DomainEvent as _, RecordedEvent};
use leasehold_projections::ReconcileError;
use sha2::{Digest as _, Sha256};

use super::{DispatchKind, Intent, Sent, Work};
use crate::providers::wire::{
    CapacityCommand, CapacityRef, NodeBootstrap, OwnershipQuery, ProvisionCommand,
};
use crate::providers::{ProviderClient, ProviderError};

/// How long work waits for an operator when its connection has no settings here.
const NO_CONNECTION_WAIT: Duration =
    Duration::from_millis(crate::limits::DISPATCH_RETRY_MAX_MILLISECONDS);

/// The provider connections' clients, by connection.
#[derive(Debug, Clone, Default)]
pub struct Providers(Arc<BTreeMap<ConnectionId, ProviderClient>>);

impl Providers {
    /// The clients of `clients`.
    pub fn new(clients: Vec<ProviderClient>) -> Self {
        let by_name = clients.into_iter().map(|c| (c.config().connection.clone(), c)).collect();
        Self(Arc::new(by_name))
    }

    /// `connection`'s client.
    pub fn get(&self, connection: &ConnectionId) -> Option<&ProviderClient> {
        self.0.get(connection)
    }

    /// Every client.
    pub fn all(&self) -> impl Iterator<Item = &ProviderClient> {
        self.0.values()
    }
}

/// The rental kind's dispatch.
#[derive(Debug, Clone)]
pub struct RentalDispatch<S> {
    rentals: RentalService<S>,
    providers: Providers,
}

impl<S> RentalDispatch<S> {
    /// Sends the work of `rentals`'s rentals to `providers`.
    pub fn new(rentals: RentalService<S>, providers: Providers) -> Self {
        Self { rentals, providers }
    }
}

/// The action an event of a rental starts.
pub fn started_work(event: &RentalEvent) -> Option<(&'static str, OperationId)> {
    match event {
        RentalEvent::CapacityRequested { operation, .. } => Some(("provision", *operation)),
        RentalEvent::CapacityStopRequested { operation, .. } => Some(("stop", *operation)),
        RentalEvent::CapacityResumed { operation, .. } => Some(("resume", *operation)),
        RentalEvent::CapacityTerminationRequested { operation, .. } => {
            Some(("terminate", *operation))
        }
        _ => None,
    }
}

/// Whether `rental` still awaits `action` of `operation`.
pub fn awaits(rental: &Rental, action: &str, operation: OperationId) -> bool {
    use RentalStatus as S;
    match action {
        // A provision awaits its receipt, also once a termination was asked.
        "provision" => {
            matches!(rental.status, S::Requested | S::Terminating) && rental.allocated.is_none()
        }
        "stop" => rental.status == S::Stopping && rental.operation == Some(operation),
        "resume" => rental.status == S::Starting && rental.operation == Some(operation),
        "terminate" => rental.status == S::Terminating && rental.operation == Some(operation),
        _ => false,
    }
}

/// The dispatcher as a caller of the rental service (its own key namespace).
fn dispatcher() -> Caller {
    Caller {
        actor: Actor { subject: "rental-dispatcher".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

fn retry(action: &str, error: &impl std::fmt::Display) -> ReconcileError {
    ReconcileError::Retry { action: action.to_owned(), reason: error.to_string() }
}

/// A digest naming what a command asks (its request hash on the wire).
fn request_hash(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hex::encode(hash.finalize())
}

impl<S> RentalDispatch<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn rental(&self, rental: RentalId) -> Result<Option<(String, Rental)>, ReconcileError> {
        match self.rentals.owned(rental).await {
            Ok((owner, stored)) => Ok(Some((owner.as_str().to_string(), stored))),
            Err(leasehold_commands::CommandError::NotFound) => Ok(None),
            Err(error) => Err(retry("read a rental", &error)),
        }
    }

    /// The bootstrap of `rental`'s current generation: its node and that node's token.
    fn bootstrap(&self, rental: &Rental) -> Option<NodeBootstrap> {
        let (terms, node) = (rental.terms.as_ref()?, rental.node?);
        let key = &self.rentals.config().key;
        Some(NodeBootstrap {
            control_plane_url: terms.bootstrap.control_plane_url.clone(),
            node_id: node.0,
            rental_id: terms.rental.0,
            generation: rental.generation,
            enrollment_token: key.enrollment_token(node),
            agent_version: terms.bootstrap.agent_version.clone(),
        })
    }

    fn capacity(owner: &str, rental: &Rental) -> Option<CapacityRef> {
        let terms = rental.terms.as_ref()?;
        Some(CapacityRef {
            workspace_id: owner.to_string(),
            connection_id: terms.connection.as_str().to_string(),
            rental_id: terms.rental.0,
            native_ref: rental
                .allocated
                .as_ref()
                .map(|allocated| allocated.native_ref.as_str().to_string())
                .unwrap_or_default(),
            ownership_token: rental.ownership.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
        })
    }

    /// Sends the provision of `operation` (the provision's own, never the rental's current
    /// operation: a termination asked before the receipt replaces that, and a retry under
    /// another key would make a second machine).
    async fn provision(
        &self,
        (work, operation): (&Work, OperationId),
        client: &ProviderClient,
        (owner, rental): (&str, &Rental),
    ) -> Result<Sent, ReconcileError> {
        let (Some(terms), Some(bootstrap)) = (rental.terms.as_ref(), self.bootstrap(rental)) else {
            return Ok(Sent::Moot);
        };
        let id = terms.rental;
        let operation_key = operation.0.to_string();
        let command = ProvisionCommand {
            workspace_id: owner.to_string(),
            connection_id: terms.connection.as_str().to_string(),
            request_hash: request_hash(&["provision", &id.0.to_string(), &operation_key]),
            operation_key,
            rental_id: id.0,
            generation: 1,
            ownership_token: rental.ownership.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
            offer_snapshot_id: terms.offer.as_str().to_string(),
            resources: terms.resources,
            bootstrap,
            interruptible: terms.interruptible,
            max_lifetime_seconds: terms.max_lifetime_seconds,
        };
        let key = |what: &str| format!("rental-dispatch:{}:{}:{what}", id.0, work.generation);
        let connection = &terms.connection;
        // An earlier attempt whose answer was lost may have made the machine: where the
        // provider lists its capacity, it is found by its mark before anything is sent again.
        let answer = match self.adoptable(work, client, (owner, rental)).await {
            Ok(Some(receipt)) => Ok(receipt),
            Ok(None) => client.provision(&command).await,
            Err(error) => Err(error),
        };
        match answer {
            Ok(receipt) => {
                let accepted = self
                    .rentals
                    .accept(&dispatcher(), &key("accepted"), connection, (id, 1, receipt))
                    .await;
                accepted.map_err(|error| retry("record a receipt", &error))?;
                Ok(Sent::Delivered)
            }
            Err(error @ (ProviderError::Refused { .. } | ProviderError::Unsupported(_))) => {
                let detail = error.to_string();
                let failed = self
                    .rentals
                    .fail_provision(&dispatcher(), &key("failed"), connection, (id, 1, &detail))
                    .await;
                failed.map_err(|error| retry("record a refused provision", &error))?;
                Ok(Sent::Refused)
            }
            Err(error) => Ok(Sent::Failed { detail: error.to_string() }),
        }
    }

    /// The machine an earlier attempt of this provision made, as its provider lists it: read
    /// from the second attempt on, where the provider lists owned capacity (every provider
    /// that does not deduplicate on the key must), the one listed with this rental's id and
    /// ownership token.
    async fn adoptable(
        &self,
        work: &Work,
        client: &ProviderClient,
        (owner, rental): (&str, &Rental),
    ) -> Result<Option<CapacityReceipt>, ProviderError> {
        let (Some(terms), Some(ownership)) = (rental.terms.as_ref(), rental.ownership.as_ref())
        else {
            return Ok(None);
        };
        if !terms.support.list_owned || work.attempt <= 1 {
            return Ok(None);
        }
        let query = OwnershipQuery { workspace_id: Some(owner.to_string()) };
        let listed = client.owned(&query).await?;
        let ours = listed.into_iter().find(|owned| {
            owned.rental_id == Some(terms.rental.0)
                && owned.ownership_token.as_deref() == Some(ownership.0.as_str())
        });
        Ok(ours.map(|owned| CapacityReceipt {
            native_ref: owned.native_ref,
            state: owned.state,
            accepted_at: owned.created_at,
            duplicate: true,
            interruptible: owned.interruptible,
            // A listing without a price is recorded as an estimate of nothing, never as a
            // billable rate.
            pricing: owned.pricing.unwrap_or(Pricing {
                currency: "USD".into(),
                micros_per_hour: 0,
                exact: false,
            }),
        }))
    }

    /// A stop, start or termination, then a look at what it did.
    async fn act(
        &self,
        work: &Work,
        client: &ProviderClient,
        (owner, rental): (&str, &Rental),
    ) -> Result<Sent, ReconcileError> {
        let (Some(capacity), Some(operation)) = (Self::capacity(owner, rental), rental.operation)
        else {
            return Ok(Sent::Moot);
        };
        let operation_key = operation.0.to_string();
        let rental_text = capacity.rental_id.to_string();
        let command = CapacityCommand {
            request_hash: request_hash(&[&work.action, &rental_text, &operation_key]),
            operation_key,
            generation: rental.generation,
            bootstrap: (work.action == "resume").then(|| self.bootstrap(rental)).flatten(),
            capacity,
        };
        let answer = match work.action.as_str() {
            "stop" => client.stop(&command).await,
            "resume" => client.start(&command).await,
            _ => client.terminate(&command).await,
        };
        match answer {
            Ok(_) => {}
            // The provider does not know the machine: for a termination, what the rental
            // makes of that (proof only where terminated capacity is unobservable).
            Err(ProviderError::NotFound) if work.action == "terminate" => {
                self.record_not_found(work, rental).await?;
                return Ok(Sent::Delivered);
            }
            // Never retried: a routing bug, for operators.
            Err(error @ ProviderError::Unsupported(_)) => {
                tracing::warn!(dispatcher = "rental-dispatcher", stream = %work.stream, action = %work.action, %error, "the provider does not support the work");
                return Ok(Sent::Refused);
            }
            // A termination is idempotent (rule 8) and the rental stays charged until it is
            // confirmed: a refusal is tried again with backoff, never dropped. So is a stop or
            // a resume the provider would not authorize (a token being rotated) or found in
            // conflict; any other refusal of those is for good, for operators.
            Err(ProviderError::Refused { status, .. })
                if work.action == "terminate" || matches!(status, 401 | 403 | 409) =>
            {
                let detail = format!("the provider refused the {} ({status})", work.action);
                return Ok(Sent::Failed { detail });
            }
            Err(error @ ProviderError::Refused { .. }) => {
                tracing::warn!(dispatcher = "rental-dispatcher", stream = %work.stream, action = %work.action, %error, "the provider refused the work");
                return Ok(Sent::Refused);
            }
            Err(ProviderError::Fenced) => return Ok(Sent::Moot),
            Err(error) => return Ok(Sent::Failed { detail: error.to_string() }),
        }
        // The look right after is best effort: the observer looks again.
        if let Err(error) = self.look(work, client, (owner, rental)).await {
            tracing::debug!(stream = %work.stream, %error, "a look after the work failed");
        }
        Ok(Sent::Delivered)
    }

    async fn look(
        &self,
        work: &Work,
        client: &ProviderClient,
        (owner, rental): (&str, &Rental),
    ) -> Result<(), ReconcileError> {
        let Some(capacity) = Self::capacity(owner, rental) else { return Ok(()) };
        let Some(terms) = rental.terms.as_ref() else { return Ok(()) };
        match client.observe(&capacity).await {
            Ok(observation) => {
                let key = observation_key(terms.rental, rental.generation, &observation);
                let observed = self
                    .rentals
                    .observe(
                        &dispatcher(),
                        &key,
                        &terms.connection,
                        (terms.rental, rental.generation, observation),
                    )
                    .await;
                observed.map_err(|error| retry("record a look", &error))?;
                Ok(())
            }
            Err(ProviderError::NotFound) => self.record_not_found(work, rental).await,
            Err(error) => Err(retry("look at a machine", &error)),
        }
    }

    async fn record_not_found(&self, work: &Work, rental: &Rental) -> Result<(), ReconcileError> {
        let Some(terms) = rental.terms.as_ref() else { return Ok(()) };
        let key = format!("rental-dispatch:{}:{}:not-found", terms.rental.0, work.generation);
        let recorded = self
            .rentals
            .not_found(&dispatcher(), &key, &terms.connection, (terms.rental, rental.generation))
            .await;
        recorded.map_err(|error| retry("record a not-found", &error))?;
        Ok(())
    }
}

/// The key a look is recorded under: the same look (one moment's state of one generation)
/// is one command however often it is read.
pub(crate) fn observation_key(
    rental: RentalId,
    generation: u64,
    observation: &leasehold_domain::rental::CapacityObservation,
) -> String {
    format!(
        "rental-look:{}:{generation}:{}:{}",
        rental.0,
        observation.state,
        observation.observed_at.timestamp_micros()
    )
}

impl<S> DispatchKind for RentalDispatch<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "rental-dispatcher";
    const VERSION: u32 = 1;
    const BESIDE: &'static [&'static str] = &["provision"];

    async fn intent(&self, event: &RecordedEvent) -> Result<Option<Intent>, ReconcileError> {
        if event.stream_type.as_str() != leasehold_domain::rental::KIND.stream_type {
            return Ok(None);
        }
        let Ok(decoded) = RentalEvent::from_stored(event.event_type.as_str(), &event.payload)
        else {
            return Ok(None);
        };
        let Some((action, operation)) = started_work(&decoded) else { return Ok(None) };
        let Some(id) = RentalId::of_stream(&event.stream_id) else { return Ok(None) };
        let Some((_, stored)) = self.rental(id).await? else { return Ok(None) };
        if !awaits(&stored, action, operation) {
            return Ok(None);
        }
        let Some(terms) = stored.terms.as_ref() else { return Ok(None) };
        Ok(Some(Intent {
            stream: event.stream_id.clone(),
            generation: event.version,
            event_id: event.event_id,
            tenant: event.tenant_id.clone(),
            target: terms.connection.as_str().to_string(),
            action,
            request: serde_json::json!({ "operation": operation.0 }),
        }))
    }

    async fn send(&self, work: &Work, _now: DateTime<Utc>) -> Result<Sent, ReconcileError> {
        let connection = ConnectionId::parse("connection", work.target.as_str())
            .map_err(|error| retry("read a connection", &error))?;
        let Some(client) = self.providers.get(&connection) else {
            let detail = format!("no settings for provider connection {connection}");
            return Ok(Sent::NotSent { detail, wait: NO_CONNECTION_WAIT });
        };
        let operation: uuid::Uuid = serde_json::from_value(work.request["operation"].clone())
            .map_err(|error| retry("decode an operation", &error))?;
        let id = RentalId::of_stream(&work.stream)
            .ok_or_else(|| retry("read a rental's id", &"not a rental stream"))?;
        let Some((owner, stored)) = self.rental(id).await? else { return Ok(Sent::Moot) };
        if !awaits(&stored, &work.action, OperationId(operation)) {
            return Ok(Sent::Moot);
        }
        match work.action.as_str() {
            "provision" => {
                let work = (work, OperationId(operation));
                self.provision(work, client, (&owner, &stored)).await
            }
            // A termination needs the receipt that names the machine: it waits for the
            // provision's answer.
            "terminate" if stored.allocated.is_none() => Ok(Sent::NotSent {
                detail: "the termination waits for the provision's receipt".into(),
                wait: Duration::ZERO,
            }),
            _ => self.act(work, client, (&owner, &stored)).await,
        }
    }

    /// A send is at most three exchanges with the provider and their recording.
    fn claim_hold(&self) -> Duration {
        let longest = self.providers.all().map(|c| c.config().timeout).max();
        longest.unwrap_or(Duration::from_secs(30)) * 3 + Duration::from_secs(10)
    }
}
