//! Golden bytes of rented capacity's stored states (`Rental`, `Node`, `Run`), as
//! `fleet_golden.rs` holds the fleet's: a change of a shape fails here until its
//! `STATE_SCHEMA` is bumped and the new version's bytes are recorded beside the old.

use chrono::{TimeZone as _, Utc};
use leasehold_domain::node::{
    AgentVersion, EnrollProof, FactText, ImageFact, Locality, ManifestDigest, Node, NodeCommand,
    NodeFacts, NodeId, NodeIdentity, NodeOrder, TokenHash,
};
use leasehold_domain::rental::{
    Booking, Bootstrap, CapacityObservation, CapacityReceipt, CapacityState, CapacitySupport,
    ConnectionId, IdempotentProvision, NativeRef, OfferId, OwnershipToken, Pricing, Rental,
    RentalCommand, RentalId, RentalTerms, Resources, TerminateCause,
};
use leasehold_domain::run::{
    AttemptId, BookingId, Run, RunBooking, RunCommand, RunId, RunTerms, WorkloadObservation,
    WorkloadPhase,
};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason};
use leasehold_domain::{Actor, Aggregate, Context, TenantId};
use uuid::Uuid;

use crate::fleet_golden::check;

const RENTAL_STATE_GOLDEN: &[(u32, &str)] = &[
    (1, include_str!("golden/rental_state_v1.hex")),
    (2, include_str!("golden/rental_state_v2.hex")),
];
const NODE_STATE_GOLDEN: &[(u32, &str)] = &[(1, include_str!("golden/node_state_v1.hex"))];
const RUN_STATE_GOLDEN: &[(u32, &str)] = &[
    (1, include_str!("golden/run_state_v1.hex")),
    (2, include_str!("golden/run_state_v2.hex")),
    (3, include_str!("golden/run_state_v3.hex")),
];

fn at(seconds: i64) -> chrono::DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000 + seconds, 0).single().expect("valid")
}

fn uuid(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

/// `commands` decided in order from the initial state, each at its second.
fn replayed<A: Aggregate<Facts = ()>>(commands: Vec<A::Command>) -> A {
    commands.iter().enumerate().fold(A::initial(), |state, (second, command)| {
        let ctx = Context {
            now: at(i64::try_from(second).expect("small")),
            tenant: TenantId::parse("acme").expect("valid"),
            actor: Actor { subject: "acme".into(), role: "tenant".into() },
            new_ids: Vec::new(),
            facts: (),
        };
        let events = state.decide(command, &ctx).expect("accepted");
        events.iter().fold(state, |state, event| state.evolve(event))
    })
}

fn look(generation: u64, state: CapacityState, second: i64) -> RentalCommand {
    RentalCommand::Observe {
        generation,
        observation: CapacityObservation {
            native_ref: NativeRef::parse("n", "m-1").expect("valid"),
            state,
            state_since: Some(at(second)),
            observed_at: at(second),
            interrupted: false,
        },
    }
}

/// A rental resumed once, booked, and being terminated: every optional field present.
fn rental() -> Rental {
    let support = CapacitySupport {
        stop: true,
        resume: true,
        persistent_disk: true,
        spot: true,
        exact_pricing: true,
        idempotent_provision: IdempotentProvision::OperationKey,
        list_owned: true,
        observe_after_terminate: false,
    };
    let terms = RentalTerms {
        rental: RentalId(uuid(1)),
        connection: ConnectionId::parse("c", "sim").expect("valid"),
        offer: OfferId::parse("o", "gpu-1x").expect("valid"),
        resources: Resources { cpu_millis: 1, memory_mb: 2, disk_gb: 3, gpus: 4 },
        interruptible: true,
        max_lifetime_seconds: 3_600,
        support,
        bootstrap: Bootstrap { control_plane_url: "https://cp".into(), agent_version: "1".into() },
    };
    let receipt = CapacityReceipt {
        native_ref: NativeRef::parse("n", "m-1").expect("valid"),
        state: CapacityState::Requested,
        accepted_at: at(1),
        duplicate: false,
        interruptible: false,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 5, exact: true },
    };
    let mut state: Rental = replayed(vec![
        RentalCommand::Provision {
            terms,
            ownership: OwnershipToken("own".into()),
            node: NodeId(uuid(2)),
            operation: OperationId(uuid(3)),
        },
        RentalCommand::Accept { generation: 1, receipt },
        look(1, CapacityState::Active, 2),
        RentalCommand::Stop { generation: 1, operation: OperationId(uuid(4)) },
        look(1, CapacityState::Stopped, 4),
        RentalCommand::Resume {
            generation: 1,
            node: NodeId(uuid(5)),
            operation: OperationId(uuid(6)),
        },
        look(2, CapacityState::Active, 6),
        RentalCommand::Book {
            generation: 2,
            booking: Booking { booking: BookingId(uuid(7)), run: RunId(uuid(8)) },
        },
        RentalCommand::Book {
            generation: 2,
            booking: Booking { booking: BookingId(uuid(9)), run: RunId(uuid(10)) },
        },
        RentalCommand::Terminate {
            generation: 2,
            cause: TerminateCause::MaxLifetime,
            operation: OperationId(uuid(11)),
        },
    ]);
    state.last_error = Some(OperatorDetail::new("quota"));
    state
}

