//! Issue 17, part 3: many clients hammering 8 aggregates of each kind with mixed commands,
//! from two processes' worth of pipelines (each with its own pool), and then the whole log
//! read once: every stream's versions contiguous, and every conservation invariant holding
//! at every cursor (`leasehold_tests::invariants`).
//!
//! Each kind keeps 8 **slots**; a slot holds one aggregate at a time and moves on to a new
//! one when its aggregate's life ends, so creations keep competing for limits set below the
//! slots' number (workload quotas of leases and VMs, runner capacity, hosts with room for one
//! VM each, some cordoned now and then). A client picks a kind and a slot at random, reads
//! the aggregate's state, and sends the command its state calls for, now and then a stale one
//! (a superseded operation, an old epoch) that must be fenced. Clients on the same slot race:
//! that is the point. A refusal is an answer; a store failure, a bad-input answer to our
//! valid input, or an idempotency conflict is a defect.
//!
//! CI runs 64 clients for 20 commands each. The long run sets
//! `LEASEHOLD_HAMMER_SECONDS=60` (and `LEASEHOLD_HAMMER_SEED` to repeat a run's choices; the
//! interleaving is the scheduler's).

mod checks;
mod delivery;
mod leases;
mod machine;
mod rented;
mod runners;
mod snapshots;
mod vms;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use leasehold_adapters::StoreConfig;
use leasehold_commands::{CommandError, CommandPipeline, ErrorClass, PipelineConfig};
use leasehold_domain::Refusal;
use leasehold_tests::TestDb;
use leasehold_tests::invariants::audit;

use delivery::Fault;
use leasehold_tests::rng::Rng;

/// How much load, from the environment.
struct Load {
    clients: usize,
    /// Commands per client, when no time is set.
    steps: usize,
    /// How long each client keeps sending, when set.
    seconds: Option<u64>,
    seed: u64,
}

fn load() -> Load {
    let number = |name: &str| std::env::var(name).ok().and_then(|value| value.parse().ok());
    Load {
        clients: number("LEASEHOLD_HAMMER_CLIENTS").map_or(64, |n: u64| n as usize),
        steps: 20,
        seconds: number("LEASEHOLD_HAMMER_SECONDS"),
        seed: leasehold_tests::rng::seed_from_env("LEASEHOLD_HAMMER_SEED"),
    }
}

/// What one command came to.
#[derive(Debug)]
enum Answer {
    Applied,
    /// A refusal the domain or the pipeline gives under contention or for a stale actor, or
    /// `UNAVAILABLE` (a state read on a session that was ended).
    Refused(ErrorClass),
    /// Nothing was sent: the slot's aggregate had ended and the slot moved on.
    Moved,
    /// A defect: the store failed, or valid input was called bad.
    Failed(String),
}

fn answer<T, E: Refusal>(result: Result<T, CommandError<E>>) -> Answer {
    match result {
        Ok(_) => Answer::Applied,
        Err(error) => match error.class() {
            class @ (ErrorClass::Internal
            | ErrorClass::BadInput
            | ErrorClass::IdempotencyConflict) => Answer::Failed(format!("{class:?}: {error}")),
            class => Answer::Refused(class),
        },
    }
}

/// Per kind: how many commands applied, were refused (by class), and failed.
#[derive(Debug, Default)]
struct Tally {
    applied: BTreeMap<&'static str, usize>,
    refused: BTreeMap<String, usize>,
    failures: Vec<String>,
}

impl Tally {
    fn count(&mut self, kind: &'static str, answer: Answer) {
        match answer {
            Answer::Applied => *self.applied.entry(kind).or_default() += 1,
            Answer::Refused(class) => {
                *self.refused.entry(format!("{kind} {class:?}")).or_default() += 1
            }
            Answer::Moved => {}
            Answer::Failed(failure) => self.failures.push(format!("{kind}: {failure}")),
        }
    }

    fn merge(&mut self, other: Tally) {
        for (kind, n) in other.applied {
            *self.applied.entry(kind).or_default() += n;
        }
        for (class, n) in other.refused {
            *self.refused.entry(class).or_default() += n;
        }
        self.failures.extend(other.failures);
    }
}

/// Every kind's slots and the services of two processes.
struct World {
    leases: leases::Leases,
    vms: vms::Vms,
    runners: runners::Runners,
    rented: rented::Rented,
    snapshots: snapshots::Snapshots,
    observer: delivery::Observer,
}

impl World {
    async fn new(db: &TestDb, processes: [Pipeline; 2]) -> World {
        World {
            leases: leases::Leases::new(&processes).await,
            vms: vms::Vms::new(db, &processes).await,
            runners: runners::Runners::new(&processes).await,
            rented: rented::Rented::new(&processes).await,
            snapshots: snapshots::Snapshots::new(db, &processes).await,
            observer: delivery::Observer::on(db).await,
        }
    }

