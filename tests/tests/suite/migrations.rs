//! The migrations runner: applies once, is safe to run concurrently, refuses a changed file.

use leasehold_adapters::migrations::MIGRATIONS_TABLE;
use leasehold_adapters::{MigrateError, migrate};
use leasehold_tests::TestDb;

#[tokio::test]
async fn migrating_twice_applies_once() {
    let db = TestDb::empty().await;
    let first = migrate(&db.url).await.unwrap();
    assert_eq!(first.applied, leasehold_adapters::migrations::embedded());
    assert_eq!(first.applied[..2], ["0001_log.sql", "0002_append.sql"]);
    let second = migrate(&db.url).await.unwrap();
    assert!(second.applied.is_empty());
    let mut client = db.client().await;
    assert!(leasehold_adapters::migrations::is_current(&mut client).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_do_not_race() {
    let db = TestDb::empty().await;
    let runs = futures_util::future::join_all((0..4).map(|_| migrate(&db.url))).await;
    let applied: usize = runs.into_iter().map(|run| run.unwrap().applied.len()).sum();
    let embedded = leasehold_adapters::migrations::embedded().len();
    assert_eq!(applied, embedded, "every migration applied exactly once across the runs");
}

#[tokio::test]
async fn an_applied_migration_whose_file_changed_is_refused() {
    let db = TestDb::migrated().await;
    // Record a checksum the embedded file does not have, as if the file had been edited
    // after it was applied.
    let client = db.client().await;
    let sql = format!("UPDATE {MIGRATIONS_TABLE} SET checksum = '12345' WHERE version = 1");
    client.execute(&sql, &[]).await.unwrap();

    let error = migrate(&db.url).await.unwrap_err();
    match &error {
        MigrateError::Changed { file, applied_checksum, .. } => {
            assert_eq!(file, "0001_log.sql");
            assert_eq!(*applied_checksum, 12345);
        }
        other => panic!("expected Changed, got {other:?}"),
    }
    assert!(error.to_string().contains("0001_log.sql"));
}

#[tokio::test]
async fn a_failing_migration_applies_nothing() {
    let db = TestDb::empty().await;
    // A table in the way makes 0001 fail part-way; nothing of the run may remain.
    let client = db.client().await;
    client.batch_execute("CREATE TABLE snapshots (x int)").await.unwrap();
    let error = migrate(&db.url).await.unwrap_err();
    assert!(matches!(error, MigrateError::Failed { .. }), "{error:?}");
    let streams: Option<String> =
        client.query_one("SELECT to_regclass('streams')::text", &[]).await.unwrap().get(0);
    assert_eq!(streams, None, "0001 was rolled back");
}
