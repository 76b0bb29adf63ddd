//! A Kafka-protocol broker for one test: `tansu` on a free port of 127.0.0.1, in memory or,
//! when a test stops and restarts it, in an SQLite file of its own.
//!
//! The binary is installed once per machine (`cargo install tansu`, a few minutes) under
//! `~/.cache/leasehold-tools/tansu-0.6.0-sqlite`, by `.ci/run` or, failing that, by the first
//! test that needs it (under a file lock, so tests running at once install it once).
//! `LEASEHOLD_TANSU` names another binary.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

/// The tansu release the tests run against.
const TANSU_VERSION: &str = "0.6.0";

/// Its features: `libsql` for the file storage a restarted broker keeps its topics in.
const TANSU_FEATURES: &str = "dynostore,libsql";

/// Where it is installed, under `~/.cache/leasehold-tools`: named for its version and
/// features, so a machine with an older build installs this one beside it. `.ci/run` installs
/// into the same folder.
const TANSU_ROOT: &str = "tansu-0.6.0-sqlite";

/// A broker that lives as long as the value.
#[derive(Debug)]
pub struct Broker {
    child: Child,
    port: u16,
    /// The folder of its SQLite file, for a broker that outlives a restart.
    durable: Option<Folder>,
    /// Whether every client must authenticate (SASL SCRAM).
    authenticating: bool,
    /// `127.0.0.1:PORT`, as clients' `bootstrap.servers`.
    pub address: String,
}

impl Broker {
    /// Starts a broker with memory storage on a free port, and waits until it takes
    /// connections.
    pub async fn start() -> Broker {
        Broker::start_with(None).await
    }

    /// Starts a broker that keeps its topics, records and producer state in an SQLite file
    /// of its own, so that it can be stopped ([`Broker::stop`]) and started again
    /// ([`Broker::restart`]) with nothing lost, as a Kafka broker with disks is.
    pub async fn start_durable() -> Broker {
        Broker::start_with(Some(Folder::new())).await
    }

    async fn start_with(durable: Option<Folder>) -> Broker {
        let port = free_port();
        let child = spawn(port, durable.as_ref(), false);
        let address = format!("127.0.0.1:{port}");
        let broker = Broker { child, port, durable, authenticating: false, address };
        broker.wait_until_listening().await;
        broker
    }

    /// Kills the broker (SIGKILL) and waits until it is gone: connections are refused from
    /// then on.
    pub async fn stop(&mut self) {
        self.child.start_kill().expect("tansu is killed");
        self.child.wait().await.expect("tansu ends");
    }

    /// Starts a stopped durable broker again on the same port and storage, and waits until it
    /// takes connections.
    pub async fn restart(&mut self) {
        assert!(self.durable.is_some(), "only a durable broker keeps its topics over a restart");
        self.child = spawn(self.port, self.durable.as_ref(), self.authenticating);
        self.wait_until_listening().await;
    }

    /// Adds SASL user `name` (SCRAM-SHA-512) with `password`.
    pub async fn create_user(&self, name: &str, password: &str) {
        let broker = format!("tcp://127.0.0.1:{}", self.port);
        let status = Command::new(tansu())
            .args(["user", "create", name, password, "--broker", &broker])
            .stdout(Stdio::null())
            .status()
            .await
            .expect("tansu user create runs");
        assert!(status.success(), "tansu user create {name}: {status}");
    }

    /// Restarts a durable broker so that every client must authenticate with SASL SCRAM as
    /// one of its users (made before, with [`Broker::create_user`]: an authenticating
    /// broker takes no new users or topics from tansu's own tools).
    pub async fn require_authentication(&mut self) {
        self.stop().await;
        self.authenticating = true;
        self.restart().await;
    }

    /// Creates `topic` with `partitions` partitions.
    pub async fn create_topic(&self, topic: &str, partitions: u32) {
        let broker = format!("tcp://127.0.0.1:{}", self.port);
        let partitions = partitions.to_string();
        let status = Command::new(tansu())
            .args(["topic", "create", topic, "--partitions", &partitions, "--broker", &broker])
            .stdout(Stdio::null())
            .status()
            .await
            .expect("tansu topic create runs");
        assert!(status.success(), "tansu topic create {topic}: {status}");
    }

