//! (f) The hash chain verifies, and tampering directly in SQL is found where it happened.

use leasehold_adapters::canonical::to_canonical_json;
use leasehold_adapters::chain::{CanonicalPieces, GENESIS_HASH, canonical_event_text, chain_hash};
use leasehold_adapters::verify::{BreakKind, ChainBreak};
use leasehold_domain::{EventStore, ExpectedVersion, RecordedEvent};
use leasehold_tests::TestDb;
use serde_json::json;

use crate::support::{append, event, read_whole_stream, stream};

async fn three_streams(store: &impl EventStore) {
    for (name, count) in [("s1", 2), ("s2", 4), ("s3", 1)] {
        let events = (0..count)
            .map(|n| event("Charged", json!({"amount": 42, "n": n, "note": "ünïcode \"q\""})))
            .collect();
        store.append(vec![append(name, ExpectedVersion::NoStream, events)]).await.unwrap();
    }
}

fn recompute(event: &RecordedEvent) -> [u8; 32] {
    let metadata_json = to_canonical_json(&serde_json::to_value(&event.metadata).unwrap());
    let payload_json = to_canonical_json(&event.payload);
    let text = canonical_event_text(&CanonicalPieces {
        event_id: event.event_id.as_uuid(),
        event_type: event.event_type.as_str(),
        metadata_json: &metadata_json,
        payload_json: &payload_json,
        recorded_at: event.recorded_at,
        schema_version: u32::from(event.schema_version),
        stream_id: event.stream_id.as_str(),
        stream_type: event.stream_type.as_str(),
        tenant_id: event.tenant_id.as_str(),
        version: event.version,
    });
    chain_hash(&event.prev_hash, &text)
}

#[tokio::test]
async fn the_chain_verifies_and_can_be_recomputed_from_what_is_read() {
    let db = TestDb::migrated().await;
    let store = db.store();
    three_streams(&store).await;

    let s2 = read_whole_stream(&store, &stream("s2"), 10).await;
    assert_eq!(s2[0].prev_hash, GENESIS_HASH);
    for pair in s2.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash);
    }
    for event in &s2 {
        assert_eq!(recompute(event), event.hash, "hash of version {}", event.version);
    }

    let report = store.verify_log(|_| {}).await.unwrap();
    assert_eq!(report.events_checked, 7);
    assert_eq!(report.streams_checked, 3);
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
}

#[tokio::test]
async fn a_byte_changed_in_sql_is_found_at_its_position() {
    let db = TestDb::migrated().await;
    let store = db.store();
    three_streams(&store).await;
    let target = read_whole_stream(&store, &stream("s2"), 10).await[2].clone();

    // 42 -> 43: one byte of one payload.
    let client = db.client().await;
    let changed = client
        .execute(
            "UPDATE events SET payload = jsonb_set(payload, '{amount}', '43') \
             WHERE stream_id = 's2' AND version = 3",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(changed, 1);

    let report = store.verify_log(|_| {}).await.unwrap();
    assert_eq!(
        report.breaks,
        vec![ChainBreak {
            stream_id: "s2".into(),
            version: 3,
            position: target.cursor.position,
            line: 0,
            kind: BreakKind::HashMismatch,
        }]
    );
}

#[tokio::test]
async fn a_deleted_event_is_found_as_a_gap() {
    let db = TestDb::migrated().await;
    let store = db.store();
    three_streams(&store).await;
    let client = db.client().await;
    client.execute("DELETE FROM events WHERE stream_id = 's2' AND version = 2", &[]).await.unwrap();

    let report = store.verify_log(|_| {}).await.unwrap();
    assert_eq!(report.breaks.len(), 1, "{:?}", report.breaks);
    assert_eq!(report.breaks[0].version, 3);
    assert_eq!(report.breaks[0].kind, BreakKind::VersionGap { expected: 2 });
}
