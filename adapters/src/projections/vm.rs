//! Writing the VM read models: one multi-row statement per table per batch.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use deadpool_postgres::{ClientWrapper, Transaction};
use leasehold_domain::values::fleet::VmId;
use leasehold_projections::vm::{DeadLetterRow, VmChange, VmProjection, VmRows, VmView};
use uuid::Uuid;

use super::kind::{PgProjected, ReadError, decode, encode};
use super::shared::SharedWrites;
use super::tables::Owned;
use super::tables::dead_letters_of;
use super::tables::workload_partitions;
use super::{Param, WriteError, execute};

const VIEWS_SQL: &str = "SELECT vm_id, state FROM vm_view_states WHERE vm_id = ANY($1)";

const PUT_VIEWS_SQL: &str = "INSERT INTO vm_view_states (vm_id, tenant_id, state) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::bytea[]) \
     ON CONFLICT (vm_id) DO UPDATE SET state = excluded.state";

const PUT_VMS_SQL: &str = "INSERT INTO vms (vm_id, tenant_id, task_id, state, task_state, \
     host_id, url, spec, reason, message, destroy_reason, created_at, updated_at, \
     copied_from, copy_kind, migrating_to) \
     SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], \
     $6::text[], $7::text[], $8::jsonb[], $9::text[], $10::text[], $11::text[], \
     $12::timestamptz[], $13::timestamptz[], $14::uuid[], $15::text[], $16::uuid[]) \
     ON CONFLICT (vm_id) DO UPDATE SET state = excluded.state, \
     task_state = excluded.task_state, host_id = excluded.host_id, url = excluded.url, \
     reason = excluded.reason, message = excluded.message, \
     destroy_reason = excluded.destroy_reason, updated_at = excluded.updated_at, \
     migrating_to = excluded.migrating_to";

/// A dead letter, into its source's partition of `dead_letters` (`dead_letters_SOURCE`).
const PUT_DEAD_LETTER_SQL: &str = "INSERT INTO dead_letters_SOURCE AS d (source, kind, \
     entity_id, task_id, reason, retry_count, payload, first_seen, last_seen) \
     VALUES ('SOURCE', $1, $2, $3, $4, 1, $5, $6, $6) \
     ON CONFLICT (source, kind, entity_id) DO UPDATE SET retry_count = d.retry_count + 1, \
     reason = excluded.reason, payload = excluded.payload, last_seen = excluded.last_seen";

/// The projections that write dead letters, each into its own partition.
#[derive(Debug, Clone, Copy)]
pub(super) enum LetterSource {
    Vm,
    Host,
    Snapshot,
    RunnerFleet,
}

impl LetterSource {
    fn name(self) -> &'static str {
        match self {
            Self::Vm => "vm",
            Self::Host => "host",
            Self::Snapshot => "snapshot",
            Self::RunnerFleet => "runner_fleet",
        }
    }
}

impl PgProjected for VmProjection {
    const TABLES: &'static [Owned] = &[
        Owned::Table("vm_view_states"),
        Owned::Table("vms"),
        dead_letters_of!("vm"),
        workload_partitions!("vm")[0],
        workload_partitions!("vm")[1],
        workload_partitions!("vm")[2],
    ];

    async fn read_views(
        client: &ClientWrapper,
        keys: &[VmId],
    ) -> Result<HashMap<VmId, VmView>, ReadError> {
        let ids: Vec<Uuid> = keys.iter().map(|key| key.0).collect();
        let statement = client.prepare_cached(VIEWS_SQL).await?;
        let rows = client.query(&statement, &[&ids]).await?;
        let mut views = HashMap::with_capacity(rows.len());
        for row in rows {
            let vm = VmId(row.get(0));
            views.insert(vm, decode(format!("VM {vm}"), row.get(1))?);
        }
        Ok(views)
    }

    async fn write_changes(tx: &Transaction<'_>, changes: Vec<VmChange>) -> Result<(), WriteError> {
        let (puts, letters, mut shared) = gather(changes);
        write_puts(tx, &puts).await?;
        write_dead_letters(tx, &letters).await?;
        for rows in &puts {
            shared.workload(rows.workload.clone());
        }
        shared.write(tx).await
    }
}

async fn write_dead_letters(
    tx: &Transaction<'_>,
    letters: &[DeadLetterRow],
) -> Result<(), WriteError> {
    for letter in letters {
        write_dead_letter(tx, LetterSource::Vm, letter).await?;
    }
    Ok(())
}

