//! Catching up with the log: page after page up to the horizon, with the next page's query
//! already running on the server while the current page is decoded and handed over.

use std::future::Future as _;
use std::ops::ControlFlow;
use std::task::Poll;

use leasehold_domain::{Cursor, LogPage, StoreError};

use super::errors::from_driver;
use super::rows::cursor_of;
use super::xid8::Xid8;
use super::{PgEventStore, decode_all, page_limit, read_log_sql, to_i64};

impl PgEventStore {
    /// Reads every event after `after` that a whole-log reader can see now, in pages of
    /// `page_size`, handing each page to `deliver` until it breaks or the log is read. Returns
    /// the cursor of the last event delivered (`after` if none). Pages are exactly those
    /// `read_log` returns; the next one is requested before the current one is decoded.
    pub async fn catch_up(
        &self,
        after: Cursor,
        page_size: usize,
        mut deliver: impl FnMut(LogPage) -> ControlFlow<()>,
    ) -> Result<Cursor, StoreError> {
        let limit = page_limit(page_size)?;
        let client = self.client().await?;
        let endpoint = self.endpoint();
        let statement =
            client.prepare_cached(&read_log_sql()).await.map_err(|e| from_driver(e, endpoint))?;
        let fetch = |cursor: Cursor| {
            let (client, statement) = (&client, &statement);
            async move {
                let epoch = i32::try_from(cursor.log_epoch).unwrap_or(i32::MAX);
                let (tx_id, position) = (Xid8(cursor.tx_id), to_i64(cursor.position));
                client
                    .query(statement, &[&epoch, &tx_id, &position, &limit])
                    .await
                    .map_err(|e| from_driver(e, endpoint))
            }
        };
        let mut delivered = after;
        let mut pending = Box::pin(fetch(after));
        let mut ready = None;
        loop {
            let rows = match ready.take() {
                Some(rows) => rows,
                None => pending.as_mut().await,
            }?;
            let Some(next) = rows.last().map(cursor_of) else { return Ok(delivered) };
            pending = Box::pin(fetch(next));
            // One poll sends the query; the server works on it while this page is decoded.
            std::future::poll_fn(|cx| {
                if let Poll::Ready(result) = pending.as_mut().poll(cx) {
                    ready = Some(result);
                }
                Poll::Ready(())
            })
            .await;
            let events = decode_all(&rows)?;
            delivered = next;
            if deliver(LogPage { events, next }).is_break() {
                return Ok(delivered);
            }
        }
    }
}
