//! Comparing a replay's read models with a live database's, row by row.
//!
//! Each live table is read by the columns its writer writes, each value decoded into the
//! JSON a row type's field of that column's type serializes to (a `uuid` as its hyphenated
//! text, a `timestamptz` as chrono writes it, a `jsonb` as its value), so that equal rows
//! have equal text on both sides.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use leasehold_domain::{Cursor, StoreError};
use serde_json::{Map, Value};
use tokio_postgres::Row;
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::TableDigest;
use super::run::REPLAYED;
use super::tables::{MemTable, MemTables, canonical, digest_of};
use crate::projections::tables::quoted;
use crate::store::{PgEventStore, cursor_of, from_driver};

/// One row that differs between a replay and the live read models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// A row the replay holds and the live table does not.
    Missing {
        /// The table.
        table: String,
        /// The row's key (its key columns' values, as JSON).
        key: String,
    },
    /// A row the live table holds and the replay does not.
    Extra {
        /// The table.
        table: String,
        /// The row's key.
        key: String,
    },
    /// A row both hold, with these columns unequal: `(column, replayed, live)`.
    Differs {
        /// The table.
        table: String,
        /// The row's key.
        key: String,
        /// Each column that differs, with the replay's value and the live one.
        columns: Vec<(String, String, String)>,
    },
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing { table, key } => write!(f, "{table} {key}: not in the live table"),
            Self::Extra { table, key } => write!(f, "{table} {key}: only in the live table"),
            Self::Differs { table, key, columns } => {
                write!(f, "{table} {key}:")?;
                for (column, replayed, live) in columns {
                    write!(f, " {column} is {live}, the replay has {replayed};")?;
                }
                Ok(())
            }
        }
    }
}

/// What comparing a replay with the live read models found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Comparison {
    /// Every row that differs.
    pub differences: Vec<Difference>,
    /// The live tables' digests, by table (as the replay's: equal rows, equal digests).
    pub live: Vec<TableDigest>,
    /// The projections whose checkpoint stands before the file's last event: their tables
    /// may differ for that alone.
    pub behind: Vec<String>,
    /// The projections whose checkpoint stands past it (the database holds later events):
    /// their tables may differ for that alone.
    pub ahead: Vec<String>,
}

/// Every row of `replayed` that the live read models in `store`'s database do not hold
/// alike, the live digests, and the projections that have not reached `last`.
///
/// # Errors
/// When the database cannot be read, or holds a column of a type this reader does not know.
pub async fn compare(
    store: &PgEventStore,
    replayed: &MemTables,
    last: Option<Cursor>,
) -> Result<Comparison, StoreError> {
    let mut client = store.client().await?;
    let fail = |error| from_driver(error, store.endpoint());
    // One snapshot for every table and checkpoint: a running `serve` moves none of them
    // between two reads.
    let client = crate::store::read_only_snapshot(&mut client).await.map_err(fail)?;
    let (mut differences, mut live_digests) = (Vec::new(), Vec::new());
    for (name, table) in replayed.tables() {
        let live = read_live(&client, name, table).await.map_err(|error| match error {
            LiveError::Driver(error) => fail(error),
            LiveError::Type(reason) => StoreError::Database { reason },
        })?;
        let live_rows = live.compared_rows();
        differences.extend(differ(name, &table.compared_rows(), &live_rows, table));
        let (rows, digest) = (live_rows.len(), digest_of(&live_rows));
        live_digests.push(TableDigest { table: name.clone(), rows, digest });
    }
    let (mut behind, mut ahead) = (Vec::new(), Vec::new());
    if let Some(last) = last {
        let rows = client
            .query(
                "SELECT log_epoch, tx_id, position, projection FROM projection_checkpoints \
                 WHERE projection = ANY($1)",
                &[&REPLAYED],
            )
            .await
            .map_err(fail)?;
        let reached: BTreeMap<String, Cursor> =
            rows.iter().map(|row| (row.get(3), cursor_of(row))).collect();
        for name in REPLAYED {
            match reached.get(*name) {
                Some(at) if *at > last => ahead.push((*name).to_owned()),
                Some(at) if *at == last => {}
                _ => behind.push((*name).to_owned()),
            }
        }
    }
    client.commit().await.map_err(fail)?;
    Ok(Comparison { differences, live: live_digests, behind, ahead })
}

enum LiveError {
    Driver(tokio_postgres::Error),
    Type(String),
}

impl From<tokio_postgres::Error> for LiveError {
    fn from(error: tokio_postgres::Error) -> Self {
        Self::Driver(error)
    }
}

