//! Builders and waits shared by the tests.

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

/// Every event of the whole log after `after`, read in pages of `page`.
pub async fn read_whole_log(
    store: &impl EventStore,
    after: Cursor,
    page: usize,
) -> Vec<RecordedEvent> {
    let mut events = Vec::new();
    let mut cursor = after;
    loop {
        let read = store.read_log(cursor, page).await.unwrap();
        if read.events.is_empty() {
            return events;
        }
        cursor = read.next;
        events.extend(read.events);
    }
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
