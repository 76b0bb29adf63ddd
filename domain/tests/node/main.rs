//! The node's transition table, row by row (the doc comment of `domain/src/node.rs`): the
//! single-use, time-bounded, bound enrollment token; re-enrollment raising the fencing token;
//! fencing before state; leases, retirement, operations and their reconciliation; then
//! properties over random command sequences.

mod fixtures;
mod properties;
#[path = "../common/table.rs"]
mod table;

use fixtures::*;
use leasehold_domain::node::{
    NodeCommand as C, NodeError, NodeOrder, NodeStatus as S, OperationResult, OperationState,
};
use leasehold_domain::rental::RentalId;
use leasehold_domain::run::WorkloadPhase;
use leasehold_domain::values::Reason;
use leasehold_domain::{Refusal, RefusalKind};
use uuid::Uuid;

use Expect::{Events, NoChange, Refused};

fn refused() -> Expect<NodeError> {
    Refused(NodeError::EnrollmentRefused)
}

fn fenced(given: u64, current: u64) -> Expect<NodeError> {
    Refused(NodeError::Fenced { given, current })
}

#[test]
fn an_invite_holds_only_the_token_hash_for_thirty_minutes() {
    let node = check(&[], invite(), Events(&["NodeInvited"]));
    assert_eq!(node.status, S::Enrolling);
    let invitation = node.invitation.expect("invited");
    assert_eq!(invitation.expires_at, t(50 + 30 * 60));
    assert!(!invitation.spent);
    check(&enrolling(), invite(), NoChange);
    let other = C::Invite { identity: identity(), token_hash: hash(2) };
    check(&enrolling(), other, Refused(NodeError::AlreadyExists));
    check(&[], beat(0), Refused(NodeError::NotFound));
}

#[test]
fn the_first_enrollment_spends_the_token_and_raises_the_fencing_token() {
    let node = check(&enrolling(), enroll(), Events(&["NodeEnrolled"]));
    assert_eq!((node.status, node.fencing_token), (S::Ready, 1));
    assert!(node.invitation.expect("invited").spent);
    assert_eq!(node.lease_expires, Some(t(50 + 90)));
    assert_eq!(node.session_expires, Some(t(50 + 30 * 60)));
    // Facts keep the node's clock, but their age is from Leasehold's receipt.
    assert_eq!(node.facts_received_at, Some(t(50)));
}

#[test]
fn an_enrollment_token_used_twice_expired_or_wrong_is_refused() {
    check(&ready(), enroll(), refused());
    check(&lost(), enroll(), refused());
    check(&enrolling(), enroll_with(hash(9)), refused());
    // The right token presented for another rental or generation.
    check(&enrolling(), enroll_claiming(hash(1), RentalId(Uuid::from_u128(8)), 1), refused());
    check(&enrolling(), enroll_claiming(hash(1), identity().rental, 2), refused());
    check_at(&enrolling(), enroll(), 30 * 60, refused());
    check_at(&enrolling(), enroll(), 30 * 60 - 1, Events(&["NodeEnrolled"]));
    // A credential cannot enroll a node that never enrolled.
    check(&enrolling(), reenroll(identity().rental, 1), refused());
    // One refusal, saying nothing of which check failed, and nothing that confirms a node.
    assert_eq!(NodeError::EnrollmentRefused.kind(), RefusalKind::NotFound);
}

#[test]
fn enrolling_again_is_a_resume_that_fences_the_previous_session() {
    let node = check(&ready(), reenroll(identity().rental, 1), Events(&["NodeEnrolled"]));
    assert_eq!(node.fencing_token, 2);
    let node = check(&lost(), reenroll(identity().rental, 1), Events(&["NodeEnrolled"]));
    assert_eq!((node.status, node.fencing_token), (S::Ready, 2));
    // The partitioned old session's commands now carry a stale token.
    check(&reenrolled(), order(1, 1, launch()), fenced(1, 2));
    check(&reenrolled(), beat(1), fenced(1, 2));
    check(&reenrolled(), observe(1, WorkloadPhase::Running, None), fenced(1, 2));
    check_at(&reenrolled(), beat(2), 60, Events(&["NodeHeartbeat"]));
    // Only the current session's credential resumes: an older one would take the node over
    // from the session that followed it.
    check(&reenrolled(), reenroll(identity().rental, 1), refused());
    check(&reenrolled(), reenroll_from(identity().rental, 1, 2), Events(&["NodeEnrolled"]));
    // A credential for another rental or generation.
    check(&ready(), reenroll(identity().rental, 2), refused());
    check(&ready(), reenroll(RentalId(Uuid::from_u128(8)), 1), refused());
}

#[test]
fn a_retired_node_can_never_enroll_again() {
    let node = check(&ready(), C::Retire, Events(&["NodeRetired"]));
    assert_eq!(node.status, S::Retired);
    check(&enrolling(), C::Retire, Events(&["NodeRetired"]));
    check(&retired(), C::Retire, NoChange);
    check(&retired(), reenroll(identity().rental, 1), Refused(NodeError::Retired));
    check(&retired(), enroll(), Refused(NodeError::Retired));
    check(&retired(), beat(1), Refused(NodeError::Retired));
}

