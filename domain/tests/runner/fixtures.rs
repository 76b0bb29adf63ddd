//! Givens for the runner lease's tests: terms, the nodes' policies, and the histories that
//! put a lease in each phase. A history is commands with the second each was decided at.
#![allow(dead_code)]

use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use leasehold_domain::runner::RunnerTerms;
use leasehold_domain::runner::{
    GuestOs, InstanceRef, JobRef, JobRequestId, NodePolicy, Outcome, Phase, ProviderKind,
    QuarantineProof, RunnerCommand as C, RunnerError, RunnerFacts, RunnerLease, RunnerLeaseId,
    RunnerNodeName, RunnerResources, StartCommand, Teardown, Tier, TrustClass,
};
use leasehold_domain::values::{OperatorDetail, Reason};
use leasehold_domain::{Actor, Context, TenantId};
use uuid::Uuid;

pub use super::table::Expect;

/// The lease's time to live in the fixtures.
pub const TTL: i64 = 90;

pub fn t(second: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 12, 0, 0).single().expect("a valid time")
        + TimeDelta::seconds(second)
}

/// The context at `second`, with node `a`'s policy admitting every fixture lease.
pub fn ctx_at(second: i64) -> Context<RunnerFacts> {
    ctx_with(second, Some(policy("a")))
}

pub fn ctx_with(second: i64, policy: Option<NodePolicy>) -> Context<RunnerFacts> {
    Context {
        now: t(second),
        tenant: TenantId::parse("acme").expect("valid"),
        actor: Actor { subject: "acme".into(), role: "tenant".into() },
        new_ids: Vec::new(),
        facts: RunnerFacts { policy },
    }
}

pub fn lease_id() -> RunnerLeaseId {
    RunnerLeaseId(Uuid::from_u128(0x51))
}

pub fn node(name: &str) -> RunnerNodeName {
    RunnerNodeName::parse("node", name).expect("valid")
}

/// A registered docker node running Linux and accepting both trust classes.
pub fn policy(name: &str) -> NodePolicy {
    NodePolicy {
        node: node(name),
        provider: ProviderKind::Docker,
        guest_os: vec![GuestOs::Linux],
        accepts: vec![TrustClass::Untrusted, TrustClass::Trusted],
        active: true,
    }
}

/// Node `name`'s policy, retired.
pub fn inactive(name: &str) -> NodePolicy {
    NodePolicy { active: false, ..policy(name) }
}

/// Node `name`'s policy with another provider.
pub fn provider(name: &str, provider: ProviderKind) -> NodePolicy {
    NodePolicy { provider, ..policy(name) }
}

/// Node `name`'s policy running only `guest_os`.
pub fn guest(name: &str, guest_os: GuestOs) -> NodePolicy {
    NodePolicy { guest_os: vec![guest_os], ..policy(name) }
}

/// Node `name`'s policy accepting only `trust`.
pub fn accepting(name: &str, trust: TrustClass) -> NodePolicy {
    NodePolicy { accepts: vec![trust], ..policy(name) }
}

pub fn terms() -> RunnerTerms {
    RunnerTerms {
        lease: lease_id(),
        tier: Tier::parse("tier", "linux-4x").expect("valid"),
        trust: TrustClass::Trusted,
        guest_os: GuestOs::Linux,
        resources: RunnerResources::new("resources", 4, 8192).expect("valid"),
        providers: vec![ProviderKind::Docker, ProviderKind::Firecracker],
        command: StartCommand::parse("command", vec!["./run.sh".into(), "--jitconfig-env".into()])
            .expect("valid"),
        ttl_seconds: u32::try_from(TTL).expect("small"),
    }
}

pub fn job(n: u128) -> JobRef {
    JobRef {
        request: JobRequestId(Uuid::from_u128(0x700 + n)),
        run: 40 + u64::try_from(n).expect("small"),
    }
}

