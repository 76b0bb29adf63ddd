//! The read-model tables in memory, written through the same statements as in PostgreSQL.
//!
//! A projection's writer in PostgreSQL upserts rows with statements of one shape: `INSERT
//! INTO t (columns) … ON CONFLICT (key) DO UPDATE SET c = excluded.c, n = t.n + excluded.n`
//! (or `DO NOTHING`). [`Statement::of`] reads that shape from the writer's own SQL text, so
//! that the memory writer inserts the same columns, finds rows by the same key, and on a
//! conflict replaces and adds exactly the columns the database does: the SQL stays the one
//! description of each table's writes. A row is the JSON of the projection's row type
//! (`LeaseRow`, ...), whose fields are named after its table's columns; a column the row
//! does not have is an error, not a null.
//!
//! Each table is named as readers name it: a kind's partition (`workloads_KIND`) is the
//! shared table (`workloads`).

use std::collections::BTreeMap;

use chrono::Timelike as _;
use serde::Serialize;
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

/// Why a write to the tables in memory failed: the writer and its statement disagree.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The statement is not of the shape [`Statement::of`] reads.
    #[error("a writer's statement cannot be read: {reason}: {sql}")]
    Statement {
        /// What was missing.
        reason: String,
        /// The statement.
        sql: String,
    },
    /// A row lacks a column its statement writes.
    #[error("{table}: the row has no column {column}")]
    MissingColumn {
        /// The table.
        table: String,
        /// The column.
        column: String,
    },
    /// A row could not be turned into JSON.
    #[error("{table}: the row cannot be written: {reason}")]
    Row {
        /// The table.
        table: String,
        /// Why.
        reason: String,
    },
}

/// What a writer's upsert does, read from its SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The table, as readers name it.
    pub table: String,
    /// The columns it inserts.
    pub columns: Vec<String>,
    /// The columns that find a row (its conflict target).
    pub key: Vec<String>,
    /// The columns a conflict replaces.
    pub replaced: Vec<String>,
    /// The columns a conflict adds to (`n = t.n + excluded.n`).
    pub added: Vec<String>,
}

impl Statement {
    /// The shape of `sql`: `INSERT INTO <table> [AS <alias>] (<columns>) … ON CONFLICT
    /// (<key>) DO NOTHING | DO UPDATE SET <column> = excluded.<column>, <column> = <alias or
    /// table>.<column> + …`.
    ///
    /// # Errors
    /// [`MemError::Statement`] when `sql` is not of that shape.
    pub fn of(sql: &str) -> Result<Self, MemError> {
        let fail =
            |reason: &str| MemError::Statement { reason: reason.to_owned(), sql: sql.to_owned() };
        let rest = sql.strip_prefix("INSERT INTO ").ok_or_else(|| fail("no INSERT INTO"))?;
        let name = rest.split([' ', '(']).next().unwrap_or_default();
        let columns = list_after(rest, "").ok_or_else(|| fail("no column list"))?;
        let conflict = sql.split_once("ON CONFLICT ").ok_or_else(|| fail("no ON CONFLICT"))?.1;
        let key = list_after(conflict, "").ok_or_else(|| fail("no conflict target"))?;
        let (mut replaced, mut added) = (Vec::new(), Vec::new());
        if let Some((_, sets)) = conflict.split_once("DO UPDATE SET ") {
            for set in sets.split(", ") {
                let (column, value) = set.split_once(" = ").ok_or_else(|| fail("a bad SET"))?;
                let column = column.trim().to_owned();
                if value.trim() == format!("excluded.{column}") {
                    replaced.push(column);
                } else if value.contains(" + ") {
                    added.push(column);
                } else {
                    return Err(fail("a SET that neither replaces nor adds"));
                }
            }
        } else if !conflict.contains("DO NOTHING") {
            return Err(fail("neither DO UPDATE nor DO NOTHING"));
        }
        Ok(Self { table: reader_name(name), columns, key, replaced, added })
    }
}

/// The comma-separated names in the first parentheses of `text` after `after`.
fn list_after(text: &str, after: &str) -> Option<Vec<String>> {
    let start = text.find(after)? + after.len();
    let open = start + text[start..].find('(')?;
    let close = open + text[open..].find(')')?;
    Some(text[open + 1..close].split(',').map(|name| name.trim().to_owned()).collect())
}

/// A kind's or a source's partition (`workloads_KIND`, `dead_letters_SOURCE`) by the shared
/// table's name.
fn reader_name(table: &str) -> String {
    table.trim_end_matches("_KIND").trim_end_matches("_SOURCE").to_owned()
}

/// One table: rows by key (the key's JSON text, which orders rows the same every time).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MemTable {
    /// Its key columns.
    pub key: Vec<String>,
    /// The columns its rows hold.
    pub columns: Vec<String>,
    /// Columns kept by adding.
    pub added: Vec<String>,
    /// Its rows.
    pub rows: BTreeMap<String, Map<String, Value>>,
}

