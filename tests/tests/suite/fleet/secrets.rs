//! A VM's credentials never leave the vault: its secrets and its minted auth token appear in
//! no event, no read-model row, no ledger row and no stored state; the vault holds them
//! sealed (no plaintext), opens them only under its key and for their tenant; and a failed
//! boot's report is recorded redacted of them.

use std::collections::BTreeMap;

use leasehold_adapters::vault::PgCredentialVault;
use leasehold_commands::vm_service::CredentialVault as _;
use leasehold_domain::EventStore as _;
use leasehold_domain::TenantId;
use leasehold_domain::values::fleet::HostBackend;
use leasehold_domain::values::{OperatorDetail, Reason, TenantMessage};
use leasehold_domain::vm::{BootFailure, PlacementPolicy};
use leasehold_projections::host::HostProjection;
use leasehold_projections::vm::VmProjection;
use leasehold_tests::TestDb;

use super::support::*;
use crate::projections::support::{last_event, quick, start_of};

const SECRET: &str = "s3cr3t-value-7f1e9a";

/// How many rows of every table hold `needle` in any column (bytea columns as text too).
async fn rows_holding(db: &TestDb, needle: &str) -> Vec<(String, i64)> {
    let client = db.client().await;
    let tables = client
        .query(
            "SELECT table_name::text FROM information_schema.tables \
             WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1",
            &[],
        )
        .await
        .expect("readable");
    let mut found = Vec::new();
    for table in tables {
        let name: String = table.get(0);
        let sql = format!(
            "SELECT count(*) FROM \"{name}\" t WHERE position($1 in row_to_json(t)::text) > 0 \
             OR position(convert_to($1, 'UTF8') in convert_to(row_to_json(t)::text, 'UTF8')) > 0"
        );
        let count: i64 = client.query_one(&sql, &[&needle]).await.expect("readable").get(0);
        if count > 0 {
            found.push((name, count));
        }
    }
    found
}

#[tokio::test]
async fn a_vms_secrets_and_token_stay_in_the_vault() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let secrets: BTreeMap<String, String> = [("API_KEY".to_string(), SECRET.to_string())].into();
    let created =
        vms.create(&tenant("acme"), "c-1", (&task("t"), spec()), &secrets).await.expect("placed");
    // A retry with other secrets keeps the first ones.
    let other: BTreeMap<String, String> = [("API_KEY".to_string(), "another".to_string())].into();
    let again =
        vms.create(&tenant("acme"), "c-1", (&task("t"), spec()), &other).await.expect("a retry");
    assert!(again.outcome.duplicate);

    let (_, stored) = vms.owned(created.vm).await.expect("stored");
    let reference = stored.terms.as_ref().expect("created").credentials;
    let acme = TenantId::parse("acme").expect("valid");
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    let opened = vault.open(reference, &acme).await.expect("readable").expect("kept");
    assert_eq!(opened.secrets, secrets, "the first write wins");
    assert_eq!(opened.auth_token.len(), 64, "a minted token: 32 random bytes");
    assert!(!format!("{opened:?}").contains(SECRET), "its Debug shows no value");
    // Another tenant, or another key, opens nothing.
    let globex = TenantId::parse("globex").expect("valid");
    assert!(vault.open(reference, &globex).await.expect("readable").is_none());
    let wrong = PgCredentialVault::new(db.store(), b"another-key-0123456789abcdef0123456789");
    assert!(wrong.open(reference, &acme).await.is_err(), "another key does not open it");

    // A failed boot whose report quotes the secret and the token is recorded redacted.
    let boot = stored.operation.expect("a boot");
    let detail =
        format!("500 boot failed: curl -H 'X-Key: {SECRET}' -H 'Auth: {}'", opened.auth_token);
    let failure = BootFailure {
        reason: Reason::parse("reason", "BootFailed").expect("valid"),
        message: TenantMessage::parse("message", format!("bad key {SECRET}")).expect("valid"),
        detail: OperatorDetail::new(&detail),
    };
    vms.report_boot_failed(&agent(), &host_id("agent-1"), "f-1", created.vm, (boot, failure))
        .await
        .expect("recorded");
    let events = db.store().read_stream(&created.vm.stream_id(), 1, 100).await.expect("readable");
    let failed =
        events.iter().find(|e| e.event_type.as_str() == "VmProvisionFailed").expect("failed");
    assert_eq!(
        failed.payload["detail"],
        "500 boot failed: curl -H 'X-Key: [redacted]' -H 'Auth: [redacted]'"
    );
    assert_eq!(failed.payload["message"], "bad key [redacted]");

    // Projected too, and then searched everywhere.
    let head = last_event(&db).await;
    let mut projections = (
        start_of(VmProjection, &db.store(), quick()),
        start_of(HostProjection, &db.store(), quick()),
    );
    projections.0.reached(head).await;
    projections.1.reached(head).await;
    projections.0.stop().await;
    projections.1.stop().await;
    // The search finds what is there (the VM's id is in its events and rows)...
    let known = rows_holding(&db, &created.vm.0.to_string()).await;
    assert!(
        known.iter().any(|(table, _)| table == "events")
            && known.iter().any(|(table, _)| table == "vms"),
        "{known:?}"
    );
    // ...and not what must not be.
    assert_eq!(rows_holding(&db, SECRET).await, [], "the secret's value is nowhere in plaintext");
    assert_eq!(rows_holding(&db, &opened.auth_token).await, [], "nor the VM's token");
    assert_eq!(rows_holding(&db, "another").await, [], "nor the secrets of the retry");
}