    /// Stops the broker answering (SIGSTOP): connections stay open and nothing is answered,
    /// as with a broker that hangs or a network that drops everything. Its memory is kept.
    pub fn pause(&self) {
        signal(&self.child, "-STOP");
    }

    /// Lets a paused broker answer again (SIGCONT).
    pub fn resume(&self) {
        signal(&self.child, "-CONT");
    }

    async fn wait_until_listening(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(&self.address).await.is_err() {
            assert!(tokio::time::Instant::now() < deadline, "tansu did not listen in 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.resume();
        let _ = self.child.start_kill();
    }
}

fn signal(child: &Child, which: &str) {
    if let Some(pid) = child.id() {
        let _ = std::process::Command::new("kill").args([which, &pid.to_string()]).status();
    }
}

/// A folder of the test's own, removed with the value.
#[derive(Debug)]
struct Folder(PathBuf);

impl Folder {
    fn new() -> Folder {
        let path = std::env::temp_dir().join(format!("leasehold-tansu-{}", uuid::Uuid::now_v7()));
        std::fs::create_dir(&path).expect("the broker's folder");
        Folder(path)
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn spawn(port: u16, durable: Option<&Folder>, authenticating: bool) -> Child {
    let url = format!("tcp://127.0.0.1:{port}");
    // A durable broker's file is named relative to its working directory. Either way it
    // reads a `.env` there: give it a folder with none in it.
    let (storage, folder) = match durable {
        Some(folder) => ("sqlite://tansu.db", folder.0.clone()),
        None => ("memory://tansu/", std::env::temp_dir()),
    };
    Command::new(tansu())
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
        .args(["--storage-engine", storage, "--cluster-id", "leasehold-test"])
        .args(authenticating.then_some("--authentication"))
        .current_dir(folder)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("tansu starts")
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("its address").port()
}

/// The tansu binary, installed first if it is missing.
fn tansu() -> PathBuf {
    if let Ok(path) = std::env::var("LEASEHOLD_TANSU") {
        return PathBuf::from(path);
    }
    let root = tools_root();
    let binary = root.join("bin").join("tansu");
    if !binary.exists() {
        install(&root);
    }
    binary
}

fn tools_root() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache").join("leasehold-tools").join(TANSU_ROOT)
}

/// `cargo install tansu` into `root`, once: under a lock, rechecked once the lock is held.
fn install(root: &std::path::Path) {
    std::fs::create_dir_all(root).expect("the tools' folder");
    let lock = std::fs::File::create(root.join("install.lock")).expect("the install lock");
    lock.lock().expect("the install lock taken");
    if root.join("bin").join("tansu").exists() {
        return;
    }
    let root_arg = root.to_str().expect("a UTF-8 path");
    let status = std::process::Command::new(std::env::var("CARGO").unwrap_or("cargo".into()))
        .args(["install", "tansu", "--version", TANSU_VERSION, "--locked"])
        .args(["--features", TANSU_FEATURES, "--root", root_arg, "--target-dir"])
        .arg(root.join("build"))
        .status()
        .expect("cargo install runs");
    assert!(status.success(), "cargo install tansu {TANSU_VERSION}: {status}");
    let _ = std::fs::remove_dir_all(root.join("build"));
}

/// Ten `LeaseDispatchFailed` events appended to stream `lease-<stream>` (tenant `acme`), the
/// `batch`th ten of that stream in round `round`: what the relay's tests publish.
pub fn ten_lease_events(
    stream: usize,
    batch: usize,
    round: usize,
) -> leasehold_domain::StreamAppend {
    use leasehold_domain::{
        EventId, EventType, ExpectedVersion, Metadata, NewEvent, StreamAppend, StreamId,
        StreamType, TenantId,
    };
    let events = (0..10)
        .map(|n| NewEvent {
            event_id: EventId::from_uuid(uuid::Uuid::now_v7()),
            event_type: EventType::parse("LeaseDispatchFailed").expect("a valid event type"),
            schema_version: 1,
            payload: serde_json::json!({ "attempt": batch * 10 + n, "round": round }),
            metadata: Metadata::default(),
        })
        .collect();
    StreamAppend {
        stream_id: StreamId::parse(format!("lease-{stream}")).expect("a valid stream id"),
        stream_type: StreamType::parse("lease").expect("a valid stream type"),
        tenant_id: TenantId::parse("acme").expect("a valid tenant"),
        expected: ExpectedVersion::Any,
        events,
    }
}
