//! What the append function derives (versions, prev_hash, new heads) and the shape rules the
//! log's columns hold whoever writes them (schema/postgres/0007_append_derived.sql).

use leasehold_domain::{EventStore, ExpectedVersion};
use leasehold_tests::TestDb;
use serde_json::json;
use tokio_postgres::error::SqlState;

use crate::support::{append, event, read_whole_stream, stream};

#[tokio::test]
async fn versions_and_prev_hashes_are_derived_from_each_entrys_head_in_the_callers_order() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let two = || (0..2).map(|n| event("Happened", json!({"n": n}))).collect();
    store.append(vec![append("m-b", ExpectedVersion::NoStream, two())]).await.unwrap();
    // The caller's order (c, b, a) is not the lock order (a, b, c), and b already has a head.
    let outcome = store
        .append(vec![
            append("m-c", ExpectedVersion::NoStream, vec![event("Happened", json!({"c": 1}))]),
            append("m-b", ExpectedVersion::Exact(2), two()),
            append("m-a", ExpectedVersion::NoStream, two()),
        ])
        .await
        .unwrap();
    let versions: Vec<u64> = outcome.stream_versions.iter().map(|(_, v)| *v).collect();
    assert_eq!(versions, [1, 4, 2]);

    let b = read_whole_stream(&store, &stream("m-b"), 10).await;
    assert_eq!(b.iter().map(|e| e.version).collect::<Vec<_>>(), [1, 2, 3, 4]);
    for pair in b.windows(2) {
        assert_eq!(pair[1].prev_hash, pair[0].hash, "version {}", pair[1].version);
    }
    let a = read_whole_stream(&store, &stream("m-a"), 10).await;
    // Positions follow the caller's order: c's event, then b's, then a's.
    let c = read_whole_stream(&store, &stream("m-c"), 10).await;
    assert!(c[0].cursor < b[2].cursor && b[3].cursor < a[0].cursor);

    // The heads the function stored are the ones the next append chains from.
    store.append(vec![append("m-b", ExpectedVersion::Exact(4), two())]).await.unwrap();
    let report = store.verify_log(|_| {}).await.unwrap();
    assert_eq!(report.events_checked, 9);
    assert!(report.breaks.is_empty(), "{:?}", report.breaks);
}

#[tokio::test]
async fn a_row_of_the_wrong_shape_is_refused_whoever_writes_it() {
    let db = TestDb::migrated().await;
    let client = db.client().await;
    let hash = |n: usize| format!("'\\x{}'::bytea", "11".repeat(n));
    let event_row = |version: i64, schema: i32, prev: usize, hash_len: usize| {
        format!(
            "INSERT INTO events (event_id, stream_id, version, stream_type, tenant_id, \
             event_type, schema_version, payload, metadata, recorded_at, prev_hash, hash) \
             VALUES (gen_random_uuid(), 's', {version}, 'test', 'acme', 'Happened', {schema}, \
             '{{}}', '{{}}', now(), {}, {})",
            hash(prev),
            hash(hash_len)
        )
    };
    let stream_row = |version: i64, hash_len: usize| {
        format!(
            "INSERT INTO streams (stream_id, stream_type, tenant_id, version, last_hash, \
             last_tx_id) VALUES ('s', 'test', 'acme', {version}, {}, pg_current_xact_id())",
            hash(hash_len)
        )
    };
    for bad in [
        event_row(0, 1, 32, 32),
        event_row(1, -1, 32, 32),
        event_row(1, 1, 31, 32),
        event_row(1, 1, 32, 33),
        stream_row(0, 32),
        stream_row(1, 0),
    ] {
        let error = client.batch_execute(&bad).await.expect_err(&bad);
        assert_eq!(error.code(), Some(&SqlState::CHECK_VIOLATION), "{bad}: {error}");
    }
    client.batch_execute(&event_row(1, 0, 32, 32)).await.expect("a row of the right shape");
    client.batch_execute(&stream_row(1, 32)).await.expect("a row of the right shape");
}