/// Every table a replay writes.
#[derive(Debug, Clone, Default)]
pub struct MemTables {
    tables: BTreeMap<String, MemTable>,
}

/// `row` as a JSON object (a row type's fields).
///
/// # Errors
/// [`MemError::Row`] when it is not an object.
pub fn row_of(table: &str, row: &impl Serialize) -> Result<Map<String, Value>, MemError> {
    match serde_json::to_value(row) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => {
            Err(MemError::Row { table: table.into(), reason: format!("not a row: {other}") })
        }
        Err(error) => Err(MemError::Row { table: table.into(), reason: error.to_string() }),
    }
}

/// The JSON text of `row`'s `columns`, in that order: a key.
fn key_of(row: &Map<String, Value>, columns: &[String]) -> String {
    let values: Vec<&Value> = columns.iter().map(|c| row.get(c).unwrap_or(&Value::Null)).collect();
    serde_json::to_string(&values).unwrap_or_default()
}

impl MemTables {
    /// Every table, by name.
    pub fn tables(&self) -> &BTreeMap<String, MemTable> {
        &self.tables
    }

    /// Makes sure `table` is listed (with no rows yet), so that a digest names it.
    pub fn declare(&mut self, table: &str) {
        self.tables.entry(table.to_owned()).or_default();
    }

    /// Upserts `row` as `statement` does.
    ///
    /// # Errors
    /// When the row lacks one of the statement's columns.
    pub fn upsert(
        &mut self,
        statement: &Statement,
        row: &Map<String, Value>,
    ) -> Result<(), MemError> {
        let mut written = Map::new();
        for column in &statement.columns {
            let value = row.get(column).ok_or_else(|| MemError::MissingColumn {
                table: statement.table.clone(),
                column: column.clone(),
            })?;
            written.insert(column.clone(), value.clone());
        }
        let table = self.tables.entry(statement.table.clone()).or_default();
        if table.columns.is_empty() {
            table.key.clone_from(&statement.key);
            table.columns.clone_from(&statement.columns);
            table.added.clone_from(&statement.added);
        }
        let key = key_of(&written, &statement.key);
        match table.rows.get_mut(&key) {
            None => {
                table.rows.insert(key, written);
            }
            Some(stored) => {
                for column in &statement.replaced {
                    stored.insert(column.clone(), written[column].clone());
                }
                for column in &statement.added {
                    let sum = as_i64(&stored[column]) + as_i64(&written[column]);
                    stored.insert(column.clone(), Value::from(sum));
                }
            }
        }
        Ok(())
    }

    /// Upserts `row` (a row type) as the writer's statement `sql` does, with `extra` columns
    /// the statement sets itself (a constant, a value given twice).
    ///
    /// # Errors
    /// When `sql` is not an upsert, or the row lacks one of its columns.
    pub fn put(
        &mut self,
        sql: &str,
        row: &impl Serialize,
        extra: &[(&str, Value)],
    ) -> Result<(), MemError> {
        let statement = Statement::of(sql)?;
        let mut row = row_of(&statement.table, row)?;
        for (column, value) in extra {
            row.insert((*column).to_owned(), value.clone());
        }
        self.upsert(&statement, &row)
    }

    /// Sets `values` on the row of `table` whose key is `key` (`UPDATE … WHERE key`), if
    /// there is one. A column only an update writes joins the table's columns: it is
    /// compared too.
    pub fn update(&mut self, table: &str, key: &[Value], values: Map<String, Value>) {
        let key = serde_json::to_string(key).unwrap_or_default();
        let Some(table) = self.tables.get_mut(table) else { return };
        let Some(row) = table.rows.get_mut(&key) else { return };
        for column in values.keys() {
            if !table.columns.contains(column) {
                table.columns.push(column.clone());
            }
        }
        row.extend(values);
    }

    /// Deletes every row of `table` whose added columns all sum to zero (as its writer drops
    /// usage that came back to zero).
    pub fn drop_zero(&mut self, table: &str) {
        if let Some(table) = self.tables.get_mut(table) {
            let added = table.added.clone();
            let zero = |row: &Map<String, Value>| {
                added.iter().all(|c| row.get(c).is_none_or(|v| as_i64(v) == 0))
            };
            table.rows.retain(|_, row| added.is_empty() || !zero(row));
        }
    }

    /// Deletes the row of `table` whose key is `key`, if there is one.
    pub fn delete(&mut self, table: &str, key: &[Value]) {
        let key = serde_json::to_string(key).unwrap_or_default();
        if let Some(table) = self.tables.get_mut(table) {
            table.rows.remove(&key);
        }
    }
}

fn as_i64(value: &Value) -> i64 {
    value.as_i64().unwrap_or_default()
}

impl MemTable {
    /// Its rows as compared: each row's key and the canonical text of its columns (one a
    /// row was never written, such as an update's before the update, as null, as the
    /// database holds it).
    pub fn compared_rows(&self) -> BTreeMap<String, String> {
        self.rows
            .iter()
            .map(|(key, row)| {
                let columns: Map<String, Value> = self
                    .columns
                    .iter()
                    .map(|c| (c.clone(), row.get(c).cloned().unwrap_or(Value::Null)))
                    .collect();
                (key.clone(), canonical(&Value::Object(columns)))
            })
            .collect()
    }
}

