//! `leasehold bench archive`: export, verify from the file, replay (every projection in
//! memory), import and the lease projection's rebuild, at 100,000 and at 1,000,000 events of mixed kinds (half of them whole lease
//! lifecycles, half VM, rental and run events the projections skip: their streams' ids are not
//! their kinds'), each beside the
//! raw read of the same log (a binary `COPY ... TO STDOUT` in commit order) and the import
//! beside a raw binary `COPY` of the same rows into a table of the log's shape; with each
//! one's peak memory (RSS) at each size.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use futures_util::{SinkExt as _, StreamExt as _};
use leasehold_adapters::archive::check::check_file;
use leasehold_adapters::archive::import::import;
use leasehold_adapters::archive::{ExportFilter, HeadsAhead};
use leasehold_adapters::replay::replay_file;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_domain::{EventStore as _, StreamAppend, StreamType};

use super::workload::{EVENTS_PER_STREAM, new_event, payload, stream_append};
use super::{BenchArgs, Measure, rate, report};
use crate::database::ScratchDatabase;

/// Options of `leasehold bench archive`.
#[derive(Debug, Clone, Args)]
pub struct ArchiveBenchArgs {
    #[command(flatten)]
    common: BenchArgs,
    /// The log sizes measured at, in events, ascending (the log grows from one to the next).
    #[arg(long, value_delimiter = ',', default_values_t = [100_000, 1_000_000])]
    events: Vec<u64>,
}

/// The kinds of the log's streams that are not leases, in turn.
const KINDS: [&str; 3] = ["vm", "rental", "run"];

/// Streams per append while filling (each of [`EVENTS_PER_STREAM`] events).
const FILL_STREAMS: u64 = 10;

/// Concurrent appenders while filling.
const FILL_WRITERS: u64 = 4;

/// The columns copied, in the log's commit order.
const COLUMNS: &str = "position, log_epoch, tx_id, event_id, stream_id, version, stream_type, \
     tenant_id, event_type, schema_version, payload, metadata, recorded_at, prev_hash, hash";

/// Runs the benchmark in a scratch database beside `--database-url`, dropped afterwards.
pub async fn run(args: &ArchiveBenchArgs) -> anyhow::Result<()> {
    args.common.in_scratch(|url| async move { measure_all(&url, args).await }).await
}

async fn measure_all(url: &DatabaseUrl, args: &ArchiveBenchArgs) -> anyhow::Result<()> {
    leasehold_adapters::migrate(url).await?;
    let store = PgEventStore::new(url, StoreConfig { pool_size: 8, ..Default::default() })?;
    let file = std::env::temp_dir().join(format!("leasehold-bench-{}.ndjson", std::process::id()));
    let common = &args.common;
    let mut filled = 0;
    for &size in &args.events {
        common.progress(&format!("filling the log to {size} events"));
        filled = fill(&store, filled, size).await?;
        store.seal_all(1_000, true).await?;
        url.connect().await?.batch_execute("VACUUM ANALYZE events").await?;
        let raw = raw_read(url).await?;
        common.progress(&format!("export at {size} events"));
        let (exported, export_rss) = peak(export(&store, &file)).await?;
        let (verified, verify_rss) = peak(async { verify(&file) }).await?;
        common.progress(&format!("replay at {size} events"));
        let (replayed, replay_rss) = peak(async { replay(&file) }).await?;
        common.progress(&format!("import at {size} events"));
        let (raw_copy, (imported, import_rss)) = import_beside_copy(url, &file).await?;
        common.progress(&format!("the lease projection's rebuild at {size} events"));
        // The active tables first caught up, as `serve` keeps them: the build then goes to
        // the end of the log.
        super::pipeline::catch_up(&store).await?;
        let (rebuilt, rebuild_rss) = peak(rebuild(&store)).await?;
        for (name, value, baseline) in [
            ("export", exported, raw),
            ("verify_file", verified, raw),
            ("replay", replayed, raw),
            ("import", imported, raw_copy),
            ("rebuild_lease_views", rebuilt, raw),
        ] {
            let name = format!("{name}_{size}");
            report(&Measure { name, value, unit: "events/s", baseline }, common.json);
        }
        for (name, rss) in [
            ("export", export_rss),
            ("verify_file", verify_rss),
            ("replay", replay_rss),
            ("import", import_rss),
            ("rebuild_lease_views", rebuild_rss),
        ] {
            // Beside nothing: the figure to compare is the same measure at the other size.
            let name = format!("{name}_{size}_peak_rss");
            report(&Measure { name, value: rss, unit: "MiB", baseline: 0.0 }, common.json);
        }
    }
    std::fs::remove_file(&file).ok();
    Ok(())
}

