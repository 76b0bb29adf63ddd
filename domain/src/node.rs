//! The Node: the agent on one rented machine for one generation of its rental, enrolled with
//! Leasehold and fenced by its **fencing token** (DOMAIN.md §1.6, rules 14–16, 20, 23).
//!
//! A rental's provision (and each resume) invites its generation's node, whose id Leasehold
//! mints: the invite holds the SHA-256 of a single-use enrollment token that expires
//! [`NODE_ENROLLMENT_SECONDS`] after it, bound to the node, the rental and the generation.
//! The token itself travels only in the bootstrap the provider delivers; no event, read model
//! or log line holds it. The first enrollment spends it and raises the fencing token to 1;
//! every later enrollment of the same identity and generation (with the node credential the
//! first one gave) is a resume: the fencing token rises again and the previous session is
//! closed, so a partitioned old session's commands, stamped with the old token, are `Fenced`.
//! A heartbeat extends the node's lease to [`NODE_LEASE_SECONDS`] after it; a node whose lease
//! passed is lost (its workloads are unobserved, not dead) until it enrolls again. When its
//! generation ends (a resume, a termination) it is retired and can never enroll again.
//!
//! Orders to the node (prepare an image or an artifact, launch or stop a workload) carry an
//! operation id and the fencing token they were decided under; the node's answer settles
//! each (pending → applied | refused). A launch or stop whose sending failed may still have
//! taken effect: it stays pending until the node answers or its reconciliation (the
//! operations it has applied) settles it, and is never sent again blindly (rule 20). Node
//! clocks are recorded (facts' `observed_at`) and never order anything; every time the node
//! aggregate keeps is Leasehold's.
//!
//! | from | command | to | events | guard |
//! |---|---|---|---|---|
//! | none | Invite(node, rental, generation, token hash) | enrolling | NodeInvited (expires in 30 min) | — |
//! | any but none | Invite | unchanged | — when the same invite (a retry), else `AlreadyExists` | — |
//! | enrolling | Enroll(token, rental, generation) | ready | NodeEnrolled{fencing token + 1, duplicate false} (the token is spent) | the token's hash, unexpired, for this node, rental and generation, else `EnrollmentRefused` |
//! | ready, lost | Enroll(token) | unchanged | refused | `EnrollmentRefused` (the token was spent) |
//! | ready, lost | Enroll(credential, rental, generation, token) | ready | NodeEnrolled{fencing token + 1, duplicate true} (a resume: the previous session closed) | the credential's rental, generation and fencing token (the current session's), else `EnrollmentRefused` |
//! | enrolling | Enroll(credential) | unchanged | refused | `EnrollmentRefused` (never enrolled) |
//! | retired | Enroll | retired | refused | `Retired` |
//! | ready | RenewSession(token) | ready | NodeSessionRenewed (30 min from now); — while more than half the session is left | the current fencing token, else `Fenced` |
//! | ready | Heartbeat(token, facts) | ready | NodeHeartbeat (lease extended, facts with Leasehold's receipt time); — within 30 s of the recorded one when the facts did not change | the current fencing token |
//! | ready | Expire | lost | NodeLost | its lease passed; — otherwise |
//! | enrolling, lost | Expire | unchanged | — | — |
//! | any but none, retired | Retire(generation) | retired | NodeRetired | — |
//! | retired | Retire | retired | — (idempotent) | — |
//! | ready | Order(op, token, order) | ready | NodeOperationRequested (pending) | the current fencing token; — when the op is known with the same order, else `OperationConflict` |
//! | ready | Settle(op, token, applied or refused) | ready | NodeOperationApplied / NodeOperationRefused | the current fencing token; a known op (`NoSuchOperation`), pending; — when it settled so already, else `ReportContradicts` (an op its reconciliation showed never applied included) |
//! | ready | Settle(op of an earlier session, token, refused) | ready | — (it stays pending: the node refuses a superseded token without saying whether it applied it then; only its reconciliation settles it) | the current fencing token |
//! | ready | Reconcile(token, applied ops) | ready | per pending op: NodeOperationApplied when listed, else NodeOperationNotApplied when ordered under an earlier session's token (the node refuses those: it can never apply it now); one of the current session's stays pending (it may be on its way) | the current fencing token |
//! | ready | Reconcile(token, applied ops, answering lookup) | ready | as above, and the lookup (a pending ReportApplied of this session) NodeOperationApplied; every op ordered before it and not listed NodeOperationNotApplied (the node takes its commands in order: it answered the lookup after everything before it) | the current fencing token; — for the high-water mark when the lookup is not pending (answered already, or unknown) |
//! | ready | ObserveWorkload(token, observation) | ready | NodeWorkloadObserved (with Leasehold's receipt time; the service links the run's timeline to it); — when it repeats the attempt's last phase and exit code | the current fencing token |
//! | enrolling, lost | RenewSession, Heartbeat, Order, Settle, Reconcile, ObserveWorkload | unchanged | refused | `NotReady` |
//! | retired | anything but Retire | retired | refused | `Retired` |
//!
//! Fencing comes before the state: a command stamped with another fencing token than the
//! node's is `Fenced` whatever the node's state (short of retired).

