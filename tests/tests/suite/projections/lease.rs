//! What the lease read models show, to whom.

use leasehold_adapters::read_models::LeaseListing;
use leasehold_commands::lease_input;
use leasehold_domain::lease::{LeaseCommand, LeaseFacts, MaintenanceId, MaintenanceOutcome};
use leasehold_tests::TestDb;
use uuid::Uuid;

use super::support::*;
use crate::commands::support::{
    self as commands, new_lease, pipeline, provision, request, routed, tenant,
};

fn plain(
    tenant_name: &str,
    lease: leasehold_domain::lease::LeaseId,
    key: &str,
    command: LeaseCommand,
) -> leasehold_commands::CommandRequest<leasehold_domain::lease::Lease> {
    request(tenant_name, lease, key, command, LeaseFacts::default())
}

#[tokio::test]
async fn the_read_models_show_each_lease_to_its_tenant_only() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let pipeline = pipeline(&db);
    // A: ready, with a custom domain, then updated to a second release.
    let a = commands::ready_lease(&pipeline, "acme").await;
    let domain =
        lease_input::set_custom_domain(Some("web"), Some("app.example.com")).expect("valid");
    pipeline.execute(plain("acme", a, "a-domain", domain)).await.expect("set");
    let update = LeaseCommand::Update {
        maintenance_id: MaintenanceId(Uuid::from_u128(1)),
        payload_hash: leasehold_domain::lease::PayloadHash::parse("h", "cd".repeat(32))
            .expect("valid"),
    };
    pipeline.execute(plain("acme", a, "a-update", update)).await.expect("updating");
    let admitted = commands::events_of(&db, a)
        .await
        .last()
        .map(|e| e.payload["admitted_at"].clone())
        .expect("an event");
    let done = LeaseCommand::CompleteMaintenance {
        maintenance_id: MaintenanceId(Uuid::from_u128(1)),
        admitted_at: Some(serde_json::from_value(admitted).expect("a time")),
        outcome: MaintenanceOutcome::Succeeded,
    };
    pipeline.execute(plain("acme", a, "a-done", done)).await.expect("updated");
    // B: its provision failed, with an operator-only detail.
    let b = new_lease();
    pipeline
        .execute(request("acme", b, "b-req", provision(b, 2), routed()))
        .await
        .expect("requested");
    let failed = lease_input::report_failed(
        commands::operation_of(b),
        Some("ImagePullFailed"),
        "the image could not be pulled",
        "401 from registry.internal at /var/lib/secret-path",
    )
    .expect("valid");
    pipeline.execute(plain("acme", b, "b-fail", failed)).await.expect("failed");
    // C: released with its data retained.
    let c = commands::ready_lease(&pipeline, "acme").await;
    pipeline
        .execute(plain("acme", c, "c-down", LeaseCommand::Deprovision))
        .await
        .expect("deprovisioning");
    pipeline
        .execute(plain("acme", c, "c-gone", LeaseCommand::ConfirmDeprovisioned { retained: true }))
        .await
        .expect("retained");

    let mut running = start(&store, quick());
    running.reached(last_event(&db).await).await;
    running.stop().await;

    let acme = tenant("acme");
    let lease_a = leasehold_adapters::PgReadModels::of(&store)
        .lease(&acme, a)
        .await
        .expect("readable")
        .expect("found");
    assert_eq!((lease_a.status.as_str(), lease_a.chain_state.as_str()), ("ready", "active"));
    assert_eq!(
        lease_a.items[1].custom_domain.as_ref().map(|d| d.as_str()),
        Some("app.example.com")
    );
    let releases =
        leasehold_adapters::PgReadModels::of(&store).releases(&acme, a).await.expect("readable");
    let statuses: Vec<(u32, &str)> =
        releases.iter().map(|r| (r.version, r.status.as_str())).collect();
    assert_eq!(statuses, [(1, "superseded"), (2, "active")]);

    let lease_b = leasehold_adapters::PgReadModels::of(&store)
        .lease(&acme, b)
        .await
        .expect("readable")
        .expect("found");
    assert_eq!((lease_b.status.as_str(), lease_b.chain_state.as_str()), ("failed", "rejected"));
    assert_eq!(lease_b.reason.as_deref(), Some("ImagePullFailed"));
    assert_eq!(lease_b.message.as_deref(), Some("the image could not be pulled"));
    assert!(
        !format!("{lease_b:?}").contains("secret-path"),
        "the tenant view never holds the detail"
    );
    let diagnostics = leasehold_adapters::PgReadModels::of(&store)
        .lease_diagnostics(b)
        .await
        .expect("readable")
        .expect("found");
    assert!(diagnostics.last_error.as_deref().is_some_and(|e| e.contains("secret-path")));
    assert_eq!(diagnostics.fail_count, 1);

    let lease_c = leasehold_adapters::PgReadModels::of(&store)
        .lease(&acme, c)
        .await
        .expect("readable")
        .expect("found");
    assert_eq!(lease_c.status, "retained");

    // Quota: A and B hold resources (B's allocation stays until it is released); C does not.
    let usage =
        leasehold_adapters::PgReadModels::of(&store).quota_usage(&acme).await.expect("readable");
    assert_eq!(usage.len(), 1);
    assert_eq!(usage[0].active_count, 2);
    assert_eq!(usage[0].skus, [("cpu.standard.4x".to_owned(), 4), ("gpu.h100.1x".to_owned(), 2)]);

    let listed = leasehold_adapters::PgReadModels::of(&store)
        .leases(&acme, &LeaseListing { first: 10, ..LeaseListing::default() })
        .await
        .expect("readable");
    assert_eq!(listed.len(), 3);
    let failed_only = LeaseListing { status: Some("failed".into()), first: 10, after: None };
    assert_eq!(
        leasehold_adapters::PgReadModels::of(&store)
            .leases(&acme, &failed_only)
            .await
            .expect("readable")
            .len(),
        1
    );

    // Another tenant sees none of it.
    let globex = tenant("globex");
    for lease in [a, b, c] {
        assert!(
            leasehold_adapters::PgReadModels::of(&store)
                .lease(&globex, lease)
                .await
                .expect("readable")
                .is_none()
        );
        assert!(
            leasehold_adapters::PgReadModels::of(&store)
                .releases(&globex, lease)
                .await
                .expect("readable")
                .is_empty()
        );
    }
    assert!(
        leasehold_adapters::PgReadModels::of(&store)
            .leases(&globex, &LeaseListing { first: 10, ..LeaseListing::default() })
            .await
            .expect("readable")
            .is_empty()
    );
    assert!(
        leasehold_adapters::PgReadModels::of(&store)
            .quota_usage(&globex)
            .await
            .expect("readable")
            .is_empty()
    );

    let client = db.client().await;
    let retained: i64 = client
        .query_one("SELECT count(*) FROM retained_leases WHERE lease_id = $1", &[&c.0])
        .await
        .expect("readable")
        .get(0);
    assert_eq!(retained, 1);
    let workloads: i64 = client
        .query_one("SELECT count(*) FROM workloads WHERE tenant_id = 'acme'", &[])
        .await
        .expect("readable")
        .get(0);
    assert_eq!(workloads, 3);
}

