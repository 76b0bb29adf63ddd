//! The run's application service: a tenant submits a run to one of its rentals and cancels
//! it; the run dispatcher starts an attempt when the run's booking runs and its rental's node
//! is ready.
//!
//! Every run command runs with its consequences derived from its decision ([`run_effects`]):
//! a booking on the rental's schedule (which holds at most one running and four queued), the
//! launch order on the node (decided under the node's fencing token: an order decided before
//! a re-enrollment is `FENCED` and nothing is appended), the stop a cancel orders, and the
//! booking's release when the run closes, all in the same append as the run's events.

use leasehold_domain::node::{ManifestDigest, Node, NodeCommand, NodeId, NodeOrder, NodeStatus};
use leasehold_domain::rental::{Booking, Rental, RentalCommand, RentalId, RentalStatus};
use leasehold_domain::run::{
    AttemptId, BookingId, CANCEL_GRACE_SECONDS, Run, RunBooking, RunCommand, RunEffect, RunError,
    RunEvent, RunId, RunTerms, StopOrder, run_effects,
};
use leasehold_domain::values::{OperationId, Reason};
use leasehold_domain::{RefusalKind, TenantId};
use serde::Serialize;
use uuid::Uuid;

use crate::lease_service::{Caller, minted_id};
use crate::{
    CommandError, CommandOutcome, CommandPipeline, CommandRequest, CommandStore, Link,
    LinkedCommand, caller_hash,
};

type Result<T> = std::result::Result<T, CommandError<RunError>>;

/// What a tenant asks of a new run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SubmitRun {
    /// The tenant's rental to run on.
    pub rental: RentalId,
    /// Exactly what runs.
    pub manifest_digest: ManifestDigest,
    /// How long it may run.
    pub max_runtime_seconds: u64,
}

/// A run command's result, with the run it ran on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOutcome {
    /// The run.
    pub run: RunId,
    /// What the pipeline answered.
    pub outcome: CommandOutcome,
}

/// Runs run commands.
#[derive(Debug, Clone)]
pub struct RunService<S> {
    pipeline: CommandPipeline<S>,
}