mod decide;
mod events;
mod evolve;
pub mod values;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregate::{Aggregate, Context, Refusal, RefusalKind};
use crate::limits::{NODE_ENROLLMENT_SECONDS, NODE_LEASE_SECONDS};
use crate::rental::RentalId;
use crate::run::{AttemptId, WorkloadObservation, WorkloadPhase};
use crate::values::{OperationId, Reason};

pub use events::{KIND, NodeEvent};
pub use values::{
    AgentVersion, FactText, ImageFact, Locality, ManifestDigest, NodeFacts, NodeId, NodeOrder,
    OperationState, TokenHash,
};

/// Where a node stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Never invited: the stream is empty.
    None,
    /// Invited; its token not redeemed yet.
    Enrolling,
    /// Enrolled, its lease held.
    Ready,
    /// Its lease passed without a heartbeat: its workloads are unobserved.
    Lost,
    /// Its generation ended: it can never enroll again.
    Retired,
}

impl NodeStatus {
    /// Every status.
    pub const ALL: [Self; 5] =
        [Self::None, Self::Enrolling, Self::Ready, Self::Lost, Self::Retired];

    /// Its name, the one spelling read models, clients and events use.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Enrolling => "enrolling",
            Self::Ready => "ready",
            Self::Lost => "lost",
            Self::Retired => "retired",
        }
    }
}

/// Who the node is: fixed by its invite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The node.
    pub node: NodeId,
    /// Its rental.
    pub rental: RentalId,
    /// Its rental's generation.
    pub generation: u64,
}

/// The invite's single-use token, as recorded: its hash and when it expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Invitation {
    /// The token's SHA-256.
    pub token_hash: TokenHash,
    /// When it stops being redeemable.
    pub expires_at: DateTime<Utc>,
    /// Whether it was redeemed.
    pub spent: bool,
}

/// What a node presents to enroll.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
pub enum EnrollProof {
    /// Its bootstrap's enrollment token (the first enrollment), as its hash, with the rental
    /// and generation the node claims.
    Token {
        /// The presented token's SHA-256.
        token_hash: TokenHash,
        /// The rental the node claims.
        rental: RentalId,
        /// The generation the node claims.
        generation: u64,
    },
    /// The node credential an earlier enrollment gave it, verified by the gateway: scoped to
    /// this node, a rental and a generation (a resume).
    Credential {
        /// The credential's rental.
        rental: RentalId,
        /// The credential's generation.
        generation: u64,
        /// The fencing token of the session it was given for: only the current session's
        /// credential resumes (an older one would take the node over from its successor).
        fencing_token: u64,
    },
}

