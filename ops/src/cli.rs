//! Command-line interface: every subcommand, its flags and their `LEASEHOLD_*` variables.

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use leasehold_adapters::DatabaseUrl;

use crate::{bench, database, events, projections, serve, token};

/// The local database `leasehold` uses when none is configured.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/leasehold";

/// Leasehold: the event-sourced control-plane ledger for rented compute.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, about, long_about = None)]
pub struct Cli {
    /// Log format on standard error.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "LEASEHOLD_LOG_FORMAT")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Migrate, then run the projectors and the GraphQL gateway until SIGINT/SIGTERM.
    Serve(Box<serve::ServeArgs>),
    /// Print a token signed with the secret `serve` uses.
    Token(token::TokenArgs),
    /// Apply the schema migrations (creating the database if it is missing).
    Migrate(DatabaseArgs),
    /// Audit the log.
    #[command(subcommand)]
    Events(EventsCommand),
    /// Watch the projections.
    #[command(subcommand)]
    Projections(ProjectionsCommand),
    /// Publish the committed log to Kafka, in commit order, from a checkpoint kept in the
    /// database: key = stream id, value = the event as an export writes it, headers = id,
    /// cursor, type, stream type, tenant, schema version. At least once: a consumer drops
    /// repeats by event id or by (stream id, version). `relay status` shows where each relay
    /// stands.
    Relay(crate::relay::RelayArgs),
    /// Measure throughput against a raw PostgreSQL baseline.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Run a simulated lease backend that speaks the backends' protocol (fred's), in memory:
    /// signed requests, signed callbacks after a delay; or, with --host-agent, a host agent
    /// speaking fuse's. For tests and demos.
    BackendSim(crate::backend_sim::SimArgs),
}

#[derive(Debug, Subcommand)]
enum EventsCommand {
    /// Check the log: recompute every stream's hash chain, compare each stream's last event
    /// with the `streams` table, check every seal against the events it covers, and check
    /// the order of the events after the last seal. Prints each fault (payload altered, event
    /// missing, stream missing, reordered, seal mismatch, ...) and the first bad position;
    /// exits with status 1 on any fault. With --from FILE, checks an export file instead,
    /// with no database: the same checks, plus the file's commit order and its line counts
    /// (a removed or added line), each fault with its line.
    Verify(events::VerifyArgs),
    /// Write the log as NDJSON (one JSON object per line) in commit order: a header, every
    /// event with every stored field (ids, cursor, payload, metadata, hashes), each seal after
    /// the last event it covers, each stream's head (unfiltered exports only) and an end line
    /// with the counts. Read from one snapshot in bounded pages: memory stays flat. With
    /// --tenant, only that tenant's events as its tenant views show them (no ids, metadata,
    /// hashes or cursors; not verifiable). An unfiltered export can be imported.
    Export(events::ExportArgs),
    /// Restore an unfiltered export into an empty database (migrated first, created if
    /// missing): every event, seal and stream head exactly as exported, by COPY, in one
    /// transaction that verifies the file as it reads it and commits nothing unless it
    /// verifies. Refuses a database that already holds a log. The epoch is raised past the
    /// restored events' so that new events sort after them.
    Import(events::ImportArgs),
    /// Replay a complete export through every projection in memory, with no database: each
    /// stream's aggregate folded and every read model written as `serve` writes it, then a
    /// digest (SHA-256) of each read model's rows. With --compare DATABASE_URL, read the same
    /// tables of that database and name every row that differs (missing, extra, or which
    /// columns); exits with status 1 if any does. The file is verified as it is read: one that
    /// does not verify replays nothing.
    Replay(events::ReplayArgs),
    /// Follow the live log: one line per event the filters admit (the export's filters and
    /// lines; with --tenant, the tenant's view), from --from-cursor (else the log's start),
    /// in commit order with no gap and no duplicate, until Ctrl-C or past --to-cursor. Resume
    /// after a stop from the last line's `cursor`. With --from-kafka, read what `leasehold
    /// relay` published instead: repeats dropped, each stream's versions checked.
    Tail(events::TailArgs),
    /// Seal every committed event not sealed yet now, the last seal over fewer events if need
    /// be (`leasehold serve` seals by itself every `--seal-every` events and at shutdown).
    Seal {
        #[command(flatten)]
        database: DatabaseArgs,
        /// Events per seal.
        #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
        every: u64,
    },
    /// Raise the log epoch, after a logical restore (pg_dump/pg_restore) into another
    /// cluster: that cluster's transaction ids may be lower than the restored events', and
    /// without a new epoch new events would sort before them and readers resuming from a
    /// cursor would skip them. Run it once, before any writer starts; it waits for appends in
    /// flight.
    NewEpoch(DatabaseArgs),
}