pub fn instance(name: &str) -> InstanceRef {
    InstanceRef::parse("instance", name).expect("valid")
}

pub fn reason(text: &str) -> Reason {
    Reason::parse("reason", text).expect("valid")
}

pub fn request() -> C {
    C::Request { terms: terms() }
}
pub fn assign(epoch: u64, n: u128) -> C {
    C::Assign { epoch, job: job(n) }
}
pub fn launch(epoch: u64, name: &str) -> C {
    C::Launch { epoch, node: node(name) }
}
pub fn record_instance(epoch: u64, name: &str) -> C {
    C::RecordInstance { epoch, instance: instance(name) }
}
pub fn advance(epoch: u64, phase: Phase) -> C {
    C::Advance { epoch, phase }
}
pub fn heartbeat(epoch: u64) -> C {
    C::Heartbeat { epoch }
}
pub fn release(epoch: u64, outcome: Outcome) -> C {
    let reason = (outcome == Outcome::Failed).then(|| reason("JobFailed"));
    C::Release { epoch, outcome, reason }
}
pub fn teardown(epoch: u64, teardown: Teardown) -> C {
    C::RecordTeardown { epoch, teardown }
}
pub fn absent_from(name: &str) -> C {
    C::ResolveQuarantine {
        proof: QuarantineProof::InventoryAbsent { node: node(name), node_epoch: 2 },
    }
}
pub fn force() -> C {
    C::ForceRelease { detail: OperatorDetail::new("destroyed by hand: i-0abc") }
}
pub fn reregistered(name: &str) -> C {
    C::NodeReregistered { node: node(name) }
}

/// The history that puts a lease in `phase` (epoch 1, node `a`, its instance `c-1`), each
/// command a second after the last; quarantine by a reap of a busy lease after its expiry.
pub fn history(phase: Phase) -> Vec<(C, i64)> {
    let mut given = vec![(request(), 0)];
    let steps: Vec<C> = match phase {
        Phase::None => return Vec::new(),
        Phase::Capacity => vec![],
        Phase::Assigned => vec![assign(1, 1)],
        Phase::Launching => vec![assign(1, 1), launch(1, "a"), record_instance(1, "c-1")],
        Phase::Online => {
            vec![assign(1, 1), launch(1, "a"), record_instance(1, "c-1"), advance(1, Phase::Online)]
        }
        Phase::Busy => [history_steps(Phase::Online), vec![advance(1, Phase::Busy)]].concat(),
        Phase::Custody => [history_steps(Phase::Busy), vec![advance(1, Phase::Custody)]].concat(),
        Phase::Teardown => [history_steps(Phase::Busy), vec![release(1, Outcome::Done)]].concat(),
        Phase::Quarantine => {
            let mut busy = history(Phase::Busy);
            busy.push((C::Reap, 200));
            return busy;
        }
        Phase::Done => vec![release(1, Outcome::Done)],
        Phase::Failed => vec![release(1, Outcome::Failed)],
    };
    for (i, step) in steps.into_iter().enumerate() {
        given.push((step, i64::try_from(i).expect("small") + 1));
    }
    given
}

fn history_steps(phase: Phase) -> Vec<C> {
    history(phase).into_iter().skip(1).map(|(command, _)| command).collect()
}

/// The state after a history.
pub fn replay(history: &[(C, i64)]) -> RunnerLease {
    super::table::replay(history, ctx_at)
}

/// One row, decided at second 50 (before any fixture lease expires, after every history).
pub fn check(given: &[(C, i64)], when: C, expect: Expect<RunnerError>) -> RunnerLease {
    super::table::check_at(given, (when, 50), expect, ctx_at)
}

/// One row decided at `second`.
pub fn check_at(
    given: &[(C, i64)],
    when: C,
    second: i64,
    expect: Expect<RunnerError>,
) -> RunnerLease {
    super::table::check_at(given, (when, second), expect, ctx_at)
}
