//! Bad input is refused with a typed error before any SQL runs; an unreachable database is
//! named without its password.

use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig};
use leasehold_domain::{
    Cursor, EventStore, EventType, ExpectedVersion, IdError, StoreError, StreamId, ValidationError,
};
use serde_json::json;

use crate::support::{append, event, stream};

fn invalid<T: std::fmt::Debug>(result: Result<T, StoreError>) -> ValidationError {
    match result {
        Err(StoreError::Invalid(error)) => error,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

/// A store whose database can never answer: any error other than a validation error would
/// prove that SQL was attempted.
fn store_without_database(payload_max_bytes: usize) -> PgEventStore {
    let url = DatabaseUrl::parse("postgres://leasehold:hunter2@127.0.0.1:1/nowhere").unwrap();
    PgEventStore::new(&url, StoreConfig { payload_max_bytes, ..Default::default() }).unwrap()
}

#[tokio::test]
async fn malformed_appends_are_refused_before_any_sql() {
    let store = store_without_database(64);

    assert_eq!(invalid(store.append(vec![]).await), ValidationError::EmptyAppend);
    let no_events = append("s", ExpectedVersion::Any, vec![]);
    assert!(matches!(
        invalid(store.append(vec![no_events]).await),
        ValidationError::NoEventsForStream { .. }
    ));
    let big = append("s", ExpectedVersion::Any, vec![event("E", json!("x".repeat(100)))]);
    assert!(matches!(
        invalid(store.append(vec![big]).await),
        ValidationError::PayloadTooLarge { size_bytes: 102, max_bytes: 64, .. }
    ));
    let nul = append("s", ExpectedVersion::Any, vec![event("E", json!("\u{0}"))]);
    assert!(matches!(invalid(store.append(vec![nul]).await), ValidationError::NulCharacter { .. }));
    assert!(matches!(
        invalid(store.read_log(Cursor::START, 0).await),
        ValidationError::PageSize { requested: 0, .. }
    ));
    assert!(matches!(
        invalid(store.read_stream(&stream("s"), 1, 1_000_000).await),
        ValidationError::PageSize { .. }
    ));
}

#[test]
fn malformed_names_cannot_be_built() {
    assert!(matches!(StreamId::parse("lease/1"), Err(IdError::BadCharacter { .. })));
    assert!(matches!(StreamId::parse("x".repeat(201)), Err(IdError::TooLong { .. })));
    assert!(matches!(StreamId::parse(""), Err(IdError::Empty { .. })));
    assert!(matches!(EventType::parse(""), Err(IdError::Empty { .. })));
    let error: ValidationError = EventType::parse("").unwrap_err().into();
    assert_eq!(error.to_string(), "event type must not be empty");
}

#[tokio::test]
async fn an_unreachable_database_is_named_without_its_password() {
    let store = store_without_database(1024);
    let result =
        store.append(vec![append("s", ExpectedVersion::Any, vec![event("E", json!({}))])]).await;
    let error = result.unwrap_err();
    assert!(matches!(error, StoreError::Unavailable { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("127.0.0.1:1"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!format!("{error:?}").contains("hunter2"));
}
