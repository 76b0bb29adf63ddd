//! Every projection rebuilt from scratch over a log holding a workload of every kind (a
//! lease, a VM, a rental with its node and a run, a runner lease with its job and capacity,
//! and the workload quotas they charge):
//! the shared `workloads` and `quota_usage` tables, and every kind's own, equal the live
//! tables — written batch by batch while the commands were decided — row for row.

use leasehold_commands::PipelineConfig;
use leasehold_commands::lease_input::{ItemInput, LeaseInputLimits, RequestLeaseInput};
use leasehold_commands::lease_service::LeaseService;
use leasehold_domain::lease::ServiceName;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::vm::PlacementPolicy;
use leasehold_projections::host::HostProjection;
use leasehold_projections::lease::LeaseProjection;
use leasehold_projections::node::NodeProjection;
use leasehold_projections::rental::RentalProjection;
use leasehold_projections::run::RunProjection;
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::runner_fleet::RunnerFleetProjection;
use leasehold_projections::runner_job::JobProjection;
use leasehold_projections::snapshot::SnapshotProjection;
use leasehold_projections::vm::VmProjection;
use leasehold_projections::workload_quota::WorkloadQuotaProjection;
use leasehold_tests::TestDb;

use super::support::{dump_of, last_event, quick, reset_of, start_of};

/// Every table a projection writes, each with an order that makes its dump comparable.
pub(crate) const TABLES: &[(&str, &str)] = &[
    ("workloads", "kind, workload_id"),
    ("quota_usage", "tenant_id, kind"),
    ("quota_usage_skus", "tenant_id, kind, sku"),
    ("lease_view_states", "lease_id"),
    ("leases", "lease_id"),
    ("lease_diagnostics", "t::text"),
    ("releases", "t::text"),
    ("retained_leases", "t::text"),
    ("host_view_states", "t::text"),
    ("hosts", "t::text"),
    ("vm_view_states", "t::text"),
    ("vms", "t::text"),
    ("dead_letters", "t::text"),
    ("snapshot_view_states", "t::text"),
    ("snapshot_records", "t::text"),
    ("snapshot_quota_usage", "t::text"),
    ("rental_view_states", "t::text"),
    ("rentals", "t::text"),
    ("node_view_states", "t::text"),
    ("nodes", "t::text"),
    ("run_view_states", "t::text"),
    ("run_timeline", "t::text"),
    ("runner_lease_view_states", "lease_id"),
    ("runner_leases", "lease_id"),
    ("runner_lease_holds", "lease_id"),
    ("runner_usage", "tier, node"),
    ("runner_job_view_states", "job_id"),
    ("job_history", "job_id"),
    ("runner_fleet_view_states", "stream_key"),
    ("runner_capacities", "tenant_id"),
    ("runner_nodes", "node"),
    ("workload_quota_view_states", "stream_key"),
    ("workload_quotas", "tenant_id, kind"),
];

/// A runner of every projection `serve` runs.
pub(crate) fn start_all(db: &TestDb) -> Vec<super::support::Running> {
    let store = db.store();
    vec![
        start_of(LeaseProjection, &store, quick()),
        start_of(VmProjection, &store, quick()),
        start_of(HostProjection, &store, quick()),
        start_of(SnapshotProjection, &store, quick()),
        start_of(RentalProjection, &store, quick()),
        start_of(NodeProjection, &store, quick()),
        start_of(RunProjection, &store, quick()),
        start_of(RunnerProjection, &store, quick()),
        start_of(JobProjection, &store, quick()),
        start_of(RunnerFleetProjection, &store, quick()),
        start_of(WorkloadQuotaProjection, &store, quick()),
    ]
}

/// Lets `running` reach the log's last event, then stops them.
pub(crate) async fn finish(db: &TestDb, running: Vec<super::support::Running>) {
    let last = last_event(db).await;
    for mut runner in running {
        runner.reached(last).await;
        runner.stop().await;
    }
}

