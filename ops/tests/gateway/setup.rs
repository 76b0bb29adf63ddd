//! `leasehold serve` with nothing configured, on a machine where no server answers: it starts a
//! private cluster from the machine's PostgreSQL binaries and prints tokens that work.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::support::TempDir;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_server_serve_starts_a_private_cluster_and_prints_working_tokens() {
    let data_dir = TempDir(std::env::temp_dir().join(format!("lh-setup-{}", uuid::Uuid::now_v7())));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("LEASEHOLD_DATABASE_URL")
        .env_remove("LEASEHOLD_JWT_SECRET")
        .env("LEASEHOLD_LOCAL_POSTGRES", "127.0.0.1:1")
        .env("LEASEHOLD_DATA_DIR", &data_dir.0)
        .env("LEASEHOLD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let (mut base, mut token, mut said) = (None, None, Vec::new());
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(line) = lines.next_line().await.expect("readable") {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().expect("an address");
                base = Some(url.trim_end_matches('.').trim_end_matches("/graphql").to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("tenant demo") {
                token = Some(rest.trim().to_string());
                break;
            }
            said.push(line);
        }
    })
    .await
    .expect("serve starts in time");
    let said = said.join("\n");
    assert!(said.contains("private PostgreSQL cluster running"), "{said}");
    let (base, token) = (base.expect("an address"), token.expect("a demo token"));

    let answer: Value = reqwest::Client::new()
        .post(format!("{base}/graphql"))
        .bearer_auth(&token)
        .json(&json!({ "query": "{ leases { edges { cursor } } }" }))
        .send()
        .await
        .expect("answers")
        .json()
        .await
        .expect("JSON");
    assert_eq!(answer, json!({ "data": { "leases": { "edges": [] } } }));

    let pid = child.id().expect("running").to_string();
    let killed = tokio::process::Command::new("kill").args(["-TERM", &pid]).status().await;
    assert!(killed.expect("kill runs").success());
    let mut rest = Vec::new();
    while let Some(line) = lines.next_line().await.expect("readable") {
        rest.push(line);
    }
    assert!(child.wait().await.expect("exits").success());
    let rest = rest.join("\n");
    assert!(rest.contains("stopped the private PostgreSQL cluster"), "{rest}");
}
