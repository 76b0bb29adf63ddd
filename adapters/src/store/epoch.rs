//! The log epoch: `(log_epoch, tx_id, position)` orders the log, and transaction ids start
//! again from lower values after a logical restore into another cluster. Raising the epoch
//! then puts every new event after every restored one.

use leasehold_domain::StoreError;

use super::PgEventStore;
use super::errors::from_driver;

/// The transaction-level advisory lock appends hold shared while they read and stamp the
/// epoch (schema/postgres/0005_review_fixes.sql), and a raise holds exclusively.
const EPOCH_LOCK_KEY: i64 = 0x6c74_72c4_a9dd_ac68;

impl PgEventStore {
    /// Raises the log epoch by one and returns the new epoch. Waits for every append in flight
    /// (they hold the epoch lock shared), so no event of the old epoch commits after it. The
    /// streams' transaction-order guard is reset where it holds a transaction id from the
    /// restored cluster, which this one's ids may never reach; every later append is in the
    /// new epoch, after all of them.
    ///
    /// # Errors
    /// [`StoreError`] when the database fails.
    pub async fn raise_epoch(&self) -> Result<u32, StoreError> {
        let endpoint = self.endpoint();
        let mut client = self.client().await?;
        let transaction = client.transaction().await.map_err(|e| from_driver(e, endpoint))?;
        let epoch = raise_epoch_in(&transaction, 0).await.map_err(|e| from_driver(e, endpoint))?;
        transaction.commit().await.map_err(|e| from_driver(e, endpoint))?;
        Ok(epoch)
    }
}

/// Raises the log epoch inside `transaction` by one, and past `restored` (the highest epoch of
/// restored events), and returns it; see [`PgEventStore::raise_epoch`].
pub(crate) async fn raise_epoch_in(
    transaction: &deadpool_postgres::Transaction<'_>,
    restored: i32,
) -> Result<u32, tokio_postgres::Error> {
    transaction.execute("SELECT pg_advisory_xact_lock($1)", &[&EPOCH_LOCK_KEY]).await?;
    let row = transaction
        .query_one(
            "UPDATE log_meta SET current_epoch = greatest(current_epoch, $1) + 1 \
             RETURNING current_epoch",
            &[&restored],
        )
        .await?;
    transaction
        .execute(
            "UPDATE streams SET last_tx_id = '0'::xid8 WHERE last_tx_id > pg_current_xact_id()",
            &[],
        )
        .await?;
    Ok(u32::try_from(row.get::<_, i32>(0)).unwrap_or_default())
}