/// The live rows of `name` by the columns `replayed` holds (by its primary key's alone when
/// the replay wrote it no row), as a table of the same shape.
async fn read_live(
    client: &impl deadpool_postgres::GenericClient,
    name: &str,
    replayed: &MemTable,
) -> Result<MemTable, LiveError> {
    // The replay's shape, none of its rows.
    let mut table = MemTable {
        key: replayed.key.clone(),
        columns: replayed.columns.clone(),
        added: replayed.added.clone(),
        rows: BTreeMap::new(),
    };
    if table.columns.is_empty() {
        table.key = primary_key(client, name).await?;
        table.columns.clone_from(&table.key);
    }
    let list: Vec<String> = table.columns.iter().map(|c| quoted(c)).collect();
    let sql = format!("SELECT {} FROM public.{}", list.join(", "), quoted(name));
    let statement = client.prepare(&sql).await?;
    let types: Vec<Type> = statement.columns().iter().map(|c| c.type_().clone()).collect();
    for row in client.query(&statement, &[]).await? {
        let mut values = Map::new();
        for (i, (column, ty)) in table.columns.iter().zip(&types).enumerate() {
            values.insert(column.clone(), cell(&row, i, ty).map_err(LiveError::Type)?);
        }
        let key: Vec<&Value> = table.key.iter().map(|c| &values[c]).collect();
        table.rows.insert(serde_json::to_string(&key).unwrap_or_default(), values);
    }
    Ok(table)
}

/// The columns of `table`'s primary key, in order.
async fn primary_key(
    client: &impl deadpool_postgres::GenericClient,
    table: &str,
) -> Result<Vec<String>, LiveError> {
    let rows = client
        .query(
            "SELECT a.attname::text FROM pg_index i \
             JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) ON true \
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
             WHERE i.indrelid = ('public.' || quote_ident($1))::regclass AND i.indisprimary \
             ORDER BY k.n",
            &[&table],
        )
        .await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Column `i` of `row`, as the JSON a row type's field of its type serializes to.
fn cell(row: &Row, i: usize, ty: &Type) -> Result<Value, String> {
    fn json<T: serde::Serialize>(value: Option<T>) -> Value {
        value.map_or(Value::Null, |v| serde_json::to_value(v).unwrap_or(Value::Null))
    }
    let value = match *ty {
        Type::BOOL => json(row.get::<_, Option<bool>>(i)),
        Type::INT2 => json(row.get::<_, Option<i16>>(i)),
        Type::INT4 => json(row.get::<_, Option<i32>>(i)),
        Type::INT8 => json(row.get::<_, Option<i64>>(i)),
        Type::FLOAT8 => json(row.get::<_, Option<f64>>(i)),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => {
            json(row.get::<_, Option<String>>(i))
        }
        Type::UUID => json(row.get::<_, Option<Uuid>>(i)),
        Type::TIMESTAMPTZ => json(row.get::<_, Option<DateTime<Utc>>>(i)),
        Type::JSONB | Type::JSON => row.get::<_, Option<Value>>(i).unwrap_or(Value::Null),
        Type::TEXT_ARRAY | Type::VARCHAR_ARRAY => json(row.get::<_, Option<Vec<String>>>(i)),
        Type::UUID_ARRAY => json(row.get::<_, Option<Vec<Uuid>>>(i)),
        Type::BYTEA => json(row.get::<_, Option<Vec<u8>>>(i)),
        ref other => return Err(format!("a column of type {other} cannot be compared")),
    };
    Ok(value)
}

/// The rows of `name` that differ between the replay and the live table.
fn differ(
    name: &str,
    replayed: &BTreeMap<String, String>,
    live: &BTreeMap<String, String>,
    table: &MemTable,
) -> Vec<Difference> {
    let keys: BTreeSet<&String> = replayed.keys().chain(live.keys()).collect();
    let mut differences = Vec::new();
    for key in keys {
        let (table_name, key_text) = (name.to_owned(), key.clone());
        match (replayed.get(key), live.get(key)) {
            (Some(_), None) => {
                differences.push(Difference::Missing { table: table_name, key: key_text })
            }
            (None, Some(_)) => {
                differences.push(Difference::Extra { table: table_name, key: key_text })
            }
            (Some(mine), Some(theirs)) if mine != theirs => {
                let columns = columns_apart(mine, theirs, table);
                differences.push(Difference::Differs { table: table_name, key: key_text, columns });
            }
            _ => {}
        }
    }
    differences
}

/// The columns two rows' canonical texts disagree on.
fn columns_apart(mine: &str, theirs: &str, table: &MemTable) -> Vec<(String, String, String)> {
    let (mine, theirs): (Value, Value) = (
        serde_json::from_str(mine).unwrap_or(Value::Null),
        serde_json::from_str(theirs).unwrap_or(Value::Null),
    );
    table
        .columns
        .iter()
        .filter_map(|column| {
            let (a, b) = (canonical(&mine[column]), canonical(&theirs[column]));
            (a != b).then(|| (column.clone(), a, b))
        })
        .collect()
}
