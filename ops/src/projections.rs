//! `leasehold projections status`: where each projection and reconciler stands and how far
//! behind it is.

use leasehold_adapters::{PgEventStore, StoreConfig};
use serde_json::json;

use crate::cli::DatabaseArgs;

/// Prints every projection's and reconciler's checkpoint and lag, and the horizon's lag.
pub async fn status(database: &DatabaseArgs, as_json: bool) -> anyhow::Result<()> {
    let url = database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 2, ..StoreConfig::default() })?;
    let statuses = leasehold_adapters::PgReadModels::of(&store).projection_status().await?;
    let horizon = leasehold_adapters::PgReadModels::of(&store).horizon_lag_seconds().await?;
    if as_json {
        for status in &statuses {
            let line = json!({
                "name": status.name,
                "kind": status.kind,
                "version": status.version,
                "cursor": status.cursor.to_string(),
                "events_applied": status.events_applied,
                "events_behind": status.events_behind,
                "seconds_behind": status.seconds_behind,
                "updated_at": status.updated_at.to_rfc3339(),
            });
            println!("{line}");
        }
        println!("{}", json!({ "horizon_lag_seconds": horizon }));
        return Ok(());
    }
    if statuses.is_empty() {
        println!("no projection has applied anything yet (is `leasehold serve` running?)");
    }
    for status in &statuses {
        println!(
            "{} {} v{}: {} events applied, {} behind ({:.1} s), cursor {}, last commit {}",
            status.kind,
            status.name,
            status.version,
            status.events_applied,
            status.events_behind,
            status.seconds_behind,
            status.cursor,
            status.updated_at.to_rfc3339(),
        );
    }
    println!("horizon lag: {horizon:.1} s (the oldest open writing transaction in the cluster)");
    Ok(())
}
