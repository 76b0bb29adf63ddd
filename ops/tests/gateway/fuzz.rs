//! Hostile input at the server's doors, by proptest generators against the real `leasehold
//! serve`: backend callbacks (any path under `/callbacks`, body, signature, timestamp and
//! content type) and the GraphQL request path (any body, document and variables). Every
//! answer is a typed one: a 2xx, or a JSON error whose code is one of the gateway's, a 5xx
//! only as `INTERNAL`; the server never drops a connection (a panic would).
//!
//! CI runs proptest's default 256 cases; `PROPTEST_CASES=5000` is the long run
//! (RELIABILITY.md).

use chrono::Utc;
use leasehold_gateway::callbacks::{CallbackSecret, SIGNATURE_HEADER};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

use crate::support::*;

/// The codes the gateway answers with: anything else is not a typed answer.
const CODES: &[&str] = &[
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "NOT_FOUND",
    "BAD_USER_INPUT",
    "CONFLICT",
    "FENCED",
    "IDEMPOTENCY_CONFLICT",
    "INVALID_STATE",
    "QUOTA_EXCEEDED",
    "UNSUPPORTED",
    "STALE",
    "RATE_LIMITED",
    "NOT_PROVISIONED",
    "UNAVAILABLE",
    "INTERNAL",
];

/// Runs `cases` on `strategy` with proptest (its failure persistence off: the seed and the
/// shrunk input are printed), each case awaited on the test's runtime.
fn run<S: Strategy>(strategy: S, case: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S::Value: std::fmt::Debug,
{
    let config = Config { failure_persistence: None, ..Config::default() };
    let result = TestRunner::new(config).run(&strategy, case);
    if let Err(failure) = result {
        panic!("{failure}");
    }
}

/// Awaits `future` from inside a proptest case, on the test's (multi-threaded) runtime.
fn wait<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}

/// `request`'s status and body, from inside a proptest case; no answer at all (a dropped
/// connection) fails the case.
fn answer(request: reqwest::RequestBuilder) -> Result<(u16, String), TestCaseError> {
    wait(async {
        let response =
            request.send().await.map_err(|e| TestCaseError::fail(format!("no answer: {e}")))?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.unwrap_or_default()))
    })
}

/// A typed answer: 2xx, or a JSON error with one of the gateway's codes (5xx only INTERNAL).
fn typed(
    status: u16,
    body: &str,
    code_of: impl Fn(&Value) -> Option<&str>,
) -> Result<(), TestCaseError> {
    if (200..300).contains(&status) {
        return Ok(());
    }
    let answer: Value = serde_json::from_str(body).map_err(|_| {
        TestCaseError::fail(format!("{status} with a body that is not JSON: {body}"))
    })?;
    let code = code_of(&answer);
    prop_assert!(code.is_some_and(|code| CODES.contains(&code)), "{status}: {answer}");
    prop_assert!(status < 500 || code == Some("INTERNAL"), "{status}: {answer}");
    Ok(())
}

#[derive(Debug, Clone)]
enum Signature {
    Valid,
    Skewed(i64),
    OtherSecret,
    Text(String),
    Missing,
}

fn signature() -> impl Strategy<Value = Signature> {
    prop_oneof![
        Just(Signature::Valid),
        (-200_000i64..200_000).prop_map(Signature::Skewed),
        Just(Signature::OtherSecret),
        "[ -~]{0,80}".prop_map(Signature::Text),
        "t=[0-9]{0,12},sha256=[0-9a-f]{0,70}".prop_map(Signature::Text),
        Just(Signature::Missing),
    ]
}

/// A path under `/callbacks`: the lease's own, one of its ids changed, or anything.
fn callback_path(lease: String, operation: String) -> impl Strategy<Value = String> {
    let segment = "([A-Za-z0-9._~-]|%[0-9A-Fa-f]{2}){0,40}";
    prop_oneof![
        Just(format!("/callbacks/leases/{lease}/operations/{operation}")),
        Just(format!("/callbacks/leases/{lease}/maintenance/{operation}")),
        Just(format!("/callbacks/leases/{lease}")),
        segment.prop_map(move |id| format!("/callbacks/leases/{id}/operations/{operation}")),
        (segment, segment).prop_map(|(a, b)| format!("/callbacks/leases/{a}/maintenance/{b}")),
        segment.prop_map(|id| format!("/callbacks/leases/{id}")),
    ]
}

