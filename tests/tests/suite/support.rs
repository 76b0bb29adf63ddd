//! Builders and waits shared by the tests.

use std::time::Duration;

use leasehold_adapters::PgEventStore;
use leasehold_domain::{
    Cursor, EventId, EventStore, EventType, ExpectedVersion, Metadata, NewEvent, RecordedEvent,
    StreamAppend, StreamId, StreamType, TenantId,
};
use serde_json::Value;

pub const TENANT: &str = "acme";

/// An event with a fresh v7 id.
pub fn event(event_type: &str, payload: Value) -> NewEvent {
    NewEvent {
        event_id: EventId::from_uuid(uuid::Uuid::now_v7()),
        event_type: EventType::parse(event_type).unwrap(),
        schema_version: 1,
        payload,
        metadata: Metadata::default(),
    }
}

/// An append of `events` to `stream` (type `lease`, tenant [`TENANT`]).
pub fn append(stream: &str, expected: ExpectedVersion, events: Vec<NewEvent>) -> StreamAppend {
    StreamAppend {
        stream_id: StreamId::parse(stream).unwrap(),
        stream_type: StreamType::parse("lease").unwrap(),
        tenant_id: TenantId::parse(TENANT).unwrap(),
        expected,
        events,
    }
}

pub fn stream(id: &str) -> StreamId {
    StreamId::parse(id).unwrap()
}

/// Every event of the whole log after `after` up to and including `through`, read in pages
/// of `page`. Waits (at most 30 s per page) for the horizon to pass `through`: a writing
/// transaction in any database of the server, another test's included, holds it back.
pub async fn read_log_through(
    store: &PgEventStore,
    after: Cursor,
    page: usize,
    through: Cursor,
) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    let mut cursor = after;
    while cursor < through {
        let read = store.wait_for_log(cursor, page, Duration::from_secs(30)).await.unwrap();
        assert!(!read.events.is_empty(), "the log did not reach {through} within 30 s");
        cursor = read.next;
        events.extend(read.events);
    }
    events
}

/// Every event of one stream, read in pages of `page`.
pub async fn read_whole_stream(
    store: &impl EventStore,
    id: &StreamId,
    page: usize,
) -> Vec<RecordedEvent> {
    let mut events: Vec<RecordedEvent> = Vec::new();
    loop {
        let from = events.last().map_or(1, |e| e.version + 1);
        let read = store.read_stream(id, from, page).await.unwrap();
        let done = read.len() < page;
        events.extend(read);
        if done {
            return events;
        }
    }
}

/// Waits (at most 30 s) until a backend of `observer`'s database waits for a lock: backend
/// `pid` if given, else any.
pub async fn until_waiting_for_a_lock(observer: &tokio_postgres::Client, pid: Option<i32>) {
    let waiting = async {
        loop {
            let row = observer
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                     AND wait_event_type = 'Lock' AND ($1::int4 IS NULL OR pid = $1)",
                    &[&pid],
                )
                .await
                .expect("pg_stat_activity");
            if row.get::<_, i64>(0) >= 1 {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waiting).await.expect("it waits in time");
}

/// How many events the whole log holds, counted in the table: the log's readers stop at
/// the horizon, which a commit a moment old may not have passed yet.
pub async fn log_len(db: &leasehold_tests::TestDb) -> i64 {
    let row = db.client().await.query_one("SELECT count(*) FROM events", &[]).await;
    row.expect("readable").get(0)
}