#[derive(Debug, Subcommand)]
enum ProjectionsCommand {
    /// Each projection's and reconciler's checkpoint and lag (events and seconds behind), each
    /// build of each projection (building with its progress, active, retired, failed with the
    /// error and the event it failed at), and the horizon's lag.
    Status {
        #[command(flatten)]
        database: DatabaseArgs,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Build a new version of a projection's read models into tables of its own, from the
    /// start of the log in bounded batches, while the current ones keep serving (and `serve`
    /// keeps applying to them); when it has caught up, switch readers to it in one
    /// transaction. The previous version is kept (`activate` brings it back, `drop` removes
    /// it). A rebuild stopped midway goes on from where it stopped when run again. Never
    /// issues a command.
    Rebuild(projections::RebuildArgs),
    /// Switch a projection's readers to one of its kept builds (a rollback), retiring the
    /// active one.
    Activate(projections::BuildArgs),
    /// Drop a kept (retired or failed) build of a projection: its tables and its record.
    Drop(projections::BuildArgs),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Appends/s and catch-up reads/s of the event log, each beside a raw baseline.
    Log(bench::log::LogBenchArgs),
    /// Commands/s through the command pipeline and the lease projection's catch-up, each
    /// beside a raw baseline.
    Pipeline(bench::pipeline::PipelineBenchArgs),
    /// Page latency over HTTP at a million leases and at a million workloads of five kinds,
    /// and delivery latency with 1,000 subscriptions (gaps and duplicates counted), each
    /// beside a raw baseline.
    Gateway(bench::gateway::GatewayBenchArgs),
    /// Leases from request to ready per second through the dispatcher, an in-process
    /// backend-sim and the gateway's callbacks at 16 clients, beside the pipeline's
    /// commands/s; and the p99 from request to ready.
    Dispatch(bench::dispatch::DispatchBenchArgs),
    /// VM creates per second through placement over 100 hosts at 16 clients, spread and
    /// pack, with the retries per create, beside the lease request's commands/s.
    Fleet(bench::fleet::FleetBenchArgs),
    /// Snapshot creates per second at 16 clients, for one tenant (one quota stream every
    /// create reserves on) and for 16 tenants, beside the lease request's commands/s.
    Snapshots(bench::snapshots::SnapshotBenchArgs),
    /// Node heartbeats accepted per second at 1,000 enrolled nodes and 16 clients, each a
    /// fenced command, recorded every 30 s per node and (the alternative) every one, beside
    /// the lease request's commands/s.
    Nodes(bench::nodes::NodeBenchArgs),
    /// Events/s of `events export`, `events verify --from`, `events replay` and `events
    /// import` at 100,000 and
    /// 1,000,000 events of mixed kinds, beside a raw binary COPY of the same log out of
    /// PostgreSQL (and, for the import, into a table of the log's shape); and each one's peak
    /// memory (RSS) at each size.
    Archive(bench::archive::ArchiveBenchArgs),
    /// The log relayed to Kafka (a tansu broker in memory unless --kafka-brokers names one),
    /// from an empty checkpoint to the log's head, beside the raw gap-safe read of the same
    /// log (`read_log` pages, nothing done per event).
    Relay(bench::relay::RelayBenchArgs),
}

/// Where the database is.
#[derive(Debug, Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL, e.g. postgres://user@127.0.0.1:5432/leasehold.
    #[arg(long, env = "LEASEHOLD_DATABASE_URL", default_value = DEFAULT_DATABASE_URL, hide_env_values = true)]
    pub database_url: String,
}

impl DatabaseArgs {
    /// The parsed URL; parse errors never repeat the URL (it may hold a password).
    pub fn parse(&self) -> anyhow::Result<DatabaseUrl> {
        DatabaseUrl::parse(&self.database_url).context("--database-url")
    }
}

/// Logs go to standard error so that `--json` output on standard out stays parseable.
pub fn init_logging(format: &LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASEHOLD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the chosen subcommand.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve::run(&args).await,
        Command::Token(args) => token::run(&args),
        Command::BackendSim(args) => crate::backend_sim::run(&args).await,
        Command::Relay(args) => crate::relay::run(&args).await,
        Command::Migrate(args) => migrate(&args.parse()?).await,
        Command::Events(EventsCommand::Verify(args)) => events::verify(&args).await,
        Command::Events(EventsCommand::Export(args)) => events::export(&args).await,
        Command::Events(EventsCommand::Import(args)) => events::import(&args).await,
        Command::Events(EventsCommand::Tail(args)) => events::tail(&args).await,
        Command::Events(EventsCommand::Replay(args)) => events::replay(&args).await,
        Command::Events(EventsCommand::NewEpoch(args)) => events::new_epoch(&args.parse()?).await,
        Command::Events(EventsCommand::Seal { database, every }) => {
            events::seal(&database.parse()?, every).await
        }
        Command::Projections(ProjectionsCommand::Status { database, json }) => {
            projections::status(&database, json).await
        }
        Command::Projections(ProjectionsCommand::Rebuild(args)) => {
            projections::rebuild(&args).await
        }
        Command::Projections(ProjectionsCommand::Activate(args)) => {
            projections::activate(&args).await
        }
        Command::Projections(ProjectionsCommand::Drop(args)) => projections::drop(&args).await,
        Command::Bench(BenchCommand::Log(args)) => bench::log::run(&args).await,
        Command::Bench(BenchCommand::Pipeline(args)) => bench::pipeline::run(&args).await,
        Command::Bench(BenchCommand::Gateway(args)) => bench::gateway::run(&args).await,
        Command::Bench(BenchCommand::Dispatch(args)) => bench::dispatch::run(&args).await,
        Command::Bench(BenchCommand::Fleet(args)) => bench::fleet::run(&args).await,
        Command::Bench(BenchCommand::Snapshots(args)) => bench::snapshots::run(&args).await,
        Command::Bench(BenchCommand::Nodes(args)) => bench::nodes::run(&args).await,
        Command::Bench(BenchCommand::Archive(args)) => bench::archive::run(&args).await,
        Command::Bench(BenchCommand::Relay(args)) => bench::relay::run(&args).await,
    }
}

async fn migrate(url: &DatabaseUrl) -> anyhow::Result<()> {
    database::ensure_exists(url).await?;
    let report = leasehold_adapters::migrate(url).await?;
    if report.applied.is_empty() {
        println!("{} at {} is up to date", url.database(), url.endpoint());
    } else {
        println!(
            "applied to {} at {}: {}",
            url.database(),
            url.endpoint(),
            report.applied.join(", ")
        );
    }
    Ok(())
}
