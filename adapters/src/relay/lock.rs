//! One relay a topic at a time. Two would publish every event twice and move one checkpoint
//! back and forth; so a relay holds a session advisory lock named for it, on a connection of
//! its own, and another relay of the same topic stands by until the lock is free (its holder
//! stopped, or died and the server ended its session). Every write of the checkpoint goes
//! through that connection: a relay whose connection (and with it the lock) was lost cannot
//! write again, and stops.

use deadpool_postgres::ClientWrapper;
use leasehold_domain::StoreError;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use crate::store::{PgEventStore, from_driver};

/// The advisory locks' class for relays ("LR"); the key is the relay name's hash.
const RELAY_LOCK_CLASS: i32 = 0x4c52;

/// A relay's own connection, holding its lock (once taken) while the value lives.
pub(super) struct RelayLock {
    client: ClientWrapper,
    endpoint: String,
}

impl RelayLock {
    /// A connection of its own, for relay `name`'s lock: not yet taken.
    pub(super) async fn open(store: &PgEventStore) -> Result<RelayLock, StoreError> {
        let client = deadpool_postgres::Object::take(store.client().await?);
        Ok(RelayLock { client, endpoint: store.endpoint().to_owned() })
    }

    /// Takes relay `name`'s lock if no other session holds it; `true` once it is held.
    pub(super) async fn try_lock(&self, name: &str) -> Result<bool, StoreError> {
        let sql = "SELECT pg_try_advisory_lock($1, hashtext($2))";
        let rows = self.query(sql, &[&RELAY_LOCK_CLASS, &name]).await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, bool>(0)))
    }

    /// Whether the lock is still this relay's: its session answers. Once the server ended
    /// the session, the lock is free for another relay, and this one must stop publishing.
    /// One round trip, asked before each page is published.
    pub(super) async fn still_held(&self) -> Result<(), StoreError> {
        self.client.simple_query("").await.map(|_| ()).map_err(|error| {
            let reason = format!("the session holding the relay's lock ended: {error}");
            StoreError::Unavailable { endpoint: self.endpoint.clone(), reason }
        })
    }

    /// Runs `sql` on the lock's connection.
    pub(super) async fn query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        let statement =
            self.client.prepare_cached(sql).await.map_err(|e| from_driver(e, &self.endpoint))?;
        self.client.query(&statement, params).await.map_err(|e| from_driver(e, &self.endpoint))
    }
}
