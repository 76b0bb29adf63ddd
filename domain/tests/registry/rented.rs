//! One event of every rental, node and run event type, every optional field present (the
//! node's order, one of each kind of order).

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::DomainEvent;
use leasehold_domain::node::{
    AgentVersion, FactText, ImageFact, Locality, ManifestDigest, NodeEvent as N, NodeFacts, NodeId,
    NodeIdentity, NodeOrder, TokenHash,
};
use leasehold_domain::rental::{
    Booking, Bootstrap, CapacityObservation, CapacityReceipt, CapacityState, CapacitySupport,
    ConnectionId, IdempotentProvision, NativeRef, OfferId, OwnershipToken, Pricing,
    RentalEvent as R, RentalId, RentalStatus, RentalTerms, Resources, TerminateCause, Termination,
};
use leasehold_domain::run::{
    Attempt, AttemptId, BookingId, Cleanup, Launch, Outcome, RunBooking, RunEvent as U, RunId,
    RunTerms, StopOrder, WorkloadObservation, WorkloadPhase,
};
use leasehold_domain::values::{OperationId, OperatorDetail, Reason};
use serde_json::Value;
use uuid::Uuid;

type Samples = Vec<(&'static str, Value)>;

fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

fn id(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn digest() -> ManifestDigest {
    ManifestDigest::parse("d", format!("sha256:{}", "ab".repeat(32))).expect("valid")
}

fn payloads<E: DomainEvent>(events: &[E]) -> Samples {
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

fn look() -> CapacityObservation {
    CapacityObservation {
        native_ref: NativeRef::parse("n", "i-1").expect("valid"),
        state: CapacityState::Active,
        state_since: Some(at()),
        observed_at: at(),
        interrupted: false,
    }
}

fn terms() -> RentalTerms {
    RentalTerms {
        rental: RentalId(id(1)),
        connection: ConnectionId::parse("c", "sim").expect("valid"),
        offer: OfferId::parse("o", "gpu-1x").expect("valid"),
        resources: Resources { cpu_millis: 1, memory_mb: 2, disk_gb: 3, gpus: 4 },
        interruptible: true,
        max_lifetime_seconds: 3_600,
        support: CapacitySupport {
            stop: true,
            resume: true,
            persistent_disk: true,
            spot: true,
            exact_pricing: true,
            idempotent_provision: IdempotentProvision::OperationKey,
            list_owned: true,
            observe_after_terminate: false,
        },
        bootstrap: Bootstrap { control_plane_url: "https://cp".into(), agent_version: "1".into() },
    }
}

pub fn rental_samples() -> Samples {
    let (at, op) = (at(), OperationId(id(9)));
    let receipt = CapacityReceipt {
        native_ref: NativeRef::parse("n", "i-1").expect("valid"),
        state: CapacityState::Requested,
        accepted_at: at,
        duplicate: false,
        interruptible: true,
        pricing: Pricing { currency: "USD".into(), micros_per_hour: 5, exact: true },
    };
    let booking = BookingId(id(5));
    payloads(&[
        R::CapacityRequested {
            terms: terms(),
            ownership: OwnershipToken("own".into()),
            node: NodeId(id(2)),
            generation: 1,
            operation: op,
            at,
        },
        R::CapacityAccepted { generation: 1, receipt, status: RentalStatus::Starting, at },
        R::CapacityProvisionFailed {
            generation: 1,
            detail: OperatorDetail::new("quota exceeded in us-east-1"),
            at,
        },
        R::CapacityObserved { observation: look(), status: RentalStatus::Active, received_at: at },
        R::CapacityStopped { observation: look(), received_at: at },
        R::CapacityInterrupted {
            observation: look(),
            status: RentalStatus::Stopped,
            received_at: at,
        },
        R::CapacityTerminated {
            by: Termination::Observed,
            observation: Some(look()),
            received_at: at,
        },
        R::CapacityStopRequested { generation: 1, operation: op, at },
        R::CapacityResumed { generation: 2, node: NodeId(id(3)), operation: op, at },
        R::CapacityTerminationRequested {
            generation: 2,
            cause: TerminateCause::Tenant,
            operation: op,
            at,
        },
        R::RentalBooked { booking: Booking { booking, run: RunId(id(6)) }, running: true, at },
        R::RentalBookingStarted { booking, at },
        R::RentalBookingReleased { booking, at },
        R::RentalAttemptAdmitted { booking, node: NodeId(id(2)), attempt: AttemptId(id(7)), at },
    ])
}

fn facts() -> NodeFacts {
    NodeFacts {
        observed_at: at(),
        os: FactText::parse("os", "linux").expect("valid"),
        architecture: FactText::parse("a", "amd64").expect("valid"),
        container_runtime: FactText::parse("r", "docker").expect("valid"),
        cpu_millis: 1,
        memory_bytes: 2,
        disk_free_bytes: Some(3),
        images: vec![ImageFact { manifest_digest: digest(), state: Locality::Hot }],
    }
}

fn workload_look() -> WorkloadObservation {
    WorkloadObservation {
        run: RunId(id(6)),
        attempt: AttemptId(id(7)),
        phase: WorkloadPhase::Exited,
        observed_at: at(),
        started_at: Some(at()),
        finished_at: Some(at()),
        exit_code: Some(0),
        oom_killed: false,
    }
}

pub fn node_samples() -> Samples {
    let (at, operation) = (at(), OperationId(id(9)));
    let identity = NodeIdentity { node: NodeId(id(2)), rental: RentalId(id(1)), generation: 1 };
    let (run, attempt) = (RunId(id(6)), AttemptId(id(7)));
    let orders = [
        NodeOrder::PrepareImage { manifest_digest: digest(), unpack: true },
        NodeOrder::PrepareArtifact { content_digest: digest(), size_bytes: 10 },
        NodeOrder::LaunchWorkload {
            run,
            attempt,
            booking: BookingId(id(5)),
            manifest_digest: digest(),
            max_runtime_seconds: 60,
        },
        NodeOrder::StopWorkload { run, attempt, grace_seconds: 30 },
    ];
    let mut events = vec![
        N::NodeInvited { identity, token_hash: TokenHash([7; 32]), expires_at: at, at },
        N::NodeEnrolled {
            fencing_token: 1,
            duplicate: false,
            agent_version: AgentVersion::parse("v", "1.0.0").expect("valid"),
            facts: facts(),
            session_expires: at,
            lease_expires: at,
            at,
        },
        N::NodeSessionRenewed { session_expires: at, at },
        N::NodeHeartbeat { lease_expires: at, facts: Some(facts()), at },
        N::NodeLost { at },
        N::NodeRetired { at },
        N::NodeOperationApplied { operation, reconciled: true, at },
        N::NodeOperationRefused {
            operation,
            reason: Reason::parse("r", "ImagePullFailed").expect("valid"),
            at,
        },
        N::NodeOperationNotApplied { operation, at },
        N::NodeWorkloadObserved { observation: workload_look(), received_at: at },
    ];
    events.extend(orders.into_iter().map(|order| N::NodeOperationRequested {
        operation,
        fencing_token: 1,
        order,
        at,
    }));
    payloads(&events)
}

pub fn run_samples() -> Samples {
    let (at, attempt) = (at(), AttemptId(id(7)));
    let reason = || Reason::parse("r", "ImagePullFailed").expect("valid");
    let booking = RunBooking { booking: BookingId(id(5)), rental: RentalId(id(1)), generation: 1 };
    let created = Attempt {
        attempt,
        rental: RentalId(id(1)),
        node: NodeId(id(2)),
        fencing_token: 1,
        offer: OfferId::parse("o", "gpu-1x").expect("valid"),
        operation: OperationId(id(8)),
        launch: Launch::Intended,
        phase: Some(WorkloadPhase::Running),
        exit_code: Some(0),
    };
    payloads(&[
        U::RunRequested {
            terms: RunTerms {
                run: RunId(id(6)),
                manifest_digest: digest(),
                max_runtime_seconds: 60,
            },
            at,
        },
        U::RunBookingDecided { booking, at },
        U::RunBookingDispatched { at },
        U::RunAttemptCreated { attempt: created, at },
        U::RunLaunchIntentRecorded { attempt, operation: OperationId(id(8)), at },
        U::RunLaunchAccepted { attempt, at },
        U::RunLaunchFailed { attempt, reason: reason(), at },
        U::RunLaunchIndeterminate { attempt, at },
        U::RunLaunchNotApplied { attempt, at },
        U::RunExternalStateObserved { observation: workload_look(), received_at: at },
        U::RunOutcomeRecorded {
            outcome: Outcome::Failed,
            exit_code: Some(1),
            reason: Some(reason()),
            at,
        },
        U::RunCancelRequested { at },
        U::RunStopOrdered {
            attempt,
            stop: StopOrder { fencing_token: 1, operation: OperationId(id(10)) },
            at,
        },
        U::RunCancelAccepted { at },
        U::RunStopFailed { attempt, at },
        U::RunCleanupRequested { at },
        U::RunCleanupFailed { reason: reason(), at },
        U::RunCleanupConfirmed { at },
        U::RunNodeRetired { attempt, at },
        U::RunClosed { cleanup: Cleanup::Confirmed, at },
    ])
}
