//! The `leasehold` binary, run as a user would run it.

use std::process::Output;

use leasehold_tests::TestDb;

async fn leasehold(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env("LEASEHOLD_LOG", "warn")
        .output()
        .await
        .expect("the leasehold binary runs")
}

/// Each line of standard output, parsed as JSON.
fn json_lines(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is JSON"))
        .collect()
}

fn url_of(db: &TestDb) -> String {
    let config = db.url.config();
    format!("postgres://postgres@{}/{}", db.url.endpoint(), config.get_dbname().unwrap())
}

#[tokio::test]
async fn migrate_applies_then_reports_up_to_date_and_verify_passes() {
    let db = TestDb::empty().await;
    let url = url_of(&db);
    let first = leasehold(&["migrate", "--database-url", &url]).await;
    assert!(first.status.success(), "{first:?}");
    assert!(String::from_utf8_lossy(&first.stdout).contains("0001_log.sql"));
    let second = leasehold(&["migrate", "--database-url", &url]).await;
    assert!(String::from_utf8_lossy(&second.stdout).contains("up to date"), "{second:?}");
    let verify = leasehold(&["events", "verify", "--database-url", &url]).await;
    assert!(verify.status.success(), "{verify:?}");
    assert!(String::from_utf8_lossy(&verify.stdout).contains("0 events in 0 streams checked"));
    let epoch = leasehold(&["events", "new-epoch", "--database-url", &url]).await;
    assert!(epoch.status.success(), "{epoch:?}");
    assert!(String::from_utf8_lossy(&epoch.stdout).contains("epoch 2"), "{epoch:?}");
}

#[tokio::test]
async fn an_unreachable_database_fails_clearly_without_the_password() {
    let url = "postgres://leasehold:hunter2@127.0.0.1:1/leasehold";
    let output = leasehold(&["migrate", "--database-url", url]).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("127.0.0.1:1"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_log_prints_one_json_object_per_measure() {
    let db = TestDb::empty().await;
    let url = url_of(&db);
    let args = ["bench", "log", "--database-url", &url, "--json", "--seconds", "1"];
    let output = leasehold(&[&args[..], &["--read-events", "2000"]].concat()).await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "append_single_1_writers",
            "append_single_4_writers",
            "append_single_16_writers",
            "append_batch_100",
            "append_batch_100_bare",
            "catch_up_read",
            "catch_up_read_unpipelined"
        ]
    );
    for line in &lines {
        let (value, baseline) =
            (line["value"].as_f64().unwrap(), line["baseline"].as_f64().unwrap());
        assert!(value > 0.0 && baseline > 0.0, "{line}");
        let ratio = line["ratio"].as_f64().unwrap();
        assert!((ratio - value / baseline).abs() < 0.01, "{line}");
        assert!(line["unit"].is_string());
    }
}

/// Three `Charged` events (amounts 40, 41, 42) appended to the new stream `stream`.
async fn three_charges(db: &TestDb, stream: &str) {
    use leasehold_domain::{
        EventId, EventStore, EventType, ExpectedVersion, Metadata, NewEvent, StreamAppend,
        StreamId, StreamType, TenantId,
    };
    let events = (0..3)
        .map(|n| NewEvent {
            event_id: EventId::from_uuid(uuid::Uuid::now_v7()),
            event_type: EventType::parse("Charged").unwrap(),
            schema_version: 1,
            payload: serde_json::json!({"amount": 40 + n}),
            metadata: Metadata::default(),
        })
        .collect();
    db.store()
        .append(vec![StreamAppend {
            stream_id: StreamId::parse(stream).unwrap(),
            stream_type: StreamType::parse("lease").unwrap(),
            tenant_id: TenantId::parse("acme").unwrap(),
            expected: ExpectedVersion::NoStream,
            events,
        }])
        .await
        .unwrap();
}

#[tokio::test]
async fn verify_names_a_tampered_event_and_fails() {
    let db = TestDb::migrated().await;
    three_charges(&db, "lease-7").await;
    let client = db.client().await;
    client
        .execute("UPDATE events SET payload = '{\"amount\": 99}' WHERE version = 2", &[])
        .await
        .unwrap();

    let output = leasehold(&["events", "verify", "--database-url", &url_of(&db)]).await;
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("stream lease-7 version 2: HashMismatch"), "{stdout}");
    let summary = "3 events in 1 streams checked, 0 seals checked, 3 events after the last seal, 1 \
                   breaks";
    assert!(stdout.contains(summary), "{stdout}");
    assert!(stdout.contains("first bad position: position"), "{stdout}");
}

