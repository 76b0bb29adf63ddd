//! Rented capacity under the hammer: 8 rental slots of acme's, whose GPU quota (6, one GPU a
//! rental) is below the slots' number. Each rental is driven through its life by its tenant,
//! its provider's reports and its node's agent: provisioned, accepted, seen active; its node
//! enrolled (and now and then enrolled again, which raises the fencing token and closes the
//! session before), beating with facts dated by a node clock hours off Leasehold's; one run
//! at a time booked, dispatched, launched, exited and its workload gone, or cancelled, or its
//! answer lost and reconciled; stopped and resumed (a new generation and node); terminated and
//! seen gone, its open run closed as the reconcilers would; then the slot rents anew.
//!
//! Now and then a provider reports under a generation that is not the rental's, or a node
//! under a session an enrollment closed: both must be fenced. The provider's clock runs
//! minutes behind Leasehold's and each node's hours off it: agents' times are recorded and
//! order nothing. Enrollments are sent once, never redelivered: each is its own command by
//! design (an agent that lost the answer enrolls again, which is a resume).

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};
use leasehold_adapters::PgEventStore;
use leasehold_commands::enrollment::{NodeSession, node_of};
use leasehold_commands::lease_service::{Caller, minted_id};
use leasehold_commands::node_service::{Enrollment, NodeService, Presented};
use leasehold_commands::quota::WorkloadQuotas;
use leasehold_commands::rental_service::RentalService;
use leasehold_commands::run_service::{RunService, SubmitRun};
use leasehold_commands::{CommandError, CommandPipeline};
use leasehold_domain::TenantId;
use leasehold_domain::node::{ManifestDigest, NodeError, NodeId, NodeStatus, OperationResult};
use leasehold_domain::rental::{
    CapacityObservation, CapacityReceipt, CapacityState, Pricing, Rental, RentalId, RentalStatus,
};
use leasehold_domain::run::{Run, RunId, RunStatus, WorkloadObservation, WorkloadPhase};
use leasehold_domain::values::Reason;
use leasehold_domain::workload_quota::{Limit, WorkloadKind};

use super::delivery::{Fault, Observer, deliver};
use super::{Answer, Rng, SLOTS, Slots, Via, answer};
use crate::rented::support::{
    Services, agent_version, ask, connection, facts, key, native, provider, rental_config, tenant,
};

/// acme's GPU quota for rentals: fewer rentals than slots.
const GPUS: u64 = 6;
/// acme's quota of runs open at once.
const RUNS: u64 = 6;

pub struct Rented {
    slots: Slots<RentalId>,
    /// Every credential each node was given, in order: the last is its session, the others
    /// closed by the enrollment after them.
    credentials: Mutex<HashMap<NodeId, Vec<String>>>,
    /// Each rental's runs not seen closed yet, oldest first.
    runs: Mutex<HashMap<RentalId, Vec<RunId>>>,
    processes: [Services; 2],
}

/// What one step works with: the process's services, the delivery, the step's key, and who
/// sends what (acme as its tenant, the provider's agent and the reconcilers as `system`).
struct Turn<'a> {
    services: &'a Services,
    delivery: (Fault, &'a Observer),
    key: &'a str,
    tenant: Caller,
    system: Caller,
    owner: TenantId,
}

impl Rented {
    pub async fn new(pipelines: &[CommandPipeline<PgEventStore>; 2]) -> Rented {
        let over = |pipeline: &CommandPipeline<PgEventStore>| Services {
            rentals: RentalService::new(pipeline.clone(), rental_config()),
            nodes: NodeService::new(pipeline.clone(), key()),
            runs: RunService::new(pipeline.clone()),
        };
        let quotas = WorkloadQuotas::new(pipelines[0].clone());
        let limits = [(WorkloadKind::Rental, "gpus", GPUS), (WorkloadKind::Run, "count", RUNS)];
        for (kind, resource, max) in limits {
            let limits = vec![Limit { resource: resource.into(), max }];
            let key = format!("{kind:?}-limits");
            let (operator, owner) = (super::vms::operator(), acme());
            let set = quotas.set_limits(&operator, &key, (&owner, kind, limits));
            set.await.expect("set");
        }
        Rented {
            slots: Slots::new(),
            credentials: Mutex::default(),
            runs: Mutex::default(),
            processes: [over(&pipelines[0]), over(&pipelines[1])],
        }
    }

