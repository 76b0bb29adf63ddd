//! The node's state after each event: no rules, only what the event records.

use super::{Invitation, Node, NodeEvent as E, NodeOperation, NodeStatus as S, OperationState};
use crate::limits::{NODE_OPERATIONS_KEPT, NODE_WORKLOADS_KEPT};
use crate::values::OperationId;

pub(super) fn evolve(mut node: Node, event: &E) -> Node {
    match event {
        E::NodeInvited { identity, token_hash, expires_at, at } => {
            node.status = S::Enrolling;
            node.identity = Some(*identity);
            node.invitation =
                Some(Invitation { token_hash: *token_hash, expires_at: *expires_at, spent: false });
            node.updated_at = Some(*at);
        }
        E::NodeEnrolled {
            fencing_token,
            agent_version,
            facts,
            session_expires,
            lease_expires,
            at,
            ..
        } => {
            node.status = S::Ready;
            node.fencing_token = *fencing_token;
            if let Some(invitation) = &mut node.invitation {
                invitation.spent = true;
            }
            node.enrolled_at.get_or_insert(*at);
            node.agent_version = Some(agent_version.clone());
            node.facts = Some(facts.clone());
            node.facts_received_at = Some(*at);
            node.session_expires = Some(*session_expires);
            node.lease_expires = Some(*lease_expires);
            node.last_heartbeat_at = Some(*at);
            node.updated_at = Some(*at);
        }
        E::NodeSessionRenewed { session_expires, at } => {
            node.session_expires = Some(*session_expires);
            node.updated_at = Some(*at);
        }
        E::NodeHeartbeat { lease_expires, facts, at } => {
            node.lease_expires = Some(*lease_expires);
            node.last_heartbeat_at = Some(*at);
            if let Some(facts) = facts {
                node.facts = Some(facts.clone());
                node.facts_received_at = Some(*at);
            }
            node.updated_at = Some(*at);
        }
        E::NodeLost { at } => {
            node.status = S::Lost;
            node.updated_at = Some(*at);
        }
        E::NodeRetired { at } => {
            node.status = S::Retired;
            node.updated_at = Some(*at);
        }
        E::NodeOperationRequested { operation, fencing_token, order, at } => {
            node.operations.push(NodeOperation {
                operation: *operation,
                order: order.clone(),
                fencing_token: *fencing_token,
                state: OperationState::Pending,
                reason: None,
            });
            forget_oldest_settled(&mut node.operations);
            node.updated_at = Some(*at);
        }
        E::NodeOperationApplied { operation, at, .. } => {
            set_state(&mut node, *operation, OperationState::Applied, None);
            node.updated_at = Some(*at);
        }
        E::NodeOperationRefused { operation, reason, at } => {
            set_state(&mut node, *operation, OperationState::Refused, Some(reason.clone()));
            node.updated_at = Some(*at);
        }
        E::NodeWorkloadObserved { observation, received_at } => {
            node.workloads.retain(|(attempt, ..)| *attempt != observation.attempt);
            node.workloads.push((observation.attempt, observation.phase, observation.exit_code));
            if node.workloads.len() > NODE_WORKLOADS_KEPT {
                node.workloads.remove(0);
            }
            node.updated_at = Some(*received_at);
        }
        E::NodeOperationNotApplied { operation, at } => {
            set_state(&mut node, *operation, OperationState::NotApplied, None);
            node.updated_at = Some(*at);
        }
    }
    node
}

fn set_state(
    node: &mut Node,
    operation: OperationId,
    state: OperationState,
    reason: Option<crate::values::Reason>,
) {
    if let Some(known) = node.operations.iter_mut().find(|known| known.operation == operation) {
        known.state = state;
        known.reason = reason;
    }
}

/// Keeps every pending operation and at most [`NODE_OPERATIONS_KEPT`] in all.
fn forget_oldest_settled(operations: &mut Vec<NodeOperation>) {
    while operations.len() > NODE_OPERATIONS_KEPT {
        let oldest = operations.iter().position(|known| known.state != OperationState::Pending);
        match oldest {
            Some(position) => {
                operations.remove(position);
            }
            None => break,
        }
    }
}
