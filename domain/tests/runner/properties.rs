//! Properties over random command sequences on several leases of one tenant and their
//! runner capacity, each command's capacity effect decided with it and both committed or
//! neither (as the service's linked append does): phases never move backwards, epochs never
//! decrease, charged capacity is the sum over the leases charged now, and never passes a
//! limit.

use leasehold_domain::runner::{
    Outcome, Phase, RunnerCommand as C, RunnerLease, RunnerLeaseId, Teardown,
};
use leasehold_domain::runner_capacity::{
    Demand, RunnerCapacity, RunnerCapacityCommand, RunnerLimits, RunnerUsage, TierLimit,
    capacity_effect,
};
use leasehold_domain::{Aggregate, Context};
use proptest::prelude::*;
use uuid::Uuid;

use super::fixtures::*;

const LEASES: usize = 5;

/// What a step asks of one lease; `stale` names another epoch than the lease's.
#[derive(Debug, Clone)]
enum Step {
    Assign(u128),
    Launch(&'static str),
    Advance(Phase),
    Heartbeat,
    Release(Outcome),
    Teardown(Teardown),
    Reap,
    Reregistered(&'static str),
    Absent(&'static str),
    Force,
}

fn step() -> impl Strategy<Value = Step> {
    let phase = proptest::sample::select(Phase::ALL.to_vec());
    let outcome = proptest::sample::select(vec![Outcome::Done, Outcome::Failed]);
    let teardown = proptest::sample::select(vec![Teardown::Requested, Teardown::Stopped]);
    let node = proptest::sample::select(vec!["a", "b"]);
    prop_oneof![
        (1u128..4).prop_map(Step::Assign),
        node.clone().prop_map(Step::Launch),
        phase.prop_map(Step::Advance),
        Just(Step::Heartbeat),
        outcome.prop_map(Step::Release),
        teardown.prop_map(Step::Teardown),
        Just(Step::Reap),
        node.clone().prop_map(Step::Reregistered),
        node.prop_map(Step::Absent),
        Just(Step::Force),
    ]
}

fn command(step: &Step, epoch: u64) -> C {
    match step {
        Step::Assign(n) => assign(epoch, *n),
        Step::Launch(name) => launch(epoch, name),
        Step::Advance(phase) => advance(epoch, *phase),
        Step::Heartbeat => heartbeat(epoch),
        Step::Release(outcome) => release(epoch, *outcome),
        Step::Teardown(what) => teardown(epoch, *what),
        Step::Reap => C::Reap,
        Step::Reregistered(name) => reregistered(name),
        Step::Absent(name) => absent_from(name),
        Step::Force => force(),
    }
}

fn lease_terms(n: usize) -> leasehold_domain::runner::RunnerTerms {
    let mut terms = terms();
    terms.lease = RunnerLeaseId(Uuid::from_u128(0x100 + n as u128));
    terms
}

fn limits() -> RunnerLimits {
    let tier = terms().tier;
    RunnerLimits { vcpu: 12, memory_mb: 0, tiers: vec![TierLimit { tier, max: 2 }], macos_slots: 0 }
}

fn plain(ctx: &Context<leasehold_domain::runner::RunnerFacts>) -> Context<()> {
    Context {
        now: ctx.now,
        tenant: ctx.tenant.clone(),
        actor: ctx.actor.clone(),
        new_ids: Vec::new(),
        facts: (),
    }
}

/// Decides `command` on lease `i` with its capacity effect; commits both or neither.
fn apply(
    leases: &mut [RunnerLease],
    capacity: &mut RunnerCapacity,
    i: usize,
    command: &C,
    second: i64,
) {
    let ctx = ctx_at(second);
    let Ok(events) = leases[i].decide(command, &ctx) else { return };
    let linked = match capacity_effect(&leases[i], &events) {
        None => Vec::new(),
        Some(effect) => match capacity.decide(&effect, &plain(&ctx)) {
            Ok(linked) => linked,
            Err(_) => return, // the linked refusal refuses the whole command
        },
    };
    leases[i] = events.iter().fold(leases[i].clone(), |lease, event| lease.evolve(event));
    *capacity = linked.iter().fold(capacity.clone(), |quota, event| quota.evolve(event));
}

proptest! {
    #[test]
    fn phases_never_move_back_epochs_never_decrease_and_charged_capacity_is_the_sum(
        steps in proptest::collection::vec((0..LEASES, step(), 0u8..8, 0i64..40), 1..150),
    ) {
        let mut leases = vec![RunnerLease::initial(); LEASES];
        let mut capacity = RunnerCapacity::initial();
        let set = RunnerCapacityCommand::SetLimits { limits: limits() };
        let events = capacity.decide(&set, &plain(&ctx_at(0))).expect("limits");
        capacity = events.iter().fold(capacity, |quota, event| quota.evolve(event));
        for (i, lease) in leases.iter_mut().enumerate() {
            let request = C::Request { terms: lease_terms(i) };
            let events = lease.decide(&request, &ctx_at(0)).expect("requested");
            *lease = events.iter().fold(lease.clone(), |lease, event| lease.evolve(event));
        }
        let mut second = 0;
        for (i, step, stale, gap) in &steps {
            second += gap;
            let before = leases[*i].clone();
            // One step in eight uses a stale epoch.
            let epoch = if *stale == 0 { before.epoch.saturating_sub(1) } else { before.epoch };
            apply(&mut leases, &mut capacity, *i, &command(step, epoch), second);
            let after = &leases[*i];
            prop_assert!(after.phase >= before.phase, "{step:?}: {:?} -> {:?}", before.phase, after.phase);
            prop_assert!(after.epoch >= before.epoch, "{step:?}");
            if before.phase.is_terminal() {
                prop_assert_eq!(after.phase, before.phase);
            }
            let charged: Vec<Demand> = leases
                .iter()
                .filter(|lease| lease.is_charged())
                .map(|lease| Demand::of(lease.terms.as_ref().expect("requested")))
                .collect();
            prop_assert_eq!(&capacity.usage, &RunnerUsage::of(&charged));
            prop_assert_eq!(capacity.reservations.len(), charged.len());
            prop_assert!(capacity.usage.vcpu <= limits().vcpu);
            prop_assert!(capacity.usage.tiers.values().all(|count| *count <= 2));
        }
    }

    #[test]
    fn a_command_with_another_epoch_is_fenced_with_no_event(
        steps in proptest::collection::vec((step(), 0i64..40), 1..40),
        off in 1u64..3,
    ) {
        let mut leases = vec![replay(&history(Phase::Capacity))];
        let mut capacity = RunnerCapacity::initial();
        let mut second = 0;
        for (step, gap) in &steps {
            second += gap;
            let epoch = leases[0].epoch;
            apply(&mut leases, &mut capacity, 0, &command(step, epoch), second);
        }
        let lease = &leases[0];
        for stale in [lease.epoch + off, lease.epoch.saturating_sub(off)] {
            if stale == lease.epoch {
                continue;
            }
            for probe in [assign(stale, 1), heartbeat(stale), release(stale, Outcome::Done), advance(stale, Phase::Busy)] {
                let refused = lease.decide(&probe, &ctx_at(second));
                let fenced = matches!(refused, Err(leasehold_domain::runner::RunnerError::Fenced { .. }));
                prop_assert!(fenced, "{probe:?} at epoch {}: {refused:?}", lease.epoch);
            }
        }
    }
}
