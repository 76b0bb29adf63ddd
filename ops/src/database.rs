//! Creating and dropping databases on a server.

use anyhow::Context as _;
use leasehold_adapters::DatabaseUrl;

/// The server's maintenance database, used to create and drop others.
const MAINTENANCE_DATABASE: &str = "postgres";

async fn admin(url: &DatabaseUrl) -> anyhow::Result<tokio_postgres::Client> {
    url.with_database(MAINTENANCE_DATABASE)
        .connect()
        .await
        .with_context(|| format!("the database server at {} is unreachable", url.endpoint()))
}

fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Creates the URL's database if the server does not have it yet.
pub async fn ensure_exists(url: &DatabaseUrl) -> anyhow::Result<()> {
    let client = admin(url).await?;
    let name = url.database();
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await
        .context("looking up the database")?
        .is_some();
    if !exists {
        let created = client.batch_execute(&format!("CREATE DATABASE {}", quoted(name))).await;
        // Another process may have created it in the meantime; that is fine.
        if let Err(error) = created
            && error.code() != Some(&tokio_postgres::error::SqlState::DUPLICATE_DATABASE)
        {
            return Err(error).context(format!("creating database {name}"));
        }
        tracing::info!(database = name, "created database");
    }
    Ok(())
}

/// A database that exists only while a command runs (the benchmark's).
pub struct ScratchDatabase {
    /// Its URL.
    pub url: DatabaseUrl,
}

impl ScratchDatabase {
    /// Creates `<database>_<purpose>_<pid>` beside the URL's database.
    pub async fn create(beside: &DatabaseUrl, purpose: &str) -> anyhow::Result<Self> {
        let name = format!("{}_{purpose}_{}", beside.database(), std::process::id());
        let client = admin(beside).await?;
        // Two statements: DROP DATABASE cannot share an implicit transaction.
        for sql in ["DROP DATABASE IF EXISTS {} WITH (FORCE)", "CREATE DATABASE {}"] {
            client
                .batch_execute(&sql.replace("{}", &quoted(&name)))
                .await
                .with_context(|| format!("creating scratch database {name}"))?;
        }
        Ok(Self { url: beside.with_database(&name) })
    }

    /// Drops it, ending any connection still open to it.
    pub async fn drop_now(self) -> anyhow::Result<()> {
        let client = admin(&self.url).await?;
        let sql = format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quoted(self.url.database()));
        client.batch_execute(&sql).await.context("dropping the scratch database")
    }
}
