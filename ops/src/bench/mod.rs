//! `leasehold bench ...`: throughput measured beside a raw PostgreSQL baseline taken in the
//! same run on the same database, reported as ratios.

pub mod archive;
pub mod dispatch;
pub mod fleet;
pub mod gateway;
pub mod log;
pub mod nodes;
pub mod pipeline;
pub mod relay;
pub mod snapshots;
mod workload;

use std::future::Future;
use std::time::{Duration, Instant};

use clap::Args;
use leasehold_adapters::DatabaseUrl;
use serde_json::json;

use crate::cli::DatabaseArgs;
use crate::database::ScratchDatabase;

/// Options every benchmark takes.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Print one JSON object per line per measure: {"name","value","unit","baseline","ratio"}.
    #[arg(long)]
    pub json: bool,
    /// Seconds each timed measure (and each baseline) runs.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Run only the measures whose names start with this (for example `append_batch`).
    #[arg(long, value_name = "PREFIX")]
    pub only: Option<String>,
}

impl BenchArgs {
    /// Whether the measure `name` is to run.
    pub fn wants(&self, name: &str) -> bool {
        self.only.as_deref().is_none_or(|prefix| name.starts_with(prefix))
    }

    /// Says what is being measured (on standard error, unless the output is JSON).
    pub fn progress(&self, what: &str) {
        if !self.json {
            eprintln!("measuring: {what}");
        }
    }

    /// How long each timed measure runs.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.seconds)
    }

    /// Runs `measure` in a scratch database beside `--database-url`, dropped afterwards.
    /// Ctrl-C ends the measures, never the clean-up.
    pub async fn in_scratch<F, Fut>(&self, measure: F) -> anyhow::Result<()>
    where
        F: FnOnce(DatabaseUrl) -> Fut,
        Fut: Future<Output = anyhow::Result<()>>,
    {
        let scratch = ScratchDatabase::create(&self.database.parse()?, "bench").await?;
        let result = tokio::select! {
            result = measure(scratch.url.clone()) => result,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        };
        scratch.drop_now().await?;
        result
    }
}

/// One measured figure and its baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct Measure {
    /// What was measured (`append_single_16_writers`).
    pub name: String,
    /// The figure.
    pub value: f64,
    /// Its unit (`appends/s`, `events/s`).
    pub unit: &'static str,
    /// The raw PostgreSQL baseline, same unit.
    pub baseline: f64,
}

impl Measure {
    /// `value / baseline`.
    pub fn ratio(&self) -> f64 {
        if self.baseline > 0.0 { self.value / self.baseline } else { 0.0 }
    }

    /// The JSON-lines form: `{"name", "value", "unit", "baseline", "ratio"}`.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "name": self.name,
            "value": round(self.value),
            "unit": self.unit,
            "baseline": round(self.baseline),
            "ratio": (self.ratio() * 1000.0).round() / 1000.0,
        })
    }

    /// One line of the human-readable table.
    pub fn to_row(&self) -> String {
        // Latencies in milliseconds need their decimals; rates do not.
        let decimals = if self.unit == "ms" { 2 } else { 0 };
        format!(
            "{:<32} {:>12.decimals$} {:<10} baseline {:>12.decimals$}   ratio {:.2}",
            self.name,
            self.value,
            self.unit,
            self.baseline,
            self.ratio()
        )
    }
}

fn round(value: f64) -> f64 {
    (value * 1000.0).round() / 1000.0
}

/// Prints a measure as soon as it is taken.
pub fn report(measure: &Measure, json: bool) {
    if json {
        println!("{}", measure.to_json());
    } else {
        println!("{}", measure.to_row());
    }
}

/// Operations per second over a run that did `operations` in `elapsed`.
pub fn rate(operations: u64, elapsed: Duration) -> f64 {
    operations as f64 / elapsed.as_secs_f64().max(f64::EPSILON)
}

/// Runs `writers` copies of `work` until `duration` has passed; each returns how many
/// operations it completed. Returns the total rate.
pub async fn run_for<F, Fut>(writers: usize, duration: Duration, work: F) -> anyhow::Result<f64>
where
    F: Fn(usize, Instant) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<u64>> + Send + 'static,
{
    let started = Instant::now();
    let deadline = started + duration;
    let tasks: Vec<_> = (0..writers).map(|writer| tokio::spawn(work(writer, deadline))).collect();
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(rate(total, started.elapsed()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_line_has_the_agreed_fields() {
        let measure = Measure {
            name: "catch_up_read".into(),
            value: 900.0,
            unit: "events/s",
            baseline: 1000.0,
        };
        let line = measure.to_json();
        assert_eq!(line["name"], "catch_up_read");
        assert_eq!(line["unit"], "events/s");
        assert_eq!(line["baseline"], 1000.0);
        assert_eq!(line["ratio"], 0.9);
        assert_eq!(line.as_object().unwrap().len(), 5);
    }
}
