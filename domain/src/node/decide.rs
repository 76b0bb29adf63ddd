//! `decide` for the node: the transition table of `node.rs`, row by row.

use chrono::{DateTime, TimeDelta, Utc};

use super::{
    AgentVersion, EnrollProof, Node, NodeCommand, NodeError, NodeEvent, NodeFacts, NodeIdentity,
    NodeOrder, NodeStatus, OperationResult, OperationState, TokenHash, enrollment_expiry,
    lease_expiry,
};
use crate::limits::{NODE_HEARTBEAT_RECORD_SECONDS, NODE_SESSION_SECONDS};
use crate::run::{WorkloadObservation, WorkloadPhase};
use crate::values::OperationId;

pub(super) fn decide(
    node: &Node,
    command: &NodeCommand,
    now: DateTime<Utc>,
) -> Result<Vec<NodeEvent>, NodeError> {
    use NodeCommand as C;
    use NodeStatus as S;
    let at = now;
    match (node.status, command) {
        (S::None, C::Invite { identity, token_hash }) => Ok(vec![NodeEvent::NodeInvited {
            identity: *identity,
            token_hash: *token_hash,
            expires_at: enrollment_expiry(at),
            at,
        }]),
        (_, C::Invite { identity, token_hash }) => {
            let same = node.identity == Some(*identity)
                && node.invitation.is_some_and(|invite| invite.token_hash == *token_hash);
            if same { Ok(Vec::new()) } else { Err(NodeError::AlreadyExists) }
        }
        (S::None, _) => Err(NodeError::NotFound),
        (S::Retired, C::Retire) => Ok(Vec::new()),
        (_, C::Retire) => Ok(vec![NodeEvent::NodeRetired { at }]),
        (S::Retired, _) => Err(NodeError::Retired),
        (_, C::Enroll { proof, agent_version, facts }) => {
            enroll(node, proof, agent_version, facts, at)
        }
        (S::Ready, C::Expire) => {
            let passed = node.lease_expires.is_some_and(|expires| expires <= at);
            Ok(if passed { vec![NodeEvent::NodeLost { at }] } else { Vec::new() })
        }
        (_, C::Expire) => Ok(Vec::new()),
        (status, command) => {
            fence(node, command)?;
            if status != S::Ready {
                return Err(NodeError::NotReady { status: status.name() });
            }
            ready(node, command, at)
        }
    }
}

/// A command of an enrolled session must carry the node's current fencing token: one of an
/// earlier session (before a re-enrollment) is `Fenced`, with no event.
fn fence(node: &Node, command: &NodeCommand) -> Result<(), NodeError> {
    use NodeCommand as C;
    let given = match command {
        C::RenewSession { fencing_token }
        | C::Heartbeat { fencing_token, .. }
        | C::Order { fencing_token, .. }
        | C::Settle { fencing_token, .. }
        | C::Reconcile { fencing_token, .. }
        | C::ObserveWorkload { fencing_token, .. } => *fencing_token,
        C::Invite { .. } | C::Enroll { .. } | C::Expire | C::Retire => return Ok(()),
    };
    if given == node.fencing_token {
        Ok(())
    } else {
        Err(NodeError::Fenced { given, current: node.fencing_token })
    }
}

fn ready(
    node: &Node,
    command: &NodeCommand,
    at: DateTime<Utc>,
) -> Result<Vec<NodeEvent>, NodeError> {
    use NodeCommand as C;
    match command {
        C::RenewSession { .. } => Ok(renew(node, at)),
        C::Heartbeat { facts, .. } => Ok(heartbeat(node, facts.as_ref(), at)),
        C::Order { operation, fencing_token, order } => {
            order_operation(node, *operation, *fencing_token, order, at)
        }
        C::Settle { operation, result, .. } => settle(node, *operation, result, at),
        C::Reconcile { applied, answering, .. } => Ok(reconcile(node, applied, *answering, at)),
        C::ObserveWorkload { observation, .. } => Ok(observe_workload(node, observation, at)),
        C::Invite { .. } | C::Enroll { .. } | C::Expire | C::Retire => {
            unreachable!("decided before the session's commands")
        }
    }
}

