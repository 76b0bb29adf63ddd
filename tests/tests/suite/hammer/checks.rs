//! The invariant checks themselves can fail: a log holding a breach of each kind (a second
//! reservation past a host's room, a workload quota's limit, a runner capacity's limit and a
//! snapshot quota's count, appended past the command pipeline as a faulty writer would, and
//! a generation that falls) is named event by event.

use leasehold_adapters::PgEventStore;
use leasehold_commands::quota::WorkloadQuotas;
use leasehold_commands::runner_service::RunnerService;
use leasehold_commands::snapshot_service::{SnapshotConfig, SnapshotService};
use leasehold_commands::{CommandPipeline, PipelineConfig};
use leasehold_domain::quota::QuotaLimits;
use leasehold_domain::runner_capacity::{RunnerLimits, TierLimit};
use leasehold_domain::snapshot::RequestedKind;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::vm::PlacementPolicy;
use leasehold_domain::workload_quota::{Limit, WorkloadKind};
use leasehold_domain::{
    EventStore as _, ExpectedVersion, StreamAppend, StreamId, StreamType, TenantId,
};
use leasehold_tests::TestDb;
use leasehold_tests::invariants::audit;
use serde_json::{Value, json};

use crate::commands::support::{new_lease, provision, request, routed};
use crate::support::event;

/// The stream's last event appended once more, with `member` of its payload set to `value`:
/// what a writer that skipped the aggregate's decision would leave.
async fn repeat_last(store: &PgEventStore, stream: &StreamId, member: &str, value: Value) {
    let events = store.read_stream(stream, 1, 1_000).await.expect("readable");
    let last = events.last().expect("the stream has events");
    let mut payload = last.payload.clone();
    assert!(payload.get(member).is_some(), "{member} in {payload}");
    payload[member] = value;
    let append = StreamAppend {
        stream_id: stream.clone(),
        stream_type: last.stream_type.clone(),
        tenant_id: last.tenant_id.clone(),
        expected: ExpectedVersion::Any,
        events: vec![event(last.event_type.as_str(), payload)],
    };
    store.append(vec![append]).await.expect("appended past the pipeline");
}

fn pipeline(db: &TestDb) -> CommandPipeline<PgEventStore> {
    CommandPipeline::new(db.store(), PipelineConfig::default())
}