#[tokio::test]
async fn verify_finds_a_deleted_tail_and_a_stream_whose_events_are_gone() {
    let db = TestDb::migrated().await;
    for stream in ["lease-1", "lease-2"] {
        three_charges(&db, stream).await;
    }
    // The chains that remain are intact: only the heads the streams table records tell.
    let client = db.client().await;
    client
        .batch_execute(
            "DELETE FROM events WHERE stream_id = 'lease-1' AND version = 3; \
             DELETE FROM events WHERE stream_id = 'lease-2'",
        )
        .await
        .unwrap();

    let output = leasehold(&["events", "verify", "--database-url", &url_of(&db)]).await;
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("stream lease-1 version 3: EventsMissing { recorded: 3 }"), "{stdout}");
    assert!(stdout.contains("stream lease-2 version 1: StreamMissing"), "{stdout}");
}

#[tokio::test]
async fn verify_holds_the_log_to_its_seals_and_names_the_first_bad_position() {
    let db = TestDb::migrated().await;
    for stream in ["lease-1", "lease-2", "lease-3"] {
        three_charges(&db, stream).await;
    }
    // Sealing covers what every reader can see: wait until that is all nine events.
    // (An append is visible once every transaction begun before it ended, in any database of
    // the cluster: another test's open transaction can hold the last ones back for a while.)
    let store = db.store();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut events = Vec::new();
    let mut after = leasehold_domain::Cursor::START;
    while events.len() < 9 && tokio::time::Instant::now() < deadline {
        let left = deadline - tokio::time::Instant::now();
        let page = store.wait_for_log(after, 9 - events.len(), left).await.unwrap();
        events.extend(page.events);
        after = page.next;
    }
    assert_eq!(events.len(), 9, "the events are visible in time");
    let sealed =
        leasehold(&["events", "seal", "--every", "4", "--database-url", &url_of(&db)]).await;
    assert!(sealed.status.success(), "{sealed:?}");
    assert!(String::from_utf8_lossy(&sealed.stdout).contains("3 seals written"));
    let output = leasehold(&["events", "verify", "--database-url", &url_of(&db)]).await;
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("3 seals checked, 0 events after"));

    // A whole stream deleted from both tables leaves every chain and head intact: the seals
    // tell, at the deleted stream's first position.
    let first_of_lease_2 = events[3].cursor.position;
    let client = db.client().await;
    client
        .batch_execute(
            "DELETE FROM events WHERE stream_id = 'lease-2'; \
             DELETE FROM streams WHERE stream_id = 'lease-2'",
        )
        .await
        .unwrap();
    let output = leasehold(&["events", "verify", "--database-url", &url_of(&db)]).await;
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let first = format!("first bad position: position {first_of_lease_2} (its event is gone");
    assert!(stdout.contains(&first), "{stdout}");
    assert!(stdout.contains("SealedEventMissing"), "{stdout}");
}