/// The SHA-256 of rows as compared (hex): one line per row, `key TAB row`, in key order.
pub fn digest_of(rows: &BTreeMap<String, String>) -> String {
    let mut hasher = Sha256::new();
    for (key, row) in rows {
        hasher.update(key.as_bytes());
        hasher.update(b"\t");
        hasher.update(row.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// `value` as JSON text with every object's keys in order, and every timestamp (RFC 3339)
/// written to the microsecond, cut as PostgreSQL stores it (a provider's clock may say
/// nanoseconds): the same value, the same text.
pub fn canonical(value: &Value) -> String {
    fn sorted(value: &Value) -> Value {
        match value {
            Value::String(text) => Value::String(to_micros(text)),
            Value::Object(map) => {
                let ordered: BTreeMap<&String, Value> =
                    map.iter().map(|(k, v)| (k, sorted(v))).collect();
                Value::Object(ordered.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sorted(value)).unwrap_or_default()
}

/// `text` as the same instant to the microsecond (truncated, as a `timestamptz` parameter is)
/// in UTC, if it is an RFC 3339 timestamp; else `text` unchanged.
fn to_micros(text: &str) -> String {
    let looks_like_time = text.len() >= 20 && text.as_bytes().get(10) == Some(&b'T');
    match chrono::DateTime::parse_from_rfc3339(text) {
        Ok(at) if looks_like_time => {
            let at = at.with_timezone(&chrono::Utc);
            let micros = at.timestamp_subsec_micros();
            let cut = at.with_nanosecond(micros * 1_000).unwrap_or(at);
            cut.to_rfc3339_opts(chrono::SecondsFormat::Micros, true)
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upsert_reads_its_table_key_and_sets_from_its_sql() {
        let sql = "INSERT INTO quota_usage_KIND AS u (tenant_id, kind, active_count) \
             SELECT * FROM unnest($1::text[], $2::text[], $3::int8[]) \
             ON CONFLICT (tenant_id, kind) DO UPDATE \
             SET active_count = u.active_count + excluded.active_count";
        let statement = Statement::of(sql).expect("read");
        assert_eq!(statement.table, "quota_usage");
        assert_eq!(statement.columns, ["tenant_id", "kind", "active_count"]);
        assert_eq!(statement.key, ["tenant_id", "kind"]);
        assert_eq!(statement.added, ["active_count"]);
        let sql = "INSERT INTO leases (lease_id, status, created_at) SELECT * FROM unnest($1) \
             ON CONFLICT (lease_id) DO UPDATE SET status = excluded.status";
        let statement = Statement::of(sql).expect("read");
        assert_eq!((statement.replaced, statement.added.len()), (vec!["status".into()], 0));
        assert!(Statement::of("UPDATE leases SET status = 'x'").is_err());
    }

    #[test]
    fn a_conflict_replaces_and_adds_only_what_the_statement_says() {
        let sql = "INSERT INTO t (id, a, b, n) SELECT 1 ON CONFLICT (id) DO UPDATE SET \
             a = excluded.a, n = t.n + excluded.n";
        let statement = Statement::of(sql).expect("read");
        let mut tables = MemTables::default();
        let row = |a: i64, b: i64, n: i64| {
            serde_json::json!({ "id": 1, "a": a, "b": b, "n": n, "extra": true })
                .as_object()
                .cloned()
                .expect("an object")
        };
        tables.upsert(&statement, &row(1, 1, 2)).expect("inserted");
        tables.upsert(&statement, &row(5, 5, 3)).expect("updated");
        let stored = &tables.tables()["t"].rows["[1]"];
        assert_eq!(
            Value::Object(stored.clone()),
            serde_json::json!({ "id": 1, "a": 5, "b": 1, "n": 5 })
        );
        let missing = serde_json::json!({ "id": 2 }).as_object().cloned().expect("an object");
        assert!(matches!(tables.upsert(&statement, &missing), Err(MemError::MissingColumn { .. })));
        // An update's column is the table's too: compared like the others.
        let set = serde_json::json!({ "settled": "yes" }).as_object().cloned().expect("an object");
        tables.update("t", &[serde_json::json!(1)], set);
        assert!(tables.tables()["t"].columns.contains(&"settled".to_owned()));
    }

    #[test]
    fn a_timestamp_compares_to_the_microsecond_whatever_its_zone_or_precision() {
        let nanos = canonical(&serde_json::json!({ "at": "2026-12-03T09:01:00.123456789Z" }));
        let stored = canonical(&serde_json::json!({ "at": "2026-12-03T10:01:00.123456+01:00" }));
        assert_eq!(nanos, stored);
        assert_eq!(canonical(&serde_json::json!("not a time")), "\"not a time\"");
    }
}
