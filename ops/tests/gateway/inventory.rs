//! Inventory reconciliation, health and reaping end to end (rules 11–13): `leasehold serve`
//! sweeping `leasehold backend-sim`'s listings every second. An exhausted budget from a
//! complete, identity-bearing listing closes a failed lease; one from a listing without
//! tenants, or from one that never completes, never does; an orphan is reported and left
//! alone; a silent backend defers everything; reaped data is confirmed gone only when the
//! backend's retention listing no longer holds it.

use std::path::Path;

use chrono::{DateTime, Utc};
use leasehold_gateway::Role;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::backend::*;
use crate::support::*;

const BACKENDS: &str = "{ backends { name healthy fenced error load activeContainers \
    inventory { sweptAt complete error provisions identityBearing missing \
    orphans { lease status why released } } } }";

/// A server dispatching to the backends of `file`, sweeping and probing every second, with
/// `extra` arguments.
async fn serve_sweeping(file: &Path, extra: &[&str]) -> Server {
    let file = file.to_str().expect("a UTF-8 path");
    let mut args = vec!["--backend", "sim-1", "--backends-file", file];
    args.extend(["--inventory-every", "1s", "--health-every", "1s"]);
    args.extend(extra);
    Server::start_with(&args).await
}

/// The operators' view of backend `sim-1`, once it has been swept after `after`.
async fn swept_after(server: &Server, after: DateTime<Utc>) -> Value {
    let operator = role_token(Role::Operator, None);
    eventually(&format!("a sweep after {after}"), || async {
        let answer = server.graphql(&operator, BACKENDS, json!({})).await;
        let backend = data(&answer)["backends"][0].clone();
        let swept = backend["inventory"]["sweptAt"].as_str()?.parse::<DateTime<Utc>>().ok()?;
        (swept > after).then_some(backend)
    })
    .await
}

/// Makes the sim fail a ready lease for good (its container exited); waits until the log holds
/// the failure. The time just after. It waits on the log, not on the tenant's read model: when a
/// sweep closes the lease right after the failure, a lagging projector applies both in one batch
/// and the read model never shows FAILED at all.
async fn fail(server: &Server, sim: &Sim, lease: &Value) -> DateTime<Utc> {
    let url = format!("{}/sim/fail/{}", sim.url, lease.as_str().expect("an id"));
    let answer = reqwest::Client::new().post(url).send().await.expect("the sim answers");
    assert_eq!(answer.status().as_u16(), 202);
    wait_for_events(server, lease, "LeaseFailed", 1).await;
    Utc::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_from_a_complete_inventory_closes_a_failed_lease() {
    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["exhausted-budget"]).await;
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &[]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    fail(&server, &sim, &lease).await;

    wait_for_status(&server, &tenant, &lease, "DEPROVISIONED").await;
    let events = stream_events(&server, &lease).await;
    let closed = events.iter().position(|e| e == "LeaseClosedForFailure").expect("closed");
    let observed = events.iter().position(|e| e == "LeaseTerminalBudgetObserved");
    assert!(observed.is_some_and(|observed| observed < closed), "{events:?}");
    assert_eq!(count(&events, "LeaseClosedForFailure"), 1, "{events:?}");
    assert_eq!(sim.received("deprovision").await, 1);
}

/// The budget may be listed before the failure is reported: recorded then, it still closes the
/// lease once the failure arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exhausted_budget_listed_before_the_failure_closes_the_lease_once_it_fails() {
    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["exhausted-budget"]).await;
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &[]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    let url = format!("{}/sim/fail/{}", sim.url, lease.as_str().expect("an id"));
    let http = reqwest::Client::new();
    let silent = http.post(format!("{url}?callback=false")).send().await.expect("answers");
    assert_eq!(silent.status().as_u16(), 202);
    // Listed failed with no retries left, while Leasehold still holds it ready.
    wait_for_events(&server, &lease, "LeaseTerminalBudgetObserved", 1).await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseFailed"), 0, "{events:?}");
    assert_eq!(http.post(&url).send().await.expect("answers").status().as_u16(), 202);
    wait_for_status(&server, &tenant, &lease, "DEPROVISIONED").await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseClosedForFailure"), 1, "{events:?}");
}