    pub async fn step(&self, (process, delivery): Via<'_>, rng: &mut Rng, key: String) -> Answer {
        let turn = Turn {
            services: &self.processes[process],
            delivery,
            key: &key,
            tenant: tenant("acme"),
            system: provider(),
            owner: acme(),
        };
        let slot = rng.below(SLOTS);
        let (round, rental) = self.slots.get(slot);
        let Some(rental) = rental else {
            let ask = ask();
            let provision = || turn.services.rentals.provision(&turn.tenant, turn.key, &ask);
            let answered = deliver(turn.delivery, provision).await;
            if matches!(answered, Answer::Applied) {
                self.slots.created(slot, round, RentalId(minted_id("rental", &turn.owner, &key)));
            }
            return answered;
        };
        let stored = match turn.services.rentals.owned(rental).await {
            Ok((_, stored)) => stored,
            Err(error) => return answer::<(), _>(Err(error)),
        };
        let reported = (rental, reported_generation(&stored, rng));
        match stored.status {
            RentalStatus::Requested => accept(&turn, reported).await,
            RentalStatus::Starting => look(&turn, reported, CapacityState::Active).await,
            RentalStatus::Stopping => look(&turn, reported, CapacityState::Stopped).await,
            RentalStatus::Terminating => look(&turn, reported, CapacityState::Terminated).await,
            RentalStatus::Stopped if rng.one_in(3) => terminate(&turn, reported).await,
            RentalStatus::Stopped => {
                let resume = || turn.services.rentals.resume(&turn.tenant, turn.key, reported);
                deliver(turn.delivery, resume).await
            }
            RentalStatus::Active => self.active(&turn, (rental, &stored), rng).await,
            RentalStatus::Terminated | RentalStatus::None => {
                match self.open_run(&turn, rental).await {
                    Some(closing) => closing,
                    None => self.slots.ended(slot, round),
                }
            }
        }
    }

    /// An active rental: its node enrolls or beats, its run moves on, or its tenant stops or
    /// terminates it.
    async fn active(
        &self,
        turn: &Turn<'_>,
        (rental, stored): (RentalId, &Rental),
        rng: &mut Rng,
    ) -> Answer {
        let node = node_of(rental, stored.generation);
        let node_state = match turn.services.nodes.owned(node).await {
            Ok((_, node_state)) => node_state,
            Err(error) => return answer::<(), _>(Err(error)),
        };
        let generation = (rental, stored.generation);
        match (node_state.status, rng.below(16)) {
            (NodeStatus::Enrolling, _) => {
                self.enroll(turn, node, (rental, stored.generation)).await
            }
            (NodeStatus::Lost, _) | (NodeStatus::Ready, 0) => self.enroll_again(turn, node).await,
            (NodeStatus::Ready, 1) => {
                let stop = || turn.services.rentals.stop(&turn.tenant, turn.key, generation);
                deliver(turn.delivery, stop).await
            }
            (NodeStatus::Ready, 2) => terminate(turn, generation).await,
            (NodeStatus::Ready, 3..=6) => self.heartbeat(turn, node, rng).await,
            (NodeStatus::Ready, _) => self.run_step(turn, (rental, node), rng).await,
            (NodeStatus::Retired | NodeStatus::None, _) => Answer::Moved,
        }
    }

    /// The node's first enrollment, with its bootstrap's token (racing clients: one spends it,
    /// the others are refused as not found).
    async fn enroll(
        &self,
        turn: &Turn<'_>,
        node: NodeId,
        (rental, generation): (RentalId, u64),
    ) -> Answer {
        let token = key().enrollment_token(node);
        let presented = Presented::Token { token: &token, rental, generation };
        let enrolled =
            turn.services.nodes.enroll(node, presented, (agent_version(), facts())).await;
        self.keep(node, enrolled)
    }

    /// The node enrolls again with its session's credential: the fencing token rises.
    async fn enroll_again(&self, turn: &Turn<'_>, node: NodeId) -> Answer {
        let Some(credential) = self.session_credential(node, false) else { return Answer::Moved };
        let presented = Presented::Credential(&credential);
        let enrolled =
            turn.services.nodes.enroll(node, presented, (agent_version(), facts())).await;
        self.keep(node, enrolled)
    }

    /// Keeps an enrollment's credential as the node's session.
    fn keep(&self, node: NodeId, enrolled: Result<Enrollment, CommandError<NodeError>>) -> Answer {
        match enrolled {
            Ok(enrollment) => {
                let mut credentials = self.credentials.lock().expect("not poisoned");
                credentials.entry(node).or_default().push(enrollment.credential);
                Answer::Applied
            }
            Err(error) => answer::<(), _>(Err(error)),
        }
    }

    /// The node's session's credential, or (when `stale`) one an enrollment since closed.
    fn session_credential(&self, node: NodeId, stale: bool) -> Option<String> {
        let credentials = self.credentials.lock().expect("not poisoned");
        let given = credentials.get(&node)?;
        let closed = given.len().saturating_sub(1);
        let at = if stale && closed > 0 { closed - 1 } else { closed };
        given.get(at).cloned()
    }

