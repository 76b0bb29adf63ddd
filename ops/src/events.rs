//! `leasehold events ...`: auditing the log, and taking it away and back.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use chrono::{DateTime, Utc};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use leasehold_adapters::archive::{
    EventLine, ExportFilter, HeadsAhead, check::check_file, import::import as import_file,
};
use leasehold_adapters::relay::{ConsumeError, RelayedLog};
use leasehold_adapters::replay::{Comparison, ReplayReport, compare, replay_file};
use leasehold_adapters::verify::VerifyReport;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_domain::Cursor;

use crate::cli::DatabaseArgs;

/// `events verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Check this export file (`-`: standard input) instead of the database; no database is
    /// used.
    #[arg(long, value_name = "FILE")]
    from: Option<PathBuf>,
}

/// Which events, for `events export` (and `events tail`).
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Only this tenant's events, as its tenant views show them.
    #[arg(long)]
    tenant: Option<String>,
    /// Only streams of this type (`lease`, `vm`, ...); repeat for more.
    #[arg(long = "kind", value_name = "STREAM_TYPE")]
    kinds: Vec<String>,
    /// Only this stream (`lease-<uuid>`); repeat for more.
    #[arg(long = "stream", value_name = "STREAM_ID")]
    streams: Vec<String>,
    /// Only events after this cursor (40 hex digits, as an export's `cursor` field).
    #[arg(long, value_name = "CURSOR", value_parser = parse_cursor)]
    from_cursor: Option<Cursor>,
    /// Only events up to and including this cursor.
    #[arg(long, value_name = "CURSOR", value_parser = parse_cursor)]
    to_cursor: Option<Cursor>,
    /// Only events recorded at or after this time (RFC 3339, e.g. 2026-12-05T00:00:00Z).
    #[arg(long, value_name = "TIME")]
    from_time: Option<DateTime<Utc>>,
    /// Only events recorded before this time (RFC 3339).
    #[arg(long, value_name = "TIME")]
    to_time: Option<DateTime<Utc>>,
}

impl FilterArgs {
    fn filter(&self) -> ExportFilter {
        ExportFilter {
            tenant: self.tenant.clone(),
            stream_types: self.kinds.clone(),
            stream_ids: self.streams.clone(),
            from_cursor: self.from_cursor,
            to_cursor: self.to_cursor,
            from_time: self.from_time,
            to_time: self.to_time,
        }
    }
}

fn parse_cursor(text: &str) -> Result<Cursor, String> {
    text.parse().map_err(|_| "a cursor is 40 lowercase hex digits".to_owned())
}

/// `events export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// Write to this file (`-`: standard output).
    #[arg(long, short, value_name = "FILE", default_value = "-")]
    output: PathBuf,
}

/// `events tail`.
#[derive(Debug, Args)]
pub struct TailArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    #[command(flatten)]
    filter: FilterArgs,
    /// Read what `leasehold relay` published to Kafka on these brokers instead of the
    /// database: each event once (a repeat of the relay's at-least-once delivery dropped),
    /// each stream's versions checked to follow one another (a gap is an error).
    #[arg(long, value_name = "HOST:PORT[,...]")]
    from_kafka: Option<String>,
    /// The topic --from-kafka reads.
    #[arg(long, default_value = "leasehold.events")]
    topic: String,
    /// The consumer group --from-kafka reads as (default: one of its own for each run, so
    /// that tails running at once each read every partition). It commits no offsets: each
    /// run reads the topic from its start (narrow it with --from-cursor).
    #[arg(long)]
    group: Option<String>,
    /// librdkafka settings of your own for --from-kafka's cluster (TLS, SASL, ...), one
    /// `key=value` a line, as `leasehold relay --kafka-config` takes them.
    #[arg(long, value_name = "FILE", env = "LEASEHOLD_KAFKA_CONFIG")]
    kafka_config: Option<std::path::PathBuf>,
}

/// `events replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The complete export to replay (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
    /// Compare the replayed read models with this database's (a PostgreSQL URL) and name
    /// every row that differs; exits with status 1 if any does.
    #[arg(
        long,
        value_name = "DATABASE_URL",
        env = "LEASEHOLD_COMPARE_DATABASE_URL",
        hide_env_values = true
    )]
    compare: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// `events import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// The export file to restore (`-`: standard input).
    #[arg(long, value_name = "FILE")]
    from: PathBuf,
}

