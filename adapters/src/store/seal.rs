//! The sealer: every `events_per_seal` committed events, a seal over their hashes in log
//! order, chained to the previous seal (schema/postgres/0006_seals.sql). Only events below
//! the read horizon are sealed, so no event can later commit inside a sealed range.
//!
//! One sealer writes at a time: a seal is written in a transaction that first takes a
//! transaction-level advisory lock, and one that finds it taken does nothing (another
//! process's sealer is at it). The sealer only reads events and writes `ledger_seals`: it
//! never waits for an append and no append waits for it.

use leasehold_domain::{Cursor, StoreError};

use super::errors::from_driver;
use super::xid8::Xid8;
use super::{HORIZON, PgEventStore, to_i64};
use crate::chain::{GENESIS_HASH, seal_digest};

/// The advisory lock a sealer holds while it writes a seal.
const SEAL_LOCK_KEY: i64 = 0x6c68_7365_616c_0001;

/// The seal written by one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seal {
    /// Its number, from 1.
    pub seal_no: u64,
    /// The last event it covers.
    pub last: Cursor,
    /// How many events it covers.
    pub events: u64,
    /// Its digest.
    pub digest: [u8; 32],
}

/// The last seal: where the next one starts and what it chains from.
struct Tip {
    seal_no: i64,
    after: Cursor,
    digest: [u8; 32],
}

impl PgEventStore {
    /// Writes one seal over the next `events_per_seal` committed events; with `partial`, over
    /// however many there are (at shutdown). `None` when there was not enough to seal or
    /// another sealer holds the lock.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails or a stored seal is malformed.
    pub async fn seal_next(
        &self,
        events_per_seal: usize,
        partial: bool,
    ) -> Result<Option<Seal>, StoreError> {
        let endpoint = self.endpoint();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(|e| from_driver(e, endpoint))?;
        let locked: bool = transaction
            .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&SEAL_LOCK_KEY])
            .await
            .map_err(|e| from_driver(e, endpoint))?
            .get(0);
        if !locked {
            return Ok(None);
        }
        let tip = tip(&transaction, endpoint).await?;
        let sql = format!(
            "SELECT log_epoch, tx_id, position, hash FROM events \
             WHERE (log_epoch, tx_id, position) > ($1, $2::xid8, $3) AND {HORIZON} \
             ORDER BY log_epoch, tx_id, position LIMIT $4"
        );
        let after = tip.after;
        let epoch = i32::try_from(after.log_epoch).unwrap_or(i32::MAX);
        let rows = transaction
            .query(
                &sql,
                &[
                    &epoch,
                    &Xid8(after.tx_id),
                    &to_i64(after.position),
                    &to_i64(events_per_seal as u64),
                ],
            )
            .await
            .map_err(|e| from_driver(e, endpoint))?;
        if rows.is_empty() || (rows.len() < events_per_seal && !partial) {
            return Ok(None);
        }
        let cursor_of = |row: &tokio_postgres::Row| Cursor {
            log_epoch: u32::try_from(row.get::<_, i32>(0)).unwrap_or_default(),
            tx_id: row.get::<_, Xid8>(1).0,
            position: u64::try_from(row.get::<_, i64>(2)).unwrap_or_default(),
        };
        let mut hashes = Vec::with_capacity(rows.len() * 32);
        let mut positions = Vec::with_capacity(rows.len());
        for row in &rows {
            positions.push(row.get::<_, i64>(2));
            hashes.extend_from_slice(row.get::<_, &[u8]>(3));
        }
        let (first, last) = (cursor_of(&rows[0]), cursor_of(&rows[rows.len() - 1]));
        let digest = seal_digest(&tip.digest, &hashes);
        let seal_no = tip.seal_no + 1;
        let events = to_i64(rows.len() as u64);
        transaction
            .execute(
                "INSERT INTO ledger_seals (seal_no, first_epoch, first_tx_id, first_position, \
                 last_epoch, last_tx_id, last_position, events, hashes, positions, prev_digest, \
                 digest) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
                &[
                    &seal_no,
                    &i32::try_from(first.log_epoch).unwrap_or(i32::MAX),
                    &Xid8(first.tx_id),
                    &to_i64(first.position),
                    &i32::try_from(last.log_epoch).unwrap_or(i32::MAX),
                    &Xid8(last.tx_id),
                    &to_i64(last.position),
                    &events,
                    &hashes,
                    &positions,
                    &tip.digest.as_slice(),
                    &digest.as_slice(),
                ],
            )
            .await
            .map_err(|e| from_driver(e, endpoint))?;
        transaction.commit().await.map_err(|e| from_driver(e, endpoint))?;
        let seal_no = u64::try_from(seal_no).unwrap_or_default();
        Ok(Some(Seal { seal_no, last, events: rows.len() as u64, digest }))
    }

    /// Seals everything there is to seal now: whole seals of `events_per_seal` events, then,
    /// with `partial`, one over the rest. The number of seals written.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn seal_all(&self, events_per_seal: usize, partial: bool) -> Result<u64, StoreError> {
        let mut written = 0;
        while self.seal_next(events_per_seal, partial).await?.is_some() {
            written += 1;
        }
        Ok(written)
    }
}

async fn tip(
    transaction: &tokio_postgres::Transaction<'_>,
    endpoint: &str,
) -> Result<Tip, StoreError> {
    let row = transaction
        .query_opt(
            "SELECT seal_no, last_epoch, last_tx_id, last_position, digest FROM ledger_seals \
             ORDER BY seal_no DESC LIMIT 1",
            &[],
        )
        .await
        .map_err(|e| from_driver(e, endpoint))?;
    let Some(row) = row else {
        return Ok(Tip { seal_no: 0, after: Cursor::START, digest: GENESIS_HASH });
    };
    let seal_no: i64 = row.get(0);
    let digest = row.get::<_, &[u8]>(4).try_into().map_err(|_| StoreError::Corrupt {
        position: 0,
        reason: format!("seal {seal_no}: its digest is not 32 bytes"),
    })?;
    let after = Cursor {
        log_epoch: u32::try_from(row.get::<_, i32>(1)).unwrap_or_default(),
        tx_id: row.get::<_, Xid8>(2).0,
        position: u64::try_from(row.get::<_, i64>(3)).unwrap_or_default(),
    };
    Ok(Tip { seal_no, after, digest })
}