#[test]
fn heartbeats_extend_the_lease_and_are_recorded_at_most_every_thirty_seconds() {
    let node = check_at(&ready(), beat(1), 45, Events(&["NodeHeartbeat"]));
    assert_eq!(node.lease_expires, Some(t(45 + 90)));
    let beaten = [ready(), vec![(beat(1), 45)]].concat();
    check_at(&beaten, beat(1), 74, NoChange);
    check_at(&beaten, beat(1), 75, Events(&["NodeHeartbeat"]));
    // New facts are recorded at once.
    let with_facts = C::Heartbeat { fencing_token: 1, facts: Some(facts(16_000)) };
    let node = check_at(&beaten, with_facts, 50, Events(&["NodeHeartbeat"]));
    assert_eq!(node.facts.expect("facts").cpu_millis, 16_000);
    check(&ready(), beat(0), fenced(0, 1));
    check(&ready(), beat(2), fenced(2, 1));
}

#[test]
fn a_node_is_lost_only_when_its_lease_passed() {
    check_at(&ready(), C::Expire, 99, NoChange);
    let node = check_at(&ready(), C::Expire, 100, Events(&["NodeLost"]));
    assert_eq!(node.status, S::Lost);
    check_at(&lost(), C::Expire, 200, NoChange);
    check_at(&enrolling(), C::Expire, 200, NoChange);
    // A lost node must enroll again before anything else.
    check(&lost(), beat(1), Refused(NodeError::NotReady { status: "lost" }));
    check(&enrolling(), beat(0), Refused(NodeError::NotReady { status: "enrolling" }));
}

#[test]
fn session_renewal_needs_the_current_token_and_half_the_session_passed() {
    // More than half the session left: nothing changes (a node renewing in a loop appends
    // nothing).
    check_at(&ready(), C::RenewSession { fencing_token: 1 }, 60, NoChange);
    let node = check_at(
        &ready(),
        C::RenewSession { fencing_token: 1 },
        20 * 60,
        Events(&["NodeSessionRenewed"]),
    );
    assert_eq!(node.session_expires, Some(t(20 * 60 + 30 * 60)));
    check(&reenrolled(), C::RenewSession { fencing_token: 1 }, fenced(1, 2));
}

#[test]
fn orders_carry_an_operation_id_and_the_fencing_token() {
    let node = check(&ready(), order(1, 1, launch()), Events(&["NodeOperationRequested"]));
    assert_eq!(node.operation(op(1)).expect("ordered").state, OperationState::Pending);
    check(&launching(), order(1, 1, launch()), NoChange);
    let stop = leasehold_domain::node::NodeOrder::StopWorkload {
        run: run(),
        attempt: attempt(),
        grace_seconds: 10,
    };
    check(&launching(), order(1, 1, stop), Refused(NodeError::OperationConflict));
    check(&ready(), order(1, 0, launch()), fenced(0, 1));
    check(&lost(), order(1, 1, launch()), Refused(NodeError::NotReady { status: "lost" }));
    check(&retired(), order(1, 1, launch()), Refused(NodeError::Retired));
}

#[test]
fn the_nodes_answer_settles_an_operation_once() {
    let applied =
        C::Settle { operation: op(1), fencing_token: 1, result: OperationResult::Applied };
    let node = check(&launching(), applied.clone(), Events(&["NodeOperationApplied"]));
    assert_eq!(node.operation(op(1)).expect("ordered").state, OperationState::Applied);
    let settled = [launching(), vec![(applied.clone(), 30)]].concat();
    check(&settled, applied, NoChange);
    let reason = Reason::parse("reason", "ImagePullFailed").expect("valid");
    let refusal = C::Settle {
        operation: op(1),
        fencing_token: 1,
        result: OperationResult::Refused { reason },
    };
    check(&settled, refusal.clone(), Refused(NodeError::ReportContradicts));
    check(&launching(), refusal, Events(&["NodeOperationRefused"]));
    let unknown =
        C::Settle { operation: op(9), fencing_token: 1, result: OperationResult::Applied };
    check(&launching(), unknown, Refused(NodeError::NoSuchOperation));
}

