//! The fleet's read models, projected from the log: `hosts` with capacity, allocation and
//! headroom; `vms`, `workloads` and quota usage per tenant, never a credential's reference;
//! and the hosts' working states read back as placement's catalog, which may lag and still
//! never lets a host be over-committed.

use futures_util::future::join_all;
use leasehold_adapters::PgHostCatalog;
use leasehold_adapters::vault::PgCredentialVault;
use leasehold_commands::vm_service::VmService;
use leasehold_commands::{CommandError, CommandPipeline, PipelineConfig};
use leasehold_domain::host::Gate;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::vm::{PlacementPolicy, VmError};
use leasehold_projections::host::HostProjection;
use leasehold_projections::vm::VmProjection;
use leasehold_tests::TestDb;

use super::support::*;
use crate::projections::support::{last_event, quick, start_of};

async fn project(db: &TestDb) {
    let head = last_event(db).await;
    let mut hosts = start_of(HostProjection, &db.store(), quick());
    let mut vms = start_of(VmProjection, &db.store(), quick());
    hosts.reached(head).await;
    vms.reached(head).await;
    hosts.stop().await;
    vms.stop().await;
}

#[tokio::test]
async fn hosts_and_vms_are_projected_and_vms_show_each_tenant_its_own() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let mine = vms
        .create(&tenant("acme"), "c-1", (&task("mine"), spec()), &no_secrets())
        .await
        .expect("placed");
    let mut big = spec();
    big.cpus = 6;
    let theirs = vms
        .create(&tenant("globex"), "c-1", (&task("theirs"), big), &no_secrets())
        .await
        .expect("placed");
    let (_, stored) = vms.owned(mine.vm).await.expect("stored");
    let credentials = stored.terms.expect("created").credentials;
    project(&db).await;

    let client = db.client().await;
    let host = client
        .query_one("SELECT state, vm_count, allocated->>'cpus', headroom->>'cpus', backend FROM hosts WHERE host_id = 'agent-1'", &[])
        .await
        .expect("a host row");
    assert_eq!(host.get::<_, &str>(0), "active");
    assert_eq!(host.get::<_, i64>(1), 2);
    assert_eq!(host.get::<_, &str>(2), "8");
    assert_eq!(host.get::<_, &str>(3), "8");
    assert_eq!(host.get::<_, &str>(4), "firecracker");

    let rows = client
        .query("SELECT vm_id, state, host_id, task_state FROM vms WHERE tenant_id = 'acme'", &[])
        .await
        .expect("readable");
    assert_eq!(rows.len(), 1, "a tenant's listing holds its own VMs only");
    assert_eq!(rows[0].get::<_, uuid::Uuid>(0), mine.vm.0);
    assert_eq!(rows[0].get::<_, &str>(1), "provisioning");
    assert_eq!(rows[0].get::<_, Option<&str>>(2), Some("agent-1"));
    assert_eq!(rows[0].get::<_, Option<&str>>(3), Some("assigned"));

    let usage = client
        .query("SELECT tenant_id, sku, quantity FROM quota_usage_skus WHERE kind = 'vm' AND sku = 'vm.cpus' ORDER BY tenant_id", &[])
        .await
        .expect("readable");
    let usage: Vec<(&str, i64)> = usage.iter().map(|row| (row.get(0), row.get(2))).collect();
    assert_eq!(usage, [("acme", 2), ("globex", 6)]);
    let workloads = client
        .query_one("SELECT count(*) FROM workloads WHERE kind = 'vm'", &[])
        .await
        .expect("readable");
    assert_eq!(workloads.get::<_, i64>(0), 2);
    let _ = theirs;

    // No read model holds a VM's credentials' reference.
    let leak = client
        .query_one(
            "SELECT count(*) FROM (SELECT row_to_json(v)::text AS t FROM vms v \
             UNION ALL SELECT row_to_json(w)::text FROM workloads w \
             UNION ALL SELECT row_to_json(h)::text FROM hosts h) rows WHERE t LIKE '%' || $1 || '%'",
            &[&credentials.0.to_string()],
        )
        .await
        .expect("readable");
    assert_eq!(leak.get::<_, i64>(0), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_catalog_still_never_over_commits_a_host() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 64, 10)).await;
    project(&db).await;
    // The catalog is the projection's working state, projected once and never again: every
    // create below places on what it said before any of them.
    let creates = (0..16).map(|n| {
        let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default());
        let ports = (PgHostCatalog::new(db.store()), PgCredentialVault::new(db.store(), VAULT_KEY));
        let vms = VmService::new(pipeline, ports, PlacementPolicy::Spread);
        async move {
            vms.create(
                &tenant("acme"),
                &format!("c-{n}"),
                (&task(&format!("t-{n}")), spec()),
                &no_secrets(),
            )
            .await
        }
    });
    let outcomes = join_all(creates).await;
    assert_eq!(outcomes.iter().filter(|outcome| outcome.is_ok()).count(), 10);
    for refused in outcomes.iter().filter_map(|outcome| outcome.as_ref().err()) {
        assert!(
            matches!(refused, CommandError::Refused(VmError::NoHostFits { gate: Gate::VmCount })),
            "{refused:?}"
        );
    }
    let (host, never_over) = replay_host(&db, "agent-1").await;
    assert!(never_over.is_ok(), "{never_over:?}");
    assert_eq!(host.allocated.vm_count, 10);
}

#[tokio::test]
async fn a_migration_in_flight_shows_on_its_source_and_a_copy_names_its_source() {
    let db = TestDb::migrated().await;
    for name in ["agent-1", "agent-2"] {
        register(&db, name, host_spec(HostBackend::Firecracker, 16, 4)).await;
        let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
        vault.keep_host_token(&host_id(name), "an-agent-token").await.expect("kept");
    }
    let vms = service(&db, &["agent-1", "agent-2"], PlacementPolicy::Spread);
    let created = vms
        .create(&tenant("acme"), "c-1", (&task("t"), spec()), &no_secrets())
        .await
        .expect("placed");
    let (_, stored) = vms.owned(created.vm).await.expect("stored");
    let (host, boot) = (stored.host().expect("placed").clone(), stored.operation.expect("a boot"));
    let url = leasehold_domain::vm::VmUrl::parse("url", "127.0.0.1:19551").expect("valid");
    vms.report_booted(&agent(), &host, "b-1", created.vm, (boot, url)).await.expect("booted");
    let options =
        leasehold_commands::vm_service::MigrateOptions { target: None, live: false, lazy: false };
    let copy = vms.migrate(&tenant("acme"), "m-1", created.vm, &options).await.expect("ok").vm;
    project(&db).await;
    let client = db.client().await;
    let row = |vm: uuid::Uuid| {
        let client = &client;
        async move {
            client
                .query_one(
                    "SELECT copied_from, copy_kind, migrating_to FROM vms WHERE vm_id = $1",
                    &[&vm],
                )
                .await
                .expect("a row")
        }
    };
    let source = row(created.vm.0).await;
    assert_eq!(source.get::<_, Option<uuid::Uuid>>(2), Some(copy.0), "migrating to its copy");
    assert_eq!(source.get::<_, Option<uuid::Uuid>>(0), None);
    let copied = row(copy.0).await;
    assert_eq!(copied.get::<_, Option<uuid::Uuid>>(0), Some(created.vm.0));
    assert_eq!(copied.get::<_, Option<&str>>(1), Some("migration"));
}
