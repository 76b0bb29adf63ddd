//! The runner read models through the real projection runners: what a tenant's lease row
//! holds (and never holds), the holds the reconcilers read, the workloads row, the tenant's
//! quota usage and the operators' usage per tier and node, charged from the assignment until
//! the compute is confirmed gone; the job history; and a rebuild from the start equal to the
//! live tables row for row.

use leasehold_commands::runner_service::HolderReport;
use leasehold_domain::runner::{Outcome, Teardown};
use leasehold_projections::runner::RunnerProjection;
use leasehold_projections::runner_job::JobProjection;
use leasehold_tests::TestDb;

use super::support::*;
use crate::projections::support::{dump_of, last_event, quick, reset_of, start_of};

const TABLES: &[(&str, &str)] = &[
    ("runner_lease_view_states", "lease_id"),
    ("runner_leases", "lease_id"),
    ("runner_lease_holds", "lease_id"),
    ("runner_usage", "tier, node"),
    ("runner_job_view_states", "job_id"),
    ("job_history", "job_id"),
    ("workloads", "kind, workload_id"),
    ("quota_usage", "tenant_id, kind"),
    ("quota_usage_skus", "tenant_id, kind, sku"),
];

/// Runs both runner projections up to the log's last event.
async fn project(db: &TestDb) {
    let last = last_event(db).await;
    for mut running in [
        start_of(RunnerProjection, &db.store(), quick()),
        start_of(JobProjection, &db.store(), quick()),
    ] {
        running.reached(last).await;
        running.stop().await;
    }
}

async fn one_text(db: &TestDb, sql: &str) -> String {
    db.client().await.query_one(sql, &[]).await.expect("one row").get(0)
}

async fn vcpu_usage(db: &TestDb) -> (i64, i64) {
    let client = db.client().await;
    let tenant: Option<i64> = client
        .query_opt(
            "SELECT quantity FROM quota_usage_skus WHERE tenant_id = 'acme' AND kind = 'runner' \
             AND sku = 'runner.vcpu'",
            &[],
        )
        .await
        .expect("readable")
        .map(|row| row.get(0));
    let node: Option<i64> = client
        .query_opt(
            "SELECT vcpu FROM runner_usage WHERE tier = 'linux-4x' AND node = 'docker-1'",
            &[],
        )
        .await
        .expect("readable")
        .map(|row| row.get(0));
    (tenant.unwrap_or(0), node.unwrap_or(0))
}

#[tokio::test]
async fn a_lease_row_shows_its_tenant_its_runner_and_nothing_of_its_holders() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let lease = busy(&service, "busy", 1).await;
    project(&db).await;
    let row =
        one_text(&db, "SELECT row_to_json(r)::text FROM runner_leases r WHERE tenant_id = 'acme'")
            .await;
    let json: serde_json::Value = serde_json::from_str(&row).expect("json");
    assert_eq!(json["phase"], "busy");
    assert_eq!(json["lease_id"], lease.0.to_string());
    assert_eq!(json["job_run"], 7);
    assert_eq!(json["providers"], serde_json::json!(["docker"]));
    for hidden in ["docker-1", "./run.sh", "epoch", "instance", "node"] {
        assert!(!row.contains(hidden), "{hidden} is in the tenant's row: {row}");
    }
    let hold =
        one_text(&db, "SELECT node || ' ' || epoch || ' ' || phase FROM runner_lease_holds").await;
    assert_eq!(hold, "docker-1 1 busy");
    let workload = one_text(&db, "SELECT kind || ' ' || status FROM workloads").await;
    assert_eq!(workload, "runner busy");
    assert_eq!(vcpu_usage(&db).await, (4, 4), "charged to the tenant and to the tier on its node");
    let job = one_text(&db, "SELECT status || ' ' || tier FROM job_history").await;
    assert_eq!(job, "assigned linux-4x");
}

#[tokio::test]
async fn capacity_stays_charged_through_teardown_and_a_rebuild_equals_the_live_tables() {
    let db = TestDb::migrated().await;
    let clock = clock();
    let service = process(&db, &clock);
    let lease = busy(&service, "busy", 1).await;
    let node = machine("node:docker-1");
    service
        .release(&node, "release", (acme(), lease, 1), (Outcome::Done, None))
        .await
        .expect("released");
    let requested = HolderReport::Teardown { epoch: 1, teardown: Teardown::Requested };
    service.report(&node, "teardown-requested", (acme(), lease), requested).await.expect("asked");
    project(&db).await;
    assert_eq!(vcpu_usage(&db).await, (4, 4), "requested is not proof: still charged");
    let teardown = one_text(&db, "SELECT phase || ' ' || teardown FROM runner_leases").await;
    assert_eq!(teardown, "teardown requested");
    let stopped = HolderReport::Teardown { epoch: 1, teardown: Teardown::Stopped };
    service.report(&node, "teardown-stopped", (acme(), lease), stopped).await.expect("stopped");
    // Another lease that stays busy, so the rebuild has something charged to compare.
    busy(&service, "other", 2).await;
    project(&db).await;
    assert_eq!(vcpu_usage(&db).await, (4, 4), "the first released, the second charged");
    let done = one_text(
        &db,
        &format!(
            "SELECT phase || ' ' || outcome FROM runner_leases WHERE lease_id = '{}'",
            lease.0
        ),
    )
    .await;
    assert_eq!(done, "done done");
    let finished = one_text(
        &db,
        &format!("SELECT status || ' ' || outcome FROM job_history WHERE lease_id = '{}'", lease.0),
    )
    .await;
    assert_eq!(finished, "finished done");
    let live = dump_of(&db, TABLES).await;
    reset_of(&db, TABLES).await;
    project(&db).await;
    assert_eq!(dump_of(&db, TABLES).await, live, "a rebuild from the start equals the live tables");
}
