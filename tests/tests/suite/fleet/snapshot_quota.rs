//! A snapshot's creation and its reservation on its tenant's quota are one append with an
//! expected version on both streams (`commands/src/cross.rs`): concurrent creates from
//! separate processes can never take more than the quota allows, whatever the interleaving.

use futures_util::future::join_all;
use leasehold_commands::{
    CommandError, CommandPipeline, CommandRequest, ErrorClass, Link, LinkedCommand, PipelineConfig,
};
use leasehold_domain::quota::{self, QuotaCommand, QuotaLimits, SnapshotQuota};
use leasehold_domain::snapshot::{
    RequestedKind, Snapshot, SnapshotCommand, SnapshotFacts, SnapshotId, SnapshotMode,
    SnapshotTerms,
};
use leasehold_domain::values::OperationId;
use leasehold_domain::values::fleet::{Arch, HostId, TaskId, VmId};
use leasehold_domain::{
    Actor, Aggregate, DomainEvent, EventStore as _, OperationKey, RefusalKind, TenantId,
};
use leasehold_tests::TestDb;
use uuid::Uuid;

type Pipeline = CommandPipeline<leasehold_adapters::PgEventStore>;

fn acme() -> TenantId {
    TenantId::parse("acme").expect("valid")
}

/// A pipeline of its own, as another process's would be (nothing remembered in common), that
/// keeps deciding again after lost races long enough for eight contenders.
fn process(db: &TestDb) -> Pipeline {
    CommandPipeline::new(
        db.store(),
        PipelineConfig { retries_max: 32, ..PipelineConfig::default() },
    )
}

async fn set_limits(db: &TestDb, limits: QuotaLimits) {
    let actor = Actor { subject: "ops".into(), role: "operator".into() };
    let key = OperationKey::parse("limits").expect("valid");
    let command = QuotaCommand::SetLimits { limits };
    let request = CommandRequest::<SnapshotQuota>::new(
        acme(),
        actor,
        quota::stream_of(&acme()),
        key,
        command,
        (),
    );
    process(db).execute(request).await.expect("limits set");
}

fn terms(n: u128) -> SnapshotTerms {
    SnapshotTerms {
        snapshot: SnapshotId(Uuid::from_u128(n)),
        vm: VmId(Uuid::from_u128(1_000 + n)),
        task: TaskId::parse("t", format!("task-{n}")).expect("valid"),
        host: HostId::parse("h", "agent-1").expect("valid"),
        arch: Arch::amd64(),
        mode: SnapshotMode::Manual,
        requested: RequestedKind::Disk,
        parent: None,
        layer_key: None,
        name: None,
        retention_until: None,
        estimate_bytes: 1_000,
    }
}

/// Snapshot `n` asked for, its estimate reserved on the tenant's quota in the same append.
async fn create(
    pipeline: &Pipeline,
    n: u128,
) -> Result<
    leasehold_commands::CommandOutcome,
    CommandError<leasehold_domain::snapshot::SnapshotError>,
> {
    let terms = terms(n);
    let reserve = QuotaCommand::Reserve { snapshot: terms.snapshot, bytes: terms.estimate_bytes };
    let links: Vec<Box<dyn Link<leasehold_adapters::PgEventStore>>> =
        vec![Box::new(LinkedCommand::<SnapshotQuota>::new(quota::stream_of(&acme()), reserve, ()))];
    let actor = Actor { subject: "acme-user".into(), role: "tenant".into() };
    let key = OperationKey::parse(format!("snap-{n}")).expect("valid");
    let stream = terms.snapshot.stream_id();
    let command = SnapshotCommand::Create {
        terms: Box::new(terms),
        operation: OperationId(Uuid::from_u128(n)),
    };
    let facts = SnapshotFacts { vm_running: true, ..SnapshotFacts::default() };
    let request = CommandRequest::<Snapshot>::new(acme(), actor, stream, key, command, facts);
    pipeline.execute_linked(request, &links).await
}

/// The quota at every version of its stream, oldest first.
async fn quota_history(db: &TestDb) -> Vec<SnapshotQuota> {
    let events =
        db.store().read_stream(&quota::stream_of(&acme()), 1, 1_000).await.expect("readable");
    let mut quota = SnapshotQuota::initial();
    let mut history = Vec::new();
    for recorded in events {
        let event = leasehold_domain::quota::QuotaEvent::from_stored(
            recorded.event_type.as_str(),
            &recorded.payload,
        )
        .expect("a quota event");
        quota = quota.evolve(&event);
        history.push(quota.clone());
    }
    history
}

/// Eight creates at once, each from a process of its own: exactly `accepted` commit, the
/// others are refused `QUOTA_EXCEEDED` with nothing of them in the log, and the quota's usage
/// is within its limits at every version of its stream.
async fn eight_concurrent_creates(db: &TestDb, limits: QuotaLimits, accepted: usize) {
    let processes: Vec<Pipeline> = (0..8).map(|_| process(db)).collect();
    let outcomes =
        join_all(processes.iter().zip(1u128..).map(|(pipeline, n)| create(pipeline, n))).await;
    let committed = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
    assert_eq!(committed, accepted, "{outcomes:?}");
    for (outcome, n) in outcomes.iter().zip(1u128..) {
        let Err(refused) = outcome else { continue };
        assert!(
            matches!(refused, CommandError::LinkedRefused { kind: RefusalKind::QuotaExceeded, .. }),
            "{refused:?}"
        );
        assert_eq!(refused.class(), ErrorClass::QuotaExceeded);
        let stream = SnapshotId(Uuid::from_u128(n)).stream_id();
        assert!(db.store().read_stream(&stream, 1, 10).await.expect("readable").is_empty());
    }
    let history = quota_history(db).await;
    for quota in &history {
        let QuotaLimits { max_count, max_bytes } = limits;
        assert!(max_count == 0 || quota.usage.count <= max_count, "{quota:?}");
        assert!(max_bytes == 0 || quota.usage.bytes <= max_bytes, "{quota:?}");
    }
    let last = history.last().expect("reservations");
    assert_eq!(last.usage.count as usize, accepted);
}

#[tokio::test]
async fn eight_concurrent_creates_with_room_for_five_snapshots_commit_exactly_five() {
    let db = TestDb::migrated().await;
    set_limits(&db, QuotaLimits { max_count: 5, max_bytes: 0 }).await;
    eight_concurrent_creates(&db, QuotaLimits { max_count: 5, max_bytes: 0 }, 5).await;
}

#[tokio::test]
async fn eight_concurrent_creates_with_room_for_five_thousand_bytes_commit_exactly_five() {
    let db = TestDb::migrated().await;
    set_limits(&db, QuotaLimits { max_count: 0, max_bytes: 5_000 }).await;
    eight_concurrent_creates(&db, QuotaLimits { max_count: 0, max_bytes: 5_000 }, 5).await;
}

#[tokio::test]
async fn a_tenants_first_snapshot_opens_its_quota_with_no_limits() {
    let db = TestDb::migrated().await;
    create(&process(&db), 1).await.expect("no quota yet: nothing limits it");
    let history = quota_history(&db).await;
    let quota = history.last().expect("opened by the reservation");
    assert_eq!((quota.usage.count, quota.usage.bytes), (1, 1_000));
    assert_eq!(quota.limits, QuotaLimits::default());
}