#[test]
fn reconciliation_settles_what_the_node_applied_and_what_it_never_can() {
    // Operation 1 ordered under session 1, operation 2 under session 2 (after a resume).
    let two = [launching(), vec![(reenroll(identity().rental, 1), 25)]].concat();
    let two = [two, vec![(order(2, 2, launch_other()), 26)]].concat();
    // The node lists neither: 1 can never be applied now (the node refuses session 1's
    // orders); 2 may still be on its way, and stays pending.
    let reconcile = C::Reconcile { fencing_token: 2, applied: vec![], answering: None };
    let node = check(&two, reconcile, Events(&["NodeOperationNotApplied"]));
    assert_eq!(node.operation(op(1)).expect("ordered").state, OperationState::NotApplied);
    assert_eq!(node.operation(op(2)).expect("ordered").state, OperationState::Pending);
    // Once the node's own account says it never applied it, a late answer saying it did
    // contradicts that account (its run may already be closed on it).
    let nothing = C::Reconcile { fencing_token: 2, applied: vec![], answering: None };
    let not_applied = [two.clone(), vec![(nothing, 27)]].concat();
    let late = C::Settle { operation: op(1), fencing_token: 2, result: OperationResult::Applied };
    check(&not_applied, late, Refused(NodeError::ReportContradicts));
    let reconcile = C::Reconcile { fencing_token: 2, applied: vec![op(1), op(2)], answering: None };
    let node = check(&two, reconcile, Events(&["NodeOperationApplied", "NodeOperationApplied"]));
    assert_eq!(node.pending().count(), 0);
    // Within one session, an operation the node does not list is not settled.
    let reconcile = C::Reconcile { fencing_token: 1, applied: vec![], answering: None };
    check(&launching(), reconcile, NoChange);
}

#[test]
fn an_answered_lookup_settles_every_operation_ordered_before_it() {
    // Operation 1 (a launch) is pending in session 1; the lookup 2 is ordered after it, and
    // operation 3 after the lookup.
    let asked = [
        launching(),
        vec![(order(2, 1, NodeOrder::ReportApplied {}), 26), (order(3, 1, launch_other()), 27)],
    ]
    .concat();
    // The node answers the lookup listing nothing: it took its commands in order, so it
    // never applied 1; 3 came after the lookup and may be on its way.
    let answer = C::Reconcile { fencing_token: 1, applied: vec![], answering: Some(op(2)) };
    let node =
        check(&asked, answer.clone(), Events(&["NodeOperationNotApplied", "NodeOperationApplied"]));
    assert_eq!(node.operation(op(1)).expect("ordered").state, OperationState::NotApplied);
    assert_eq!(node.operation(op(2)).expect("ordered").state, OperationState::Applied);
    assert_eq!(node.operation(op(3)).expect("ordered").state, OperationState::Pending);
    // Listing 1: applied. Answered already, the lookup is no mark: nothing more is settled.
    let listed = C::Reconcile { fencing_token: 1, applied: vec![op(1)], answering: Some(op(2)) };
    check(&asked, listed, Events(&["NodeOperationApplied", "NodeOperationApplied"]));
    let answered = [asked.clone(), vec![(answer.clone(), 28)]].concat();
    check(&answered, answer, NoChange);
    // An operation that is no lookup is no mark.
    let not_a_lookup = C::Reconcile { fencing_token: 1, applied: vec![], answering: Some(op(3)) };
    check(&asked, not_a_lookup, NoChange);
}

#[test]
fn an_earlier_sessions_order_refused_now_stays_pending_until_reconciled() {
    // Operation 1 was ordered under session 1; the node resumed as session 2 and refuses
    // session 1's token without saying whether it applied operation 1 then.
    let resumed = [launching(), vec![(reenroll(identity().rental, 1), 25)]].concat();
    let reason = Reason::parse("reason", "NodeRefused").expect("valid");
    let superseded = C::Settle {
        operation: op(1),
        fencing_token: 2,
        result: OperationResult::Refused { reason },
    };
    let node = check(&resumed, superseded, NoChange);
    assert_eq!(node.operation(op(1)).expect("ordered").state, OperationState::Pending);
    // Its own answer that it applied it then still settles it.
    let applied =
        C::Settle { operation: op(1), fencing_token: 2, result: OperationResult::Applied };
    check(&resumed, applied, Events(&["NodeOperationApplied"]));
}

fn launch_other() -> leasehold_domain::node::NodeOrder {
    leasehold_domain::node::NodeOrder::PrepareImage { manifest_digest: digest(), unpack: true }
}

#[test]
fn an_exit_code_outside_phase_exited_is_not_recorded() {
    let before = replay_node(&launching());
    let events = leasehold_domain::Aggregate::decide(
        &before,
        &observe(1, WorkloadPhase::Running, Some(0)),
        &ctx_at(30),
    )
    .expect("accepted");
    let [leasehold_domain::node::NodeEvent::NodeWorkloadObserved { observation, .. }] =
        events.as_slice()
    else {
        panic!("{events:?}")
    };
    assert_eq!(observation.exit_code, None);
}

fn replay_node(history: &[(C, i64)]) -> leasehold_domain::node::Node {
    crate::table::replay(history, ctx_at)
}

#[test]
fn a_workload_look_is_recorded_once_per_phase() {
    let running = observe(1, WorkloadPhase::Running, None);
    check(&launching(), running.clone(), Events(&["NodeWorkloadObserved"]));
    let seen = [launching(), vec![(running.clone(), 30)]].concat();
    check(&seen, running, NoChange);
    check(&seen, observe(1, WorkloadPhase::Exited, Some(0)), Events(&["NodeWorkloadObserved"]));
}
