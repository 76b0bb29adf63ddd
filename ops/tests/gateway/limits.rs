//! Requests that must be refused clearly, after which the server keeps serving.

use serde_json::json;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_deep_and_huge_requests_get_clear_errors_and_the_server_keeps_serving() {
    let server = Server::start().await;
    let acme = tenant_token("acme");

    let malformed =
        server.graphql_with(&acme, json!({ "query": "{ leases { edges { cursor }" })).await;
    assert_eq!(code(&malformed), Some("BAD_USER_INPUT"), "{malformed}");

    let (status, not_json) = server.post(Some(&acme), "this is not JSON".into()).await;
    assert_eq!((status, code(&not_json)), (400, Some("BAD_USER_INPUT")));

    let deep = "{ __schema { types { fields { type { ofType { ofType { ofType { ofType { ofType { ofType { name } } } } } } } } } } }";
    let answer = server.graphql_with(&acme, json!({ "query": deep })).await;
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{answer}");
    assert!(
        answer.to_string().contains("too deep") || answer.to_string().contains("depth"),
        "{answer}"
    );

    let huge = format!(
        r#"{{"query": "{{ leases {{ edges {{ cursor }} }} }}", "variables": {{"pad": "{}"}}}}"#,
        "x".repeat(10 * 1024 * 1024)
    );
    let (status, answer) = server.post_unread(&acme, huge.into_bytes()).await;
    assert_eq!((status, code(&answer)), (413, Some("BAD_USER_INPUT")), "{answer}");

    let unknown = server.graphql_with(&acme, json!({ "query": "{ leasez { id } }" })).await;
    assert_eq!(code(&unknown), Some("BAD_USER_INPUT"));
    assert!(!unknown.to_string().contains("Did you mean"), "{unknown}");

    let batch: Vec<_> = (0..6).map(|_| json!({ "query": "{ quotaUsage { kind } }" })).collect();
    let (status, answer) = server.post(Some(&acme), json!(batch).to_string().into()).await;
    assert_eq!((status, code(&answer)), (400, Some("BAD_USER_INPUT")), "{answer}");

    let too_many = server
        .graphql_with(&acme, json!({ "query": "{ leases(first: 101) { edges { cursor } } }" }))
        .await;
    assert_eq!(code(&too_many), Some("BAD_USER_INPUT"));

    // Still serving.
    let fine =
        server.graphql_with(&acme, json!({ "query": "{ leases { edges { cursor } } }" })).await;
    assert_eq!(data(&fine)["leases"]["edges"], json!([]));
    assert_eq!(server.get("/healthz").await.0, 200);
    assert_eq!(server.get("/readyz").await, (200, "ready\n".to_string()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_is_for_operators_only() {
    let server = Server::start().await;
    let query = json!({ "query": "{ __schema { queryType { name } } }" });
    let operator = server
        .graphql_with(&role_token(leasehold_gateway::Role::Operator, None), query.clone())
        .await;
    assert_eq!(data(&operator)["__schema"]["queryType"]["name"], "Query");
    let tenant = server.graphql_with(&tenant_token("acme"), query).await;
    assert!(tenant["data"]["__schema"].is_null(), "{tenant}");
}