#[tokio::test]
async fn a_create_refused_then_retried_with_other_secrets_keeps_the_latest() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let first: BTreeMap<String, String> =
        [("API_KEY".to_string(), "first-secret".to_string())].into();
    let mut huge = spec();
    huge.cpus = 64;
    let refused = vms.create(&tenant("acme"), "c-1", (&task("t"), huge), &first).await;
    assert!(refused.is_err(), "no host fits 64 vCPUs");
    let second: BTreeMap<String, String> =
        [("API_KEY".to_string(), "second-secret".to_string())].into();
    let created =
        vms.create(&tenant("acme"), "c-1", (&task("t"), spec()), &second).await.expect("placed");
    let (_, stored) = vms.owned(created.vm).await.expect("stored");
    let reference = stored.terms.expect("created").credentials;
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    let acme = TenantId::parse("acme").expect("valid");
    let opened = vault.open(reference, &acme).await.expect("readable").expect("kept");
    assert_eq!(opened.secrets, second, "the refused create's secrets are not the VM's");
}

#[tokio::test]
async fn a_vms_credentials_are_its_own_whatever_keys_are_reused() {
    let db = TestDb::migrated().await;
    register(&db, "agent-1", host_spec(HostBackend::Firecracker, 16, 4)).await;
    let vms = service(&db, &["agent-1"], PlacementPolicy::Spread);
    let first: BTreeMap<String, String> = [("API_KEY".to_string(), "first".to_string())].into();
    let created =
        vms.create(&tenant("acme"), "c-1", (&task("a"), spec()), &first).await.expect("placed");
    let (_, stored) = vms.owned(created.vm).await.expect("stored");
    let reference = stored.terms.expect("created").credentials;
    let vault = PgCredentialVault::new(db.store(), VAULT_KEY);
    let acme = TenantId::parse("acme").expect("valid");
    let before = vault.open(reference, &acme).await.expect("readable").expect("kept");
    let other: BTreeMap<String, String> = [("API_KEY".to_string(), "other".to_string())].into();
    // The same key for another task: a conflict, and the first VM's credentials untouched.
    let reused = vms.create(&tenant("acme"), "c-1", (&task("b"), spec()), &other).await;
    assert!(
        matches!(reused, Err(leasehold_commands::CommandError::IdempotencyConflict)),
        "{reused:?}"
    );
    // Another key for the same task: the task has its VM, and keeps its credentials.
    let again = vms.create(&tenant("acme"), "c-2", (&task("a"), spec()), &other).await;
    assert!(again.is_err(), "{again:?}");
    let after = vault.open(reference, &acme).await.expect("readable").expect("kept");
    assert_eq!(after, before, "its token and secrets as first kept");
}