/// One dead letter of `source`, counted again when its kind and entity are there already.
pub(super) async fn write_dead_letter(
    tx: &Transaction<'_>,
    source: LetterSource,
    letter: &DeadLetterRow,
) -> Result<(), WriteError> {
    let params: [Param<'_>; 6] = [
        &letter.kind,
        &letter.entity_id,
        &letter.task_id,
        &letter.reason,
        &letter.payload,
        &letter.at,
    ];
    execute(tx, &PUT_DEAD_LETTER_SQL.replace("SOURCE", source.name()), &params).await
}

async fn write_puts(tx: &Transaction<'_>, puts: &[VmRows]) -> Result<(), WriteError> {
    if puts.is_empty() {
        return Ok(());
    }
    let mut states = Vec::with_capacity(puts.len());
    for rows in puts {
        states.push(encode("VM", &rows.view)?);
    }
    let rows: Vec<_> = puts.iter().map(|r| &r.vm).collect();
    let ids: Vec<Uuid> = rows.iter().map(|r| r.vm_id).collect();
    let tenants: Vec<&str> = rows.iter().map(|r| r.tenant_id.as_str()).collect();
    execute(tx, PUT_VIEWS_SQL, &[&ids, &tenants, &states]).await?;
    let tasks: Vec<&str> = rows.iter().map(|r| r.task_id.as_str()).collect();
    let vm_states: Vec<&str> = rows.iter().map(|r| r.state).collect();
    let task_states: Vec<Option<&str>> = rows.iter().map(|r| r.task_state).collect();
    let hosts: Vec<Option<&str>> = rows.iter().map(|r| r.host_id.as_deref()).collect();
    let urls: Vec<Option<&str>> = rows.iter().map(|r| r.url.as_deref()).collect();
    let specs: Vec<&serde_json::Value> = rows.iter().map(|r| &r.spec).collect();
    let reasons: Vec<Option<&str>> = rows.iter().map(|r| r.reason.as_deref()).collect();
    let messages: Vec<Option<&str>> = rows.iter().map(|r| r.message.as_deref()).collect();
    let destroys: Vec<Option<&str>> = rows.iter().map(|r| r.destroy_reason).collect();
    let created: Vec<DateTime<Utc>> = rows.iter().map(|r| r.created_at).collect();
    let updated: Vec<DateTime<Utc>> = rows.iter().map(|r| r.updated_at).collect();
    let sources: Vec<Option<Uuid>> = rows.iter().map(|r| r.copied_from).collect();
    let kinds: Vec<Option<&str>> = rows.iter().map(|r| r.copy_kind).collect();
    let migrating: Vec<Option<Uuid>> = rows.iter().map(|r| r.migrating_to).collect();
    let params: [Param<'_>; 16] = [
        &ids,
        &tenants,
        &tasks,
        &vm_states,
        &task_states,
        &hosts,
        &urls,
        &specs,
        &reasons,
        &messages,
        &destroys,
        &created,
        &updated,
        &sources,
        &kinds,
        &migrating,
    ];
    execute(tx, PUT_VMS_SQL, &params).await
}

/// One dead letter of `source` in memory, as [`write_dead_letter`] writes it.
pub(super) fn dead_letter_memory(
    tables: &mut crate::replay::MemTables,
    source: LetterSource,
    letter: &DeadLetterRow,
) -> Result<(), crate::replay::MemError> {
    use serde_json::json;
    let extra = [
        ("source", json!(source.name())),
        ("retry_count", json!(1)),
        ("first_seen", json!(letter.at)),
        ("last_seen", json!(letter.at)),
    ];
    tables.put(PUT_DEAD_LETTER_SQL, letter, &extra)
}

impl crate::replay::MemProjected for VmProjection {
    fn write_memory(
        changes: Vec<VmChange>,
        tables: &mut crate::replay::MemTables,
    ) -> Result<(), crate::replay::MemError> {
        let (puts, letters, mut shared) = gather(changes);
        for rows in &puts {
            tables.put(PUT_VMS_SQL, &rows.vm, &[])?;
        }
        for letter in &letters {
            dead_letter_memory(tables, LetterSource::Vm, letter)?;
        }
        for rows in puts {
            shared.workload(rows.workload);
        }
        shared.write_memory(tables)
    }
}

/// A batch's changes as both writers write them: the VMs' rows, the dead letters, and the
/// shared tables'.
fn gather(changes: Vec<VmChange>) -> (Vec<VmRows>, Vec<DeadLetterRow>, SharedWrites) {
    let (mut puts, mut letters) = (Vec::new(), Vec::new());
    let mut shared = SharedWrites::default();
    for change in changes {
        match change {
            VmChange::Put(rows) => puts.push(*rows),
            VmChange::Quota(delta) => shared.quota(delta),
            VmChange::DeadLetter(letter) => letters.push(letter),
        }
    }
    (puts, letters, shared)
}
