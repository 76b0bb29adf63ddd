//! The sealer inside `leasehold serve`: seals the log every `--seal-every` events and the rest
//! at shutdown (DESIGN.md, "Tamper evidence"). Several servers on one database may each run
//! one: a seal is written by one of them at a time, and the others find nothing to do.

use std::time::Duration;

use leasehold_adapters::PgEventStore;
use tokio::sync::watch;

/// How often the sealer looks for a whole seal's worth of new events.
const SEAL_INTERVAL_MILLISECONDS: u64 = 1_000;

/// Longest events wait for a seal on a quiet log: then they are sealed however few they are.
const SEAL_AGE_MAX_SECONDS: u64 = 60;

/// Seals whole seals of `events_per_seal` events until `stopped`, and every minute the rest
/// (so a quiet log is not left unsealed for long); once stopped, the rest.
pub async fn run(store: PgEventStore, events_per_seal: usize, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(Duration::from_millis(SEAL_INTERVAL_MILLISECONDS));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rest = tokio::time::interval(Duration::from_secs(SEAL_AGE_MAX_SECONDS));
    rest.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    rest.tick().await;
    while !*stopped.borrow() {
        tokio::select! {
            _ = interval.tick() => seal(&store, events_per_seal, false).await,
            _ = rest.tick() => seal(&store, events_per_seal, true).await,
            _ = stopped.changed() => {}
        }
    }
    seal(&store, events_per_seal, true).await;
}

async fn seal(store: &PgEventStore, events_per_seal: usize, partial: bool) {
    match store.seal_all(events_per_seal, partial).await {
        Ok(0) => {}
        Ok(seals) => tracing::debug!(seals, partial, "log sealed"),
        // The next tick tries again; a database that is down is reported by /readyz.
        Err(error) => tracing::warn!(%error, "sealing failed"),
    }
}