    /// The session a node's report goes under: now and then a closed one (fenced).
    fn session(&self, turn: &Turn<'_>, node: NodeId, rng: &mut Rng) -> Option<NodeSession> {
        let credential = self.session_credential(node, rng.one_in(6))?;
        turn.services.nodes.verify(&credential).ok()
    }

    async fn heartbeat(&self, turn: &Turn<'_>, node: NodeId, rng: &mut Rng) -> Answer {
        let Some(session) = self.session(turn, node, rng) else { return Answer::Moved };
        let mut facts = crate::rented::support::facts();
        facts.observed_at = node_clock(rng);
        let beat = || turn.services.nodes.heartbeat(&session, turn.key, Some(facts.clone()));
        deliver(turn.delivery, beat).await
    }

    /// The rental's first open run moves on by what its state calls for; a new one is
    /// submitted when every one has closed.
    async fn run_step(
        &self,
        turn: &Turn<'_>,
        (rental, node): (RentalId, NodeId),
        rng: &mut Rng,
    ) -> Answer {
        let Some((run, stored)) = self.open_run_of(turn, rental).await else {
            return self.submit(turn, rental).await;
        };
        if let Some(closing) = retired_under(turn, (run, &stored), node).await {
            return closing;
        }
        let runs = &turn.services.runs;
        let Some(session) = self.session(turn, node, rng) else { return Answer::Moved };
        let attempt = stored.current().cloned();
        let nodes = &turn.services.nodes;
        match (stored.status, attempt) {
            (RunStatus::Requested, _) => give_up(turn, run).await,
            (RunStatus::Booked, _) => {
                let dispatch = || runs.dispatch(&turn.system, &turn.owner, run);
                deliver(turn.delivery, dispatch).await
            }
            (RunStatus::Launching, Some(attempt)) if rng.one_in(8) => {
                let lost = || runs.launch_lost(&turn.system, &turn.owner, (run, attempt.attempt));
                deliver(turn.delivery, lost).await
            }
            (RunStatus::Launching, Some(attempt)) => {
                let settled = (attempt.operation, OperationResult::Applied);
                deliver(turn.delivery, || nodes.settle(&session, turn.key, settled.clone())).await
            }
            (RunStatus::Indeterminate, Some(attempt)) => {
                let applied = if rng.one_in(2) { vec![attempt.operation] } else { Vec::new() };
                let account = || nodes.reconcile(&session, turn.key, (applied.clone(), None));
                deliver(turn.delivery, account).await
            }
            (RunStatus::Running, _) if stored.stop.is_some() => {
                let stop = stored.stop.expect("a stop ordered").operation;
                let settled = (stop, OperationResult::Applied);
                deliver(turn.delivery, || nodes.settle(&session, turn.key, settled.clone())).await
            }
            (RunStatus::Running, _) if rng.one_in(4) => {
                deliver(turn.delivery, || runs.cancel(&turn.tenant, turn.key, run)).await
            }
            (RunStatus::Running | RunStatus::Finished, Some(attempt)) => {
                let phase = match stored.status {
                    RunStatus::Running => WorkloadPhase::Exited,
                    _ => WorkloadPhase::Absent,
                };
                let look = workload_look((run, attempt.attempt), phase, rng);
                deliver(turn.delivery, || nodes.observe(&session, turn.key, look.clone())).await
            }
            _ => Answer::Moved,
        }
    }

    async fn submit(&self, turn: &Turn<'_>, rental: RentalId) -> Answer {
        let digest = ManifestDigest::parse("d", format!("sha256:{}", "ab".repeat(32)));
        let ask =
            SubmitRun { rental, manifest_digest: digest.expect("valid"), max_runtime_seconds: 600 };
        let submit = || turn.services.runs.submit(&turn.tenant, turn.key, &ask);
        let answered = deliver(turn.delivery, submit).await;
        // Refused or not, the run may exist (a run the rental could not book ends failed).
        let run = RunId(minted_id("run", &turn.owner, turn.key));
        self.runs.lock().expect("not poisoned").entry(rental).or_default().push(run);
        answered
    }

    /// The rental's first run not closed, as stored, if any. Clients racing on one rental may
    /// each submit one: every run is followed until it closes, as the run dispatcher follows
    /// them all; the closed ones are forgotten.
    async fn open_run_of(&self, turn: &Turn<'_>, rental: RentalId) -> Option<(RunId, Run)> {
        let runs = self.runs.lock().expect("not poisoned").get(&rental).cloned()?;
        for run in runs {
            let Ok((_, stored)) = turn.services.runs.owned(run).await else { continue };
            if stored.status != RunStatus::Closed {
                return Some((run, stored));
            }
            let mut held = self.runs.lock().expect("not poisoned");
            held.entry(rental).or_default().retain(|kept| *kept != run);
        }
        None
    }