/// Index tuples the current transaction fetched from `streams`.
async fn streams_fetched(tx: &tokio_postgres::Transaction<'_>) -> i64 {
    let row = tx
        .query_one(
            "SELECT coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables \
             WHERE relname = 'streams'",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

#[tokio::test]
async fn an_append_reads_its_own_streams_rows_not_the_whole_streams_index() {
    // The generic plan of a join between the entries and `streams`, with the entries planned
    // as a thousand rows (a generate_series over a parameter), read far more of the key index
    // than its own rows, more on every append; single appends at 16 writers ran at half speed.
    let db = TestDb::migrated().await;
    let store = db.store();
    for batch in 0..30 {
        let appends = (0..100)
            .map(|s| {
                let name = format!("wide-{batch}-{s}");
                append(&name, ExpectedVersion::NoStream, vec![event("Happened", json!({}))])
            })
            .collect();
        store.append(appends).await.unwrap();
    }
    db.client().await.batch_execute("ANALYZE streams").await.unwrap();

    let mut connection = store.pool().get().await.unwrap();
    for attempt in 0..2 {
        let tx = connection.transaction().await.unwrap();
        let before = streams_fetched(&tx).await;
        let appends: Vec<_> = (0..10)
            .map(|s| {
                let name = format!("wide-{attempt}-{s}");
                append(&name, ExpectedVersion::Exact(1), vec![event("Happened", json!({}))])
            })
            .collect();
        store.append_in(&tx, &appends).await.unwrap();
        let fetched = streams_fetched(&tx).await - before;
        // Ten streams, each locked once and updated once: twenty fetches. (The plan that
        // joined through the whole index fetched 101, then 201 on the next append.)
        assert!(fetched <= 40, "attempt {attempt}: {fetched} index fetches from streams");
        tx.commit().await.unwrap();
    }
}

#[tokio::test]
async fn an_append_planned_while_streams_looked_empty_reads_only_its_own_rows() {
    // The append's generic plan is made once per connection, from the statistics of that
    // moment. Made while they said `streams` was empty (a new database, analyzed before its
    // first append), the plan updated the stream rows by walking the whole key index and
    // joining the entries to it, on every append: 100-event appends ran at a fifth of their
    // speed once a few thousand streams existed. Autovacuum is kept off `streams` so that the
    // statistics stay as they were when the plans were made.
    let db = TestDb::migrated().await;
    let client = db.client().await;
    for sql in ["ALTER TABLE streams SET (autovacuum_enabled = false)", "VACUUM ANALYZE streams"] {
        client.batch_execute(sql).await.unwrap();
    }
    let store = db.store();
    for batch in 0..30 {
        let appends = (0..100)
            .map(|s| {
                let name = format!("grown-{batch}-{s}");
                append(&name, ExpectedVersion::NoStream, vec![event("Happened", json!({}))])
            })
            .collect();
        store.append(appends).await.unwrap();
    }
    // Another process moves one stream, so this store's remembered head of it is stale and
    // its next append to it takes the checked path as well as the usual one.
    let other = db.store();
    let moved = append("grown-0-0", ExpectedVersion::Any, vec![event("Moved", json!({}))]);
    other.append(vec![moved]).await.unwrap();

    let mut connection = store.pool().get().await.unwrap();
    let cases: [(&str, Vec<_>); 3] = [
        (
            "new streams",
            (0..10).map(|s| (format!("fresh-{s}"), ExpectedVersion::NoStream)).collect(),
        ),
        (
            "existing streams",
            (0..10).map(|s| (format!("grown-1-{s}"), ExpectedVersion::Exact(1))).collect(),
        ),
        ("a stale head", vec![("grown-0-0".to_string(), ExpectedVersion::Any)]),
    ];
    for (case, streams) in cases {
        let tx = connection.transaction().await.unwrap();
        let before = streams_fetched(&tx).await;
        let appends: Vec<_> = streams
            .iter()
            .map(|(name, expected)| append(name, *expected, vec![event("Happened", json!({}))]))
            .collect();
        store.append_in(&tx, &appends).await.unwrap();
        let fetched = streams_fetched(&tx).await - before;
        // At most a lock, a read and an update per stream: 3,000 streams exist.
        assert!(fetched <= 40, "{case}: {fetched} index fetches from streams");
        tx.commit().await.unwrap();
    }
}
