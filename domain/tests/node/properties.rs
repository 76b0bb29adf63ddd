//! Properties over random command sequences: the fencing token never decreases, a retired
//! node stays retired, the enrollment token is redeemed at most once, and a command carrying
//! another session's token changes nothing.

use leasehold_domain::node::{Node, NodeCommand, NodeStatus, OperationResult};
use leasehold_domain::run::WorkloadPhase;
use leasehold_domain::{Aggregate, Refusal, RefusalKind};
use proptest::prelude::*;

use super::fixtures::*;

fn command() -> impl Strategy<Value = NodeCommand> {
    let token = 0u64..4;
    prop_oneof![
        Just(invite()),
        Just(enroll()),
        Just(enroll_with(hash(2))),
        (0u64..3, 0u64..4).prop_map(|(generation, token)| reenroll_from(
            identity().rental,
            generation,
            token
        )),
        token.clone().prop_map(beat),
        token.clone().prop_map(|fencing_token| NodeCommand::RenewSession { fencing_token }),
        Just(NodeCommand::Expire),
        Just(NodeCommand::Retire),
        (1u128..4, token.clone()).prop_map(|(n, t)| order(n, t, launch())),
        (1u128..4, token.clone()).prop_map(|(n, fencing_token)| NodeCommand::Settle {
            operation: op(n),
            fencing_token,
            result: OperationResult::Applied,
        }),
        token.clone().prop_map(|fencing_token| NodeCommand::Reconcile {
            fencing_token,
            applied: vec![op(1)],
            answering: Some(op(3)),
        }),
        token.prop_map(|t| observe(t, WorkloadPhase::Running, None)),
    ]
}

proptest! {
    #[test]
    fn fencing_tokens_never_decrease_and_retirement_is_final(
        commands in proptest::collection::vec(command(), 1..60),
    ) {
        let mut node = Node::initial();
        let mut first_enrollments = 0;
        for (i, command) in commands.iter().enumerate() {
            let at = i64::try_from(i).expect("small") * 40;
            let before = node.clone();
            let decided = node.decide(command, &ctx_at(at));
            if let Err(refusal) = &decided
                && refusal.kind() == RefusalKind::Fenced
            {
                prop_assert_ne!(before.status, NodeStatus::Retired);
            }
            for event in decided.iter().flatten() {
                if matches!(event, leasehold_domain::node::NodeEvent::NodeEnrolled { duplicate: false, .. }) {
                    first_enrollments += 1;
                }
            }
            node = decided.unwrap_or_default().iter().fold(node, |state, event| state.evolve(event));
            prop_assert!(node.fencing_token >= before.fencing_token, "{command:?}");
            if before.status == NodeStatus::Retired {
                prop_assert_eq!(node.status, NodeStatus::Retired);
            }
        }
        prop_assert!(first_enrollments <= 1, "the token is redeemed at most once");
    }
}
