//! A real `leasehold serve` on a fresh database and a free port, and a GraphQL client for it.

use std::time::Duration;

use chrono::TimeDelta;
use leasehold_domain::TenantId;
use leasehold_gateway::{JwtSecret, Role};
use leasehold_tests::TestDb;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use uuid::Uuid;

/// The secret the test servers are started with.
pub const SECRET: &str = "test-secret-0123456789abcdef0123456789abcdef";

/// The secret backends sign callbacks with on the test servers.
pub const CALLBACK_SECRET: &str = "callback-secret-0123456789abcdef0123456789ab";

/// How long a server may take to start.
const START_WAIT: Duration = Duration::from_secs(60);

/// A running `leasehold serve`; killed when dropped.
#[derive(Debug)]
pub struct Server {
    /// The process: declared first so that it is killed before its database is dropped.
    pub child: tokio::process::Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its database.
    pub db: TestDb,
    url: String,
    extra: Vec<String>,
    /// `LEASEHOLD_LOG` for every start of this server.
    log_level: String,
    /// Every line the server wrote to standard error (its log), across restarts.
    logs: Logs,
    pub http: reqwest::Client,
    _data_dir: TempDir,
}

/// A server's log lines, as it wrote them.
type Logs = std::sync::Arc<std::sync::Mutex<String>>;

/// A directory removed when dropped.
#[derive(Debug)]
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Server {
    /// Starts the binary on a fresh database and waits until it listens.
    pub async fn start() -> Server {
        Server::start_with(&[]).await
    }

    /// Starts it with extra `serve` arguments.
    pub async fn start_with(extra: &[&str]) -> Server {
        Server::start_logging(extra, "warn").await
    }

    /// Starts it with extra `serve` arguments, logging at `level` (`LEASEHOLD_LOG`).
    pub async fn start_logging(extra: &[&str], level: &str) -> Server {
        let db = TestDb::empty().await;
        let config = db.url.config();
        let url = format!(
            "postgres://postgres@{}/{}",
            db.url.endpoint(),
            config.get_dbname().expect("a database name")
        );
        let data_dir = TempDir(std::env::temp_dir().join(format!("lh-{}", Uuid::now_v7())));
        let extra: Vec<String> = extra.iter().map(ToString::to_string).collect();
        let logs = Logs::default();
        let log_level = level.to_string();
        let launch = Launch { url: &url, data_dir: &data_dir, extra: &extra, log_level: level };
        let (child, base) = spawn(&launch, "127.0.0.1:0", &logs).await;
        let http = reqwest::Client::new();
        Server { base, db, url, extra, log_level, logs, child, http, _data_dir: data_dir }
    }

    /// The URL of its database (`--database-url`).
    pub fn database_url(&self) -> String {
        self.url.clone()
    }

    /// Everything the server has logged so far.
    pub fn logs(&self) -> String {
        self.logs.lock().expect("not poisoned").clone()
    }

    /// Starts the binary again on the same address and database, after [`Server::terminate`].
    pub async fn start_again(&mut self) {
        let address = self.base.trim_start_matches("http://").to_string();
        let launch = Launch {
            url: &self.url,
            data_dir: &self._data_dir,
            extra: &self.extra,
            log_level: &self.log_level,
        };
        let (child, base) = spawn(&launch, &address, &self.logs).await;
        assert_eq!(base, self.base);
        self.child = child;
    }

    /// Starts the binary again on the same address and database with other extra arguments,
    /// after it stopped (terminated or killed).
    pub async fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(ToString::to_string).collect();
        self.start_again().await;
    }

    /// Sends SIGTERM and waits for a clean exit.
    pub async fn terminate(&mut self) {
        let pid = self.child.id().expect("running");
        let killed =
            tokio::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().await;
        assert!(killed.expect("kill runs").success());
        let status = tokio::time::timeout(START_WAIT, self.child.wait()).await;
        assert!(status.expect("exits in time").expect("waited").success());
    }

    /// POSTs `body` to `/graphql` with `token`; the status and the JSON answer.
    pub async fn post(&self, token: Option<&str>, body: reqwest::Body) -> (u16, Value) {
        let mut request = self
            .http
            .post(format!("{}/graphql", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("the server answers");
        let status = response.status().as_u16();
        (status, response.json().await.expect("a JSON answer"))
    }

    /// Runs `query` with `variables` as `token`.
    pub async fn graphql(&self, token: &str, query: &str, variables: Value) -> Value {
        self.graphql_with(token, json!({ "query": query, "variables": variables })).await
    }

    /// Sends a whole GraphQL request object.
    pub async fn graphql_with(&self, token: &str, request: Value) -> Value {
        self.post(Some(token), request.to_string().into()).await.1
    }

    /// Runs `query` once the projections have reached `cursor` (read-your-writes). Another
    /// test's open transaction holds back every reader of the log on this shared cluster, so
    /// a STALE answer is asked again, for at most 60 s.
    pub async fn graphql_after(
        &self,
        token: &str,
        query: &str,
        variables: Value,
        cursor: &Value,
    ) -> Value {
        let request = json!({ "query": query, "variables": variables, "extensions": { "minCursor": cursor } });
        self.answered(token, request).await
    }

    /// The answer to `request` once it is not `STALE` (asked again until then, at most 60 s).
    pub async fn answered(&self, token: &str, request: Value) -> Value {
        let fresh = tokio::time::timeout(std::time::Duration::from_secs(60), async {
            loop {
                let answer = self.graphql_with(token, request.clone()).await;
                if code(&answer) != Some("STALE") {
                    return answer;
                }
            }
        });
        fresh.await.expect("the projections reach the cursor within 60 s")
    }

    /// A plain GET.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = self.http.get(format!("{}{path}", self.base)).send().await.expect("answers");
        (response.status().as_u16(), response.text().await.expect("text"))
    }
}