#[tokio::test]
async fn a_fenced_completion_changes_no_read_model() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let pipeline = pipeline(&db);
    let lease = commands::ready_lease(&pipeline, "acme").await;
    let maintenance = MaintenanceId(Uuid::from_u128(9));
    pipeline
        .execute(plain(
            "acme",
            lease,
            "restart",
            LeaseCommand::Restart { maintenance_id: maintenance },
        ))
        .await
        .expect("restarting");
    let mut running = start(&store, quick());
    running.reached(last_event(&db).await).await;
    let before = dump(&db).await;
    let stale = LeaseCommand::CompleteMaintenance {
        maintenance_id: maintenance,
        admitted_at: Some(chrono::Utc::now() - chrono::TimeDelta::hours(1)),
        outcome: MaintenanceOutcome::Succeeded,
    };
    let refused = pipeline.execute(plain("acme", lease, "stale", stale)).await;
    assert_eq!(refused.expect_err("fenced").class(), leasehold_commands::ErrorClass::Fenced);
    // Something else happens in the log, so the projection has moved past the refusal.
    let other = commands::ready_lease(&pipeline, "acme").await;
    running.reached(last_event(&db).await).await;
    running.stop().await;
    let after = dump(&db).await;
    let of_lease = |tables: &[(String, Vec<String>)]| -> Vec<String> {
        tables
            .iter()
            .flat_map(|(_, rows)| {
                rows.iter().filter(|row| row.contains(&lease.0.to_string())).cloned()
            })
            .collect()
    };
    assert_eq!(of_lease(&after), of_lease(&before));
    assert!(
        leasehold_adapters::PgReadModels::of(&store)
            .lease(&tenant("acme"), other)
            .await
            .expect("readable")
            .is_some()
    );
    assert_eq!(
        leasehold_adapters::PgReadModels::of(&store)
            .lease(&tenant("acme"), lease)
            .await
            .expect("readable")
            .expect("found")
            .status,
        "restarting"
    );
}