/// One operation ordered of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOperation {
    /// Its id.
    pub operation: OperationId,
    /// What was ordered.
    pub order: NodeOrder,
    /// The fencing token it was ordered under.
    pub fencing_token: u64,
    /// Where it stands.
    pub state: OperationState,
    /// Why the node refused it.
    pub reason: Option<Reason>,
}

/// How the node answered one operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum OperationResult {
    /// It applied it.
    Applied,
    /// It refused it.
    Refused {
        /// Why (tenant-safe, from an open set).
        reason: Reason,
    },
}

/// The Node aggregate's state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Where it stands.
    pub status: NodeStatus,
    /// Who it is.
    pub identity: Option<NodeIdentity>,
    /// Its invite's token.
    pub invitation: Option<Invitation>,
    /// Raised by every enrollment; 0 before the first.
    pub fencing_token: u64,
    /// When it first enrolled.
    pub enrolled_at: Option<DateTime<Utc>>,
    /// When its session ends unless renewed.
    pub session_expires: Option<DateTime<Utc>>,
    /// When it is lost unless it beats.
    pub lease_expires: Option<DateTime<Utc>>,
    /// Its last recorded heartbeat (Leasehold's clock).
    pub last_heartbeat_at: Option<DateTime<Utc>>,
    /// The agent build it runs.
    pub agent_version: Option<AgentVersion>,
    /// Its last reported facts.
    pub facts: Option<NodeFacts>,
    /// When Leasehold received them (their age is from this).
    pub facts_received_at: Option<DateTime<Utc>>,
    /// Operations ordered of it: every pending one, and the most recent settled ones.
    pub operations: Vec<NodeOperation>,
    /// The last phase (and exit code) it reported of each recent attempt.
    pub workloads: Vec<(AttemptId, WorkloadPhase, Option<i32>)>,
    /// When it was last changed.
    pub updated_at: Option<DateTime<Utc>>,
}

impl Node {
    /// The operation `id`, if remembered.
    pub fn operation(&self, id: OperationId) -> Option<&NodeOperation> {
        self.operations.iter().find(|operation| operation.operation == id)
    }

    /// Its operations still pending.
    pub fn pending(&self) -> impl Iterator<Item = &NodeOperation> {
        self.operations.iter().filter(|operation| operation.state == OperationState::Pending)
    }
}

/// What can be asked of a node. Every command a node (or an order to it) sends after its
/// enrollment names the fencing token it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeCommand {
    /// Invites the node of a rental's generation.
    Invite {
        /// Who it is.
        identity: NodeIdentity,
        /// Its enrollment token's hash.
        token_hash: TokenHash,
    },
    /// The node enrolls (or enrolls again).
    Enroll {
        /// What it presents.
        proof: EnrollProof,
        /// The agent build it runs.
        agent_version: AgentVersion,
        /// What it reports of its host.
        facts: NodeFacts,
    },
    /// The node renews its session.
    RenewSession {
        /// Its fencing token.
        fencing_token: u64,
    },
    /// The node is alive.
    Heartbeat {
        /// Its fencing token.
        fencing_token: u64,
        /// What it reports of its host, if it reports.
        facts: Option<NodeFacts>,
    },
    /// Its lease passed (the lease reconciler).
    Expire,
    /// Its generation ended.
    Retire,
    /// Orders an operation of it.
    Order {
        /// The operation.
        operation: OperationId,
        /// The fencing token the order was decided under.
        fencing_token: u64,
        /// What is ordered.
        order: NodeOrder,
    },
    /// The node's answer to an operation.
    Settle {
        /// The operation.
        operation: OperationId,
        /// Its fencing token.
        fencing_token: u64,
        /// Its answer.
        result: OperationResult,
    },
    /// The node's account of the operations it applied (after either side restarted).
    Reconcile {
        /// Its fencing token.
        fencing_token: u64,
        /// Every operation it applied and still remembers.
        applied: Vec<OperationId>,
        /// The lookup (a `ReportApplied` order) it answers, if any.
        #[serde(default)]
        answering: Option<OperationId>,
    },
    /// The node's look at a run's attempt. Recorded on the node's stream, so that its
    /// fencing token is checked in the same append that records it on the run's.
    ObserveWorkload {
        /// Its fencing token.
        fencing_token: u64,
        /// What it saw.
        observation: WorkloadObservation,
    },
}