/// Starts `leasehold serve` and waits until it listens; the process and its base URL.
/// What every start of one server is given.
struct Launch<'a> {
    url: &'a str,
    data_dir: &'a TempDir,
    extra: &'a [String],
    log_level: &'a str,
}

async fn spawn(launch: &Launch<'_>, listen: &str, logs: &Logs) -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["serve", "--database-url", launch.url, "--listen", listen])
        .args(launch.extra)
        .env("LEASEHOLD_JWT_SECRET", SECRET)
        .env("LEASEHOLD_CALLBACK_SECRET", CALLBACK_SECRET)
        .env("LEASEHOLD_DATA_DIR", &launch.data_dir.0)
        .env("LEASEHOLD_LOG", launch.log_level)
        // Up to three servers run at once here (two tests, one with two servers), each with
        // a lock connection per projection and reconciler: with the default pool they came
        // within 10 of PostgreSQL's 100 connections.
        .env("LEASEHOLD_DATABASE_POOL_SIZE", "8")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("serve starts");
    keep_logs(child.stderr.take().expect("piped"), logs.clone());
    let stdout = child.stdout.take().expect("piped");
    let mut lines = BufReader::new(stdout).lines();
    let base = tokio::time::timeout(START_WAIT, async {
        while let Some(line) = lines.next_line().await.expect("readable stdout") {
            if let Some(rest) = line.split("listening on ").nth(1) {
                let url = rest.split_whitespace().next().expect("an address");
                return url.trim_end_matches('.').trim_end_matches("/graphql").to_string();
            }
        }
        panic!("serve exited before listening");
    })
    .await
    .expect("serve listens in time");
    // Keep draining stdout so the server never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, base)
}

/// Collects the server's log lines into `logs`, and passes them on to the test's own
/// standard error as before, for a failing test's reader.
fn keep_logs(stderr: tokio::process::ChildStderr, logs: Logs) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("{line}");
            let mut logs = logs.lock().expect("not poisoned");
            logs.push_str(&line);
            logs.push('\n');
        }
    });
}

/// A token for tenant `name`.
pub fn tenant_token(name: &str) -> String {
    let tenant = TenantId::parse(name).expect("valid");
    secret().mint_for(
        &format!("{name}-user"),
        Role::Tenant,
        Some(&tenant),
        None,
        TimeDelta::hours(1),
    )
}

/// A token in `role` (no tenant), optionally bound to `provider`; an agent without one gets
/// the explicit all-providers grant.
pub fn role_token(role: Role, provider: Option<Uuid>) -> String {
    if role == Role::Agent && provider.is_none() {
        return secret().mint_agent_for_all_providers("agent", TimeDelta::hours(1));
    }
    secret().mint_for(role.as_str(), role, None, provider, TimeDelta::hours(1))
}

