//! The dashboard and GraphiQL in a real browser: Debian's Chromium, driven by playwright-core
//! (`web/e2e/*.mjs`, pinned in `web/package-lock.json`, installed by the first test that needs
//! it), against a real `leasehold serve`. A scenario asks this side for what only it can do
//! (stop the server, write while it is down, start it again) with one JSON line on its
//! standard output, and is answered with one line on its standard input.
//!
//! A failed scenario leaves a screenshot of each page it had open in the folder
//! `LEASEHOLD_SCREENSHOTS` names (relative to the repository), else in a temporary one that
//! the failure names. (The README's screenshots come from `web/scripts/screenshots.mjs`, of a
//! running demo.)

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use leasehold_gateway::Role;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

use crate::support::*;

/// Where Debian installs Chromium.
const CHROMIUM: &str = "/usr/bin/chromium";

/// Longest a whole scenario may take, its browser's start included, on a loaded machine.
const SCENARIO_WAIT: Duration = Duration::from_secs(300);

/// One browser at a time: each is several processes, and the machine has two cores.
static ONE_BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Chromium, installed from Debian's packages if it is missing (`.ci/run` installs it too).
fn chromium() -> &'static str {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        if Path::new(CHROMIUM).exists() {
            return;
        }
        let lock = std::fs::File::create(std::env::temp_dir().join("leasehold-chromium.lock"))
            .expect("a lock file");
        lock.lock().expect("the install lock");
        if !Path::new(CHROMIUM).exists() {
            let install = |args: &[&str]| {
                std::process::Command::new("apt-get")
                    .args(args)
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .status()
                    .is_ok_and(|status| status.success())
            };
            let installed = install(&["install", "-y", "--no-install-recommends", "chromium"])
                || (install(&["update"]) && install(&["install", "-y", "chromium"]));
            assert!(
                installed,
                "Chromium is needed for the browser tests: apt-get install chromium"
            );
        }
        lock.unlock().expect("the install lock is released");
    });
    CHROMIUM
}

/// Where a scenario's screenshots go: the folder `LEASEHOLD_SCREENSHOTS` names (relative to the
/// repository), else a folder of the test's own, removed unless the scenario fails.
fn screenshots() -> (PathBuf, Option<TempDir>) {
    if let Ok(folder) = std::env::var("LEASEHOLD_SCREENSHOTS") {
        let folder = repository().join(folder);
        std::fs::create_dir_all(&folder).expect("the screenshots folder");
        return (folder, None);
    }
    let folder = std::env::temp_dir().join(format!("lh-shots-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir_all(&folder).expect("a screenshots folder");
    (folder.clone(), Some(TempDir(folder)))
}

/// Runs `web/e2e/{name}.mjs` against `server` until it is done; its summary.
async fn scenario(name: &str, server: &mut Server) -> Value {
    let web = npm_installed(&repository().join("web"));
    let chromium = chromium();
    let _one = ONE_BROWSER.lock().await;
    let tokens = json!({
        "acme": tenant_token("acme"),
        "globex": tenant_token("globex"),
        "operator": role_token(Role::Operator, None),
    });
    let (shots, temporary) = screenshots();
    let mut child = tokio::process::Command::new("node")
        .arg(web.join(format!("e2e/{name}.mjs")))
        .env("LEASEHOLD_BASE", &server.base)
        .env("LEASEHOLD_TOKENS", tokens.to_string())
        .env("LEASEHOLD_SHOTS", &shots)
        .env("LEASEHOLD_CHROMIUM", chromium)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node runs");
    let mut stdin = child.stdin.take().expect("piped");
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut stderr = child.stderr.take().expect("piped");
    let errors = tokio::spawn(async move {
        let mut text = String::new();
        let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
        text
    });
    let summary = tokio::time::timeout(SCENARIO_WAIT, async {
        while let Some(line) = lines.next_line().await.expect("readable") {
            let asked: Value = serde_json::from_str(&line)
                .unwrap_or_else(|_| panic!("{name} printed a line that is not JSON: {line}"));
            if let Some(summary) = asked.get("done") {
                return Some(summary.clone());
            }
            let answer = serve_request(server, &asked).await;
            stdin.write_all(format!("{answer}\n").as_bytes()).await.expect("the scenario reads");
        }
        None
    })
    .await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    let mut errors = errors.await.unwrap_or_default();
    let finished = matches!((&summary, &status), (Ok(Some(_)), Ok(Ok(status))) if status.success());
    if !finished {
        // Kept for whoever reads the failure: the pages as they were.
        std::mem::forget(temporary);
        errors = format!("{errors}\n(screenshots of the pages: {})", shots.display());
    }
    let summary = summary.unwrap_or_else(|_| panic!("{name} did not finish in time:\n{errors}"));
    let summary = summary.unwrap_or_else(|| panic!("{name} ended without finishing:\n{errors}"));
    let status = status.expect("the scenario exits").expect("waited");
    assert!(status.success(), "{name} failed ({status}):\n{errors}");
    summary
}

/// Does what a scenario asked of the server; the line to answer it with.
async fn serve_request(server: &mut Server, asked: &Value) -> String {
    if asked.get("stop").is_some() {
        server.terminate().await;
        "stopped".into()
    } else if asked.get("start").is_some() {
        server.start_again().await;
        "started".into()
    } else if asked.get("write").is_some() {
        let key = format!("direct-{}", uuid::Uuid::now_v7());
        DirectWriter::on(server).request(&key).await.0.to_string()
    } else {
        panic!("a scenario asked for what no test does: {asked}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_signs_in_and_sees_its_own_feed_and_workloads_change_live() {
    let mut server = Server::start().await;
    let summary = scenario("tenant", &mut server).await;
    assert_ne!(summary["requested"], summary["released"], "the state changed: {summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_outlives_a_server_restart_and_resumes_the_feed_without_a_duplicate_row() {
    let mut server = Server::start().await;
    let summary = scenario("restart", &mut server).await;
    assert!(summary["rows"].as_u64().unwrap_or_default() >= 3, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_sees_lag_hosts_and_dead_letters() {
    let mut server = Server::start().await;
    let summary = scenario("operator", &mut server).await;
    assert!(summary["meters"].as_u64().unwrap_or_default() > 0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graphiql_runs_a_query_with_every_other_host_unreachable() {
    let mut server = Server::start().await;
    let summary = scenario("graphiql", &mut server).await;
    assert_eq!(summary["elsewhere"], 0, "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_works_by_keyboard_on_a_narrow_screen_with_no_serious_axe_finding() {
    let mut server = Server::start().await;
    scenario("access", &mut server).await;
}
