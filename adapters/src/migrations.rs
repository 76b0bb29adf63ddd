//! The schema migrations under `schema/postgres/`, embedded in the binary and applied with
//! refinery.
//!
//! refinery records each applied migration with a checksum of its name and SQL and refuses to
//! go on when an applied migration's file changed. This module adds what refinery lacks: the
//! `NNNN_name.sql` file names of our schema folder, one transaction for the whole run, and a
//! session advisory lock so two processes starting together cannot race.

use refinery::error::Kind;
use refinery::{Migration, Runner};

use crate::database::DatabaseUrl;

/// The migration files, in order: every `.sql` file of `schema/postgres/`, listed by the
/// build script (`build.rs`), so a new migration needs no entry here.
const FILES: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migrations.rs"));

/// The table recording applied migrations.
pub const MIGRATIONS_TABLE: &str = "schema_migrations";

/// Key of the session advisory lock held while migrating ("leasehold migrate" in ASCII).
const MIGRATION_LOCK_KEY: i64 = 0x6c65_6173_6d69_6772;

/// Why migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The database could not be reached.
    #[error("the database at {endpoint} is unreachable: {reason}")]
    Unavailable {
        /// `host:port`.
        endpoint: String,
        /// What the connection attempt reported.
        reason: String,
    },
    /// An applied migration's file has changed since it was applied.
    #[error(
        "migration {file} was applied with different contents (checksum {applied_checksum}, \
         the file now has {file_checksum}); applied migrations must never change: add a new one"
    )]
    Changed {
        /// The migration's file name.
        file: String,
        /// The checksum recorded when it was applied.
        applied_checksum: u64,
        /// The checksum of the embedded file.
        file_checksum: u64,
    },
    /// The database has a migration this binary does not know (a newer binary migrated it).
    #[error("the database has migration V{version} ({name}), which this binary does not have")]
    Unknown {
        /// Its version.
        version: i64,
        /// Its name.
        name: String,
    },
    /// A migration file's name is not `NNNN_name.sql`.
    #[error("migration file {file} is not named NNNN_name.sql")]
    BadFileName {
        /// The file name.
        file: String,
    },
    /// A migration's SQL failed; nothing of this run was applied.
    #[error("migrating failed, nothing was applied: {reason}")]
    Failed {
        /// What the database reported.
        reason: String,
    },
}

/// What a run applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationReport {
    /// File names of the migrations this run applied, in order.
    pub applied: Vec<String>,
}

/// The embedded migration files' names, in order.
pub fn embedded() -> Vec<&'static str> {
    FILES.iter().map(|(file, _)| *file).collect()
}

/// The file name `0001_log.sql` as refinery's `V1__log`.
fn refinery_name(file: &str) -> Result<String, MigrateError> {
    let bad = || MigrateError::BadFileName { file: file.to_string() };
    let stem = file.strip_suffix(".sql").ok_or_else(bad)?;
    let (number, name) = stem.split_once('_').ok_or_else(bad)?;
    let version: u32 = number.parse().map_err(|_| bad())?;
    if number.len() != 4 || name.is_empty() {
        return Err(bad());
    }
    Ok(format!("V{version}__{name}"))
}

fn file_of(version: i64) -> String {
    FILES
        .iter()
        .map(|(file, _)| *file)
        .find(|file| file.get(..4).and_then(|n| n.parse::<i64>().ok()) == Some(version))
        .unwrap_or("?")
        .to_string()
}

/// The embedded migrations, in order.
fn migrations() -> Result<Vec<Migration>, MigrateError> {
    FILES
        .iter()
        .map(|(file, sql)| {
            Migration::unapplied(&refinery_name(file)?, sql)
                .map_err(|_| MigrateError::BadFileName { file: file.to_string() })
        })
        .collect()
}

fn runner() -> Result<Runner, MigrateError> {
    let mut runner = Runner::new(&migrations()?)
        .set_grouped(true)
        .set_abort_divergent(true)
        .set_abort_missing(true);
    runner.set_migration_table_name(MIGRATIONS_TABLE);
    Ok(runner)
}

fn map_refinery(error: refinery::Error) -> MigrateError {
    match error.kind() {
        Kind::DivergentVersion(applied, file) => MigrateError::Changed {
            file: file_of(i64::from(file.version())),
            applied_checksum: applied.checksum(),
            file_checksum: file.checksum(),
        },
        Kind::MissingVersion(applied) => MigrateError::Unknown {
            version: i64::from(applied.version()),
            name: applied.name().to_string(),
        },
        other => MigrateError::Failed { reason: other.to_string() },
    }
}

/// Applies every migration the database lacks, all in one transaction, holding an advisory
/// lock so that a second process waits and then finds nothing left to do.
pub async fn migrate(url: &DatabaseUrl) -> Result<MigrationReport, MigrateError> {
    let runner = runner()?;
    let mut client = url.connect().await.map_err(|e| MigrateError::Unavailable {
        endpoint: url.endpoint(),
        reason: e.to_string(),
    })?;
    let failed = |e: tokio_postgres::Error| MigrateError::Failed { reason: e.to_string() };
    client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK_KEY]).await.map_err(failed)?;
    let result = runner.run_async(&mut client).await;
    // The lock is a session lock: dropping the connection would release it too.
    let _ = client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK_KEY]).await;
    let report = result.map_err(map_refinery)?;
    let applied =
        report.applied_migrations().iter().map(|m| file_of(i64::from(m.version()))).collect();
    Ok(MigrationReport { applied })
}

/// Whether every embedded migration is applied (and none changed): what `/readyz` checks.
pub async fn is_current(client: &mut tokio_postgres::Client) -> Result<bool, MigrateError> {
    let runner = runner()?;
    let applied = runner.get_applied_migrations_async(client).await.map_err(map_refinery)?;
    let expected = migrations()?;
    Ok(applied.len() == expected.len()
        && applied.iter().zip(&expected).all(|(a, e)| a.checksum() == e.checksum()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_file_is_embedded() {
        let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/postgres");
        let mut on_disk: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = FILES.iter().map(|(f, _)| f.to_string()).collect();
        assert_eq!(on_disk, embedded);
    }

    #[test]
    fn file_names_become_refinery_names() {
        assert_eq!(refinery_name("0001_log.sql").unwrap(), "V1__log");
        assert_eq!(refinery_name("0012_lease_read_models.sql").unwrap(), "V12__lease_read_models");
        for bad in ["1_log.sql", "0001log.sql", "0001_.sql", "0001_log.txt", "abcd_log.sql"] {
            assert!(refinery_name(bad).is_err(), "{bad} was accepted");
        }
        assert!(migrations().is_ok());
    }
}
