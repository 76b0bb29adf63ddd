//! `serve --demo`: with nothing set up, the tenant `demo` has workloads of every kind within
//! a minute or two, and lifecycle events keep coming.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::backend::eventually_within;
use crate::support::*;

/// Longest the demo may take to show every kind, or its next events, on a loaded machine.
const SEEDED_WITHIN: Duration = Duration::from_secs(180);

const SEEN: &str = "{
    workloads(first: 100) { edges { node { kind state } } }
    snapshots(first: 5) { edges { node { id } } }
}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_seeds_every_kind_and_keeps_events_coming() {
    let server = Server::start_with(&["--demo"]).await;
    let demo = tenant_token("demo");
    let seeded = "workloads of every kind, a ready lease and a snapshot";
    let kinds = eventually_within(seeded, SEEDED_WITHIN, || async {
        let answer = server.graphql(&demo, SEEN, json!({})).await;
        let data = data(&answer);
        let workloads: Vec<&Value> =
            data["workloads"]["edges"].as_array()?.iter().map(|edge| &edge["node"]).collect();
        let kinds: BTreeSet<&str> = workloads.iter().filter_map(|w| w["kind"].as_str()).collect();
        let ready = workloads.iter().any(|w| w["kind"] == "lease" && w["state"] == "ready");
        let snapshot = data["snapshots"]["edges"].as_array().is_some_and(|edges| !edges.is_empty());
        let every = ["lease", "vm", "rental", "run", "runner"].iter().all(|k| kinds.contains(k));
        (every && ready && snapshot)
            .then(|| kinds.into_iter().map(String::from).collect::<Vec<_>>())
    })
    .await;
    assert_eq!(kinds.len(), 5, "{kinds:?}");

    // The stream goes on: new events after the newest seen now.
    let head = last_cursor(&server, &demo).await;
    eventually_within("new lifecycle events", SEEDED_WITHIN, || async {
        let page =
            "query($after: String) { events(after: $after, first: 10) { edges { cursor } } }";
        let answer = server.graphql(&demo, page, json!({ "after": head })).await;
        let edges = data(&answer)["events"]["edges"].as_array().map_or(0, Vec::len);
        (edges >= 3).then_some(())
    })
    .await;
}

/// The cursor of the tenant's newest event, read page by page.
async fn last_cursor(server: &Server, token: &str) -> Option<String> {
    let page = "query($after: String) {
        events(after: $after, first: 100) { edges { cursor } pageInfo { hasNextPage endCursor } }
    }";
    let mut after: Option<String> = None;
    loop {
        let answer = server.graphql(token, page, json!({ "after": after })).await;
        let events = &data(&answer)["events"];
        let end = events["pageInfo"]["endCursor"].as_str().map(String::from);
        if end.is_some() {
            after = end;
        }
        if events["pageInfo"]["hasNextPage"] != true {
            return after;
        }
    }
}