/// A body: a report for the lease (any status, any extra fields), any JSON, or any bytes.
fn callback_body(lease: String) -> impl Strategy<Value = Vec<u8>> {
    let value = prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::from),
        "[ -~]{0,30}".prop_map(Value::from),
        Just(Value::String(lease.clone())),
    ];
    let status = prop_oneof![
        prop::sample::select(vec!["success", "failed", "deprovisioned", "provisioning"])
            .prop_map(Value::from),
        "[ -~]{0,20}".prop_map(Value::from),
    ];
    let report = (status, value.clone(), value.clone(), value).prop_map(move |(s, a, b, c)| {
        json!({ "lease_uuid": lease, "status": s, "error": a, "maintenance_admitted_at": b, "extra": c })
            .to_string()
            .into_bytes()
    });
    prop_oneof![
        4 => report,
        1 => "[ -~]{0,200}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..300),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_callback_gets_a_typed_answer_and_the_server_stays_up() {
    let server = Server::start().await;
    let lease = request_lease(&server, &tenant_token("acme"), "req-1").await;
    let work = lease_work(&server, &lease["id"]).await;
    let lease_id = lease["id"].as_str().expect("an id").to_owned();
    let operation = work["operationId"].as_str().expect("an operation").to_owned();
    let secret = CallbackSecret::new(CALLBACK_SECRET.as_bytes()).expect("long enough");
    let other = CallbackSecret::new(&[7u8; 48]).expect("long enough");
    let content_type = prop::option::of(prop::sample::select(vec![
        "application/json",
        "text/plain",
        "application/json; charset=utf-8",
    ]));
    let strategy = (
        callback_path(lease_id.clone(), operation),
        callback_body(lease_id),
        signature(),
        content_type,
    );
    run(strategy, |(path, body, signature, content_type)| {
        let now = Utc::now().timestamp();
        let header = match &signature {
            Signature::Valid => Some(secret.sign(now, "POST", &path, &body)),
            Signature::Skewed(by) => Some(secret.sign(now + by, "POST", &path, &body)),
            Signature::OtherSecret => Some(other.sign(now, "POST", &path, &body)),
            Signature::Text(text) => Some(text.clone()),
            Signature::Missing => None,
        };
        let mut request = server.http.post(format!("{}{path}", server.base)).body(body);
        if let Some(header) = header {
            request = request.header(SIGNATURE_HEADER, header);
        }
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let (status, text) = answer(request)?;
        typed(status, &text, |answer| answer["code"].as_str())
    });
    // Still up, and still right: the lease reads back (once the projector has it: the read
    // model may lag the mutation's answer).
    let query = "query($id: ID!) { lease(id: $id) { id } }";
    let variables = json!({ "id": lease["id"] });
    let found =
        server.graphql_after(&tenant_token("acme"), query, variables, &lease["cursor"]).await;
    assert_eq!(data(&found)["lease"]["id"], lease["id"]);
}

/// A GraphQL request: a document built of the schema's words and punctuation, or any text;
/// variables of any shape; or a body that is not a request at all.
fn graphql_body() -> impl Strategy<Value = Vec<u8>> {
    let word = prop::sample::select(vec![
        "query",
        "mutation",
        "subscription",
        "fragment",
        "on",
        "lease",
        "leases",
        "workloads",
        "id",
        "state",
        "events",
        "first",
        "after",
        "asOf",
        "requestLease",
        "input",
        "__schema",
        "__typename",
        "$id",
        "ID!",
        "String",
        "...",
        "{",
        "}",
        "(",
        ")",
        ":",
        "[",
        "]",
        "@skip",
        "@include",
        "if:",
        "true",
        "\"x\"",
        "1e999",
        "-1",
        "null",
    ]);
    let document = prop_oneof![
        prop::collection::vec(word, 0..40).prop_map(|words| words.join(" ")),
        "[ -~]{0,120}",
    ];
    let variables = prop_oneof![
        Just(Value::Null),
        Just(json!({})),
        ("[a-z]{1,8}", "[ -~]{0,20}").prop_map(|(k, v)| json!({ k: v })),
        Just(json!({ "id": [1, 2, {"a": null}] })),
        Just(json!("not an object")),
    ];
    let request = (document, variables, prop::option::of("[A-Za-z]{0,10}")).prop_map(
        |(query, variables, operation)| {
            json!({ "query": query, "variables": variables, "operationName": operation })
                .to_string()
                .into_bytes()
        },
    );
    prop_oneof![
        6 => request,
        1 => "[ -~]{0,200}".prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..300),
        1 => Just(b"[]".to_vec()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_graphql_request_gets_a_typed_answer_and_the_server_stays_up() {
    let server = Server::start().await;
    let token = tenant_token("acme");
    let tokens = prop_oneof![Just(Some(token.clone())), Just(None), "[ -~]{0,60}".prop_map(Some),];
    run((graphql_body(), tokens), |(body, token)| {
        let mut request = server
            .http
            .post(format!("{}/graphql", server.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let (status, text) = answer(request)?;
        // GraphQL answers errors in `errors[].extensions.code`; a request the server refuses
        // before GraphQL (not JSON at all) answers as the rest of the gateway does.
        typed(status, &text, |answer| {
            answer["errors"][0]["extensions"]["code"].as_str().or(answer["code"].as_str())
        })?;
        if (200..300).contains(&status) {
            let answer: Value =
                serde_json::from_str(&text).map_err(|_| TestCaseError::fail(text.clone()))?;
            if let Some(errors) = answer["errors"].as_array() {
                for error in errors {
                    let code = error["extensions"]["code"].as_str();
                    prop_assert!(
                        code.is_some_and(|c| CODES.contains(&c)),
                        "an error without a typed code: {error}"
                    );
                    prop_assert!(
                        code != Some("INTERNAL"),
                        "INTERNAL for a client's mistake: {error}"
                    );
                }
            }
        }
        Ok(())
    });
    let found =
        server.graphql(&token, "{ leases(first: 1) { edges { cursor } } }", json!({})).await;
    assert!(found.get("data").is_some(), "{found}");
}