fn is_stdio(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// A bar for `len` units of `unit`.
fn bar(len: u64, what: &str) -> ProgressBar {
    let template = format!("{what} {{bar:40}} {{pos}}/{{len}} {{msg}}, {{per_sec}}, eta {{eta}}");
    ProgressBar::new(len).with_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// A bar over the bytes of a file (none for standard input, whose length is unknown).
fn bytes_bar(path: &Path, what: &str) -> ProgressBar {
    let len = if is_stdio(path) { 0 } else { std::fs::metadata(path).map_or(0, |m| m.len()) };
    if len == 0 {
        return ProgressBar::hidden();
    }
    let template =
        format!("{what} {{bar:40}} {{bytes}}/{{total_bytes}}, {{bytes_per_sec}}, eta {{eta}}");
    ProgressBar::new(len).with_style(
        ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

fn open(path: &Path) -> anyhow::Result<Box<dyn BufRead>> {
    if is_stdio(path) {
        return Ok(Box::new(BufReader::with_capacity(1 << 20, std::io::stdin().lock())));
    }
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
}

/// The file at `path`, and a second reader of it to read its stream heads ahead of its events,
/// so that a check holds only the streams open at one point of the log. Only a regular file
/// can be read twice (not stdin, a pipe or a FIFO), and only if both handles are one file.
fn open_twice(path: &Path) -> anyhow::Result<(Box<dyn BufRead>, Option<HeadsAhead<'static>>)> {
    use std::os::unix::fs::MetadataExt as _;
    if is_stdio(path) {
        return Ok((open(path)?, None));
    }
    let opening = || File::open(path).with_context(|| format!("opening {}", path.display()));
    let (first, second) = (opening()?, opening()?);
    let (one, other) = (first.metadata()?, second.metadata()?);
    let same = one.is_file() && one.dev() == other.dev() && one.ino() == other.ino();
    let heads = same.then(|| HeadsAhead::new(BufReader::with_capacity(1 << 20, second)));
    Ok((Box::new(BufReader::with_capacity(1 << 20, first)), heads))
}

/// Writes the log's events the filters admit.
pub async fn export(args: &ExportArgs) -> anyhow::Result<()> {
    let url = args.database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 1, ..Default::default() })?;
    let mut out: Box<dyn Write> = if is_stdio(&args.output) {
        Box::new(BufWriter::with_capacity(1 << 20, std::io::stdout().lock()))
    } else {
        let file = File::create(&args.output)
            .with_context(|| format!("creating {}", args.output.display()))?;
        Box::new(BufWriter::with_capacity(1 << 20, file))
    };
    let bar = bar(0, "exporting");
    let summary = store
        .export(&args.filter.filter(), &mut out, |written, total| {
            bar.set_length(total);
            bar.set_position(written);
        })
        .await
        .context("exporting the log")?;
    bar.finish_and_clear();
    let last = summary.last.map_or_else(|| "none".to_owned(), |cursor| cursor.to_string());
    eprintln!(
        "{} events, {} seals and {} stream heads written; last cursor {last}",
        summary.events, summary.seals, summary.streams
    );
    Ok(())
}

/// Follows the log from `--from-cursor` (else its start), one line per event the filters
/// admit, as the export writes them, until Ctrl-C or past `--to-cursor`.
pub async fn tail(args: &TailArgs) -> anyhow::Result<()> {
    if let Some(brokers) = &args.from_kafka {
        return tail_kafka(brokers, args).await;
    }
    let url = args.database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let filter = args.filter.filter();
    let mut after = filter.from_cursor.unwrap_or(Cursor::START);
    let mut out = std::io::stdout().lock();
    loop {
        let page = tokio::select! {
            page = store.wait_for_log(after, TAIL_PAGE_EVENTS, TAIL_WAIT) => page?,
            _ = tokio::signal::ctrl_c() => return stopped_at(after),
        };
        for event in &page.events {
            if filter.to_cursor.is_some_and(|to| event.cursor > to) {
                return stopped_at(after);
            }
            if filter.admits(event) {
                filter.write_event(&mut out, EventLine::of(event))?;
            }
            after = event.cursor;
        }
        out.flush()?;
        after = after.max(page.next);
        if filter.to_cursor.is_some_and(|to| after >= to) {
            return stopped_at(after);
        }
    }
}

/// `events tail --from-kafka`: the relayed topic, through the reference consumer.
async fn tail_kafka(brokers: &str, args: &TailArgs) -> anyhow::Result<()> {
    let filter = args.filter.filter();
    // Partitions interleave on the topic: no one event marks where the log passes a cursor.
    anyhow::ensure!(
        filter.to_cursor.is_none(),
        "--to-cursor does not go with --from-kafka: the topic's partitions interleave, so \
         reading past the cursor in one says nothing of the others"
    );
    let settings = crate::relay::kafka_settings(args.kafka_config.as_deref())?;
    let group = args
        .group
        .clone()
        .unwrap_or_else(|| format!("leasehold-tail-{}", uuid::Uuid::now_v7().simple()));
    let mut log = RelayedLog::subscribe_with(brokers, &args.topic, &group, false, &settings)?;
    let mut out = std::io::stdout().lock();
    let mut number = 0;
    loop {
        let line = tokio::select! {
            line = log.next(TAIL_WAIT) => line,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("stopped ({} repeats dropped)", log.repeats());
                return Ok(());
            }
        };
        let line = match line {
            Ok(line) => line,
            Err(ConsumeError::Quiet(_)) => continue,
            Err(error) => return Err(error.into()),
        };
        number += 1;
        let event = line.recorded(number)?;
        if filter.admits(&event) {
            filter.write_event(&mut out, line)?;
            out.flush()?;
        }
    }
}

/// Says on standard error where a stopped tail stands: a tenant's lines carry no cursor, so
/// this is where to resume it from (`--from-cursor`).
#[allow(clippy::unnecessary_wraps)]
fn stopped_at(after: Cursor) -> anyhow::Result<()> {
    eprintln!("stopped after cursor {after} (resume with --from-cursor {after})");
    Ok(())
}

/// Events read per page by `events tail`.
const TAIL_PAGE_EVENTS: usize = 1_000;

/// How long `events tail` waits for an event before it asks again.
const TAIL_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Restores an export into an empty database.
pub async fn import(args: &ImportArgs) -> anyhow::Result<()> {
    let url = args.database.parse()?;
    crate::database::ensure_exists(&url).await?;
    leasehold_adapters::migrate(&url).await?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 1, ..Default::default() })?;
    let bar = bytes_bar(&args.from, "importing");
    let (reader, heads) = open_twice(&args.from)?;
    let imported = import_file(&store, reader, heads, |bytes| bar.set_position(bytes))
        .await
        .context("importing")?;
    bar.finish_and_clear();
    let report = &imported.checked.report;
    println!(
        "{} events in {} streams and {} seals imported and verified; new events are appended \
         in epoch {}",
        report.events_checked, report.streams_checked, report.seals_checked, imported.epoch
    );
    Ok(())
}