    /// One command of a kind, on a slot, by a process drawn from `rng`, delivered under
    /// `fault`.
    async fn step(&self, rng: &mut Rng, key: String, fault: Fault) -> (&'static str, Answer) {
        let process = rng.below(2);
        let delivery = (fault, &self.observer);
        match rng.below(5) {
            0 => ("lease", self.leases.step((process, delivery), rng, key).await),
            1 => ("vm", self.vms.step((process, delivery), rng, key).await),
            2 => ("runner", self.runners.step((process, delivery), rng, key).await),
            3 => ("rented", self.rented.step((process, delivery), rng, key).await),
            _ => ("snapshot", self.snapshots.step((process, delivery), rng, key).await),
        }
    }
}

type Pipeline = CommandPipeline<leasehold_adapters::PgEventStore>;

/// Which process sends a command, and how it is delivered.
type Via<'a> = (usize, (Fault, &'a delivery::Observer));

/// A pipeline over a pool of its own (8 connections), deciding again after lost races long
/// enough for many contenders, as a `serve` process's would.
fn process(db: &TestDb) -> Pipeline {
    let store = db.store_with(StoreConfig { pool_size: 8, ..StoreConfig::default() });
    CommandPipeline::new(store, PipelineConfig { retries_max: 32, ..PipelineConfig::default() })
}

async fn client(
    world: std::sync::Arc<World>,
    load: (u64, usize, Option<Instant>),
    n: usize,
) -> Tally {
    let (seed, steps, until) = load;
    let mut rng = Rng::new(seed ^ (n as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut tally = Tally::default();
    for step in 0.. {
        let more = match until {
            Some(until) => Instant::now() < until,
            None => step < steps,
        };
        if !more {
            break;
        }
        let (kind, answer) = world.step(&mut rng, format!("c{n}-s{step}"), Fault::None).await;
        tally.count(kind, answer);
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_clients_on_eight_aggregates_of_each_kind_break_no_invariant_at_any_cursor() {
    let load = load();
    eprintln!("hammer: seed {} (LEASEHOLD_HAMMER_SEED repeats its choices)", load.seed);
    let db = TestDb::migrated().await;
    let world = std::sync::Arc::new(World::new(&db, [process(&db), process(&db)]).await);
    let until = load.seconds.map(|s| Instant::now() + Duration::from_secs(s));
    let clients: Vec<_> = (0..load.clients)
        .map(|n| tokio::spawn(client(world.clone(), (load.seed, load.steps, until), n)))
        .collect();
    let mut tally = Tally::default();
    for client in clients {
        tally.merge(client.await.expect("the client ran"));
    }
    let audit = audit(&db).await;
    eprintln!(
        "hammer: applied {:?}; refused {:?}; {} events over {} streams, {} reservations and {} \
         generations/tokens/epochs checked",
        tally.applied, tally.refused, audit.events, audit.streams, audit.reservations, audit.rising
    );
    eprintln!("hammer: events by type {:?}", event_types(&db).await);
    assert_eq!(tally.failures, Vec::<String>::new(), "no command failed");
    let unavailable = tally.refused.keys().filter(|class| class.ends_with("Unavailable"));
    assert_eq!(unavailable.count(), 0, "no session ended, so nothing unavailable");
    assert_eq!(audit.violations, Vec::<String>::new(), "no invariant broken at any cursor");
    for kind in ["lease", "vm", "runner", "rented", "snapshot"] {
        assert!(tally.applied.get(kind) > Some(&0), "{kind} commands applied: {:?}", tally.applied);
    }
    assert!(audit.reservations > 0 && audit.rising > 0, "the checks had something to check");
}

/// How many events of each type the log holds: how far the clients drove each kind's life.
async fn event_types(db: &TestDb) -> BTreeMap<String, i64> {
    let client = db.client().await;
    let rows = client.query("SELECT event_type, count(*) FROM events GROUP BY 1", &[]).await;
    let rows = rows.expect("the log is readable");
    rows.iter().map(|row| (row.get(0), row.get(1))).collect()
}

/// How many aggregates of each kind the clients share.
const SLOTS: usize = 8;

/// A kind's slots: each its round (how many aggregates it has had) and its aggregate, once
/// created.
struct Slots<Id>(Vec<std::sync::Mutex<(u32, Option<Id>)>>);

impl<Id: Copy> Slots<Id> {
    fn new() -> Slots<Id> {
        Slots((0..SLOTS).map(|_| std::sync::Mutex::new((0, None))).collect())
    }

    fn get(&self, slot: usize) -> (u32, Option<Id>) {
        *self.0[slot].lock().expect("not poisoned")
    }

    /// The slot's aggregate of `round` exists (whoever created it).
    fn created(&self, slot: usize, round: u32, id: Id) {
        let mut held = self.0[slot].lock().expect("not poisoned");
        if held.0 == round {
            held.1 = Some(id);
        }
    }

    /// The slot's aggregate of `round` ended: the slot moves on (once, whoever sees it).
    fn ended(&self, slot: usize, round: u32) -> Answer {
        let mut held = self.0[slot].lock().expect("not poisoned");
        if held.0 == round {
            *held = (round + 1, None);
        }
        Answer::Moved
    }
}