pub fn secret() -> JwtSecret {
    JwtSecret::new(SECRET.as_bytes()).expect("long enough")
}

/// The error code of the first error, if any.
pub fn code(answer: &Value) -> Option<&str> {
    answer["errors"][0]["extensions"]["code"].as_str()
}

/// `answer` must have no errors; its `data`.
pub fn data(answer: &Value) -> &Value {
    assert!(answer.get("errors").is_none(), "unexpected errors: {answer}");
    &answer["data"]
}

/// The provider every test lease is rented from.
pub const PROVIDER: &str = "00000000-0000-0000-0000-000000000007";

pub const REQUEST_LEASE: &str = "mutation($input: RequestLeaseInput!) {
    requestLease(input: $input) { id streamId version cursor duplicate events { type } }
}";

pub const REPORT_PROVISIONED: &str = "mutation($input: LeaseReportInput!) {
    reportLeaseProvisioned(input: $input) { id version cursor events { type } }
}";

/// The operation the lease's backend reports on now (the last provision, restore, restart or
/// update started), as an agent reads it with `leaseWork`.
pub async fn current_operation(server: &Server, lease_id: &Value) -> String {
    let work = lease_work(server, lease_id).await;
    work["operationId"].as_str().expect("the lease has started an operation").to_string()
}

/// `leaseWork` of the lease, read with an agent token for every provider.
pub async fn lease_work(server: &Server, lease_id: &Value) -> Value {
    let query = "query($id: ID!) { leaseWork(id: $id) { leaseId status operationId callbackPath maintenanceId admittedAt } }";
    let agent = role_token(Role::Agent, None);
    let answer = server.graphql(&agent, query, json!({ "id": lease_id })).await;
    data(&answer)["leaseWork"].clone()
}

/// The input of an agent's report on the lease's current operation, under `key`.
pub async fn report_input(server: &Server, lease_id: &Value, key: &str) -> Value {
    let operation = current_operation(server, lease_id).await;
    json!({ "input": { "leaseId": lease_id, "operationKey": key, "operationId": operation } })
}

/// The input of a one-item lease request under `key`.
pub fn lease_request(key: &str) -> Value {
    json!({ "input": {
        "operationKey": key,
        "providerId": PROVIDER,
        "items": [{ "sku": "gpu.h100.1x", "quantity": 1 }],
        "payload": "image: trainer:1",
    }})
}

/// Requests a lease as `token`; its `requestLease` result.
pub async fn request_lease(server: &Server, token: &str, key: &str) -> Value {
    let answer = server.graphql(token, REQUEST_LEASE, lease_request(key)).await;
    data(&answer)["requestLease"].clone()
}

impl Server {
    /// POSTs a body the server may refuse before reading it whole, over a plain socket: the
    /// server answers and closes early, which HTTP clients report as a broken pipe rather
    /// than the answer. The status and the JSON answer.
    pub async fn post_unread(&self, token: &str, body: Vec<u8>) -> (u16, Value) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let address = self.base.trim_start_matches("http://");
        let stream = tokio::net::TcpStream::connect(address).await.expect("connects");
        let (mut reader, mut writer) = stream.into_split();
        let head = format!(
            "POST /graphql HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {token}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let writing = tokio::spawn(async move {
            // The server may stop reading at any point: a failed write is expected.
            let _ = writer.write_all(head.as_bytes()).await;
            let _ = writer.write_all(&body).await;
        });
        let mut answer = Vec::new();
        let read = tokio::time::timeout(START_WAIT, reader.read_to_end(&mut answer)).await;
        writing.abort();
        // A reset after the answer arrived is fine; the answer must be there.
        let _ = read.expect("the server answers in time");
        let text = String::from_utf8_lossy(&answer);
        let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).expect("a status");
        let body = text.split("\r\n\r\n").nth(1).expect("a body");
        (status, serde_json::from_str(body).expect("a JSON answer"))
    }
}

/// Writes straight through the command pipeline on the server's database, past the gateway:
/// writers that go on while the gateway restarts or a socket is stuck.
pub struct DirectWriter {
    pipeline: leasehold_commands::CommandPipeline<leasehold_adapters::PgEventStore>,
}

