//! Issue 17, part 4: a state machine over the real pipeline and projections. proptest draws a
//! run: a sequence of commands (kind, slot, process and choices each drawn from a seed) with
//! faults among them — a reply lost and the command sent again with its key, every database
//! session ended after an append, the projectors crashing mid-batch — and a clock skew
//! between the two processes deciding them. Every projection follows the log throughout.
//! After the run: every command answered as the client contract says (a result or a refusal;
//! sent again, nothing more appended), every invariant of the log holds at every cursor
//! (`leasehold_tests::invariants`), and the read models equal a rebuild from scratch, row
//! for row.
//!
//! A failing run is shrunk and saved to `tests/tests/proptest-regressions/hammer/machine.txt`,
//! which replays it first on every later run. CI draws 4 runs; `PROPTEST_CASES=100` is the
//! long run.

use std::sync::Arc;

use chrono::{TimeDelta, Utc};
use leasehold_projections::ManualClock;
use leasehold_tests::TestDb;
use leasehold_tests::invariants::audit;
use leasehold_tests::rng::Rng;
use proptest::collection::vec;
use proptest::prelude::*;

use super::delivery::Fault;
use super::{Answer, Tally, World, process};
use crate::projections::every_kind::{TABLES, finish, start_all};
use crate::projections::support::{dump_of, reset_of};

/// One step of a run.
#[derive(Debug, Clone)]
enum Op {
    /// A command whose kind, slot, process and choices are drawn from `seed`, delivered
    /// under `fault`.
    Command { seed: u64, fault: Fault },
    /// The projectors crash: their sessions ended mid-batch, their tasks aborted; then they
    /// start again from their checkpoints.
    ProjectorsCrash,
}

fn op() -> impl Strategy<Value = Op> {
    let command = |fault| any::<u64>().prop_map(move |seed| Op::Command { seed, fault });
    prop_oneof![
        6 => command(Fault::None),
        2 => command(Fault::Redelivered),
        1 => command(Fault::SessionsDropped),
        1 => Just(Op::ProjectorsCrash),
    ]
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(4)
}

/// Runs `ops` with the second process's clock `skew` seconds off (and standing still).
async fn run(ops: Vec<Op>, skew: i64) {
    let db = TestDb::migrated().await;
    let clock = ManualClock::at(Utc::now() + TimeDelta::seconds(skew));
    let skewed = process(&db).with_clock(clock as Arc<dyn leasehold_domain::Clock>);
    let world = World::new(&db, [process(&db), skewed]).await;
    let mut running = start_all(&db);
    let mut tally = Tally::default();
    for (n, op) in ops.iter().enumerate() {
        match op {
            Op::Command { seed, fault } => {
                let (kind, answer) =
                    world.step(&mut Rng::new(*seed), format!("op{n}"), *fault).await;
                if let Answer::Failed(failure) = &answer {
                    panic!("step {n} ({kind}, {fault:?}): {failure}");
                }
                tally.count(kind, answer);
            }
            Op::ProjectorsCrash => {
                world.observer.drop_sessions().await;
                for runner in running.drain(..) {
                    runner.task.abort();
                }
                running = start_all(&db);
            }
        }
    }
    finish(&db, running).await;
    let found = audit(&db).await;
    eprintln!(
        "machine: {} steps, skew {skew} s: applied {:?}, refused {:?}; {} events audited",
        ops.len(),
        tally.applied,
        tally.refused,
        found.events
    );
    assert_eq!(found.violations, Vec::<String>::new(), "every invariant at every cursor");
    let live = dump_of(&db, TABLES).await;
    reset_of(&db, TABLES).await;
    finish(&db, start_all(&db)).await;
    let rebuilt = dump_of(&db, TABLES).await;
    for ((table, live_rows), (_, rebuilt_rows)) in live.iter().zip(&rebuilt) {
        assert_eq!(rebuilt_rows, live_rows, "{table}: the live read model equals a rebuild");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { max_shrink_iters: 64, ..ProptestConfig::with_cases(cases()) })]

    #[test]
    fn commands_and_faults_keep_every_invariant_and_the_read_models_equal_a_rebuild(
        ops in vec(op(), 20..100),
        skew in -600i64..600,
    ) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(run(ops, skew));
    }
}