/// A failed lease whose backend reports an exhausted budget through a listing that `fault`
/// spoils stays failed and open across a sweep; the backend's view after that sweep.
async fn spoiled_listing_never_closes(fault: &str) -> Value {
    let dir = scratch();
    let sim = Sim::start_with("127.0.0.1:0", &dir.0, &["exhausted-budget", fault]).await;
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &[]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    let failed_at = fail(&server, &sim, &lease).await;
    // Nothing closes it here, so the tenant reads it failed and it stays so.
    wait_for_status(&server, &tenant, &lease, "FAILED").await;

    let backend = swept_after(&server, failed_at).await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseClosedForFailure"), 0, "{events:?}");
    assert_eq!(count(&events, "LeaseTerminalBudgetObserved"), 0, "{events:?}");
    assert_eq!(count(&events, "LeaseDeprovisionRequested"), 0, "{events:?}");
    assert_eq!(sim.received("deprovision").await, 0);
    backend
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_without_tenants_never_closes_a_lease() {
    let backend = spoiled_listing_never_closes("anonymous-inventory").await;
    assert_eq!(backend["inventory"]["complete"], true, "{backend}");
    assert_eq!(backend["inventory"]["identityBearing"], false, "{backend}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_never_completes_never_closes_a_lease() {
    let backend = spoiled_listing_never_closes("partial-inventory").await;
    assert_eq!(backend["inventory"]["complete"], false, "{backend}");
    let error = backend["inventory"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("GET /provisions"), "{backend}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphan_is_reported_and_left_alone_and_a_silent_backend_defers() {
    let dir = scratch();
    let orphan = Uuid::now_v7().to_string();
    let sim = Sim::start_args("127.0.0.1:0", &dir.0, &["--orphan", &orphan]).await;
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &[]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;

    let backend = swept_after(&server, Utc::now()).await;
    assert_eq!(backend["healthy"], true, "{backend}");
    assert_eq!(backend["inventory"]["complete"], true, "{backend}");
    assert_eq!(backend["inventory"]["provisions"], 2, "{backend}");
    let orphans = &backend["inventory"]["orphans"];
    assert_eq!(
        orphans,
        &json!([{ "lease": orphan, "status": "ready", "why": "unknown", "released": false }]),
    );
    assert_eq!(sim.received("deprovision").await, 0, "an unknown lease is never released");

    drop(sim);
    let silent_since = Utc::now();
    let backend = swept_after(&server, silent_since).await;
    assert_eq!(backend["inventory"]["complete"], false, "{backend}");
    assert!(backend["inventory"]["error"].as_str().is_some(), "{backend}");
    let operator = role_token(Role::Operator, None);
    eventually("the probe seeing the backend down", || async {
        let answer = server.graphql(&operator, BACKENDS, json!({})).await;
        (data(&answer)["backends"][0]["healthy"] == false).then_some(())
    })
    .await;
    // Deferred: the lease it holds is neither released nor provisioned again.
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseDeprovisionRequested"), 0, "{events:?}");
    assert_eq!(count(&events, "LeaseProvisionRequested"), 1, "{events:?}");
    let query = "query($id: ID!) { lease(id: $id) { status } }";
    let answer = server.graphql(&tenant, query, json!({ "id": lease })).await;
    assert_eq!(data(&answer)["lease"]["status"], "READY");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaped_data_is_confirmed_gone_only_once_the_backend_no_longer_retains_it() {
    let dir = scratch();
    let sim = Sim::start_args("127.0.0.1:0", &dir.0, &["--retain"]).await;
    let retention = ["--retention-max-age", "1s", "--reap-every", "1s"];
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &retention).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    release(&server, &tenant, &lease, "release-1").await;

    // Its grace (a second after its creation) is over: the reaper reaps it at once.
    wait_for_events(&server, &lease, "LeaseRetentionReaping", 1).await;
    let restore = "mutation($input: RestoreLeaseInput!) { restoreLease(input: $input) { id } }";
    let input = json!({ "input": {
        "operationKey": "restore-1", "fromLeaseId": lease,
        "items": [{ "sku": "gpu.h100.1x", "quantity": 1 }],
    }});
    let refused = server.graphql(&tenant, restore, input).await;
    assert_eq!(code(&refused), Some("INVALID_STATE"), "{refused}");
    assert_eq!(sim.received("restore").await, 0);

    // The backend still lists it as retained: a sweep after the read models show it reaping
    // confirms nothing.
    let reaping = "{ retainedLeases { id status } }";
    eventually("the record read as reaping", || async {
        let answer = server.graphql(&tenant, reaping, json!({})).await;
        (data(&answer)["retainedLeases"][0]["status"] == "reaping").then_some(())
    })
    .await;
    swept_after(&server, Utc::now()).await;
    let events = stream_events(&server, &lease).await;
    assert_eq!(count(&events, "LeaseRetentionDeleted"), 0, "{events:?}");

    let swept = reqwest::Client::new()
        .post(format!("{}/sim/sweep/{}", sim.url, lease.as_str().expect("an id")))
        .send()
        .await
        .expect("the sim answers");
    assert_eq!(swept.status().as_u16(), 204);
    wait_for_events(&server, &lease, "LeaseRetentionDeleted", 1).await;
    wait_for_status(&server, &tenant, &lease, "DEPROVISIONED").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_domain_is_reconciled_onto_the_running_provision_and_then_left_alone() {
    let dir = scratch();
    let sim = Sim::start("127.0.0.1:0", &dir.0).await;
    let server = serve_sweeping(&backends_file(&dir.0, &sim.url), &[]).await;
    let tenant = tenant_token("acme");
    let lease = ready_lease(&server, &tenant, "req-1").await;
    swept_after(&server, Utc::now()).await;
    assert_eq!(sim.received("reconcile_custom_domain").await, 0, "nothing to change yet");

    let set = "mutation($input: SetLeaseCustomDomainInput!) { \
        setLeaseCustomDomain(input: $input) { id } }";
    let input = json!({ "input": {
        "leaseId": lease, "operationKey": "domain-1", "customDomain": "app.example.com",
    }});
    data(&server.graphql(&tenant, set, input).await);
    eventually("the backend asked to reconcile the domain", || async {
        (sim.received("reconcile_custom_domain").await >= 1).then_some(())
    })
    .await;
    // Once the backend lists the domain, sweeps leave it alone.
    swept_after(&server, Utc::now()).await;
    let asked = sim.received("reconcile_custom_domain").await;
    swept_after(&server, Utc::now()).await;
    assert_eq!(sim.received("reconcile_custom_domain").await, asked);
}
