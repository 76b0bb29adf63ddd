//! GraphQL over HTTP as its specification has it now: `application/graphql-response+json`
//! for clients that accept it (a request that never executed is a 4xx with no `data`), the
//! legacy `application/json` with 200 for the rest, and a POST body that must say it is JSON.
//! And the pages the binary serves itself.

use reqwest::header::{ACCEPT, CONTENT_SECURITY_POLICY, CONTENT_TYPE};
use serde_json::{Value, json};

use crate::support::*;

const CURRENT: &str = "application/graphql-response+json";

/// POSTs `body` as JSON, accepting `accept`, with `token`: the status, content type and answer.
async fn post(
    server: &Server,
    accept: &str,
    token: Option<&str>,
    body: &Value,
) -> (u16, String, Value) {
    let mut request = server
        .http
        .post(format!("{}/graphql", server.base))
        .header(ACCEPT, accept)
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().await.expect("answers");
    let status = response.status().as_u16();
    let media = response.headers()[CONTENT_TYPE].to_str().expect("text").to_string();
    (status, media, response.json().await.expect("JSON"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_accepting_the_current_media_type_gets_it_with_the_specifications_statuses() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let token = Some(acme.as_str());
    let workloads = "query($first: Int) { workloads(first: $first) { edges { cursor } } }";
    let never_executed = [
        ("a document that does not parse", json!({ "query": "{ workloads(" })),
        ("a document that does not validate", json!({ "query": "{ noSuchField }" })),
        (
            "variables that do not coerce",
            json!({ "query": workloads, "variables": { "first": "ten" } }),
        ),
    ];
    for (what, body) in &never_executed {
        let (status, media, answer) = post(&server, CURRENT, token, body).await;
        assert_eq!((status, media.as_str()), (400, CURRENT), "{what}: {answer}");
        assert!(answer.get("data").is_none(), "{what} has no data entry: {answer}");
        assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{what}: {answer}");
        // The legacy type: 200 and `data: null`, as before.
        let (status, media, answer) = post(&server, "application/json", token, body).await;
        assert_eq!((status, media.as_str()), (200, "application/json"), "{what}: {answer}");
        assert!(answer.get("data").is_some_and(Value::is_null), "{what}: {answer}");
    }

    let ran = json!({ "query": workloads, "variables": { "first": 5 } });
    let (status, media, answer) = post(&server, CURRENT, token, &ran).await;
    assert_eq!((status, media.as_str()), (200, CURRENT), "{answer}");
    assert!(data(&answer)["workloads"]["edges"].is_array(), "{answer}");

    // Executed with a field's error: 200, with data.
    let field_error = json!({ "query": "{ lease(id: \"not-a-uuid\") { id } }" });
    let (status, _, answer) = post(&server, CURRENT, token, &field_error).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.get("data").is_some(), "executed: {answer}");
    assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{answer}");

    // Refused before anything ran: the refusal's own status, no data.
    let (status, media, answer) = post(&server, CURRENT, None, &ran).await;
    assert_eq!((status, media.as_str()), (401, CURRENT), "{answer}");
    assert!(answer.get("data").is_none(), "{answer}");
    assert_eq!(code(&answer), Some("UNAUTHENTICATED"));

    // Preferred by weight, and the default without an Accept.
    let prefers_json = "application/graphql-response+json;q=0.5, application/json";
    let (_, media, _) = post(&server, prefers_json, token, &ran).await;
    assert_eq!(media, "application/json");
    let (_, media, _) = post(&server, "*/*", token, &ran).await;
    assert_eq!(media, "application/json");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_whose_body_is_not_said_to_be_json_is_refused_with_415() {
    let server = Server::start().await;
    let acme = tenant_token("acme");
    let body = json!({ "query": "{ workloads { edges { cursor } } }" }).to_string();
    for content_type in [None, Some("text/plain"), Some("application/graphql")] {
        let mut request = server
            .http
            .post(format!("{}/graphql", server.base))
            .bearer_auth(&acme)
            .body(body.clone());
        if let Some(content_type) = content_type {
            request = request.header(CONTENT_TYPE, content_type);
        }
        let response = request.send().await.expect("answers");
        let status = response.status().as_u16();
        let answer: Value = response.json().await.expect("a JSON answer");
        assert_eq!(status, 415, "{content_type:?}: {answer}");
        assert_eq!(code(&answer), Some("BAD_USER_INPUT"), "{content_type:?}: {answer}");
    }
    let response = server
        .http
        .post(format!("{}/graphql", server.base))
        .bearer_auth(&acme)
        .header(CONTENT_TYPE, "application/json; charset=utf-8")
        .body(body)
        .send()
        .await
        .expect("answers");
    assert_eq!(response.status().as_u16(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_graphiql_and_every_asset_they_name_are_served_by_the_binary() {
    let server = Server::start().await;
    for (path, marker) in [("/", "Leasehold"), ("/graphql", "graphiql")] {
        let response =
            server.http.get(format!("{}{path}", server.base)).send().await.expect("answers");
        assert_eq!(response.status().as_u16(), 200, "{path}");
        let policy = response.headers()[CONTENT_SECURITY_POLICY].to_str().expect("text");
        assert!(policy.contains("default-src 'self'"), "{path}: {policy}");
        assert!(!policy.contains("http"), "{path} allows no other host: {policy}");
        let html = response.text().await.expect("text");
        assert!(html.contains(marker), "{path}");
        let assets = html.split('"').filter(|part| part.starts_with("/assets/"));
        let mut served = 0;
        for asset in assets {
            let response =
                server.http.get(format!("{}{asset}", server.base)).send().await.expect("answers");
            assert_eq!(response.status().as_u16(), 200, "{asset}");
            let media = response.headers()[CONTENT_TYPE].to_str().expect("text").to_string();
            assert!(media.starts_with("text/"), "{asset}: {media}");
            served += 1;
        }
        assert!(served > 0, "{path} names its scripts");
    }
    let (status, _) = server.get("/assets/no-such-file.js").await;
    assert_eq!(status, 404);
}
