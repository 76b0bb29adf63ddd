//! `leasehold projections ...`: where each projection and reconciler stands and how far behind
//! it is, and rebuilding a projection without downtime.

use anyhow::Context as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use leasehold_adapters::projections::BuildStatus;
use leasehold_adapters::{PgEventStore, PgProjectionStore, StoreConfig};
use serde_json::json;

use crate::cli::DatabaseArgs;

/// `projections rebuild`.
#[derive(Debug, Args)]
pub struct RebuildArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// The projection (`lease_views`, `vm_views`, ...; `projections status` lists them).
    name: String,
    /// Most events applied in one transaction.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000))]
    batch_events: u64,
}

/// `projections activate` and `projections drop`.
#[derive(Debug, Args)]
pub struct BuildArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// The projection.
    name: String,
    /// The build's number (`projections status` lists them; 0 is the tables from before the
    /// first rebuild).
    #[arg(long = "version", value_name = "N")]
    build_no: u32,
}

fn store_of(database: &DatabaseArgs) -> anyhow::Result<PgProjectionStore> {
    let url = database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 4, ..StoreConfig::default() })?;
    Ok(PgProjectionStore::new(store))
}

fn known(name: &str) -> anyhow::Result<&'static [leasehold_adapters::projections::tables::Owned]> {
    crate::projectors::tables(name).with_context(|| {
        format!(
            "no projection is named {name:?}; they are: {}",
            crate::projectors::NAMES.join(", ")
        )
    })
}

/// Builds a new version of a projection beside the active one and switches it in.
pub async fn rebuild(args: &RebuildArgs) -> anyhow::Result<()> {
    known(&args.name)?;
    let store = store_of(&args.database)?;
    let bar = ProgressBar::new(0).with_style(
        ProgressStyle::with_template(
            "rebuilding {prefix} {bar:40} {pos}/{len} events, {per_sec}, eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_prefix(args.name.clone());
    let batch = usize::try_from(args.batch_events).unwrap_or(1_000);
    let mut progress = |at: leasehold_adapters::projections::BuildProgress| {
        bar.set_length(at.total.max(at.applied));
        bar.set_position(at.applied);
    };
    let built = crate::projectors::rebuild(&args.name, &store, batch, &mut progress).await;
    bar.finish_and_clear();
    let build_no = built.context("a known projection")?.context("rebuilding")?;
    println!(
        "{} build {build_no} is active; the previous build is kept (`projections activate {}          --version N` brings it back, `projections drop` removes it)",
        args.name, args.name
    );
    Ok(())
}

/// Switches a projection's readers to a kept build.
pub async fn activate(args: &BuildArgs) -> anyhow::Result<()> {
    let tables = known(&args.name)?;
    let store = store_of(&args.database)?;
    store.activate_build(&args.name, tables, args.build_no).await.context("activating")?;
    println!("{} build {} is active", args.name, args.build_no);
    Ok(())
}

/// Drops a kept build.
pub async fn drop(args: &BuildArgs) -> anyhow::Result<()> {
    known(&args.name)?;
    let store = store_of(&args.database)?;
    store.drop_build(&args.name, args.build_no).await.context("dropping")?;
    println!("{} build {} is dropped", args.name, args.build_no);
    Ok(())
}

/// `running`, `rebuilding` (a build of it is being written) or `failed` (its runner failed
/// after its last commit).
fn state_of(
    status: &leasehold_adapters::projections::ProjectionStatus,
    builds: &[BuildStatus],
) -> &'static str {
    if status.failure.is_some() {
        "failed"
    } else if builds.iter().any(|b| b.projection == status.name && b.state == "building") {
        "rebuilding"
    } else {
        "running"
    }
}

fn build_line(build: &BuildStatus) -> String {
    let mut line = format!(
        "build {} {} v{} {}: {} of {} events",
        build.projection,
        build.build_no,
        build.version,
        build.state,
        build.events_applied,
        build.events_total
    );
    if let Some(cursor) = build.cursor {
        line.push_str(&format!(", cursor {cursor}"));
    }
    if let Some((error, position)) = &build.error {
        let at = position.map_or_else(String::new, |p| format!(" at position {p}"));
        line.push_str(&format!(", failed{at}: {error}"));
    }
    line
}

fn build_json(build: &BuildStatus) -> serde_json::Value {
    json!({
        "build": build.projection,
        "build_no": build.build_no,
        "version": build.version,
        "state": build.state,
        "cursor": build.cursor.map(|c| c.to_string()),
        "events_applied": build.events_applied,
        "events_total": build.events_total,
        "error": build.error.as_ref().map(|(error, _)| error),
        "error_position": build.error.as_ref().and_then(|(_, position)| *position),
        "updated_at": build.updated_at.to_rfc3339(),
    })
}

/// Prints every projection's and reconciler's checkpoint and lag, and the horizon's lag.
pub async fn status(database: &DatabaseArgs, as_json: bool) -> anyhow::Result<()> {
    let url = database.parse()?;
    let store = PgEventStore::new(&url, StoreConfig { pool_size: 2, ..StoreConfig::default() })?;
    let statuses = leasehold_adapters::PgReadModels::of(&store).projection_status().await?;
    let horizon = leasehold_adapters::PgReadModels::of(&store).horizon_lag_seconds().await?;
    let builds = PgProjectionStore::new(store.clone()).builds().await?;
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
                "state": state_of(status, &builds),
                "error": status.failure.as_ref().map(|(error, _)| error),
                "error_position": status.failure.as_ref().and_then(|(_, position)| *position),
            });
            println!("{line}");
        }
        for build in &builds {
            println!("{}", build_json(build));
        }
        println!("{}", json!({ "horizon_lag_seconds": horizon }));
        return Ok(());
    }
    if statuses.is_empty() {
        println!("no projection has applied anything yet (is `leasehold serve` running?)");
    }
    for status in &statuses {
        let failure = match &status.failure {
            Some((error, Some(position))) => format!(", FAILED at position {position}: {error}"),
            Some((error, None)) => format!(", FAILED: {error}"),
            None => String::new(),
        };
        println!(
            "{} {} v{} {}: {} events applied, {} behind ({:.1} s), cursor {}, last commit {}{failure}",
            status.kind,
            status.name,
            status.version,
            state_of(status, &builds),
            status.events_applied,
            status.events_behind,
            status.seconds_behind,
            status.cursor,
            status.updated_at.to_rfc3339(),
        );
    }
    for build in &builds {
        println!("{}", build_line(build));
    }
    println!("horizon lag: {horizon:.1} s (the oldest open writing transaction in the cluster)");
    Ok(())
}