impl DirectWriter {
    /// A writer on `server`'s database.
    pub fn on(server: &Server) -> DirectWriter {
        let config = leasehold_commands::PipelineConfig::default();
        DirectWriter {
            pipeline: leasehold_commands::CommandPipeline::new(server.db.store(), config),
        }
    }

    /// Runs `command` on `lease` for tenant acme under `key`.
    pub async fn execute(
        &self,
        lease: leasehold_domain::lease::LeaseId,
        key: &str,
        command: leasehold_domain::lease::LeaseCommand,
    ) {
        use leasehold_domain::lease::{LeaseCommand, LeaseFacts, ServiceName};
        let facts = match command {
            LeaseCommand::RequestProvision { .. } => {
                let backend = ServiceName::parse("backend", "local").expect("valid");
                LeaseFacts { backend: Some(backend), ..LeaseFacts::default() }
            }
            _ => LeaseFacts::default(),
        };
        let request = leasehold_commands::CommandRequest::<leasehold_domain::lease::Lease>::new(
            TenantId::parse("acme").expect("valid"),
            leasehold_domain::Actor { subject: "acme-user".into(), role: "tenant".into() },
            lease.stream_id(),
            leasehold_domain::OperationKey::parse(key).expect("valid"),
            command,
            facts,
        );
        self.pipeline.execute(request).await.expect("written");
    }

    /// Requests a one-item lease under `key`; its id.
    pub async fn request(&self, key: &str) -> leasehold_domain::lease::LeaseId {
        use leasehold_commands::lease_input::{
            self, ItemInput, LeaseInputLimits, RequestLeaseInput,
        };
        let lease = leasehold_domain::lease::LeaseId(Uuid::now_v7());
        let input = RequestLeaseInput {
            provider_id: PROVIDER.into(),
            items: vec![ItemInput { sku: "gpu.h100.1x".into(), quantity: 1, service_name: None }],
            payload_hash: "ab".repeat(32),
        };
        let operation = leasehold_domain::lease::OperationId(lease.0);
        let limits = LeaseInputLimits::default();
        let command =
            lease_input::request_provision(lease, operation, &input, limits).expect("valid input");
        self.execute(lease, key, command).await;
        lease
    }
}

/// Sends mutation `name` until the server answers it with its result: a refused connection
/// (the server is down) or `UNAVAILABLE` is sent again, with the same operation key.
pub async fn until_answered(
    base: &str,
    token: &str,
    (name, query): (&str, &str),
    input: Value,
) -> Value {
    let http = reqwest::Client::new();
    let body = json!({ "query": query, "variables": input });
    let answered = tokio::time::timeout(START_WAIT, async {
        loop {
            let sent = http.post(format!("{base}/graphql")).bearer_auth(token).json(&body).send();
            let answer = match sent.await {
                Ok(response) => response.json::<Value>().await.ok(),
                Err(_) => None,
            };
            match answer {
                Some(answer) if code(&answer).is_none() => return answer,
                Some(answer) if code(&answer) != Some("UNAVAILABLE") => {
                    panic!("a retryable code or the result, not: {answer}")
                }
                _ => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    });
    let answer = answered.await.unwrap_or_else(|_| panic!("{name} answered within {START_WAIT:?}"));
    data(&answer)[name].clone()
}

/// `dir`'s pinned npm packages, installed with `npm ci` unless they are, so that `cargo test`
/// alone is enough on a fresh clone. An exclusive lock on a file beside them makes test
/// processes running at once install them once and never read a half-written install.
pub fn npm_installed(dir: &std::path::Path) -> std::path::PathBuf {
    static INSTALLED: std::sync::Mutex<Vec<std::path::PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut installed = INSTALLED.lock().expect("not poisoned");
    if !installed.iter().any(|done| done == dir) {
        let lock = std::fs::File::create(dir.join(".install.lock")).expect("a lock file");
        lock.lock().expect("the install lock");
        // npm writes this file last, so its presence means a whole install.
        if !dir.join("node_modules/.package-lock.json").is_file() {
            let status = std::process::Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund", "--prefix"])
                .arg(dir)
                .status()
                .expect(
                    "npm runs (Node.js 20 or later is needed for the browser and client tests)",
                );
            assert!(status.success(), "`npm ci --prefix {}` failed: {status}", dir.display());
        }
        lock.unlock().expect("the install lock is released");
        installed.push(dir.to_path_buf());
    }
    dir.to_path_buf()
}
