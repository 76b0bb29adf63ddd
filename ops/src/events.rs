//! `leasehold events ...`: auditing the log.

use anyhow::{Context as _, bail};
use indicatif::{ProgressBar, ProgressStyle};
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};

/// Recomputes every hash chain; fails when any chain breaks.
pub async fn verify(url: &DatabaseUrl) -> anyhow::Result<()> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let total = count_events(&store).await?;
    let bar = ProgressBar::new(total).with_style(
        ProgressStyle::with_template("verifying {bar:40} {pos}/{len} events, {per_sec}, eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let report = store.verify_chains(|checked| bar.set_position(checked)).await?;
    bar.finish_and_clear();
    for found in &report.breaks {
        println!(
            "BROKEN stream {} version {} (position {}): {:?}",
            found.stream_id, found.version, found.position, found.kind
        );
    }
    println!(
        "{} events in {} streams checked, {} breaks{}",
        report.events_checked,
        report.streams_checked,
        report.breaks.len(),
        if report.breaks_truncated { " (more not listed)" } else { "" }
    );
    if !report.breaks.is_empty() {
        bail!("the log does not verify");
    }
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
