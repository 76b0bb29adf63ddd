//! Test support shared by Leasehold's integration tests: every test gets its own freshly
//! created (and afterwards dropped) PostgreSQL database, so tests run in parallel.
//!
//! The server is `LEASEHOLD_TEST_DATABASE_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); the URL's database is only used to create
//! and drop the per-test databases.

use leasehold_adapters::{DatabaseUrl, PgEventStore, StoreConfig, migrate};
use leasehold_domain::{Cursor, EventStore as _};

pub mod invariants;
pub mod kafka;
mod listening;
pub mod rng;

pub use listening::{documented_routes, routes_in, spawn_listening};

/// The server tests run against.
pub fn server_url() -> DatabaseUrl {
    let url = std::env::var("LEASEHOLD_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
    DatabaseUrl::parse(&url).expect("LEASEHOLD_TEST_DATABASE_URL is a valid database URL")
}

/// A database that exists for one test and is dropped when the value is.
#[derive(Debug)]
pub struct TestDb {
    /// The test's database.
    pub url: DatabaseUrl,
    admin: DatabaseUrl,
    name: String,
}

impl TestDb {
    /// A new database with every migration applied.
    pub async fn migrated() -> TestDb {
        let db = TestDb::empty().await;
        migrate(&db.url).await.expect("migrations apply to a fresh database");
        db
    }

    /// A new, empty database.
    pub async fn empty() -> TestDb {
        let admin = server_url();
        let name = format!("lh_test_{}", uuid::Uuid::now_v7().simple());
        let client = admin.connect().await.expect("the test PostgreSQL server is reachable");
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("the test database can be created");
        TestDb { url: admin.with_database(&name), admin, name }
    }

    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An event store over this database with the default settings.
    pub fn store(&self) -> PgEventStore {
        self.store_with(StoreConfig::default())
    }

    /// An event store over this database.
    pub fn store_with(&self, config: StoreConfig) -> PgEventStore {
        PgEventStore::new(&self.url, config).expect("the test URL makes a pool")
    }

    /// A connection of its own, outside any pool.
    pub async fn client(&self) -> tokio_postgres::Client {
        self.url.connect().await.expect("the test database is reachable")
    }

    /// The log's head once every event committed so far is below the read horizon (waited
    /// for, at most 30 s). `EventStore::head` alone can lag behind a commit the test made: a
    /// writing transaction anywhere on the server, another test's included, holds the
    /// horizon back, and a wait for the relay or a projector to pass such a head ends early.
    pub async fn settled_head(&self) -> Cursor {
        let client = self.client().await;
        let newest = "SELECT log_epoch, tx_id::text, position FROM events \
                      ORDER BY log_epoch DESC, tx_id DESC, position DESC LIMIT 1";
        let row = client.query_opt(newest, &[]).await.expect("the newest event");
        let Some(row) = row else { return Cursor::START };
        let newest = Cursor {
            log_epoch: u32::try_from(row.get::<_, i32>(0)).expect("an epoch"),
            tx_id: row.get::<_, String>(1).parse().expect("a transaction id"),
            position: u64::try_from(row.get::<_, i64>(2)).expect("a position"),
        };
        let store = self.store();
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let head = store.head().await.expect("the head");
            if head >= newest {
                return head;
            }
            assert!(tokio::time::Instant::now() < deadline, "the horizon did not pass in 30 s");
            let waited = store.wait_for_log(head, 1, std::time::Duration::from_secs(1)).await;
            waited.expect("the log is readable");
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop cannot await; run the DROP on a runtime of its own, in a thread, so it works
        // whether or not the test's runtime is still alive.
        let admin = self.admin.clone();
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name);
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            runtime.block_on(async move {
                let client = admin.connect().await.map_err(std::io::Error::other)?;
                client.batch_execute(&sql).await.map_err(std::io::Error::other)
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test database {}: {dropped:?}", self.name);
        }
    }
}
