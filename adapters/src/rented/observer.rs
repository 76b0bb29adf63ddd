//! The `rental-observer` reconciler: every sweep (15 s by default) it asks each rental's
//! provider for a look at its machine, paging through the rentals in id order (at most
//! [`LOOKS_PER_SWEEP`] a sweep, the next sweep going on from there, so a provider that does
//! not answer holds no other rental back), and records what the provider says: `unknown` is recorded
//! as the honest answer it is and moves nothing (rule 10); a not-found is the rental's to
//! weigh (proof of termination only while one is asked, and only from a provider that
//! declares terminated capacity unobservable; rule 11). A look is keyed by the generation,
//! state and moment it describes, so a sweep repeated after a crash records it once, and a
//! look asked before a resume is `FENCED` by the rental.
//!
//! A provider that does not answer is logged and looked at again on the next sweep; its
//! silence says nothing of the machine.

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_commands::CommandStore;
use leasehold_commands::lease_service::Caller;
use leasehold_commands::rental_service::RentalService;
use leasehold_domain::Actor;
use leasehold_domain::rental::{Rental, RentalId};
use leasehold_projections::{ReconcileError, Reconciler, Seen};

use super::{retry, settled};
use crate::PgReadModels;
use crate::dispatch::rental::{Providers, observation_key};
use crate::providers::ProviderError;
use crate::providers::wire::CapacityRef;

/// How often the observer sweeps when nothing else is said.
pub const OBSERVE_EVERY_DEFAULT: TimeDelta = TimeDelta::seconds(15);

/// Most looks one sweep asks for.
pub const LOOKS_PER_SWEEP: i64 = 200;

/// The observer.
#[derive(Debug)]
pub struct RentalObserver<S> {
    rentals: RentalService<S>,
    providers: Providers,
    read_models: PgReadModels,
    every: TimeDelta,
    next_sweep: std::sync::Mutex<Option<DateTime<Utc>>>,
    /// Where the next sweep's page starts (the last rental looked at; none: from the first).
    after: std::sync::Mutex<Option<uuid::Uuid>>,
}

impl<S> RentalObserver<S> {
    /// An observer recording through `rentals` what `providers` say, finding the rentals
    /// to look at in `read_models`, every `every`.
    pub fn new(
        rentals: RentalService<S>,
        providers: Providers,
        read_models: PgReadModels,
        every: TimeDelta,
    ) -> Self {
        Self {
            rentals,
            providers,
            read_models,
            every,
            next_sweep: std::sync::Mutex::new(None),
            after: std::sync::Mutex::new(None),
        }
    }
}

fn observer() -> Caller {
    Caller {
        actor: Actor { subject: "rental-observer".into(), role: "system".into() },
        tenant: None,
        provider: None,
        namespace: None,
    }
}

impl<S> RentalObserver<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    async fn sweep(&self) -> Result<(), ReconcileError> {
        let after = *self.after.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let due = self
            .read_models
            .rentals_to_observe((after, LOOKS_PER_SWEEP))
            .await
            .map_err(|error| retry("read rentals", &error))?;
        // A short page was the last: the next sweep starts from the first rental again.
        let next = (due.len() as i64 == LOOKS_PER_SWEEP).then(|| due.last().copied()).flatten();
        *self.after.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = next;
        for rental in due {
            let (owner, stored) = match self.rentals.owned(RentalId(rental)).await {
                Ok(found) => found,
                Err(leasehold_commands::CommandError::NotFound) => continue,
                Err(error) => return Err(retry("read a rental", &error)),
            };
            self.look(owner.as_str(), &stored).await?;
        }
        Ok(())
    }

    async fn look(&self, owner: &str, rental: &Rental) -> Result<(), ReconcileError> {
        let (Some(terms), Some(allocated)) = (rental.terms.as_ref(), rental.allocated.as_ref())
        else {
            return Ok(());
        };
        let Some(client) = self.providers.get(&terms.connection) else { return Ok(()) };
        let capacity = CapacityRef {
            workspace_id: owner.to_string(),
            connection_id: terms.connection.as_str().to_string(),
            rental_id: terms.rental.0,
            native_ref: allocated.native_ref.as_str().to_string(),
            ownership_token: rental.ownership.as_ref().map(|t| t.0.clone()).unwrap_or_default(),
        };
        let (id, generation) = (terms.rental, rental.generation);
        match client.observe(&capacity).await {
            Ok(observation) => {
                let key = observation_key(id, generation, &observation);
                let connection = &terms.connection;
                let observed = self
                    .rentals
                    .observe(&observer(), &key, connection, (id, generation, observation))
                    .await;
                settled("record a look", observed)
            }
            Err(ProviderError::NotFound) => {
                // Keyed by the generation and the status it was seen in: a termination asked
                // later is weighed again.
                let key = format!("rental-absent:{}:{generation}:{}", id.0, rental.status.name());
                let absent = self
                    .rentals
                    .not_found(&observer(), &key, &terms.connection, (id, generation))
                    .await;
                settled("record a not-found", absent)
            }
            Err(error) => {
                tracing::warn!(rental = %id.0, connection = %terms.connection, %error, "a provider gave no look");
                Ok(())
            }
        }
    }
}

impl<S> Reconciler for RentalObserver<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    const NAME: &'static str = "rental-observer";
    const VERSION: u32 = 1;

    async fn reconcile(&self, seen: Seen<'_>) -> Result<Option<DateTime<Utc>>, ReconcileError> {
        let scheduled = *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if scheduled.is_some_and(|at| seen.now < at) {
            return Ok(scheduled);
        }
        let next = seen.now + self.every;
        *self.next_sweep.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(next);
        self.sweep().await?;
        Ok(Some(next))
    }
}
