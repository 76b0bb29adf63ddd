//! `bench relay`: the log published to Kafka, beside the raw gap-safe read of the same log
//! in the same run (the reader the relay and the projectors use, with nothing done per
//! event).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use leasehold_adapters::relay::{KafkaRelay, RelayConfig, relay_checkpoints};
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_domain::{Cursor, EventStore as _};

use super::{BenchArgs, Measure, rate, report};

/// `bench relay`.
#[derive(Debug, Args)]
pub struct RelayBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// Events in the log relayed.
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// A Kafka broker to publish to; without it, a tansu broker in memory is started on a
    /// free port of 127.0.0.1 (`LEASEHOLD_TANSU`, else
    /// `~/.cache/leasehold-tools/tansu-0.6.0-sqlite/bin/tansu`, which `.ci/run` installs).
    #[arg(long, value_name = "HOST:PORT")]
    kafka_brokers: Option<String>,
    /// Partitions of the topic made for the run.
    #[arg(long, default_value_t = 4)]
    partitions: u32,
}

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &RelayBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure(&url, args).await }).await
}

async fn measure(url: &DatabaseUrl, args: &RelayBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 8, ..Default::default() })?;
    args.common.progress(&format!("filling the log to {} events", args.events));
    super::archive::fill(&store, 0, args.events).await?;
    let raw = raw_gap_safe_read(&store).await?;
    let mut tansu = None;
    let brokers = match &args.kafka_brokers {
        Some(brokers) => brokers.clone(),
        None => {
            let (child, address) = start_tansu().await?;
            tansu = Some(child);
            address
        }
    };
    let topic = format!("bench.{}", std::process::id());
    create_topic(&brokers, &topic, args.partitions)?;
    args.common.progress("relaying");
    let relayed = relay_all(&store, &brokers, &topic).await;
    drop(tansu);
    let name = format!("relay_{}", args.events);
    report(&Measure { name, value: relayed?, unit: "events/s", baseline: raw }, args.common.json);
    Ok(())
}

/// Events/s of the gap-safe reader (`read_log`, pages of 1,000) from the start to the head.
async fn raw_gap_safe_read(store: &PgEventStore) -> anyhow::Result<f64> {
    let (started, mut after, mut read) = (Instant::now(), Cursor::START, 0_u64);
    loop {
        let page = store.read_log(after, 1_000).await?;
        let Some(last) = page.events.last() else { break };
        (after, read) = (last.cursor, read + page.events.len() as u64);
    }
    Ok(rate(read, started.elapsed()))
}

/// Events/s of a relay from an empty checkpoint until its checkpoint is the log's head.
async fn relay_all(store: &PgEventStore, brokers: &str, topic: &str) -> anyhow::Result<f64> {
    let head = store.head().await?;
    let total: i64 =
        store.pool().get().await?.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    let relay = KafkaRelay::new(store.clone(), RelayConfig::new(brokers, topic))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let running = tokio::spawn(async move {
        relay
            .run(async {
                let _ = stopped.await;
            })
            .await
    });
    let name = leasehold_adapters::relay::kafka_relay_name(topic);
    loop {
        let checkpoint = relay_checkpoints(store, Some(&name)).await?;
        if checkpoint.first().is_some_and(|c| c.cursor == head) {
            break;
        }
        anyhow::ensure!(!running.is_finished(), "the relay stopped before the head");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let _ = stop.send(());
    running.await??;
    Ok(rate(u64::try_from(total)?, elapsed))
}

fn tansu_binary() -> PathBuf {
    std::env::var_os("LEASEHOLD_TANSU").map_or_else(
        || {
            let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
            home.join(".cache/leasehold-tools/tansu-0.6.0-sqlite/bin/tansu")
        },
        PathBuf::from,
    )
}

/// A broker process, killed when dropped.
struct Tansu(std::process::Child);

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A tansu broker in memory on a free port.
async fn start_tansu() -> anyhow::Result<(Tansu, String)> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let url = format!("tcp://127.0.0.1:{port}");
    let child = std::process::Command::new(tansu_binary())
        .args(["broker", "--listener-url", &url, "--advertised-listener-url", &url])
        .args(["--storage-engine", "memory://tansu/"])
        .current_dir(std::env::temp_dir())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map(Tansu)
        .map_err(|error| {
            anyhow::anyhow!("starting tansu ({}): {error}", tansu_binary().display())
        })?;
    let address = format!("127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while tokio::net::TcpStream::connect(&address).await.is_err() {
        anyhow::ensure!(Instant::now() < deadline, "tansu did not listen in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((child, address))
}

fn create_topic(brokers: &str, topic: &str, partitions: u32) -> anyhow::Result<()> {
    let broker = format!("tcp://{}", brokers.split(',').next().unwrap_or(brokers));
    let partitions = partitions.to_string();
    let status = std::process::Command::new(tansu_binary())
        .args(["topic", "create", topic, "--partitions", &partitions, "--broker", &broker])
        .stdout(std::process::Stdio::null())
        .status()?;
    anyhow::ensure!(status.success(), "creating topic {topic}: {status}");
    Ok(())
}