fn enroll(
    node: &Node,
    proof: &EnrollProof,
    agent_version: &AgentVersion,
    facts: &NodeFacts,
    at: DateTime<Utc>,
) -> Result<Vec<NodeEvent>, NodeError> {
    let identity = node.identity.expect("an invited node has its identity");
    let duplicate = match (node.status, proof) {
        (NodeStatus::Enrolling, EnrollProof::Token { token_hash, rental, generation }) => {
            let claimed = NodeIdentity { rental: *rental, generation: *generation, ..identity };
            if claimed != identity {
                return Err(NodeError::EnrollmentRefused);
            }
            redeemable(node, *token_hash, at)?;
            false
        }
        (
            NodeStatus::Ready | NodeStatus::Lost,
            EnrollProof::Credential { rental, generation, fencing_token },
        ) => {
            let same = NodeIdentity { rental: *rental, generation: *generation, ..identity };
            if same != identity || *fencing_token != node.fencing_token {
                return Err(NodeError::EnrollmentRefused);
            }
            true
        }
        // A spent token, or a credential of a node that never enrolled.
        _ => return Err(NodeError::EnrollmentRefused),
    };
    Ok(vec![NodeEvent::NodeEnrolled {
        fencing_token: node.fencing_token + 1,
        duplicate,
        agent_version: agent_version.clone(),
        facts: facts.clone(),
        session_expires: at + TimeDelta::seconds(NODE_SESSION_SECONDS),
        lease_expires: lease_expiry(at),
        at,
    }])
}

/// The invite's token: its hash, unspent and unexpired. The token is bound to this node's
/// stream, and through it to the rental and generation of its invite.
fn redeemable(node: &Node, presented: TokenHash, at: DateTime<Utc>) -> Result<(), NodeError> {
    let Some(invitation) = node.invitation else {
        return Err(NodeError::EnrollmentRefused);
    };
    let holds = constant_time_eq(&invitation.token_hash.0, &presented.0)
        && !invitation.spent
        && at < invitation.expires_at;
    if holds { Ok(()) } else { Err(NodeError::EnrollmentRefused) }
}

/// Compares two hashes in time independent of where they differ.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// A renewal once half the session has passed; before that it changes nothing (a node
/// renewing in a loop appends nothing).
fn renew(node: &Node, at: DateTime<Utc>) -> Vec<NodeEvent> {
    let half = TimeDelta::seconds(NODE_SESSION_SECONDS / 2);
    if node.session_expires.is_some_and(|expires| expires - at > half) {
        return Vec::new();
    }
    vec![NodeEvent::NodeSessionRenewed {
        session_expires: at + TimeDelta::seconds(NODE_SESSION_SECONDS),
        at,
    }]
}

fn heartbeat(node: &Node, facts: Option<&NodeFacts>, at: DateTime<Utc>) -> Vec<NodeEvent> {
    let new_facts = facts.filter(|facts| node.facts.as_ref() != Some(*facts));
    let every = TimeDelta::seconds(NODE_HEARTBEAT_RECORD_SECONDS);
    let recent = node.last_heartbeat_at.is_some_and(|last| at < last + every);
    if recent && new_facts.is_none() {
        return Vec::new();
    }
    vec![NodeEvent::NodeHeartbeat {
        lease_expires: lease_expiry(at),
        facts: new_facts.cloned(),
        at,
    }]
}

fn order_operation(
    node: &Node,
    operation: OperationId,
    fencing_token: u64,
    order: &NodeOrder,
    at: DateTime<Utc>,
) -> Result<Vec<NodeEvent>, NodeError> {
    match node.operation(operation) {
        Some(known) if known.order == *order => Ok(Vec::new()),
        Some(_) => Err(NodeError::OperationConflict),
        None => Ok(vec![NodeEvent::NodeOperationRequested {
            operation,
            fencing_token,
            order: order.clone(),
            at,
        }]),
    }
}

