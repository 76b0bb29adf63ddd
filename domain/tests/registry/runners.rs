//! One event of every runner lease, runner capacity, runner job and runner node event type,
//! every optional field present.

use chrono::{DateTime, TimeZone, Utc};
use leasehold_domain::DomainEvent;
use leasehold_domain::runner::{
    GuestOs, InstanceRef, JobRef, JobRequestId, Outcome, Phase, ProviderKind, QuarantineProof,
    RunnerEvent as L, RunnerLeaseId, RunnerNodeName, RunnerResources, RunnerTerms, StartCommand,
    Tier, TrustClass,
};
use leasehold_domain::runner_capacity::{
    Demand, RunnerCapacityEvent as C, RunnerLimits, TierLimit,
};
use leasehold_domain::runner_job::RunnerJobEvent as J;
use leasehold_domain::runner_node::{Registration, RunnerNodeEvent as N};
use leasehold_domain::values::{OperatorDetail, Reason};
use serde_json::Value;
use uuid::Uuid;

type Samples = Vec<(&'static str, Value)>;

fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a time")
}

fn lease() -> RunnerLeaseId {
    RunnerLeaseId(Uuid::from_u128(1))
}

fn node() -> RunnerNodeName {
    RunnerNodeName::parse("node", "docker-1").expect("valid")
}

fn tier() -> Tier {
    Tier::parse("tier", "linux-4x").expect("valid")
}

fn reason() -> Reason {
    Reason::parse("reason", "JobFailed").expect("valid")
}

fn job() -> JobRef {
    JobRef { request: JobRequestId(Uuid::from_u128(2)), run: 7 }
}

fn demand() -> Demand {
    let resources = RunnerResources::new("r", 4, 8192).expect("valid");
    Demand { tier: tier(), resources, macos: false }
}

fn samples<E: DomainEvent>(events: &[E]) -> Samples {
    events.iter().map(|event| (event.event_type(), event.to_payload())).collect()
}

pub fn lease_samples() -> Samples {
    let terms = RunnerTerms {
        lease: lease(),
        tier: tier(),
        trust: TrustClass::Trusted,
        guest_os: GuestOs::Linux,
        resources: RunnerResources::new("r", 4, 8192).expect("valid"),
        providers: vec![ProviderKind::Docker],
        command: StartCommand::parse("command", vec!["./run.sh".into()]).expect("valid"),
        ttl_seconds: 90,
    };
    let at = at();
    let instance = InstanceRef::parse("instance", "c-1").expect("valid");
    let proof = QuarantineProof::InventoryAbsent { node: node(), node_epoch: 2 };
    samples(&[
        L::RunnerLeaseRequested { terms, epoch: 1, expires_at: at, at },
        L::RunnerJobAssigned { job: job(), expires_at: at, at },
        L::RunnerLaunching { node: node(), expires_at: at, at },
        L::RunnerInstanceLaunched { instance, at },
        L::RunnerAdvanced { phase: Phase::Online, expires_at: at, at },
        L::RunnerHeartbeat { expires_at: at, at },
        L::RunnerReleased {
            outcome: Outcome::Failed,
            reason: Some(reason()),
            phase: Phase::Teardown,
            at,
        },
        L::RunnerTeardownRequested { at },
        L::RunnerTeardownConfirmed { phase: Phase::Failed, at },
        L::RunnerReaped { phase: Phase::Quarantine, epoch: 2, reason: reason(), at },
        L::RunnerEpochBumped { epoch: 3, node: node(), at },
        L::RunnerQuarantineResolved { proof, phase: Phase::Failed, at },
        L::RunnerForceReleased { detail: OperatorDetail::new("gone"), phase: Phase::Failed, at },
    ])
}

pub fn capacity_samples() -> Samples {
    let limits = RunnerLimits {
        vcpu: 40,
        memory_mb: 81_920,
        tiers: vec![TierLimit { tier: tier(), max: 10 }],
        macos_slots: 2,
    };
    let at = at();
    samples(&[
        C::RunnerLimitsSet { limits, at },
        C::RunnerCapacityReserved { lease: lease(), demand: demand(), at },
        C::RunnerCapacityReleased { lease: lease(), demand: demand(), at },
    ])
}

pub fn job_samples() -> Samples {
    let at = at();
    samples(&[
        J::RunnerJobClaimed { lease: lease(), job: job(), tier: tier(), queued_at: at, at },
        J::RunnerJobFinished { outcome: Outcome::Failed, reason: Some(reason()), at },
    ])
}

pub fn node_samples() -> Samples {
    let registration = Registration {
        node: node(),
        provider: ProviderKind::Docker,
        guest_os: vec![GuestOs::Linux],
        accepts: vec![TrustClass::Trusted],
        vcpu: 64,
        memory_mb: 262_144,
    };
    let at = at();
    samples(&[
        N::RunnerNodeRegistered { registration, inventory: Some(vec![lease()]), node_epoch: 1, at },
        N::RunnerInventoryReported { node: node(), node_epoch: 1, leases: vec![lease()], at },
        N::RunnerNodeRetired { at },
        N::RunnerOrphanDeadLettered {
            name: format!("billet-{}", lease().0.simple()),
            attempts: 5,
            detail: OperatorDetail::new("destroy answered 500"),
            at,
        },
    ])
}

/// One event of every workload quota event type (a reservation replacing another).
pub fn workload_quota_samples() -> Samples {
    use leasehold_domain::workload_quota::{Charge, Limit, WorkloadKind, WorkloadQuotaEvent as W};
    let (at, kind) = (at(), WorkloadKind::Vm);
    let held = Charge::of([("cpus".to_owned(), 4)]).held;
    let workload = format!("vm-{}", Uuid::from_u128(3));
    samples(&[
        W::WorkloadLimitsSet { kind, limits: vec![Limit { resource: "count".into(), max: 2 }], at },
        W::WorkloadReserved {
            kind,
            workload: workload.clone(),
            held: held.clone(),
            replaced: held.clone(),
            at,
        },
        W::WorkloadReleased { kind, workload, held, at },
    ])
}
