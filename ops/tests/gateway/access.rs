//! Who may do what: tokens, roles, tenants and providers.

use chrono::{TimeDelta, Utc};
use leasehold_gateway::{Claims, JwtSecret, Role};
use serde_json::json;

use crate::support::*;

const LEASES: &str = "{ leases { edges { cursor node { id } } } }";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_that_are_missing_forged_or_expired_are_unauthenticated() {
    let server = Server::start().await;
    let body = || json!({ "query": LEASES }).to_string().into();
    let (status, none) = server.post(None, body()).await;
    assert_eq!((status, code(&none)), (401, Some("UNAUTHENTICATED")));

    let forger = JwtSecret::new(&[b'k'; 32]).expect("long enough");
    let tenant = leasehold_domain::TenantId::parse("acme").expect("valid");
    let forged = forger.mint_for("eve", Role::Tenant, Some(&tenant), None, TimeDelta::hours(1));
    let (status, answer) = server.post(Some(&forged), body()).await;
    assert_eq!((status, code(&answer)), (401, Some("UNAUTHENTICATED")));

    let expired = secret().mint(&Claims {
        sub: "acme-user".into(),
        role: Role::Tenant,
        tenant: Some("acme".into()),
        provider: None,
        all_providers: false,
        host: None,
        connection: None,
        runner_node: None,
        exp: (Utc::now() - TimeDelta::minutes(10)).timestamp(),
        iat: (Utc::now() - TimeDelta::hours(1)).timestamp(),
    });
    let (status, answer) = server.post(Some(&expired), body()).await;
    assert_eq!((status, code(&answer)), (401, Some("UNAUTHENTICATED")));
    assert!(answer.to_string().contains("expired"), "{answer}");

    let (status, answer) = server.post(Some(&tenant_token("acme")), body()).await;
    assert_eq!(status, 200);
    assert_eq!(data(&answer)["leases"]["edges"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roles_are_held_to_their_mutations() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let report = report_input(&server, &lease["id"], "up-1").await;
    let by_tenant = server.graphql(&acme, REPORT_PROVISIONED, report.clone()).await;
    assert_eq!(code(&by_tenant), Some("FORBIDDEN"), "{by_tenant}");
    let agent = role_token(Role::Agent, None);
    let by_agent = server.graphql(&agent, REQUEST_LEASE, lease_request("req-2")).await;
    assert_eq!(code(&by_agent), Some("FORBIDDEN"), "{by_agent}");
    let close = "mutation($input: LeaseOperationInput!) { closeLease(input: $input) { id } }";
    let input = json!({ "input": { "leaseId": lease["id"], "operationKey": "close-1" } });
    let closed_by_tenant = server.graphql(&acme, close, input).await;
    assert_eq!(code(&closed_by_tenant), Some("FORBIDDEN"));
    // Nothing the refused calls asked for happened.
    let read = json!({
        "query": "query($id: ID!) { lease(id: $id) { status } }",
        "variables": { "id": lease["id"] },
        "extensions": { "minCursor": lease["cursor"] },
    });
    let answer = server.graphql_with(&acme, read).await;
    assert_eq!(data(&answer)["lease"]["status"], "PROVISIONING");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_lease_and_cursors_are_not_found_and_bad_input() {
    let server = Server::start().await;
    let (acme, beta) = (tenant_token("acme"), tenant_token("beta"));
    let lease = request_lease(&server, &acme, "req-1").await;
    let second = request_lease(&server, &acme, "req-2").await;

    let query = "query($id: ID!) { lease(id: $id) { id } }";
    let answer = server.graphql(&beta, query, json!({ "id": lease["id"] })).await;
    assert_eq!(code(&answer), Some("NOT_FOUND"), "{answer}");
    // Acting on it is not found either, and changes nothing.
    let down = "mutation($input: LeaseOperationInput!) { deprovisionLease(input: $input) { id } }";
    let input = json!({ "input": { "leaseId": lease["id"], "operationKey": "down" } });
    assert_eq!(code(&server.graphql(&beta, down, input).await), Some("NOT_FOUND"));

    let page = "query($after: String) { leases(first: 1, after: $after) { edges { cursor node { id status } } pageInfo { hasNextPage endCursor } } }";
    let read = json!({ "query": page, "variables": { "after": null }, "extensions": { "minCursor": second["cursor"] } });
    let mine = server.graphql_with(&acme, read).await;
    let end = data(&mine)["leases"]["pageInfo"]["endCursor"].clone();
    assert_eq!(data(&mine)["leases"]["pageInfo"]["hasNextPage"], true);
    let foreign = server.graphql(&beta, page, json!({ "after": end })).await;
    assert_eq!(code(&foreign), Some("BAD_USER_INPUT"), "{foreign}");
    // A read-your-writes cursor of acme's is refused for beta too.
    let request = json!({ "query": "{ leases { edges { cursor } } }", "extensions": { "minCursor": lease["cursor"] } });
    assert_eq!(code(&server.graphql_with(&beta, request).await), Some("BAD_USER_INPUT"));
    // And beta's own list is empty.
    let theirs = server.graphql(&beta, page, json!({ "after": null })).await;
    assert_eq!(data(&theirs)["leases"]["edges"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_bound_to_a_provider_finds_only_its_providers_leases() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let lease = request_lease(&server, &acme, "req-1").await;
    let input = report_input(&server, &lease["id"], "up-1").await;
    // An agent token that names no provider (and lacks the explicit grant) is refused.
    let unbound = secret().mint_for("agent", Role::Agent, None, None, TimeDelta::hours(1));
    let answer = server.graphql(&unbound, REPORT_PROVISIONED, input.clone()).await;
    assert_eq!(code(&answer), Some("UNAUTHENTICATED"), "{answer}");
    let stranger = role_token(Role::Agent, Some(uuid::Uuid::from_u128(99)));
    let answer = server.graphql(&stranger, REPORT_PROVISIONED, input.clone()).await;
    assert_eq!(code(&answer), Some("NOT_FOUND"), "{answer}");
    // What the lease's backend is carrying out is for machine actors of its provider only.
    let work = "query($id: ID!) { leaseWork(id: $id) { operationId } }";
    let id = json!({ "id": lease["id"] });
    let by_tenant = server.graphql(&acme, work, id.clone()).await;
    assert_eq!(code(&by_tenant), Some("FORBIDDEN"), "{by_tenant}");
    let by_stranger = server.graphql(&stranger, work, id.clone()).await;
    assert_eq!(code(&by_stranger), Some("NOT_FOUND"), "{by_stranger}");
    let own = role_token(Role::Agent, Some(PROVIDER.parse().expect("a UUID")));
    let answer = server.graphql(&own, REPORT_PROVISIONED, input).await;
    let types = &data(&answer)["reportLeaseProvisioned"]["events"];
    assert_eq!(types, &json!([{ "type": "LeaseProvisioned" }, { "type": "LeaseActivated" }]));
}
