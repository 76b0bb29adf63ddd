//! A snapshot's creation and its reservation on its tenant's quota are one append with an
//! expected version on both streams (`commands/src/cross.rs`): concurrent creates from
//! separate processes can never take more than the quota allows, whatever the interleaving.

use futures_util::future::join_all;
use leasehold_commands::quota::quota_of;
use leasehold_commands::snapshot_service::quota_follows;
use leasehold_commands::{
    CommandError, CommandPipeline, CommandRequest, ErrorClass, PipelineConfig,
};
use leasehold_domain::quota::{QuotaCommand, QuotaLimits, SnapshotQuota};
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

pub(super) type Pipeline = CommandPipeline<leasehold_adapters::PgEventStore>;

fn acme() -> TenantId {
    TenantId::parse("acme").expect("valid")
}

/// A pipeline of its own, as another process's would be (nothing remembered in common), that
/// keeps deciding again after lost races long enough for eight contenders.
pub(super) fn process(db: &TestDb) -> Pipeline {
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
        quota_of(&acme()).stream_id(),
        key,
        command,
        (),
    );
    process(db).execute(request).await.expect("limits set");
}

pub(super) fn terms(n: u128) -> SnapshotTerms {
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
    create_as(pipeline, &acme(), terms(n)).await
}

/// A snapshot of `tenant`'s asked for, with the quota command its events carry linked to it
/// (as the snapshot service links it).
pub(super) async fn create_as(
    pipeline: &Pipeline,
    tenant: &TenantId,
    terms: SnapshotTerms,
) -> Result<
    leasehold_commands::CommandOutcome,
    CommandError<leasehold_domain::snapshot::SnapshotError>,
> {
    let key = OperationKey::parse(format!("snap-{}", terms.snapshot)).expect("valid");
    let stream = terms.snapshot.stream_id();
    let operation = OperationId(terms.snapshot.0);
    let command = SnapshotCommand::Create { terms: Box::new(terms), operation };
    execute_as(pipeline, tenant, stream, key, command).await
}

/// Runs `command` on `stream` as `tenant`'s, with the quota command its decision carries
/// linked, as the snapshot service runs it.
async fn execute_as(
    pipeline: &Pipeline,
    tenant: &TenantId,
    stream: leasehold_domain::StreamId,
    key: OperationKey,
    command: SnapshotCommand,
) -> Result<
    leasehold_commands::CommandOutcome,
    CommandError<leasehold_domain::snapshot::SnapshotError>,
> {
    let facts = SnapshotFacts { vm_running: true, ..SnapshotFacts::default() };
    let actor = Actor { subject: "user".into(), role: "tenant".into() };
    let request =
        CommandRequest::<Snapshot>::new(tenant.clone(), actor, stream, key, command, facts);
    let follows = quota_follows::<leasehold_adapters::PgEventStore>(tenant);
    pipeline.execute_following(request, &[], &follows).await
}

/// The quota at every version of its stream, oldest first.
async fn quota_history(db: &TestDb) -> Vec<SnapshotQuota> {
    let events =
        db.store().read_stream(&quota_of(&acme()).stream_id(), 1, 1_000).await.expect("readable");
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

/// Runs `command` on snapshot `n` with the quota command its events carry linked to it, as
/// the snapshot service does (`snapshot::quota_effect`).
async fn run(pipeline: &Pipeline, n: u128, key: &str, command: SnapshotCommand) {
    run_as(pipeline, &acme(), SnapshotId(Uuid::from_u128(n)), key, command).await;
}

/// Runs `command` on `tenant`'s `snapshot` (an agent's report, say), with its quota link.
pub(super) async fn run_as(
    pipeline: &Pipeline,
    tenant: &TenantId,
    snapshot: SnapshotId,
    key: &str,
    command: SnapshotCommand,
) {
    let key = OperationKey::parse(key).expect("valid");
    execute_as(pipeline, tenant, snapshot.stream_id(), key, command).await.expect("ran");
}

#[tokio::test]
async fn snapshots_and_quota_usage_are_projected_and_settled_to_the_honest_size() {
    use leasehold_domain::snapshot::{ReportedSizes, SnapshotKind, Written};
    use leasehold_projections::snapshot::SnapshotProjection;

    use crate::projections::support::{last_event, quick, start_of};
    let db = TestDb::migrated().await;
    set_limits(&db, QuotaLimits { max_count: 5, max_bytes: 1_000_000 }).await;
    let pipeline = process(&db);
    create(&pipeline, 1).await.expect("created");
    create(&pipeline, 2).await.expect("created");
    let written = Written {
        kind: SnapshotKind::Disk,
        sizes: ReportedSizes { disk_bytes: 800, memory_bytes: 0 },
        digest: Some(
            leasehold_domain::snapshot::Digest::parse("d", "cd".repeat(32)).expect("valid"),
        ),
        store_ref: leasehold_domain::vm::SnapshotRef::parse("r", "snap-1-a").expect("valid"),
        diff_of: None,
    };
    let confirm = SnapshotCommand::Confirm { operation: OperationId(Uuid::from_u128(1)), written };
    run(&pipeline, 1, "confirm-1", confirm).await;
    let detail = leasehold_domain::values::OperatorDetail::new("disk full on agent-1");
    let fail = SnapshotCommand::Fail { operation: OperationId(Uuid::from_u128(2)), detail };
    run(&pipeline, 2, "fail-2", fail).await;

    let head = last_event(&db).await;
    let mut projector = start_of(SnapshotProjection, &db.store(), quick());
    projector.reached(head).await;
    projector.stop().await;
    let client = db.client().await;
    let rows = client
        .query("SELECT snapshot_id, state, size_bytes, kind, digest, last_error FROM snapshot_records ORDER BY snapshot_id", &[])
        .await
        .expect("snapshots");
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].get::<_, &str>(1), "ready");
    assert_eq!(rows[0].get::<_, i64>(2), 800, "settled to the honest size");
    assert_eq!(rows[0].get::<_, Option<&str>>(3), Some("disk"));
    assert_eq!(rows[0].get::<_, Option<String>>(4), Some("cd".repeat(32)));
    assert_eq!(rows[1].get::<_, &str>(1), "error");
    assert_eq!(
        rows[1].get::<_, Option<&str>>(5),
        Some("disk full on agent-1"),
        "kept for operators"
    );
    let usage = client
        .query_one("SELECT count, bytes, max_count, max_bytes FROM snapshot_quota_usage WHERE tenant_id = 'acme'", &[])
        .await
        .expect("usage");
    let usage: (i64, i64, i64, i64) = (usage.get(0), usage.get(1), usage.get(2), usage.get(3));
    assert_eq!(usage, (1, 800, 5, 1_000_000), "the failed snapshot was released");
}