    /// A gone rental's run still open, closed as the reconcilers would (its node retired, or
    /// given up when never launched); `None` once it is closed.
    async fn open_run(&self, turn: &Turn<'_>, rental: RentalId) -> Option<Answer> {
        let (run, stored) = self.open_run_of(turn, rental).await?;
        let node = stored.current().map(|attempt| attempt.node);
        Some(match node {
            Some(node) => {
                let retired =
                    || turn.services.runs.node_retired(&turn.system, &turn.owner, (run, node));
                deliver(turn.delivery, retired).await
            }
            None => give_up(turn, run).await,
        })
    }
}

/// When the run's current attempt is on a node other than the rental's current one (the
/// rental resumed), that node is retired: the run ends with it, as the reconciler would end it.
async fn retired_under(
    turn: &Turn<'_>,
    (run, stored): (RunId, &Run),
    node: NodeId,
) -> Option<Answer> {
    let on = stored.current().map(|attempt| attempt.node).filter(|on| *on != node)?;
    if stored.status == RunStatus::Closed {
        return None;
    }
    let retired = || turn.services.runs.node_retired(&turn.system, &turn.owner, (run, on));
    Some(deliver(turn.delivery, retired).await)
}

async fn give_up(turn: &Turn<'_>, run: RunId) -> Answer {
    let reason = Reason::parse("reason", "RentalGone").expect("valid");
    let give_up = || turn.services.runs.give_up(&turn.system, &turn.owner, (run, reason.clone()));
    deliver(turn.delivery, give_up).await
}

async fn terminate(turn: &Turn<'_>, generation: (RentalId, u64)) -> Answer {
    let terminate = || turn.services.rentals.terminate(&turn.tenant, turn.key, generation);
    deliver(turn.delivery, terminate).await
}

/// The provider's receipt for the rental's provision.
async fn accept(turn: &Turn<'_>, (rental, generation): (RentalId, u64)) -> Answer {
    let receipt = CapacityReceipt {
        native_ref: native(),
        state: CapacityState::Requested,
        accepted_at: provider_clock(),
        duplicate: false,
        interruptible: false,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 900_000, exact: true },
    };
    let (reported, connection) = ((rental, generation, receipt), connection());
    let accept =
        || turn.services.rentals.accept(&turn.system, turn.key, &connection, reported.clone());
    deliver(turn.delivery, accept).await
}

/// The provider's look at the rental's machine, in `state`.
async fn look(
    turn: &Turn<'_>,
    (rental, generation): (RentalId, u64),
    state: CapacityState,
) -> Answer {
    let at = provider_clock();
    let observation = CapacityObservation {
        native_ref: native(),
        state,
        state_since: Some(at),
        observed_at: at,
        interrupted: false,
    };
    let (reported, connection) = ((rental, generation, observation), connection());
    let observe =
        || turn.services.rentals.observe(&turn.system, turn.key, &connection, reported.clone());
    deliver(turn.delivery, observe).await
}

/// The generation a provider's report names: now and then one that is not the rental's.
fn reported_generation(stored: &Rental, rng: &mut Rng) -> u64 {
    match rng.below(12) {
        0 => stored.generation + 1,
        1 if stored.generation > 1 => stored.generation - 1,
        _ => stored.generation,
    }
}

/// The provider's clock: minutes behind Leasehold's, and moving forward with it (its looks
/// are ordered by it).
fn provider_clock() -> DateTime<Utc> {
    Utc::now() - TimeDelta::minutes(37)
}

/// A node's clock at one report: anywhere within half a day of Leasehold's.
fn node_clock(rng: &mut Rng) -> DateTime<Utc> {
    Utc::now() + TimeDelta::seconds(rng.below(86_400) as i64 - 43_200)
}

fn workload_look(
    (run, attempt): (RunId, leasehold_domain::run::AttemptId),
    phase: WorkloadPhase,
    rng: &mut Rng,
) -> WorkloadObservation {
    let exited = phase == WorkloadPhase::Exited;
    WorkloadObservation {
        run,
        attempt,
        phase,
        observed_at: node_clock(rng),
        started_at: None,
        finished_at: None,
        exit_code: exited.then_some(rng.below(2) as i32),
        oom_killed: false,
    }
}

fn acme() -> TenantId {
    TenantId::parse("acme").expect("valid")
}