/// acme's lease, VM, rental, run and runner lease, and globex's lease.
async fn one_of_each_kind(db: &TestDb) {
    let backend = ServiceName::parse("backend", "docker-1").expect("valid");
    let pipeline = crate::commands::support::pipeline_with(db, PipelineConfig::default());
    let leases = LeaseService::new(pipeline, Some(backend), LeaseInputLimits::default());
    let input = RequestLeaseInput {
        provider_id: uuid::Uuid::from_u128(7).to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 2, service_name: None }],
        payload_hash: "ab".repeat(32),
    };
    for tenant in ["acme", "globex"] {
        let caller = crate::fleet::support::tenant(tenant);
        leases.request(&caller, "lease-1", None, &input).await.expect("requested");
    }
    use crate::fleet::support as fleet;
    fleet::register(db, "agent-1", fleet::host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = fleet::service(db, &["agent-1"], PlacementPolicy::Spread);
    let task = fleet::task("build-1");
    vms.create(&fleet::tenant("acme"), "vm-1", (&task, fleet::spec()), &fleet::no_secrets())
        .await
        .expect("placed");
    let clock = leasehold_projections::ManualClock::at(crate::rented::support::start());
    let rented = crate::rented::support::services(db, &clock);
    let rental = crate::rented::support::active_rental(&rented, "acme", "rental-1").await;
    crate::rented::runs::booked_run(&rented, rental, "run-1").await;
    let runners = crate::runners::support::process(db, &crate::runners::support::clock());
    crate::runners::support::busy(&runners, "runner-1", 1).await;
}

#[tokio::test]
async fn every_projection_rebuilt_from_scratch_equals_the_live_tables() {
    let db = TestDb::migrated().await;
    // Live: every projection follows the log while the commands are decided, batch by batch.
    let running = start_all(&db);
    one_of_each_kind(&db).await;
    finish(&db, running).await;
    let live = dump_of(&db, TABLES).await;
    let kinds: Vec<&str> =
        live[0].1.iter().map(|row| row.split(',').next().unwrap_or("")).collect();
    for kind in ["(lease", "(vm", "(rental", "(run", "(runner"] {
        assert!(kinds.contains(&kind), "a {kind} workload in {kinds:?}");
    }
    assert!(!live[1].1.is_empty() && !live[2].1.is_empty(), "quota usage to compare");
    reset_of(&db, TABLES).await;
    assert!(dump_of(&db, TABLES).await.iter().all(|(_, rows)| rows.is_empty()), "from scratch");
    finish(&db, start_all(&db)).await;
    let rebuilt = dump_of(&db, TABLES).await;
    for ((table, live_rows), (_, rebuilt_rows)) in live.iter().zip(&rebuilt) {
        assert_eq!(rebuilt_rows, live_rows, "{table}: a rebuild equals the live table");
    }
}