impl<S> RunService<S>
where
    S: CommandStore + Clone + Send + Sync + 'static,
{
    /// A service over `pipeline`.
    pub fn new(pipeline: CommandPipeline<S>) -> Self {
        Self { pipeline }
    }

    /// The pipeline commands run through.
    pub fn pipeline(&self) -> &CommandPipeline<S> {
        &self.pipeline
    }

    /// A tenant submits a run and books it on its rental's schedule (refused when the
    /// schedule is full: the run then ends, failed, with nothing launched).
    ///
    /// # Errors
    /// `NotFound` for a rental that is not the tenant's; the rental's refusal of the booking
    /// (`INVALID_STATE` when it is not active or its schedule is full); the pipeline's.
    pub async fn submit(&self, caller: &Caller, key: &str, ask: &SubmitRun) -> Result<RunOutcome> {
        let tenant = own_tenant(caller)?;
        let run = RunId(minted_id("run", tenant, key));
        let (owner, rental) = self.rental(ask.rental).await?;
        if &owner != tenant {
            return Err(CommandError::NotFound);
        }
        let terms = RunTerms {
            run,
            manifest_digest: ask.manifest_digest.clone(),
            max_runtime_seconds: ask.max_runtime_seconds,
        };
        let hash = caller_hash("run", &run.stream_id(), ask);
        let submit =
            self.request(caller, tenant.clone(), run, key, RunCommand::Submit { terms })?;
        self.run(submit.hashed_as(hash), run).await?;
        let booking = BookingId(minted_id("run-booking", tenant, key));
        let mut generation = rental.generation;
        let mut tries = 0;
        loop {
            let booking = RunBooking { booking, rental: ask.rental, generation };
            // One key per generation: a booking fenced by a resume is asked again under the
            // resumed one, not answered with the recorded refusal.
            let book_key = format!("{key}:book:{generation}");
            let book = RunCommand::Book { booking };
            let book = self.request(caller, tenant.clone(), run, &book_key, book)?;
            let refused = match self.run(book, run).await {
                Err(refused @ CommandError::LinkedRefused { .. }) => refused,
                done => return done,
            };
            let (_, now) = self.rental(ask.rental).await?;
            let resumed =
                matches!(refused, CommandError::LinkedRefused { kind: RefusalKind::Fenced, .. });
            if resumed && now.generation != generation && tries < BOOK_TRIES {
                (generation, tries) = (now.generation, tries + 1);
                continue;
            }
            let why = if resumed { "RentalResumed" } else { booking_refused(&now) };
            let reason =
                leasehold_domain::values::Reason::parse("reason", why).expect("a valid reason");
            let give_up = self.request(
                caller,
                tenant.clone(),
                run,
                &format!("{key}:give-up"),
                RunCommand::GiveUp { reason },
            )?;
            self.run(give_up, run).await?;
            return Err(refused);
        }
    }

    /// A tenant cancels its run: at once when nothing was launched, else by ordering its node
    /// to stop it (the outcome is recorded when the node applies the stop, unless an exit
    /// came first).
    ///
    /// # Errors
    /// The run's refusal; the pipeline's.
    pub async fn cancel(&self, caller: &Caller, key: &str, run: RunId) -> Result<RunOutcome> {
        let tenant = own_tenant(caller)?;
        let mut tries = 0;
        loop {
            let (owner, stored) = self.owned(run).await?;
            if &owner != tenant {
                return Err(CommandError::NotFound);
            }
            let stop = self.stop_order(&stored).await?;
            // What the tenant asked is the cancel of this run; the stop is what the service
            // read of the node, which a retry may read otherwise.
            let hash = caller_hash("run-cancel", &run.stream_id(), &());
            let request = self
                .request(caller, tenant.clone(), run, key, RunCommand::Cancel { stop })?
                .hashed_as(hash);
            let follows = effects_follow::<S>(run);
            let executed = self.pipeline.execute_following(request, &[], &follows);
            match Box::pin(executed).await {
                // The node enrolled again between the look and the append: look again.
                Err(CommandError::LinkedRefused { kind: RefusalKind::Fenced, .. })
                    if tries < CANCEL_TRIES =>
                {
                    tries += 1;
                }
                done => return Ok(RunOutcome { run, outcome: done? }),
            }
        }
    }

    /// Orders the stop a cancel asked for and could not order then (its launch was not
    /// answered yet, or its node could not take orders): once the run is running and its
    /// node ready, under the node's fencing token now. `None` when there is nothing to order
    /// (no cancel waiting on a stop) or it must still wait.
    ///
    /// # Errors
    /// The run's refusal; the node's, linked (`FENCED` after a re-enrollment: look again);
    /// the pipeline's.
    pub async fn order_pending_stop(
        &self,
        caller: &Caller,
        owner: &TenantId,
        run: RunId,
    ) -> Result<Option<RunOutcome>> {
        let (_, stored) = self.owned(run).await?;
        // After STOP_TRIES_MAX stops the node did not act on, the run is left to operators.
        let waiting = stored.cancel_requested
            && stored.stop.is_none()
            && stored.stop_failures < STOP_TRIES_MAX;
        if !waiting || stored.status != leasehold_domain::run::RunStatus::Running {
            return Ok(None);
        }
        let Some(stop) = self.stop_order(&stored).await? else { return Ok(None) };
        let key = format!("stop-{}-{}", stop.operation.0, stop.fencing_token);
        let command = RunCommand::Cancel { stop: Some(stop) };
        let request = self.request(caller, owner.clone(), run, &key, command)?;
        self.run(request, run).await.map(Some)
    }

    /// The stop a cancel orders: under the current attempt's node's fencing token now, when
    /// that node can take orders. A node that cannot (lost, retired) takes none: the cancel
    /// is recorded all the same, and the run dispatcher orders the stop when the node is back
    /// ([`Self::order_pending_stop`]).
    async fn stop_order(&self, stored: &Run) -> Result<Option<StopOrder>> {
        let Some(attempt) = stored.current() else { return Ok(None) };
        let operation = OperationId(stop_operation(attempt.attempt, stored.stop_failures));
        let found = self
            .pipeline
            .state::<Node>(&attempt.node.stream_id())
            .await
            .map_err(CommandError::as_lookup)?;
        Ok(found
            .filter(|(_, _, node)| node.status == NodeStatus::Ready)
            .map(|(_, _, node)| StopOrder { fencing_token: node.fencing_token, operation }))
    }

    /// Starts an attempt of `run` (of `owner`'s) if its booking runs on its rental's
    /// schedule and the rental's node is ready: the launch is ordered on the node under the
    /// node's current fencing token, in the same append. `None` when it must wait.
    ///
    /// # Errors
    /// The run's refusal (`LaunchIndeterminate`: reconcile first); the node's, linked
    /// (`FENCED` after a re-enrollment); the pipeline's.
    pub async fn dispatch(
        &self,
        caller: &Caller,
        owner: &TenantId,
        run: RunId,
    ) -> Result<Option<RunOutcome>> {
        let (_, stored) = self.owned(run).await?;
        // Only a booked run awaits an attempt: one launching or past it has its attempt (a
        // dispatcher looking again, or a dispatch sent twice, finds nothing to do), and an
        // indeterminate launch is refused by the run itself until it is reconciled.
        use leasehold_domain::run::RunStatus as S;
        if matches!(stored.status, S::Launching | S::Running | S::Finished | S::Closed) {
            return Ok(None);
        }
        let Some(booking) = stored.booking else { return Ok(None) };
        let (_, rental) = self.rental(booking.rental).await?;
        let running = rental.schedule.running.is_some_and(|held| held.booking == booking.booking);
        let (Some(node), Some(terms)) = (rental.node, &rental.terms) else { return Ok(None) };
        if !running || rental.status != RentalStatus::Active {
            return Ok(None);
        }
        let found = self
            .pipeline
            .state::<Node>(&node.stream_id())
            .await
            .map_err(CommandError::as_lookup)?;
        let Some((_, _, node_state)) =
            found.filter(|(_, _, node)| node.status == NodeStatus::Ready)
        else {
            return Ok(None);
        };
        let n = stored.attempts.len() + 1;
        let attempt = AttemptId(minted_id("run-attempt", owner, &format!("{}:{n}", run.0)));
        let operation = OperationId(minted_id("run-launch", owner, &format!("{}:{n}", attempt.0)));
        let command = RunCommand::CreateAttempt {
            attempt,
            node,
            fencing_token: node_state.fencing_token,
            offer: terms.offer.clone(),
            operation,
        };
        let key = format!("attempt-{}", attempt.0);
        // What a dispatcher asks is this attempt of the run; the node and its token are what
        // it read, which another dispatcher racing an enrollment may read otherwise: the
        // loser is answered with the attempt recorded (or refused), never a key conflict.
        let hash = caller_hash("run-attempt", &run.stream_id(), &attempt);
        let request = self.request(caller, owner.clone(), run, &key, command)?.hashed_as(hash);
        self.run(request, run).await.map(Some)
    }

    /// The dispatcher lost the answer to `attempt`'s launch order (a timeout, a dropped
    /// connection): the launch is indeterminate, and no other attempt is made until the
    /// node's reconciliation (or a look at the workload) settles it.
    ///
    /// # Errors
    /// The run's refusal; the pipeline's.
    pub async fn launch_lost(
        &self,
        caller: &Caller,
        owner: &TenantId,
        (run, attempt): (RunId, AttemptId),
    ) -> Result<RunOutcome> {
        let answer = leasehold_domain::run::LaunchAnswer::Indeterminate;
        let command = RunCommand::LaunchAnswered { attempt, answer };
        let key = format!("launch-lost-{}", attempt.0);
        let request = self.request(caller, owner.clone(), run, &key, command)?;
        self.run(request, run).await
    }

    /// `node` was retired (its machine's generation ended): `run`, of `owner`'s, ends with it
    /// when its current attempt was launched there, and is left as it is otherwise.
    ///
    /// # Errors
    /// The run's refusal; the pipeline's.
    pub async fn node_retired(
        &self,
        caller: &Caller,
        owner: &TenantId,
        (run, node): (RunId, NodeId),
    ) -> Result<RunOutcome> {
        let key = format!("node-retired-{}-{}", run.0, node.0);
        let command = RunCommand::NodeRetired { node };
        let request = self.request(caller, owner.clone(), run, &key, command)?;
        self.run(request, run).await
    }

    /// No attempt of `run` (of `owner`'s) can ever be made: it fails for `reason` (its
    /// rental is gone) and closes, its booking released.
    ///
    /// # Errors
    /// The run's refusal (`INVALID_STATE` while a launch is in flight); the pipeline's.
    pub async fn give_up(
        &self,
        caller: &Caller,
        owner: &TenantId,
        (run, reason): (RunId, Reason),
    ) -> Result<RunOutcome> {
        let key = format!("give-up-{}-{}", run.0, reason.as_str());
        let command = RunCommand::GiveUp { reason };
        let request = self.request(caller, owner.clone(), run, &key, command)?;
        self.run(request, run).await
    }

    /// The run as stored now and its owner.
    ///
    /// # Errors
    /// [`CommandError::NotFound`] for no such run; a store failure.
    pub async fn owned(&self, run: RunId) -> Result<(TenantId, Run)> {
        let found = self.pipeline.state::<Run>(&run.stream_id()).await?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    async fn rental(&self, rental: RentalId) -> Result<(TenantId, Rental)> {
        let found = self
            .pipeline
            .state::<Rental>(&rental.stream_id())
            .await
            .map_err(CommandError::as_lookup)?;
        let (owner, _, stored) = found.ok_or(CommandError::NotFound)?;
        Ok((owner, stored))
    }

    fn request(
        &self,
        caller: &Caller,
        tenant: TenantId,
        run: RunId,
        key: &str,
        command: RunCommand,
    ) -> Result<CommandRequest<Run>> {
        Ok(caller.request(tenant, (run.stream_id(), key), command, ())?)
    }

    async fn run(&self, request: CommandRequest<Run>, run: RunId) -> Result<RunOutcome> {
        let follows = effects_follow::<S>(run);
        let outcome = Box::pin(self.pipeline.execute_following(request, &[], &follows)).await?;
        Ok(RunOutcome { run, outcome })
    }
}

/// How often a cancel looks again at a node that enrolled again under it.
const CANCEL_TRIES: u32 = 3;

/// How often a submit books again on a rental that resumed under it.
const BOOK_TRIES: u32 = 3;

/// Why a rental refused a booking, as the run's failure says it: read from the rental after
/// the refusal (its message is not a reason a tenant is shown).
fn booking_refused(rental: &Rental) -> &'static str {
    if rental.status == RentalStatus::Active { "ScheduleFull" } else { "RentalNotActive" }
}