fn settle(
    node: &Node,
    operation: OperationId,
    result: &OperationResult,
    at: DateTime<Utc>,
) -> Result<Vec<NodeEvent>, NodeError> {
    let Some(known) = node.operation(operation) else {
        return Err(NodeError::NoSuchOperation);
    };
    match (known.state, result) {
        // Not `NotApplied`: the node's own reconciliation said it never applied it (and the
        // run may have closed on that), so a late answer saying it did contradicts it.
        (OperationState::Pending, OperationResult::Applied) => {
            Ok(vec![NodeEvent::NodeOperationApplied { operation, reconciled: false, at }])
        }
        // An earlier session's order refused now says only that the node did not act on it
        // now (it refuses a superseded token before it looks whether it applied the
        // operation then): only its reconciliation settles it.
        (OperationState::Pending, OperationResult::Refused { .. })
            if known.fencing_token < node.fencing_token =>
        {
            Ok(Vec::new())
        }
        (OperationState::Pending, OperationResult::Refused { reason }) => {
            Ok(vec![NodeEvent::NodeOperationRefused { operation, reason: reason.clone(), at }])
        }
        (OperationState::Applied, OperationResult::Applied) => Ok(Vec::new()),
        (OperationState::Refused, OperationResult::Refused { reason })
            if known.reason.as_ref() == Some(reason) =>
        {
            Ok(Vec::new())
        }
        _ => Err(NodeError::ReportContradicts),
    }
}

fn observe_workload(
    node: &Node,
    observation: &WorkloadObservation,
    received_at: DateTime<Utc>,
) -> Vec<NodeEvent> {
    let mut observation = observation.clone();
    if observation.phase != WorkloadPhase::Exited {
        // An exit code means something only in phase exited (a node reporting 0 while
        // running): it is not recorded, nor shown.
        observation.exit_code = None;
    }
    let look = (observation.attempt, observation.phase, observation.exit_code);
    if node.workloads.contains(&look) {
        return Vec::new();
    }
    vec![NodeEvent::NodeWorkloadObserved { observation, received_at }]
}

/// Settles the pending operations the node's list of applied ones decides. One it lists was
/// applied. One it does not list was never applied only when it was ordered under an earlier
/// session's fencing token: the node refuses such an order, so it can never apply it now.
/// One ordered under the current session may still be on its way to the node: it stays
/// pending (its answer, or the next session's reconciliation, settles it).
///
/// Answering a lookup (a pending `ReportApplied` of the current session), the answer is also
/// a high-water mark: the node takes its session's commands in order, so every operation
/// ordered before the lookup reached it first, and one it does not list it never applied.
fn reconcile(
    node: &Node,
    applied: &[OperationId],
    answering: Option<OperationId>,
    at: DateTime<Utc>,
) -> Vec<NodeEvent> {
    let mark = answering.and_then(|lookup| {
        node.operations.iter().position(|known| {
            known.operation == lookup
                && known.state == OperationState::Pending
                && known.fencing_token == node.fencing_token
                && matches!(known.order, NodeOrder::ReportApplied {})
        })
    });
    node.operations
        .iter()
        .enumerate()
        .filter(|(_, known)| known.state == OperationState::Pending)
        .filter_map(|(position, pending)| {
            let operation = pending.operation;
            let before_mark = mark.is_some_and(|mark| position < mark);
            if Some(position) == mark || applied.contains(&operation) {
                Some(NodeEvent::NodeOperationApplied { operation, reconciled: true, at })
            } else if pending.fencing_token < node.fencing_token || before_mark {
                Some(NodeEvent::NodeOperationNotApplied { operation, at })
            } else {
                None
            }
        })
        .collect()
}