#[tokio::test]
async fn a_breach_of_each_invariant_is_named_at_its_event() {
    use crate::fleet::support as fleet;
    let db = TestDb::migrated().await;
    let store = db.store();
    let acme = TenantId::parse("acme").expect("valid");
    // A host with room for one VM, holding one.
    fleet::register(&db, "small", fleet::host_spec(HostBackend::Firecracker, 2, 1)).await;
    let vms = fleet::service(&db, &["small"], PlacementPolicy::Spread);
    let task = fleet::task("one");
    let placed = (&task, fleet::spec());
    let vm = vms.create(&fleet::tenant("acme"), "vm-1", placed, &fleet::no_secrets()).await;
    let vm = vm.expect("placed").vm;
    // A snapshot quota of one snapshot, holding one of that VM, booted.
    let (_, stored) = vms.owned(vm).await.expect("stored");
    let (boot, host) = (stored.operation.expect("a boot"), fleet::host_id("small"));
    let url = leasehold_domain::vm::VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    vms.report_booted(&fleet::agent(), &host, "booted", vm, (boot, url)).await.expect("booted");
    let snapshots = SnapshotService::new(
        pipeline(&db),
        leasehold_adapters::PgReadModels::of(&store),
        SnapshotConfig::default(),
    );
    let one = QuotaLimits { max_count: 1, max_bytes: 0 };
    let operator = super::vms::operator();
    snapshots.set_limits(&operator, "snapshot-limits", (&acme, one)).await.expect("set");
    let ask = fleet::snapshot_ask(vm, RequestedKind::Disk);
    snapshots.create(&fleet::tenant("acme"), "snapshot-1", &ask).await.expect("reserved");
    // A lease quota of one lease, holding one.
    let quotas = WorkloadQuotas::new(pipeline(&db));
    let limits = vec![Limit { resource: "count".into(), max: 1 }];
    let set = (&acme, WorkloadKind::Lease, limits);
    quotas.set_limits(&super::vms::operator(), "limits", set).await.expect("set");
    let lease = new_lease();
    let asked = request("acme", lease, "lease-1", provision(lease, 1), routed());
    pipeline(&db).execute(asked).await.expect("admitted");
    // A runner capacity of one lease of the tier, holding one.
    use crate::runners::support as runners;
    let service = RunnerService::new(pipeline(&db));
    let tier = vec![TierLimit { tier: runners::tier(), max: 1 }];
    let limits = RunnerLimits { tiers: tier, ..RunnerLimits::default() };
    service.set_limits(&runners::operator(), "runner-limits", (&acme, limits)).await.expect("set");
    let runner = runners::requested(&service, "runner-1").await;
    let assign = (runner, 1, runners::job(1));
    service.assign(&runners::tenant("acme"), "assign-1", assign).await.expect("assigned");
    let clean = audit(&db).await;
    assert_eq!(clean.violations, Vec::<String>::new(), "the pipeline's log breaks nothing");
    // The VM charged its host and its workload quota; the lease, the runner and the snapshot
    // one each.
    assert_eq!(clean.reservations, 5, "every reservation checked");

    // The same reservations once more, for other workloads, past the pipeline.
    let host = fleet::host_id("small").stream_id();
    repeat_last(&store, &host, "vm", json!(uuid::Uuid::now_v7())).await;
    let quota = leasehold_commands::workload_quota_of(&acme, WorkloadKind::Lease).stream_id();
    repeat_last(&store, &quota, "workload", json!(new_lease().stream_id().to_string())).await;
    let capacity = stream_of_type(&store, "runner-capacity").await;
    repeat_last(&store, &capacity, "lease", json!(uuid::Uuid::now_v7())).await;
    let snapshot_quota = stream_of_type(&store, "tenant-quota").await;
    repeat_last(&store, &snapshot_quota, "snapshot", json!(uuid::Uuid::now_v7())).await;
    // And a generation that falls.
    let falls = StreamAppend {
        stream_id: StreamId::parse("lease-falling").expect("valid"),
        stream_type: StreamType::parse("lease").expect("valid"),
        tenant_id: acme.clone(),
        expected: ExpectedVersion::Any,
        events: vec![
            event("LeaseDispatched", json!({"generation": 2, "attempt": 1})),
            event("LeaseDispatched", json!({"generation": 1, "attempt": 1})),
        ],
    };
    store.append(vec![falls]).await.expect("appended");

    let found = audit(&db).await.violations;
    let named = |what: &str| found.iter().filter(|v| v.contains(what)).count();
    assert_eq!(found.len(), 5, "{found:#?}");
    assert_eq!(named("host over capacity"), 1, "{found:#?}");
    assert_eq!(named("workload quota exceeded"), 1, "{found:#?}");
    assert_eq!(named("runner capacity exceeded"), 1, "{found:#?}");
    assert_eq!(named("snapshot quota exceeded: [\"count 2 > 1\"]"), 1, "{found:#?}");
    assert_eq!(named("lease-falling v2 (LeaseDispatched): generation fell from 2 to 1"), 1);
}

/// The one stream of `stream_type` in the log.
async fn stream_of_type(store: &PgEventStore, stream_type: &str) -> StreamId {
    let page = store.read_log(leasehold_domain::Cursor::START, 1_000).await.expect("readable");
    let found = page.events.iter().find(|e| e.stream_type.as_str() == stream_type);
    found.unwrap_or_else(|| panic!("a {stream_type} stream")).stream_id.clone()
}