/// Events/s of a rebuild of the lease projection from the start of the log, switched in.
async fn rebuild(store: &PgEventStore) -> anyhow::Result<f64> {
    let client = store.pool().get().await?;
    let total: i64 = client.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    drop(client);
    let started = Instant::now();
    let projections = leasehold_adapters::PgProjectionStore::new(store.clone());
    projections.rebuild(&leasehold_projections::lease::LeaseProjection, 1_000, |_| {}).await?;
    Ok(rate(u64::try_from(total)?, started.elapsed()))
}

/// Appends until the log holds `size` events (it holds `from`): half whole lease lifecycles,
/// half streams of the other kinds in turn.
pub(super) async fn fill(store: &PgEventStore, from: u64, size: u64) -> anyhow::Result<u64> {
    let wanted = size.saturating_sub(from);
    super::pipeline::fill_leases(store, wanted / 2).await?;
    let per_append = FILL_STREAMS * EVENTS_PER_STREAM;
    let appends = (wanted - wanted / 2).div_ceil(per_append);
    let mut writers = Vec::new();
    for writer in 0..FILL_WRITERS {
        let store = store.clone();
        writers.push(tokio::spawn(async move {
            let mut batch = writer;
            while batch < appends {
                store.append(fill_append(from, batch)).await?;
                batch += FILL_WRITERS;
            }
            anyhow::Ok(())
        }));
    }
    for writer in writers {
        writer.await??;
    }
    let client = store.pool().get().await?;
    let held: i64 = client.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    Ok(u64::try_from(held)?)
}

fn fill_append(from: u64, batch: u64) -> Vec<StreamAppend> {
    (0..FILL_STREAMS)
        .map(|s| {
            let n = from / EVENTS_PER_STREAM + batch * FILL_STREAMS + s;
            let kind = KINDS[usize::try_from(n).unwrap_or(0) % KINDS.len()];
            let events = (0..EVENTS_PER_STREAM).map(|i| new_event(payload(0, n + i))).collect();
            let mut append = stream_append(&format!("{kind}-{n}"), 0, events);
            append.stream_type = StreamType::parse(kind).expect("a kind's name");
            append
        })
        .collect()
}

/// Events/s of a binary `COPY` of the whole log, in commit order, read and dropped.
async fn raw_read(url: &DatabaseUrl) -> anyhow::Result<f64> {
    let client = url.connect().await?;
    let count: i64 = client.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    let started = Instant::now();
    let sql = format!(
        "COPY (SELECT {COLUMNS} FROM events ORDER BY log_epoch, tx_id, position) \
         TO STDOUT (FORMAT binary)"
    );
    let stream = client.copy_out(&sql).await?;
    futures_util::pin_mut!(stream);
    let mut bytes = 0;
    while let Some(chunk) = stream.next().await {
        bytes += chunk?.len();
    }
    anyhow::ensure!(bytes > 0, "the raw read read nothing");
    Ok(rate(u64::try_from(count)?, started.elapsed()))
}

async fn export(store: &PgEventStore, file: &std::path::Path) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut out = BufWriter::with_capacity(1 << 20, File::create(file)?);
    let summary = store.export(&ExportFilter::default(), &mut out, |_, _| {}).await?;
    Ok(rate(summary.events, started.elapsed()))
}

/// The export file, read from its start (each check reads it twice: its events, and its
/// heads ahead of them).
fn reader(file: &std::path::Path) -> std::io::Result<BufReader<File>> {
    Ok(BufReader::with_capacity(1 << 20, File::open(file)?))
}

fn verify(file: &std::path::Path) -> anyhow::Result<f64> {
    let started = Instant::now();
    let checked = check_file(reader(file)?, Some(HeadsAhead::new(reader(file)?)), |_| {})?;
    anyhow::ensure!(checked.report.breaks.is_empty(), "the export does not verify");
    Ok(rate(checked.report.events_checked, started.elapsed()))
}

/// Events/s of `events replay` of the file: every projection in memory.
fn replay(file: &std::path::Path) -> anyhow::Result<f64> {
    let started = Instant::now();
    let replayed = replay_file(reader(file)?, Some(HeadsAhead::new(reader(file)?)), |_| {})?;
    Ok(rate(replayed.events, started.elapsed()))
}

