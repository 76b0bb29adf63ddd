//! Offline replay: every projection run over an export file in memory, with no database.
//!
//! [`replay_file`] reads a full export (`events export`), checks it as `events verify --from`
//! does, and hands each event to every projection `serve` runs, through the projection's own
//! code (which folds each stream's aggregate into its view) and a memory writer that writes
//! the same rows the PostgreSQL writer writes ([`MemProjected`], from the writer's own
//! statements: `tables.rs`). The answer is each read model's rows and a digest of them;
//! [`compare`] reads the same tables of a live database and names every row that differs.
//!
//! What is compared is what readers read: every table a projection writes except its
//! working states (`*_view_states`), by the columns its writer writes. Counting tables hold
//! the same rows however the log is cut into batches (the writers drop usage back at zero,
//! and keep a tenant's kind once charged), so a replay event by event equals them.

mod compare;
mod run;
mod tables;

use std::collections::BTreeMap;

pub use compare::{Comparison, Difference, compare};
pub use run::{REPLAYED, ReplayError, ReplayReport, replay_file};
pub use tables::{MemError, MemTable, MemTables, Statement, canonical, digest_of, row_of};

use leasehold_projections::Projection;

/// A projection whose rows can be written in memory as its PostgreSQL writer writes them.
pub trait MemProjected: Projection {
    /// Writes a batch's changes into `tables`, as [`crate::projections::PgProjected`]'s
    /// `write_changes` writes them into PostgreSQL.
    ///
    /// # Errors
    /// When a row and its writer's statement disagree.
    fn write_memory(changes: Vec<Self::Change>, tables: &mut MemTables) -> Result<(), MemError>;
}

/// One read model's rows, as compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableDigest {
    /// The table.
    pub table: String,
    /// Its rows.
    pub rows: usize,
    /// [`digest_of`] its rows.
    pub digest: String,
}

/// The digest of every table in `tables`, by name.
pub fn digests(tables: &MemTables) -> Vec<TableDigest> {
    tables
        .tables()
        .iter()
        .map(|(name, table)| {
            let rows: BTreeMap<String, String> = table.compared_rows();
            TableDigest { table: name.clone(), rows: rows.len(), digest: digest_of(&rows) }
        })
        .collect()
}
