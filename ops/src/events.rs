//! `leasehold events ...`: auditing the log.

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use leasehold_adapters::verify::ChainBreak;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};

/// Checks the chains, the stream heads, the seals and the order; fails on any fault.
pub async fn verify(url: &DatabaseUrl) -> anyhow::Result<()> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let total = count_events(&store).await?;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("verifying {bar:40} {pos}/{len} events, {per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = store.verify_log(|checked| bar.set_position(checked)).await?;
    bar.finish_and_clear();
    for found in &report.breaks {
        println!("BROKEN {}", describe(found));
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
        println!("first bad position: {}", describe(first));
    }
    if !report.breaks.is_empty() {
        bail!("the log does not verify");
    }
    Ok(())
}

/// One fault, for a person: where, and what.
fn describe(found: &ChainBreak) -> String {
    let place = if found.stream_id.is_empty() {
        format!("position {} (its event is gone; its stream is not known)", found.position)
    } else {
        format!("position {}, stream {} version {}", found.position, found.stream_id, found.version)
    };
    format!("{place}: {:?}", found.kind)
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