/// Why a node refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeError {
    /// The node was never invited.
    #[error("no such node")]
    NotFound,
    /// The node exists with another invite.
    #[error("a node with this id was invited otherwise")]
    AlreadyExists,
    /// The enrollment's token or credential does not hold (used, expired, or for another
    /// node, rental or generation). Deliberately one refusal: it says nothing of which.
    #[error("the enrollment is refused")]
    EnrollmentRefused,
    /// Its generation ended.
    #[error("the node is retired: its generation ended")]
    Retired,
    /// Not enrolled (or lost): it must enroll first.
    #[error("the node is {status}: it must enroll first")]
    NotReady {
        /// Its status's name.
        status: &'static str,
    },
    /// Another session's fencing token.
    #[error("fencing token {given} is not the node's current {current}")]
    Fenced {
        /// The token given.
        given: u64,
        /// The node's.
        current: u64,
    },
    /// The operation id is known with another order.
    #[error("the operation id was ordered with another order")]
    OperationConflict,
    /// No such operation ordered of the node.
    #[error("no such operation was ordered of the node")]
    NoSuchOperation,
    /// An answer contradicting how the operation settled.
    #[error("the operation already settled otherwise than this report says")]
    ReportContradicts,
}

impl Refusal for NodeError {
    fn kind(&self) -> RefusalKind {
        match self {
            Self::NotFound | Self::NoSuchOperation | Self::EnrollmentRefused => {
                RefusalKind::NotFound
            }
            Self::Retired | Self::NotReady { .. } => RefusalKind::InvalidState,
            Self::Fenced { .. } => RefusalKind::Fenced,
            Self::AlreadyExists | Self::OperationConflict | Self::ReportContradicts => {
                RefusalKind::Conflict
            }
        }
    }
}

impl Aggregate for Node {
    const STREAM_TYPE: &'static str = "node";
    const STATE_SCHEMA: u32 = 1;
    type Command = NodeCommand;
    type Event = NodeEvent;
    type Error = NodeError;
    type Facts = ();

    fn initial() -> Self {
        Self {
            status: NodeStatus::None,
            identity: None,
            invitation: None,
            fencing_token: 0,
            enrolled_at: None,
            session_expires: None,
            lease_expires: None,
            last_heartbeat_at: None,
            agent_version: None,
            facts: None,
            facts_received_at: None,
            operations: Vec::new(),
            workloads: Vec::new(),
            updated_at: None,
        }
    }

    fn decide(
        &self,
        command: &NodeCommand,
        ctx: &Context<()>,
    ) -> Result<Vec<NodeEvent>, NodeError> {
        decide::decide(self, command, ctx.now)
    }

    fn evolve(self, event: &NodeEvent) -> Self {
        evolve::evolve(self, event)
    }

    fn is_terminal(&self) -> bool {
        self.status == NodeStatus::Retired
    }

    fn is_creation(command: &NodeCommand) -> bool {
        matches!(command, NodeCommand::Invite { .. })
    }

    fn generation(&self) -> Option<u64> {
        self.identity.map(|identity| identity.generation)
    }
}

/// When an invite made at `at` stops being redeemable.
pub fn enrollment_expiry(at: DateTime<Utc>) -> DateTime<Utc> {
    at + chrono::TimeDelta::seconds(NODE_ENROLLMENT_SECONDS)
}

/// When a lease extended at `at` ends.
pub fn lease_expiry(at: DateTime<Utc>) -> DateTime<Utc> {
    at + chrono::TimeDelta::seconds(NODE_LEASE_SECONDS)
}
