//! `leasehold relay`: the committed log published to Kafka, and where each relay stands.

use std::time::Duration;

use clap::{Args, Subcommand};
use futures_util::FutureExt as _;
use leasehold_adapters::relay::{KafkaRelay, KafkaSettings, RelayConfig, relay_checkpoints};
use leasehold_adapters::{PgEventStore, StoreConfig};

use crate::cli::DatabaseArgs;

/// `relay`: publish (the default) or `relay status`.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RelayArgs {
    #[command(subcommand)]
    command: Option<RelayCommand>,
    #[command(flatten)]
    publish: PublishArgs,
}

#[derive(Debug, Subcommand)]
enum RelayCommand {
    /// Print each relay's checkpoint (the last event acknowledged with every event before
    /// it), events published, events and seconds behind the log, and publishing failures.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// How to publish.
#[derive(Debug, Args)]
pub struct PublishArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// The Kafka brokers to publish to.
    #[arg(long, value_name = "HOST:PORT[,...]", env = "LEASEHOLD_KAFKA_BROKERS")]
    kafka_brokers: Option<String>,
    /// The topic every event is published to (it must exist).
    #[arg(long, default_value = "leasehold.events")]
    topic: String,
    /// Events published and not yet acknowledged, at most: a broker that is slow or down
    /// holds the relay back once this many are waiting.
    #[arg(long, default_value_t = 10_000)]
    in_flight_max: usize,
    /// The largest message to publish, in bytes (librdkafka's message.max.bytes; keep it
    /// at or under the broker's limit). A larger event stops the relay: it is never skipped.
    #[arg(long, default_value_t = 1_000_000)]
    message_max_bytes: usize,
    /// librdkafka settings of your own for the cluster, one `key=value` a line (TLS, SASL,
    /// client.id, ...; `#` comments): a password stays off the command line and out of the
    /// logs. The relay's own settings (acks, idempotence, timeouts) are refused.
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_KAFKA_CONFIG")]
    kafka_config: Option<std::path::PathBuf>,
}

/// The librdkafka settings in `file`, if one is named.
pub fn kafka_settings(file: Option<&std::path::Path>) -> anyhow::Result<KafkaSettings> {
    Ok(file.map(KafkaSettings::read).transpose()?.unwrap_or_default())
}

/// Runs `relay` or `relay status`.
pub async fn run(args: &RelayArgs) -> anyhow::Result<()> {
    match &args.command {
        Some(RelayCommand::Status { database, json }) => status(database, *json).await,
        None => publish(&args.publish).await,
    }
}

async fn publish(args: &PublishArgs) -> anyhow::Result<()> {
    let Some(brokers) = &args.kafka_brokers else {
        anyhow::bail!("--kafka-brokers HOST:PORT[,...] (or LEASEHOLD_KAFKA_BROKERS) is required");
    };
    let url = args.database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let mut config = RelayConfig::new(brokers, &args.topic);
    config.in_flight_max = args.in_flight_max.max(1);
    config.message_max_bytes = args.message_max_bytes;
    config.settings = kafka_settings(args.kafka_config.as_deref())?;
    let relay = KafkaRelay::new(store, config)?;
    eprintln!("relaying the log to topic {} on {brokers}; stop with Ctrl-C or SIGTERM", args.topic);
    relay
        .run(async {
            let _ = crate::serve::stop_signal().await;
        })
        .await?;
    eprintln!("stopped; the checkpoint is written");
    Ok(())
}

/// The relay inside `serve`: run until `stopped`; after a failure (recorded in its checkpoint's
/// row) run again from its checkpoint, waiting 1 s, then twice as long each time up to a
/// minute (short again after a run that lasted longer than that).
pub fn spawn(
    store: PgEventStore,
    config: RelayConfig,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    // Settings librdkafka refuses are refused now, not on each run.
    drop(KafkaRelay::new(store.clone(), config.clone())?);
    Ok(tokio::spawn(async move {
        let stopped = stopped.shared();
        let (first_wait, longest_wait) = (Duration::from_secs(1), Duration::from_secs(60));
        let mut wait = first_wait;
        loop {
            let started = std::time::Instant::now();
            // A producer of its own each run: one that failed may hold undelivered messages.
            let ran = match KafkaRelay::new(store.clone(), config.clone()) {
                Ok(relay) => relay.run(stopped.clone()).await,
                Err(error) => Err(error),
            };
            if ran.is_ok() {
                return;
            }
            // A run that went well for a while failed afresh: the waits start short again.
            if started.elapsed() > longest_wait {
                wait = first_wait;
            }
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stopped.clone() => return,
            }
            wait = (wait * 2).min(longest_wait);
        }
    }))
}

async fn status(database: &DatabaseArgs, json: bool) -> anyhow::Result<()> {
    let store =
        PgEventStore::new(&database.parse()?, StoreConfig { pool_size: 1, ..Default::default() })?;
    let checkpoints = relay_checkpoints(&store, None).await?;
    let read_models = leasehold_adapters::read_models::PgReadModels::of(&store);
    let mut rows = Vec::new();
    for checkpoint in checkpoints {
        let (events_behind, seconds_behind) = read_models.behind_cursor(checkpoint.cursor).await?;
        rows.push(serde_json::json!({
            "relay": checkpoint.relay,
            "cursor": checkpoint.cursor.to_string(),
            "published": checkpoint.published,
            "events_behind": events_behind,
            "seconds_behind": seconds_behind,
            "publish_errors": checkpoint.publish_errors,
            "last_error": checkpoint.last_error,
            "updated_at": checkpoint.updated_at,
        }));
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    if rows.is_empty() {
        println!("no relay has run against this database");
    }
    for row in &rows {
        println!(
            "{:<28} published {:>10}  behind {:>8} events / {:>6.1} s  errors {}{}",
            row["relay"].as_str().unwrap_or_default(),
            row["published"],
            row["events_behind"],
            row["seconds_behind"].as_f64().unwrap_or_default(),
            row["publish_errors"],
            row["last_error"].as_str().map(|e| format!(" (last: {e})")).unwrap_or_default(),
        );
    }
    Ok(())
}