/// Reads the child's standard output until a line contains `needle` (bounded wait).
async fn read_until(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    needle: &str,
) -> String {
    let found = async {
        while let Some(line) = lines.next_line().await.expect("stdout is readable") {
            if line.contains(needle) {
                return line;
            }
        }
        panic!("stdout ended before {needle:?}");
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), found).await.expect("in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_projects_the_log_and_stops_on_sigterm_keeping_its_checkpoint() {
    use leasehold_commands::{CommandPipeline, CommandRequest, PipelineConfig};
    use leasehold_domain::lease::{Lease, LeaseCommand, LeaseFacts, LeaseId};
    use tokio::io::AsyncBufReadExt as _;

    let db = TestDb::empty().await;
    let url = url_of(&db);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["serve", "--database-url", &url])
        .env("LEASEHOLD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    read_until(&mut lines, "running").await;

    let store = db.store();
    let pipeline = CommandPipeline::new(store.clone(), PipelineConfig::default());
    let lease = LeaseId(uuid::Uuid::now_v7());
    let request = |key: &str, command: LeaseCommand, facts: LeaseFacts| {
        CommandRequest::<Lease>::new(
            leasehold_domain::TenantId::parse("acme").expect("valid"),
            leasehold_domain::Actor { subject: "alice".into(), role: "tenant".into() },
            lease.stream_id(),
            leasehold_domain::OperationKey::parse(key).expect("valid"),
            command,
            facts,
        )
    };
    let items = vec![leasehold_commands::lease_input::ItemInput {
        sku: "gpu.h100.1x".into(),
        quantity: 1,
        service_name: None,
    }];
    let input = leasehold_commands::lease_input::RequestLeaseInput {
        provider_id: uuid::Uuid::nil().to_string(),
        items,
        payload_hash: "ab".repeat(32),
    };
    let limits = leasehold_commands::lease_input::LeaseInputLimits::default();
    let operation = leasehold_domain::lease::OperationId(lease.0);
    let provision =
        leasehold_commands::lease_input::request_provision(lease, operation, &input, limits)
            .expect("valid");
    let backend =
        leasehold_domain::lease::ServiceName::parse("backend", "docker-1").expect("valid");
    let routed = LeaseFacts { backend: Some(backend), ..LeaseFacts::default() };
    pipeline.execute(request("req", provision, routed)).await.expect("requested");
    let ready = pipeline
        .execute(request(
            "up",
            LeaseCommand::ReportProvisioned { operation },
            LeaseFacts::default(),
        ))
        .await
        .expect("provisioned");
    let cursor = ready.cursor.expect("a cursor");

    // The serving process (not this one) projects the events: wait for its checkpoint.
    let caught_up = async {
        loop {
            if leasehold_adapters::PgReadModels::of(&store)
                .checkpoint("lease_views")
                .await
                .expect("readable")
                .is_some_and(|c| c >= cursor)
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), caught_up)
        .await
        .expect("projected in time");

    let pid = child.id().expect("running").to_string();
    let killed =
        std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
    assert!(killed.success());
    let stopped = read_until(&mut lines, "stopped;").await;
    assert!(stopped.contains(&cursor.to_string()), "{stopped}");
    let status = tokio::time::timeout(std::time::Duration::from_secs(30), child.wait())
        .await
        .expect("exits in time")
        .expect("exit status");
    assert!(status.success(), "{status:?}");
    assert_eq!(
        leasehold_adapters::PgReadModels::of(&store)
            .checkpoint("lease_views")
            .await
            .expect("readable"),
        Some(cursor)
    );
    let tenant = leasehold_domain::TenantId::parse("acme").expect("valid");
    let summary = leasehold_adapters::PgReadModels::of(&store)
        .lease(&tenant, lease)
        .await
        .expect("readable")
        .expect("projected");
    assert_eq!(summary.status, "ready");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_pipeline_prints_one_json_object_per_measure() {
    let db = TestDb::empty().await;
    let url = url_of(&db);
    let args = ["bench", "pipeline", "--database-url", &url, "--json", "--seconds", "1"];
    let output = leasehold(&[&args[..], &["--projection-events", "1000"]].concat()).await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["commands_1_clients", "commands_4_clients", "commands_16_clients", "projection_catch_up"]
    );
    for line in &lines {
        assert!(line["value"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["baseline"].as_f64().unwrap() > 0.0, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_dispatch_prints_one_json_object_per_measure() {
    let db = TestDb::empty().await;
    let url = url_of(&db);
    let args = ["bench", "dispatch", "--database-url", &url, "--json", "--seconds", "1"];
    let output = leasehold(&args).await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["dispatch_16_clients", "dispatch_request_to_ready_p99", "dispatch_floor_16_clients"]
    );
    for line in &lines {
        assert!(line["value"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["baseline"].as_f64().unwrap() > 0.0, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_fleet_prints_one_json_object_per_measure() {
    let db = TestDb::empty().await;
    let url = url_of(&db);
    let args =
        ["bench", "fleet", "--database-url", &url, "--json", "--seconds", "1", "--hosts", "10"];
    let output = leasehold(&args).await;
    assert!(output.status.success(), "{output:?}");
    let lines = json_lines(&output);
    let names: Vec<&str> = lines.iter().map(|l| l["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "vm_creates_spread_16_clients",
            "vm_create_retries_spread",
            "vm_creates_pack_16_clients",
            "vm_create_retries_pack"
        ]
    );
    for line in lines.iter().filter(|l| l["unit"] == "creates/s") {
        assert!(line["value"].as_f64().unwrap() > 0.0, "{line}");
        assert!(line["baseline"].as_f64().unwrap() > 0.0, "{line}");
    }
}

#[tokio::test]
async fn projections_status_reports_each_projection_and_the_horizon() {
    let db = TestDb::migrated().await;
    let url = url_of(&db);
    let empty = leasehold(&["projections", "status", "--database-url", &url]).await;
    assert!(empty.status.success(), "{empty:?}");
    let text = String::from_utf8_lossy(&empty.stdout);
    assert!(text.contains("no projection has applied anything yet"), "{text}");
    assert!(text.contains("horizon lag"), "{text}");
    // A checkpoint, as a projector would have written it.
    db.client()
        .await
        .batch_execute(
            "INSERT INTO projection_checkpoints (projection, version, log_epoch, tx_id, position, \
             events_applied) VALUES ('lease_views', 1, 1, '5', 7, 7)",
        )
        .await
        .expect("written");
    let json = leasehold(&["projections", "status", "--database-url", &url, "--json"]).await;
    assert!(json.status.success(), "{json:?}");
    let lines = json_lines(&json);
    assert_eq!(lines[0]["name"], "lease_views");
    assert_eq!(lines[0]["events_applied"], 7);
    assert_eq!(lines[0]["events_behind"], 0);
    assert!(lines[1]["horizon_lag_seconds"].as_f64().is_some());
}

#[tokio::test]
async fn an_agent_token_names_its_provider_or_is_granted_all_providers_explicitly() {
    let token = |args: &[&str]| {
        let mut all = vec!["token", "--role", "agent"];
        all.extend_from_slice(args);
        let all: Vec<String> = all.into_iter().map(String::from).collect();
        async move {
            tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
                .args(&all)
                .env("LEASEHOLD_JWT_SECRET", "cli-test-secret-0123456789abcdef0123456789")
                .output()
                .await
                .expect("the leasehold binary runs")
        }
    };
    let unbound = token(&[]).await;
    assert!(!unbound.status.success());
    assert!(String::from_utf8_lossy(&unbound.stderr).contains("--all-providers"));
    let bound = token(&["--provider", "00000000-0000-0000-0000-000000000007"]).await;
    assert!(bound.status.success(), "{}", String::from_utf8_lossy(&bound.stderr));
    let all = token(&["--all-providers"]).await;
    assert!(all.status.success(), "{}", String::from_utf8_lossy(&all.stderr));
    let both = token(&["--all-providers", "--provider", "00000000-0000-0000-0000-000000000007"]);
    assert!(!both.await.status.success());
    // A host's agent names its host instead, and the token says so.
    let host = token(&["--host", "agent-1"]).await;
    assert!(host.status.success(), "{}", String::from_utf8_lossy(&host.stderr));
    let secret = leasehold_gateway::JwtSecret::new(b"cli-test-secret-0123456789abcdef0123456789")
        .expect("long enough");
    let minted = String::from_utf8_lossy(&host.stdout).trim().to_string();
    let principal = secret.verify(&minted).expect("a valid token");
    assert_eq!(principal.host.map(|host| host.to_string()), Some("agent-1".to_string()));
    assert!(!token(&["--host", "Not A Host"]).await.status.success());
    assert!(!token(&["--host", "agent-1", "--all-providers"]).await.status.success());
}

/// Waits (at most 30 s) until every event of `db` is below the read horizon: a writing
/// transaction anywhere on the server, another test's included, holds it back.
async fn below_the_horizon(db: &TestDb, events: usize) {
    use leasehold_domain::{Cursor, EventStore as _};
    let store = db.store();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let read = store.read_log(Cursor::START, events + 1).await.unwrap();
        if read.events.len() >= events {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "the horizon did not pass in 30 s");
        let waited = store.wait_for_log(read.next, 1, std::time::Duration::from_secs(1)).await;
        waited.unwrap();
    }
}

#[tokio::test]
async fn export_verify_from_the_file_and_import_into_a_new_database() {
    let db = TestDb::migrated().await;
    three_charges(&db, "lease-7").await;
    three_charges(&db, "lease-8").await;
    below_the_horizon(&db, 6).await;
    let (url, target) = (url_of(&db), TestDb::empty().await);
    let target_url = url_of(&target);
    let seal = leasehold(&["events", "seal", "--every", "4", "--database-url", &url]).await;
    assert!(seal.status.success());
    let file = std::env::temp_dir().join(format!("lh-export-{}.ndjson", uuid::Uuid::now_v7()));
    let path = file.to_str().unwrap();

    let export = leasehold(&["events", "export", "--database-url", &url, "-o", path]).await;
    assert!(export.status.success(), "{export:?}");
    let said = String::from_utf8_lossy(&export.stderr);
    assert!(said.contains("6 events, 2 seals and 2 stream heads written"), "{said}");

    let verify = leasehold(&["events", "verify", "--from", path]).await;
    assert!(verify.status.success(), "{verify:?}");
    let stdout = String::from_utf8_lossy(&verify.stdout);
    assert!(stdout.contains("6 events in 2 streams checked, 2 seals checked"), "{stdout}");

    let args = ["events", "import", "--database-url", &target_url, "--from", path];
    let import = leasehold(&args).await;
    assert!(import.status.success(), "{import:?}");
    let stdout = String::from_utf8_lossy(&import.stdout);
    assert!(stdout.contains("6 events in 2 streams and 2 seals imported and verified"), "{stdout}");
    let verify = leasehold(&["events", "verify", "--database-url", &target_url]).await;
    assert!(verify.status.success(), "{verify:?}");

    // The file altered: the amount of lease-8's second charge.
    let text = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    // The payload as PostgreSQL stores it, passed through: `{"amount": 41}`.
    let at = lines.iter().position(|l| l.contains("lease-8") && l.contains("\"amount\": 41"));
    let at = at.expect("lease-8's second charge");
    let altered = text.replacen("\"amount\": 41", "\"amount\": 99", 2).replacen(
        "\"amount\": 99",
        "\"amount\": 41",
        1,
    );
    std::fs::write(&file, altered).unwrap();
    let verify = leasehold(&["events", "verify", "--from", path]).await;
    std::fs::remove_file(&file).unwrap();
    assert!(!verify.status.success());
    let stdout = String::from_utf8_lossy(&verify.stdout);
    let line = at + 1;
    assert!(stdout.contains(&format!("BROKEN line {line}, position")), "{stdout}");
    assert!(stdout.contains("stream lease-8 version 2: HashMismatch"), "{stdout}");
}

#[tokio::test]
async fn tail_follows_the_live_log_from_a_cursor_with_the_exports_filters() {
    use leasehold_domain::{Cursor, EventStore as _};
    use tokio::io::AsyncBufReadExt as _;
    let db = TestDb::migrated().await;
    three_charges(&db, "lease-7").await;
    below_the_horizon(&db, 3).await;
    let first = db.store().read_log(Cursor::START, 1).await.unwrap().events[0].cursor;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["events", "tail", "--database-url", &url_of(&db)])
        .args(["--from-cursor", &first.to_string(), "--stream", "lease-7", "--stream", "lease-8"])
        .env("LEASEHOLD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line());
        let line = line.await.expect("a line within 30 s").unwrap().expect("the tail runs on");
        let line: serde_json::Value = serde_json::from_str(&line).unwrap();
        (line["stream_id"].as_str().unwrap().to_owned(), line["version"].as_u64().unwrap())
    };
    // After the cursor: lease-7's second and third events.
    assert_eq!(next().await, ("lease-7".to_owned(), 2));
    assert_eq!(next().await, ("lease-7".to_owned(), 3));
    // Then what is appended while it runs, lease-9 filtered out.
    three_charges(&db, "lease-9").await;
    three_charges(&db, "lease-8").await;
    for version in 1..=3 {
        assert_eq!(next().await, ("lease-8".to_owned(), version));
    }
    child.kill().await.unwrap();
}

#[tokio::test]
async fn projections_rebuild_activate_drop_and_status_show_each_build() {
    use leasehold_domain::EventStore as _;
    let db = TestDb::migrated().await;
    let url = url_of(&db);
    let rebuild = ["projections", "rebuild", "lease_views", "--database-url", &url];
    let rebuilt = leasehold(&rebuild).await;
    assert!(rebuilt.status.success(), "{rebuilt:?}");
    assert!(String::from_utf8_lossy(&rebuilt.stdout).contains("lease_views build 1 is active"));
    let unknown = leasehold(&["projections", "rebuild", "nothing", "--database-url", &url]).await;
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no projection is named"));

    // A lease event this code cannot read fails the next build at its position; the active
    // tables are untouched.
    three_charges(&db, &format!("lease-{}", uuid::Uuid::now_v7())).await;
    below_the_horizon(&db, 3).await;
    assert!(!leasehold(&rebuild).await.status.success());
    let status = leasehold(&["projections", "status", "--json", "--database-url", &url]).await;
    let builds: Vec<(u64, String, Option<u64>)> = json_lines(&status)
        .iter()
        .filter(|line| line["build"] == "lease_views")
        .map(|line| {
            let state = line["state"].as_str().unwrap().to_owned();
            (line["build_no"].as_u64().unwrap(), state, line["error_position"].as_u64())
        })
        .collect();
    let first = db.store().read_log(leasehold_domain::Cursor::START, 1).await.unwrap().events[0]
        .cursor
        .position;
    assert_eq!(
        builds,
        [
            (0, "retired".into(), None),
            (1, "active".into(), None),
            (2, "failed".into(), Some(first))
        ]
    );

    let args = |verb: &'static str, version: &'static str| {
        vec!["projections", verb, "lease_views", "--version", version, "--database-url"]
    };
    let mut drop_failed = args("drop", "2");
    drop_failed.push(&url);
    assert!(leasehold(&drop_failed).await.status.success());
    let mut back = args("activate", "0");
    back.push(&url);
    let back = leasehold(&back).await;
    assert!(back.status.success(), "{back:?}");
    let mut drop_active = args("drop", "0");
    drop_active.push(&url);
    let refused = leasehold(&drop_active).await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("is active"), "{refused:?}");
}

/// Two tenants' leases requested through the lease service (real events every projection of
/// leases reads).
async fn two_leases(db: &TestDb) {
    use leasehold_commands::lease_input::{ItemInput, LeaseInputLimits, RequestLeaseInput};
    use leasehold_commands::lease_service::{Caller, LeaseService};
    use leasehold_commands::{CommandPipeline, PipelineConfig};
    use leasehold_domain::lease::ServiceName;
    use leasehold_domain::{Actor, TenantId};
    let backend = ServiceName::parse("backend", "docker-1").unwrap();
    let pipeline = CommandPipeline::new(db.store(), PipelineConfig::default());
    let leases = LeaseService::new(pipeline, Some(backend), LeaseInputLimits::default());
    let input = RequestLeaseInput {
        provider_id: uuid::Uuid::from_u128(7).to_string(),
        items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 2, service_name: None }],
        payload_hash: "ab".repeat(32),
    };
    for tenant in ["acme", "globex"] {
        let caller = Caller {
            actor: Actor { subject: format!("{tenant}-user"), role: "tenant".into() },
            tenant: Some(TenantId::parse(tenant).unwrap()),
            provider: None,
            namespace: None,
        };
        leases.request(&caller, "lease-1", None, &input).await.unwrap();
    }
}

#[tokio::test]
async fn replay_prints_each_read_models_digest_and_names_the_rows_a_database_lacks() {
    let db = TestDb::migrated().await;
    two_leases(&db).await;
    // An export holds the events below its horizon: another test's open transaction (an
    // import's, say) can hold it back.
    let client = db.client().await;
    let written: i64 = client.query_one("SELECT count(*) FROM events", &[]).await.unwrap().get(0);
    below_the_horizon(&db, usize::try_from(written).unwrap()).await;
    let url = url_of(&db);
    let file = std::env::temp_dir().join(format!("lh-replay-{}.ndjson", uuid::Uuid::now_v7()));
    let path = file.to_str().unwrap();
    let export = leasehold(&["events", "export", "--database-url", &url, "-o", path]).await;
    assert!(export.status.success(), "{export:?}");

    // No database: a digest of every read model.
    let replay = leasehold(&["events", "replay", "--from", path, "--json"]).await;
    assert!(replay.status.success(), "{replay:?}");
    let out: serde_json::Value = serde_json::from_slice(&replay.stdout).expect("JSON");
    let leases = out["tables"].as_array().unwrap().iter().find(|t| t["table"] == "leases");
    let leases = leases.expect("the leases read model");
    assert_eq!(leases["rows"], 2, "{out}");
    assert_eq!(leases["digest"].as_str().map(str::len), Some(64), "{out}");

    // Against a database whose projections never ran: every row is named, every projection
    // is said to be behind, and the exit status says so.
    let replay = leasehold(&["events", "replay", "--from", path, "--compare", &url]).await;
    std::fs::remove_file(&file).unwrap();
    assert!(!replay.status.success(), "{replay:?}");
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert!(stdout.contains("projection lease_views has not reached"), "{stdout}");
    let missing = stdout.lines().filter(|l| l.starts_with("DIFFERS leases ")).count();
    assert_eq!(missing, 2, "{stdout}");
    assert!(stdout.contains("not in the live table"), "{stdout}");
    assert!(
        String::from_utf8_lossy(&replay.stderr).contains("rows of the live read models differ")
    );
}

/// `count` events of stream `lease-<stream>` (ten an append), appended through the store.
async fn lease_events(db: &TestDb, streams: usize, count: usize) {
    use leasehold_domain::EventStore as _;
    let store = db.store();
    for stream in 0..streams {
        for batch in 0..count / 10 {
            let append = leasehold_tests::kafka::ten_lease_events(stream, batch, 0);
            store.append(vec![append]).await.unwrap();
        }
    }
}

/// Waits (bounded) until the relay's checkpoint satisfies `done`.
async fn relay_checkpoint_until(
    db: &TestDb,
    done: impl Fn(&leasehold_adapters::relay::RelayCheckpoint) -> bool,
) {
    use leasehold_adapters::relay::relay_checkpoints;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let checkpoints = relay_checkpoints(&db.store(), None).await.unwrap();
        if checkpoints.first().is_some_and(&done) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the relay did not get there: {checkpoints:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `leasehold relay` with at most `in_flight` events unacknowledged.
fn spawn_relay(url: &str, brokers: &str, in_flight: &str) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["relay", "--database-url", url, "--kafka-brokers", brokers])
        .args(["--in-flight-max", in_flight])
        .env("LEASEHOLD_LOG", "warn")
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("relay starts")
}

#[tokio::test]
async fn relay_and_tail_reach_a_broker_that_requires_sasl_with_a_settings_file_never_logging_it() {
    use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _};
    let db = TestDb::migrated().await;
    let mut broker = leasehold_tests::kafka::Broker::start_durable().await;
    broker.create_topic("leasehold.events", 1).await;
    broker.create_user("relay", "s3cret-pw").await;
    broker.require_authentication().await;
    lease_events(&db, 2, 20).await;
    let folder = std::env::temp_dir().join(format!("lh-kafka-{}", uuid::Uuid::now_v7()));
    std::fs::create_dir(&folder).unwrap();
    let settings = folder.join("kafka.properties");
    let properties = "# SCRAM over plaintext, as the test broker takes it\n\
                      security.protocol=SASL_PLAINTEXT\nsasl.mechanisms=SCRAM-SHA-512\n\
                      sasl.username=relay\nsasl.password=s3cret-pw\n\
                      debug=security,broker,conf\n";
    std::fs::write(&settings, properties).unwrap();
    let settings = settings.to_str().unwrap();

    let url = url_of(&db);
    let mut relay = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["relay", "--database-url", &url, "--kafka-brokers", &broker.address])
        .args(["--kafka-config", settings])
        .env("LEASEHOLD_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("relay starts");
    let head = db.settled_head().await;
    relay_checkpoint_until(&db, |checkpoint| checkpoint.cursor >= head).await;

    let mut tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["events", "tail", "--from-kafka", &broker.address, "--kafka-config", settings])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("tail starts");
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let read = async {
        for _ in 0..40 {
            lines.next_line().await.unwrap().expect("a line");
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), read).await.expect("in time");
    tail.start_kill().unwrap();

    // Logged at debug, and not one line holds the password.
    relay.start_kill().unwrap();
    let mut logged = String::new();
    relay.stderr.take().unwrap().read_to_string(&mut logged).await.unwrap();
    relay.stdout.take().unwrap().read_to_string(&mut logged).await.unwrap();
    assert!(!logged.contains("s3cret-pw"), "{logged}");
    let _ = std::fs::remove_dir_all(&folder);

    // A file that sets what the relay's guarantees rest on is refused, by line.
    std::fs::create_dir(&folder).unwrap();
    let owned = folder.join("owned.properties");
    std::fs::write(&owned, "client.id=x\nacks=1\n").unwrap();
    let refused = leasehold(&[
        "relay",
        "--database-url",
        &url,
        "--kafka-brokers",
        &broker.address,
        "--kafka-config",
        owned.to_str().unwrap(),
    ])
    .await;
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("line 2: acks is not one the relay takes"), "{said}");
    let _ = std::fs::remove_dir_all(&folder);
}

