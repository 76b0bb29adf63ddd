//! Givens for the node's tests: its identity, token hashes, facts and orders, and the
//! histories that put a node in each state. A history is commands with the second each was
//! decided at.

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_domain::node::{
    AgentVersion, EnrollProof, FactText, ManifestDigest, Node, NodeCommand, NodeError, NodeFacts,
    NodeId, NodeIdentity, NodeOrder, TokenHash,
};
use leasehold_domain::rental::RentalId;
use leasehold_domain::run::{AttemptId, BookingId, RunId, WorkloadObservation, WorkloadPhase};
use leasehold_domain::values::OperationId;
use leasehold_domain::{Actor, Context, TenantId};
use uuid::Uuid;

pub fn t(second: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a valid time")
        + TimeDelta::seconds(second)
}

pub fn ctx_at(second: i64) -> Context<()> {
    Context {
        now: t(second),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "node".into(), role: "node".into() },
        new_ids: Vec::new(),
        facts: (),
    }
}

pub fn identity() -> NodeIdentity {
    NodeIdentity {
        node: NodeId(Uuid::from_u128(101)),
        rental: RentalId(Uuid::from_u128(7)),
        generation: 1,
    }
}

pub fn hash(byte: u8) -> TokenHash {
    TokenHash([byte; 32])
}

pub fn invite() -> NodeCommand {
    NodeCommand::Invite { identity: identity(), token_hash: hash(1) }
}

pub fn facts(cpu_millis: u64) -> NodeFacts {
    NodeFacts {
        observed_at: t(0) + TimeDelta::hours(3), // a node clock hours ahead
        os: FactText::parse("os", "linux").expect("valid"),
        architecture: FactText::parse("arch", "amd64").expect("valid"),
        container_runtime: FactText::parse("runtime", "docker 27.1").expect("valid"),
        cpu_millis,
        memory_bytes: 32 << 30,
        disk_free_bytes: Some(100 << 30),
        images: Vec::new(),
    }
}

pub fn enroll_with(token: TokenHash) -> NodeCommand {
    enroll_claiming(token, identity().rental, 1)
}

pub fn enroll_claiming(token: TokenHash, rental: RentalId, generation: u64) -> NodeCommand {
    NodeCommand::Enroll {
        proof: EnrollProof::Token { token_hash: token, rental, generation },
        agent_version: AgentVersion::parse("agent", "1.0.0").expect("valid"),
        facts: facts(8_000),
    }
}

pub fn enroll() -> NodeCommand {
    enroll_with(hash(1))
}

/// A re-enrollment with the credential of the session of fencing token 1.
pub fn reenroll(rental: RentalId, generation: u64) -> NodeCommand {
    reenroll_from(rental, generation, 1)
}

pub fn reenroll_from(rental: RentalId, generation: u64, fencing_token: u64) -> NodeCommand {
    NodeCommand::Enroll {
        proof: EnrollProof::Credential { rental, generation, fencing_token },
        agent_version: AgentVersion::parse("agent", "1.0.1").expect("valid"),
        facts: facts(8_000),
    }
}

pub fn beat(fencing_token: u64) -> NodeCommand {
    NodeCommand::Heartbeat { fencing_token, facts: None }
}

pub fn op(n: u128) -> OperationId {
    OperationId(Uuid::from_u128(1_000 + n))
}

pub fn digest() -> ManifestDigest {
    ManifestDigest::parse("digest", format!("sha256:{}", "ab".repeat(32))).expect("valid")
}

pub fn run() -> RunId {
    RunId(Uuid::from_u128(600))
}

pub fn attempt() -> AttemptId {
    AttemptId(Uuid::from_u128(700))
}

pub fn launch() -> NodeOrder {
    NodeOrder::LaunchWorkload {
        run: run(),
        attempt: attempt(),
        booking: BookingId(Uuid::from_u128(500)),
        manifest_digest: digest(),
        max_runtime_seconds: 3_600,
    }
}

pub fn order(n: u128, fencing_token: u64, order: NodeOrder) -> NodeCommand {
    NodeCommand::Order { operation: op(n), fencing_token, order }
}

pub fn observe(fencing_token: u64, phase: WorkloadPhase, exit_code: Option<i32>) -> NodeCommand {
    NodeCommand::ObserveWorkload {
        fencing_token,
        observation: WorkloadObservation {
            run: run(),
            attempt: attempt(),
            phase,
            observed_at: t(0) + TimeDelta::hours(3),
            started_at: None,
            finished_at: None,
            exit_code,
            oom_killed: false,
        },
    }
}

pub type History = Vec<(NodeCommand, i64)>;

pub fn enrolling() -> History {
    vec![(invite(), 0)]
}

/// Enrolled at second 10: fencing token 1, lease to second 100.
pub fn ready() -> History {
    [enrolling(), vec![(enroll(), 10)]].concat()
}

/// Ready with operation 1 (a launch) pending.
pub fn launching() -> History {
    [ready(), vec![(order(1, 1, launch()), 20)]].concat()
}

/// Its lease passed at second 100.
pub fn lost() -> History {
    [ready(), vec![(NodeCommand::Expire, 100)]].concat()
}

/// Enrolled again (a resume): fencing token 2.
pub fn reenrolled() -> History {
    [ready(), vec![(reenroll(identity().rental, 1), 30)]].concat()
}

pub fn retired() -> History {
    [ready(), vec![(NodeCommand::Retire, 30)]].concat()
}

pub use crate::table::Expect;

/// One row: given a history, when a command is decided at `second`, the expectation holds.
pub fn check_at(
    given: &[(NodeCommand, i64)],
    when: NodeCommand,
    second: i64,
    expect: Expect<NodeError>,
) -> Node {
    crate::table::check_at(given, (when, second), expect, ctx_at)
}

/// One row decided at second 50.
pub fn check(given: &[(NodeCommand, i64)], when: NodeCommand, expect: Expect<NodeError>) -> Node {
    check_at(given, when, 50, expect)
}
