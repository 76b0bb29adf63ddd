//! The runner node, row by row (`domain/src/runner_node.rs`).

use leasehold_domain::runner::{GuestOs, ProviderKind, RunnerLeaseId, TrustClass};
use leasehold_domain::runner_node::{
    NodeStatus, Registration, RunnerNode, RunnerNodeCommand as C, RunnerNodeError,
};
use leasehold_domain::{Context, Refusal, RefusalKind};
use uuid::Uuid;

use super::fixtures::{self, Expect, node};
use super::table;

use Expect::{Events, NoChange, Refused};

fn ctx_at(second: i64) -> Context<()> {
    let facts = fixtures::ctx_at(second);
    Context {
        now: facts.now,
        tenant: facts.tenant,
        actor: facts.actor,
        new_ids: Vec::new(),
        facts: (),
    }
}

fn check(given: &[C], when: C, expect: Expect<RunnerNodeError>) -> RunnerNode {
    let given: Vec<(C, i64)> = given.iter().cloned().map(|command| (command, 1)).collect();
    table::check_at(&given, (when, 2), expect, ctx_at)
}

fn register(inventory: Option<Vec<RunnerLeaseId>>) -> C {
    let registration = Registration {
        node: node("a"),
        provider: ProviderKind::Docker,
        guest_os: vec![GuestOs::Linux],
        accepts: vec![TrustClass::Trusted],
        vcpu: 32,
        memory_mb: 65_536,
    };
    C::Register { registration, inventory }
}

fn lease(n: u128) -> RunnerLeaseId {
    RunnerLeaseId(Uuid::from_u128(n))
}

#[test]
fn every_registration_is_a_new_node_epoch() {
    let node = check(&[], register(None), Events(&["RunnerNodeRegistered"]));
    assert_eq!((node.status, node.node_epoch), (NodeStatus::Registered, 1));
    let node =
        check(&[register(None)], register(Some(vec![lease(1)])), Events(&["RunnerNodeRegistered"]));
    assert_eq!(node.node_epoch, 2);
    let policy = node.policy().expect("a policy");
    assert!(policy.active);
    assert_eq!(policy.accepts, vec![TrustClass::Trusted]);
}

#[test]
fn an_inventory_of_an_earlier_registration_is_fenced() {
    let given = [register(None), register(None)];
    let report = |node_epoch| C::ReportInventory { node_epoch, leases: vec![lease(1)] };
    check(&given, report(2), Events(&["RunnerInventoryReported"]));
    let fenced = RunnerNodeError::Fenced { given: 1, current: 2 };
    check(&given, report(1), Refused(fenced.clone()));
    assert_eq!(fenced.kind(), RefusalKind::Fenced);
    check(&[], report(1), Refused(RunnerNodeError::NotFound));
}

#[test]
fn an_orphan_the_sweep_gave_up_on_is_dead_lettered_on_a_registered_or_retired_node() {
    let letter = || C::DeadLetterOrphan {
        name: "billet-0123".into(),
        attempts: 5,
        detail: leasehold_domain::values::OperatorDetail::new("destroy answered 500"),
    };
    check(&[register(None)], letter(), Events(&["RunnerOrphanDeadLettered"]));
    check(&[register(None), C::Retire], letter(), Events(&["RunnerOrphanDeadLettered"]));
    check(&[], letter(), Refused(RunnerNodeError::NotFound));
}

#[test]
fn a_retired_node_never_registers_again_and_its_policy_admits_nothing() {
    let node = check(&[register(None)], C::Retire, Events(&["RunnerNodeRetired"]));
    assert!(!node.policy().expect("a policy").active);
    let given = [register(None), C::Retire];
    check(&given, C::Retire, NoChange);
    check(&given, register(None), Refused(RunnerNodeError::Retired));
    check(&[], C::Retire, Refused(RunnerNodeError::NotFound));
}