#[tokio::test]
async fn a_relay_killed_with_sigkill_resumes_and_tail_from_kafka_prints_each_event_once() {
    use tokio::io::AsyncBufReadExt as _;
    let (db, broker) = (TestDb::migrated().await, leasehold_tests::kafka::Broker::start().await);
    broker.create_topic("leasehold.events", 2).await;
    let url = url_of(&db);
    lease_events(&db, 10, 200).await;
    // The second round (below) is written only once the broker is paused.

    // Killed mid-stream, with SIGKILL: no last checkpoint written. Mid-stream for sure: the
    // broker stops acknowledging and a round more is written, which the relay cannot pass.
    let mut relay = spawn_relay(&url, &broker.address, "100");
    relay_checkpoint_until(&db, |checkpoint| checkpoint.published > 0).await;
    broker.pause();
    lease_events(&db, 10, 100).await;
    let reads = leasehold_adapters::read_models::PgReadModels::of(&db.store());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let checkpoints = leasehold_adapters::relay::relay_checkpoints(&db.store(), None).await;
        let (behind, _) = reads.behind_cursor(checkpoints.unwrap()[0].cursor).await.unwrap();
        if behind >= 1_000 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the lag never showed: {behind}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    relay.start_kill().unwrap();
    relay.wait().await.unwrap();
    broker.resume();
    let head = db.settled_head().await;
    let mut relay = spawn_relay(&url, &broker.address, "100");
    relay_checkpoint_until(&db, |checkpoint| checkpoint.cursor >= head).await;

    let status = leasehold(&["relay", "status", "--json", "--database-url", &url]).await;
    assert!(status.status.success(), "{status:?}");
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status[0]["relay"], "kafka:leasehold.events", "{status}");
    assert_eq!(status[0]["events_behind"], 0, "{status}");
    assert!(status[0]["published"].as_u64().unwrap() >= 3_000, "{status}");
    let projections = leasehold(&["projections", "status", "--json", "--database-url", &url]).await;
    let line = json_lines(&projections).into_iter().find(|line| line["kind"] == "relay");
    let line = line.expect("the relay beside the projections");
    assert_eq!(line["name"], "kafka:leasehold.events", "{line}");
    assert_eq!(line["events_behind"], 0, "{line}");

    // Every event once, whatever the relay repeated.
    let mut tail = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["events", "tail", "--from-kafka", &broker.address])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("tail starts");
    let mut lines = tokio::io::BufReader::new(tail.stdout.take().unwrap()).lines();
    let mut ids = std::collections::HashSet::new();
    let read = async {
        while ids.len() < 3_000 {
            let line = lines.next_line().await.unwrap().expect("a line");
            let line: serde_json::Value = serde_json::from_str(&line).unwrap();
            assert!(ids.insert(line["event_id"].as_str().unwrap().to_owned()), "a repeat: {line}");
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), read).await.expect("in time");
    tail.start_kill().unwrap();
    relay.start_kill().unwrap();
}

