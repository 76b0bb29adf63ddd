//! The tables a projection owns, and copying their shape into another schema.
//!
//! Every read-model table belongs to one projection (schema/postgres/0026): its own tables,
//! and its partitions of the tables several projections share (`workloads`, `quota_usage`,
//! `quota_usage_skus`, `dead_letters`, partitioned by kind or source). A rebuild creates the
//! same tables in a schema of its own, with the same columns, constraints and index names, and
//! a switch moves them into `public` (a partition detached and attached again) and the
//! active ones out.

use deadpool_postgres::GenericClient;
use leasehold_domain::StoreError;

use super::WriteError;

/// One table a projection owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owned {
    /// A table of its own.
    Table(&'static str),
    /// A partition of a shared table: `table` holds the rows of `parent` whose partition key
    /// is `value`.
    Partition {
        /// The shared table readers read.
        parent: &'static str,
        /// The partition the projection writes.
        table: &'static str,
        /// Its partition key's value.
        value: &'static str,
    },
}

impl Owned {
    /// The table's name (in whichever schema it is).
    pub fn name(self) -> &'static str {
        match self {
            Self::Table(table) | Self::Partition { table, .. } => table,
        }
    }
}

/// The four partitions of the shared tables a workload kind's projection writes: its
/// `workloads`, `quota_usage` and `quota_usage_skus` rows.
macro_rules! workload_partitions {
    ($kind:literal) => {
        [
            $crate::projections::tables::Owned::Partition {
                parent: "workloads",
                table: concat!("workloads_", $kind),
                value: $kind,
            },
            $crate::projections::tables::Owned::Partition {
                parent: "quota_usage",
                table: concat!("quota_usage_", $kind),
                value: $kind,
            },
            $crate::projections::tables::Owned::Partition {
                parent: "quota_usage_skus",
                table: concat!("quota_usage_skus_", $kind),
                value: $kind,
            },
        ]
    };
}
pub(crate) use workload_partitions;

/// The partition of `dead_letters` a projection writes (`source` names it).
macro_rules! dead_letters_of {
    ($source:literal) => {
        $crate::projections::tables::Owned::Partition {
            parent: "dead_letters",
            table: concat!("dead_letters_", $source),
            value: $source,
        }
    };
}
pub(crate) use dead_letters_of;

/// A name quoted as an SQL identifier.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The indexes and their constraints of `schema.table`: `(constraint name and definition, or
/// the index's own definition)`.
const INDEXES_SQL: &str = "SELECT c.conname, pg_get_constraintdef(c.oid), \
     pg_get_indexdef(i.indexrelid) FROM pg_index i \
     LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid \
     WHERE i.indrelid = (quote_ident($1) || '.' || quote_ident($2))::regclass \
     ORDER BY i.indexrelid";

/// Creates `to.table` with the shape of `from.table`: its columns, defaults and CHECKs, its
/// keys and indexes under the same names (names are per schema, so the copy can later take
/// the original's place).
pub(crate) async fn copy_shape(
    client: &impl GenericClient,
    table: &str,
    from: &str,
    to: &str,
) -> Result<(), WriteError> {
    let (source, target) = (
        format!("{}.{}", quoted(from), quoted(table)),
        format!("{}.{}", quoted(to), quoted(table)),
    );
    client
        .batch_execute(&format!(
            "CREATE TABLE {target} (LIKE {source} INCLUDING DEFAULTS INCLUDING CONSTRAINTS \
             INCLUDING GENERATED INCLUDING STORAGE EXCLUDING INDEXES)"
        ))
        .await?;
    let rows = client.query(INDEXES_SQL, &[&from, &table]).await?;
    for row in rows {
        let sql = match row.get::<_, Option<String>>(0) {
            Some(constraint) => {
                let definition: String = row.get(1);
                format!("ALTER TABLE {target} ADD CONSTRAINT {} {definition}", quoted(&constraint))
            }
            None => {
                let definition: String = row.get(2);
                let on = format!(" ON {from}.{table} ");
                let into = format!(" ON {} ", target);
                // pg_get_indexdef names the table schema-qualified; quoted only if it must be.
                let definition = definition.replacen(&on, &into, 1);
                if !definition.contains(&into) {
                    return Err(WriteError::Store(StoreError::Database {
                        reason: format!("cannot copy an index of {source}: {definition}"),
                    }));
                }
                definition
            }
        };
        client.batch_execute(&sql).await?;
    }
    Ok(())
}