/// Issue 15: an export replayed in memory, with no database, equals the live read models
/// table for table (equal digests); a row edited by hand is named, with its column.
#[tokio::test]
async fn a_replay_of_an_export_equals_the_live_read_models_and_names_an_edited_row() {
    use leasehold_adapters::archive::{ExportFilter, HeadsAhead};
    use leasehold_adapters::replay::{Difference, compare, replay_file};
    let db = TestDb::migrated().await;
    let running = start_all(&db);
    one_of_each_kind(&db).await;
    provisioned_lease(&db).await;
    finish(&db, running).await;
    let store = db.store();
    let mut file = Vec::new();
    store.export(&ExportFilter::default(), &mut file, |_, _| {}).await.expect("exported");
    let heads = Some(HeadsAhead::new(&file[..]));
    let replayed = replay_file(&file[..], heads, |_| {}).expect("replayed");
    let rows = |table: &str| replayed.digests.iter().find(|d| d.table == table).map(|d| d.rows);
    for table in [
        "workloads",
        "quota_usage",
        "quota_usage_skus",
        "leases",
        "lease_diagnostics",
        "hosts",
        "vms",
        "rentals",
        "nodes",
        "run_timeline",
        "runner_leases",
        "runner_lease_holds",
        "job_history",
        "runner_capacities",
        "runner_nodes",
        "workload_quotas",
    ] {
        assert!(rows(table) > Some(0), "{table} has rows: {:?}", replayed.digests);
    }
    let compared = compare(&store, &replayed.tables, replayed.last).await.expect("compared");
    assert_eq!(compared.differences, vec![]);
    assert_eq!(compared.live, replayed.digests, "every read model's digest");
    assert_eq!((compared.behind.len(), compared.ahead.len()), (0, 0), "{compared:?}");
    // One row edited by hand: named, with the column, and nothing else.
    let client = db.client().await;
    let edited =
        "UPDATE leases SET status = 'tampered' WHERE tenant_id = 'globex' RETURNING lease_id";
    let lease: uuid::Uuid = client.query_one(edited, &[]).await.expect("edited").get(0);
    let compared = compare(&store, &replayed.tables, replayed.last).await.expect("compared");
    let [Difference::Differs { table, key, columns }] = &compared.differences[..] else {
        panic!("one row differs: {:?}", compared.differences);
    };
    assert_eq!((table.as_str(), key.contains(&lease.to_string())), ("leases", true), "{key}");
    assert_eq!(columns.len(), 1, "{columns:?}");
    assert_eq!((columns[0].0.as_str(), columns[0].2.as_str()), ("status", "\"tampered\""));
    let differs = compared.live.iter().zip(&replayed.digests).filter(|(a, b)| a != b);
    assert_eq!(differs.map(|(a, _)| a.table.as_str()).collect::<Vec<_>>(), ["leases"]);
    // A row removed, and a row added, are named too.
    client.execute("DELETE FROM vms", &[]).await.expect("removed");
    client
        .execute("INSERT INTO workload_quotas (tenant_id, kind, limits, updated_at) VALUES ('nobody', 'vm', '{}', now())", &[])
        .await
        .expect("added");
    let compared = compare(&store, &replayed.tables, replayed.last).await.expect("compared");
    let named: Vec<String> = compared.differences.iter().map(ToString::to_string).collect();
    assert_eq!(compared.differences.len(), 3, "{named:?}");
    assert!(
        named.iter().any(|d| d.starts_with("vms ") && d.contains("not in the live table")),
        "{named:?}"
    );
    assert!(
        named.iter().any(|d| d.starts_with("workload_quotas ")
            && d.contains("nobody")
            && d.contains("only in the live table")),
        "{named:?}"
    );
}

/// acme's second lease, reported provisioned by its provider's agent: its release settles
/// (an `UPDATE` of `releases` the replay writes by hand).
async fn provisioned_lease(db: &TestDb) {
    use leasehold_commands::lease_service::Caller;
    use leasehold_domain::lease::{Lease, LeaseCommand};
    let backend = ServiceName::parse("backend", "docker-1").expect("valid");
    let pipeline = crate::commands::support::pipeline_with(db, PipelineConfig::default());
    let leases = LeaseService::new(pipeline, Some(backend), LeaseInputLimits::default());
    let input = RequestLeaseInput {
        provider_id: uuid::Uuid::from_u128(7).to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
        payload_hash: "cd".repeat(32),
    };
    let acme = crate::fleet::support::tenant("acme");
    let requested = leases.request(&acme, "lease-2", None, &input).await.expect("requested");
    let stream = requested.lease.stream_id();
    let stored = leases.pipeline().state::<Lease>(&stream).await.expect("readable");
    let operation = stored.expect("stored").2.operation.expect("the provision's operation");
    let agent = Caller {
        actor: leasehold_domain::Actor { subject: "agent-7".into(), role: "agent".into() },
        tenant: None,
        provider: Some(leasehold_domain::lease::ProviderId(uuid::Uuid::from_u128(7))),
        namespace: None,
    };
    let report = LeaseCommand::ReportProvisioned { operation };
    leases.for_owner(&agent, "up-1", requested.lease, report).await.expect("reported");
}
