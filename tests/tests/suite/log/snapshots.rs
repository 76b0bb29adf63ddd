//! Aggregate snapshots: postcard round trip; another state schema is ignored; an older
//! version never replaces a newer one.

use leasehold_tests::TestDb;
use serde::{Deserialize, Serialize};

use crate::support::stream;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct LeaseState {
    status: String,
    fail_count: u32,
    items: Vec<(String, u32)>,
}

#[tokio::test]
async fn snapshots_round_trip_and_respect_schema_and_version() {
    let db = TestDb::migrated().await;
    let store = db.store();
    let id = stream("lease-1");
    let state =
        LeaseState { status: "ready".into(), fail_count: 2, items: vec![("gpu".into(), 1)] };
    assert!(store.load_snapshot::<LeaseState>(&id, 1).await.unwrap().is_none());

    store.save_snapshot(&id, 10, 1, &state).await.unwrap();
    let loaded = store.load_snapshot::<LeaseState>(&id, 1).await.unwrap().unwrap();
    assert_eq!((loaded.version, loaded.state), (10, state.clone()));

    // A reader of another state schema rebuilds from events instead.
    assert!(store.load_snapshot::<LeaseState>(&id, 2).await.unwrap().is_none());

    // An older snapshot arriving late does not replace the newer one.
    let older = LeaseState { status: "provisioning".into(), ..state.clone() };
    store.save_snapshot(&id, 5, 1, &older).await.unwrap();
    let loaded = store.load_snapshot::<LeaseState>(&id, 1).await.unwrap().unwrap();
    assert_eq!(loaded.version, 10);
    assert_eq!(loaded.state, state);
}