/// Replays an export through every projection in memory, prints each read model's digest
/// and, with `--compare`, every row the live read models hold otherwise.
pub async fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let bar = bytes_bar(&args.from, "replaying");
    let (reader, heads) = open_twice(&args.from)?;
    let replayed =
        replay_file(reader, heads, |bytes| bar.set_position(bytes)).context("replaying")?;
    bar.finish_and_clear();
    let compared = match &args.compare {
        Some(url) => {
            let url = DatabaseUrl::parse(url).context("--compare")?;
            let store =
                PgEventStore::new(&url, StoreConfig { pool_size: 1, ..Default::default() })?;
            Some(compare(&store, &replayed.tables, replayed.last).await.context("comparing")?)
        }
        None => None,
    };
    if args.json {
        print_replay_json(&replayed, compared.as_ref())?;
    } else {
        print_replay(&replayed, compared.as_ref());
    }
    match compared {
        Some(compared) if !compared.differences.is_empty() => {
            let differ = compared.differences.len();
            bail!("{differ} rows of the live read models differ from the replay")
        }
        _ => Ok(()),
    }
}

fn print_replay(replayed: &ReplayReport, compared: Option<&Comparison>) {
    println!("{} events replayed through every projection", replayed.events);
    let width = replayed.digests.iter().map(|d| d.table.len()).max().unwrap_or(5);
    println!("{:width$}  {:>9}  digest", "table", "rows");
    for digest in &replayed.digests {
        let live = compared.and_then(|c| c.live.iter().find(|l| l.table == digest.table));
        let same = match live {
            Some(live) if live.digest == digest.digest => "  (live: equal)",
            Some(_) => "  (live: DIFFERS)",
            None => "",
        };
        println!("{:width$}  {:>9}  {}{same}", digest.table, digest.rows, digest.digest);
    }
    let Some(Comparison { differences, behind, ahead, .. }) = compared else { return };
    for name in behind {
        println!(
            "projection {name} has not reached the file's last event: its rows may differ \
             for that alone"
        );
    }
    for name in ahead {
        println!(
            "projection {name} has applied events past the file's last one: its rows may \
             differ for that alone"
        );
    }
    for difference in differences {
        println!("DIFFERS {difference}");
    }
    println!("compared with the live read models: {} rows differ", differences.len());
}