#[tokio::test]
async fn serve_relays_the_log_to_kafka_when_given_brokers() {
    use leasehold_adapters::relay::RelayedLog;
    use tokio::io::AsyncBufReadExt as _;
    let (db, broker) = (TestDb::migrated().await, leasehold_tests::kafka::Broker::start().await);
    broker.create_topic("leasehold.events", 1).await;
    lease_events(&db, 2, 20).await;
    let url = url_of(&db);
    let mut serve = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["serve", "--database-url", &url, "--listen", "127.0.0.1:0"])
        .args(["--relay-kafka-brokers", &broker.address])
        .env("LEASEHOLD_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    let mut lines = tokio::io::BufReader::new(serve.stdout.take().expect("piped")).lines();
    read_until(&mut lines, "running").await;
    let head = db.settled_head().await;
    relay_checkpoint_until(&db, |checkpoint| checkpoint.cursor >= head).await;

    let mut log =
        RelayedLog::subscribe(&broker.address, "leasehold.events", "check", true).unwrap();
    let mut streams = std::collections::HashSet::new();
    for _ in 0..40 {
        let event = log.next(std::time::Duration::from_secs(60)).await.unwrap();
        streams.insert(event.stream_id);
    }
    assert_eq!(streams.len(), 2);
    serve.start_kill().unwrap();
}