/// The rental and node commands a run command's decision carries ([`run_effects`]).
pub fn effects_follow<S: CommandStore + Send + Sync + 'static>(
    run: RunId,
) -> impl Fn(&Run, &[RunEvent]) -> Vec<Box<dyn Link<S>>> + Send + Sync {
    move |before, events| {
        run_effects(before, events)
            .into_iter()
            .map(|effect| -> Box<dyn Link<S>> {
                match effect {
                    RunEffect::AdmitAttempt { booking, node, attempt } => {
                        let command =
                            RentalCommand::AdmitAttempt { booking: booking.booking, node, attempt };
                        Box::new(LinkedCommand::<Rental>::new(
                            booking.rental.stream_id(),
                            command,
                            (),
                        ))
                    }
                    RunEffect::Book { booking } => {
                        let command = RentalCommand::Book {
                            generation: booking.generation,
                            booking: Booking { booking: booking.booking, run },
                        };
                        Box::new(LinkedCommand::<Rental>::new(
                            booking.rental.stream_id(),
                            command,
                            (),
                        ))
                    }
                    RunEffect::ReleaseBooking { booking } => {
                        let command = RentalCommand::ReleaseBooking { booking: booking.booking };
                        Box::new(LinkedCommand::<Rental>::new(
                            booking.rental.stream_id(),
                            command,
                            (),
                        ))
                    }
                    RunEffect::OrderLaunch { node, fencing_token, operation, order } => {
                        let command = NodeCommand::Order { operation, fencing_token, order };
                        Box::new(LinkedCommand::<Node>::new(node.stream_id(), command, ()))
                    }
                    RunEffect::OrderStop { node, attempt, stop } => {
                        let StopOrder { fencing_token, operation } = stop;
                        let order = NodeOrder::StopWorkload {
                            run,
                            attempt,
                            grace_seconds: CANCEL_GRACE_SECONDS,
                        };
                        let command = NodeCommand::Order { operation, fencing_token, order };
                        Box::new(LinkedCommand::<Node>::new(node.stream_id(), command, ()))
                    }
                }
            })
            .collect()
    }
}

/// The stop operation of a cancelled attempt: one per attempt, whoever cancels how often.
/// Most stop orders a cancel makes of one attempt.
pub const STOP_TRIES_MAX: u32 = 5;

/// The operation of the `failed`-th retry of `attempt`'s stop (the first, 0, as it always was).
fn stop_operation(attempt: AttemptId, failed: u32) -> Uuid {
    use sha2::{Digest, Sha256};
    let mut input = [b"leasehold/stop\0".as_slice(), attempt.0.as_bytes()].concat();
    if failed > 0 {
        input.extend_from_slice(&failed.to_be_bytes());
    }
    let digest = Sha256::digest(input);
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Uuid::new_v8(bytes)
}

fn own_tenant(caller: &Caller) -> Result<&TenantId> {
    caller.own_tenant()
}