fn print_replay_json(replayed: &ReplayReport, compared: Option<&Comparison>) -> anyhow::Result<()> {
    let tables: Vec<serde_json::Value> = replayed
        .digests
        .iter()
        .map(|d| serde_json::json!({ "table": d.table, "rows": d.rows, "digest": d.digest }))
        .collect();
    let mut out = serde_json::json!({
        "events": replayed.events,
        "last_cursor": replayed.last.map(|cursor| cursor.to_string()),
        "tables": tables,
    });
    if let Some(compared) = compared {
        let listed: Vec<String> = compared.differences.iter().map(ToString::to_string).collect();
        let live: Vec<serde_json::Value> = compared
            .live
            .iter()
            .map(|d| serde_json::json!({ "table": d.table, "rows": d.rows, "digest": d.digest }))
            .collect();
        out["live"] = serde_json::json!(live);
        out["differences"] = serde_json::json!(listed);
        out["behind"] = serde_json::json!(compared.behind);
        out["ahead"] = serde_json::json!(compared.ahead);
    }
    println!("{}", serde_json::to_string_pretty(&out)?);
    Ok(())
}

/// Checks the log, or an export file with `--from`.
pub async fn verify(args: &VerifyArgs) -> anyhow::Result<()> {
    let report = match &args.from {
        Some(path) => {
            let bar = bytes_bar(path, "verifying");
            let (reader, heads) = open_twice(path)?;
            let checked = check_file(reader, heads, |bytes| bar.set_position(bytes))?;
            bar.finish_and_clear();
            if !checked.header.complete {
                println!(
                    "a filtered export: chains are checked from each stream's first event in \
                     the file, seals only where the file holds their whole range, stream heads \
                     not at all"
                );
            }
            checked.report
        }
        None => verify_database(&args.database.parse()?).await?,
    };
    print_report(&report)
}

/// Checks the chains, the stream heads, the seals and the order; fails on any fault.
async fn verify_database(url: &DatabaseUrl) -> anyhow::Result<VerifyReport> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let total = count_events(&store).await?;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("verifying {bar:40} {pos}/{len} events, {per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = store.verify_log(|checked| bar.set_position(checked)).await?;
    bar.finish_and_clear();
    Ok(report)
}

fn print_report(report: &VerifyReport) -> anyhow::Result<()> {
    for found in &report.breaks {
        println!("BROKEN {found}");
    }
    println!(
        "{} events in {} streams checked, {} seals checked, {} events after the last seal, {} \
         breaks{}",
        report.events_checked,
        report.streams_checked,
        report.seals_checked,
        report.unsealed_events,
        report.breaks.len(),
        if report.breaks_truncated { " (more not listed)" } else { "" }
    );
    if let Some(first) = report.first_break() {
        println!("first bad position: {}", first);
    }
    if !report.breaks.is_empty() {
        bail!("the log does not verify");
    }
    Ok(())
}

/// Seals what is not sealed yet and prints how many seals were written.
pub async fn seal(url: &DatabaseUrl, every: u64) -> anyhow::Result<()> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 1, ..Default::default() })?;
    let every = usize::try_from(every).unwrap_or(1_000);
    let seals = store.seal_all(every, true).await.context("sealing the log")?;
    println!("{seals} seals written");
    Ok(())
}

/// How many events the log holds, for the progress bar.
async fn count_events(store: &PgEventStore) -> anyhow::Result<u64> {
    let client = store.pool().get().await.context("connecting to the database")?;
    let row = client.query_one("SELECT count(*) FROM events", &[]).await?;
    Ok(u64::try_from(row.get::<_, i64>(0)).unwrap_or_default())
}

/// Raises the log epoch (after a logical restore) and prints the new one.
pub async fn new_epoch(url: &DatabaseUrl) -> anyhow::Result<()> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 1, ..Default::default() })?;
    let epoch = store.raise_epoch().await.context("raising the log epoch")?;
    println!("the log is now in epoch {epoch}: new events sort after every earlier one");
    Ok(())
}