/// The raw copy's events/s, then the import's and its peak RSS, into a new database each.
async fn import_beside_copy(
    url: &DatabaseUrl,
    file: &std::path::Path,
) -> anyhow::Result<(f64, (f64, f64))> {
    let target = ScratchDatabase::create(url, "import").await?;
    let measured = async {
        leasehold_adapters::migrate(&target.url).await?;
        let raw = raw_copy(url, &target.url).await?;
        let store =
            PgEventStore::new(&target.url, StoreConfig { pool_size: 2, ..Default::default() })?;
        let imported = peak(async {
            let started = Instant::now();
            let heads = Some(HeadsAhead::new(reader(file)?));
            let imported = import(&store, reader(file)?, heads, |_| {}).await?;
            anyhow::Ok(rate(imported.checked.report.events_checked, started.elapsed()))
        })
        .await?;
        anyhow::Ok((raw, imported))
    }
    .await;
    target.drop_now().await?;
    measured
}

/// The stream heads' columns, as the import writes them.
const STREAM_COLUMNS: &str = "stream_id, stream_type, tenant_id, version, last_hash, last_tx_id";

/// The seals' columns, as the import writes them.
const SEAL_COLUMNS: &str = "seal_no, first_epoch, first_tx_id, first_position, last_epoch, \
     last_tx_id, last_position, events, hashes, positions, prev_digest, digest, sealed_at";

/// Events/s of a binary `COPY` of the rows an import writes (the log's events, its streams'
/// heads and its seals) into tables of their shape (columns, keys and indexes) in `target`,
/// in one transaction, from local files as the import reads its own: the rows are first
/// copied out of `source` into those files, untimed.
async fn raw_copy(source: &DatabaseUrl, target: &DatabaseUrl) -> anyhow::Result<f64> {
    let (from, mut to) = (source.connect().await?, target.connect().await?);
    let count: i64 = from.query_one("SELECT count(*) FROM events", &[]).await?.get(0);
    let tables = [
        ("events", COLUMNS, "ORDER BY log_epoch, tx_id, position"),
        ("streams", STREAM_COLUMNS, "ORDER BY stream_id"),
        ("ledger_seals", SEAL_COLUMNS, "ORDER BY seal_no"),
    ];
    let mut files = Vec::new();
    for (table, columns, order) in tables {
        to.batch_execute(&format!("CREATE TABLE bench_{table} (LIKE {table} INCLUDING ALL)"))
            .await?;
        let file = std::env::temp_dir()
            .join(format!("leasehold-bench-{}.{table}.copy", std::process::id()));
        copy_out_to(&from, &format!("SELECT {columns} FROM {table} {order}"), &file).await?;
        files.push(file);
    }
    let started = Instant::now();
    let tx = to.transaction().await?;
    let mut copied = Vec::new();
    for ((table, columns, _), file) in tables.iter().zip(&files) {
        copied.push(copy_in_from(&tx, &format!("bench_{table} ({columns})"), file).await?);
    }
    tx.commit().await?;
    let elapsed = started.elapsed();
    for file in &files {
        std::fs::remove_file(file).ok();
    }
    anyhow::ensure!(
        copied[0] == u64::try_from(count)?,
        "the raw copy copied {copied:?} of {count}"
    );
    Ok(rate(copied[0], elapsed))
}

/// Copies `file` (PostgreSQL's binary `COPY` format) into `table (columns)`; the rows copied.
async fn copy_in_from(
    tx: &tokio_postgres::Transaction<'_>,
    table: &str,
    file: &std::path::Path,
) -> anyhow::Result<u64> {
    let sink = tx.copy_in(&format!("COPY {table} FROM STDIN (FORMAT binary)")).await?;
    futures_util::pin_mut!(sink);
    let mut reader = File::open(file)?;
    let mut chunk = vec![0; 1 << 20];
    loop {
        let read = std::io::Read::read(&mut reader, &mut chunk)?;
        if read == 0 {
            break;
        }
        sink.send(std::io::Cursor::new(chunk[..read].to_vec())).await?;
    }
    Ok(sink.finish().await?)
}

/// The rows `select` reads, as a binary `COPY` writes them, into `file`.
async fn copy_out_to(
    client: &tokio_postgres::Client,
    select: &str,
    file: &std::path::Path,
) -> anyhow::Result<()> {
    let out = format!("COPY ({select}) TO STDOUT (FORMAT binary)");
    let rows = client.copy_out(&out).await?;
    futures_util::pin_mut!(rows);
    let mut writer = BufWriter::new(File::create(file)?);
    while let Some(chunk) = rows.next().await {
        std::io::Write::write_all(&mut writer, &chunk?)?;
    }
    std::io::Write::flush(&mut writer)?;
    Ok(())
}

/// Runs `work` and returns its result with the process's peak resident memory during it, in
/// MiB (the peak is reset first: `/proc/self/clear_refs`).
async fn peak<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<(T, f64)> {
    std::fs::write("/proc/self/clear_refs", "5").context("resetting the peak RSS")?;
    let value = work.await?;
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .context("reading the peak RSS")?;
    Ok((value, kib / 1024.0))
}
