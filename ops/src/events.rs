//! `leasehold events ...`: auditing the log.

use anyhow::bail;
use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};

/// Recomputes every hash chain; fails when any chain breaks.
pub async fn verify(url: &DatabaseUrl) -> anyhow::Result<()> {
    let store = PgEventStore::new(url, StoreConfig { pool_size: 2, ..Default::default() })?;
    let report = store.verify_chains(|checked| eprint!("\rverified {checked} events")).await?;
    eprintln!();
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