fn facts() -> NodeFacts {
    NodeFacts {
        observed_at: at(100),
        os: FactText::parse("os", "linux").expect("valid"),
        architecture: FactText::parse("a", "amd64").expect("valid"),
        container_runtime: FactText::parse("r", "docker").expect("valid"),
        cpu_millis: 1,
        memory_bytes: 2,
        disk_free_bytes: Some(3),
        images: vec![ImageFact {
            manifest_digest: ManifestDigest::parse("d", format!("sha256:{}", "ab".repeat(32)))
                .expect("valid"),
            state: Locality::Hot,
        }],
    }
}

/// A node enrolled, with an order pending and a workload seen.
fn node() -> Node {
    let identity = NodeIdentity { node: NodeId(uuid(1)), rental: RentalId(uuid(2)), generation: 1 };
    let order = NodeOrder::LaunchWorkload {
        run: RunId(uuid(3)),
        attempt: AttemptId(uuid(4)),
        booking: BookingId(uuid(5)),
        manifest_digest: ManifestDigest::parse("d", format!("sha256:{}", "cd".repeat(32)))
            .expect("valid"),
        max_runtime_seconds: 60,
    };
    replayed(vec![
        NodeCommand::Invite { identity, token_hash: TokenHash([7; 32]) },
        NodeCommand::Enroll {
            proof: EnrollProof::Token {
                token_hash: TokenHash([7; 32]),
                rental: RentalId(uuid(2)),
                generation: 1,
            },
            agent_version: AgentVersion::parse("v", "1.0.0").expect("valid"),
            facts: facts(),
        },
        NodeCommand::Order { operation: OperationId(uuid(6)), fencing_token: 1, order },
        NodeCommand::ObserveWorkload {
            fencing_token: 1,
            observation: WorkloadObservation {
                run: RunId(uuid(3)),
                attempt: AttemptId(uuid(4)),
                phase: WorkloadPhase::Exited,
                observed_at: at(50),
                started_at: Some(at(40)),
                finished_at: Some(at(49)),
                exit_code: Some(0),
                oom_killed: false,
            },
        },
    ])
}

/// A run whose first attempt failed and second exited while its cancel's stop was out, its
/// cleanup blocked.
fn run() -> Run {
    let attempt = |n: u128, offer: &str| RunCommand::CreateAttempt {
        attempt: AttemptId(uuid(n)),
        node: NodeId(uuid(20)),
        fencing_token: 1,
        offer: OfferId::parse("o", offer).expect("valid"),
        operation: OperationId(uuid(n + 100)),
    };
    let reason = |text: &str| Reason::parse("r", text).expect("valid");
    replayed(vec![
        RunCommand::Submit {
            terms: RunTerms {
                run: RunId(uuid(1)),
                manifest_digest: ManifestDigest::parse("d", format!("sha256:{}", "ef".repeat(32)))
                    .expect("valid"),
                max_runtime_seconds: 60,
            },
        },
        RunCommand::Book {
            booking: RunBooking {
                booking: BookingId(uuid(2)),
                rental: RentalId(uuid(3)),
                generation: 1,
            },
        },
        attempt(4, "offer-a"),
        RunCommand::LaunchAnswered {
            attempt: AttemptId(uuid(4)),
            answer: leasehold_domain::run::LaunchAnswer::Failed {
                reason: reason("ImagePullFailed"),
            },
        },
        attempt(5, "offer-b"),
        RunCommand::LaunchAnswered {
            attempt: AttemptId(uuid(5)),
            answer: leasehold_domain::run::LaunchAnswer::Accepted,
        },
        RunCommand::Cancel {
            stop: Some(leasehold_domain::run::StopOrder {
                fencing_token: 1,
                operation: OperationId(uuid(6)),
            }),
        },
        RunCommand::Observe {
            node: NodeId(uuid(20)),
            observation: WorkloadObservation {
                run: RunId(uuid(1)),
                attempt: AttemptId(uuid(5)),
                phase: WorkloadPhase::Exited,
                observed_at: at(9),
                started_at: None,
                finished_at: None,
                exit_code: Some(1),
                oom_killed: true,
            },
            received_at: at(9),
        },
        RunCommand::FailCleanup { reason: reason("StopTimedOut") },
    ])
}

#[test]
fn the_rental_state_keeps_its_stored_shape_for_its_schema() {
    check(
        "Rental",
        Rental::STATE_SCHEMA,
        RENTAL_STATE_GOLDEN,
        &(TenantId::parse("acme").expect("valid"), rental()),
    );
}

#[test]
fn the_node_state_keeps_its_stored_shape_for_its_schema() {
    check(
        "Node",
        Node::STATE_SCHEMA,
        NODE_STATE_GOLDEN,
        &(TenantId::parse("acme").expect("valid"), node()),
    );
}

#[test]
fn the_run_state_keeps_its_stored_shape_for_its_schema() {
    check(
        "Run",
        Run::STATE_SCHEMA,
        RUN_STATE_GOLDEN,
        &(TenantId::parse("acme").expect("valid"), run()),
    );
}
