//! Connecting to PostgreSQL: parsing a database URL, describing it without its password, and
//! building the connection pool.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;
use tokio_postgres::config::Host;

use crate::limits::{
    CONNECT_TIMEOUT_SECONDS, IDLE_IN_TRANSACTION_TIMEOUT_MILLISECONDS, POOL_WAIT_TIMEOUT_SECONDS,
};

/// Why a database URL could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DatabaseUrlError {
    /// The URL did not parse. The message never repeats the URL, which may hold a password.
    #[error("the database URL is malformed: {reason}")]
    Malformed {
        /// What the parser reported.
        reason: String,
    },
    /// The URL names no database.
    #[error("the database URL names no database (add /NAME at its end)")]
    NoDatabase,
    /// The pool could not be built.
    #[error("the connection pool could not be built: {reason}")]
    Pool {
        /// What deadpool reported.
        reason: String,
    },
}

/// A parsed database URL.
#[derive(Clone)]
pub struct DatabaseUrl {
    config: tokio_postgres::Config,
}

impl std::fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        write!(f, "DatabaseUrl({}/{})", self.endpoint(), self.database())
    }
}

impl DatabaseUrl {
    /// Parses a `postgres://user[:password]@host[:port]/database` URL.
    pub fn parse(url: &str) -> Result<Self, DatabaseUrlError> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| DatabaseUrlError::Malformed {
                reason: e.to_string(),
            })?;
        if config.get_dbname().is_none() {
            return Err(DatabaseUrlError::NoDatabase);
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(Duration::from_secs(CONNECT_TIMEOUT_SECONDS));
        }
        if config.get_application_name().is_none() {
            config.application_name("leasehold");
        }
        // A transaction left open holds back every whole-log reader; never let one idle long.
        let timeout = format!(
            "-c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MILLISECONDS}"
        );
        config.options(&timeout);
        Ok(Self { config })
    }

    /// `host:port` (or the socket directory) of the first host, for messages.
    pub fn endpoint(&self) -> String {
        let port = self.config.get_ports().first().copied().unwrap_or(5432);
        match self.config.get_hosts().first() {
            Some(Host::Tcp(host)) => format!("{host}:{port}"),
            Some(Host::Unix(path)) => format!("{}:{port}", path.display()),
            None => format!("localhost:{port}"),
        }
    }

    /// The database name.
    pub fn database(&self) -> &str {
        self.config.get_dbname().unwrap_or_default()
    }

    /// The same server, another database (used to create or drop databases).
    pub fn with_database(&self, database: &str) -> Self {
        let mut config = self.config.clone();
        config.dbname(database);
        Self { config }
    }

    /// The driver's configuration.
    pub fn config(&self) -> &tokio_postgres::Config {
        &self.config
    }

    /// A pool of at most `size_max` connections.
    pub fn pool(&self, size_max: usize) -> Result<Pool, DatabaseUrlError> {
        let manager = Manager::from_config(
            self.config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        Pool::builder(manager)
            .max_size(size_max)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(Duration::from_secs(POOL_WAIT_TIMEOUT_SECONDS)))
            .create_timeout(Some(Duration::from_secs(CONNECT_TIMEOUT_SECONDS)))
            .build()
            .map_err(|e| DatabaseUrlError::Pool { reason: e.to_string() })
    }

    /// One connection outside any pool; its driver task runs until the client is dropped.
    pub async fn connect(&self) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        let (client, connection) = self.config.connect(NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "database connection closed");
            }
        });
        Ok(client)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_the_endpoint_without_the_password() {
        let url = DatabaseUrl::parse("postgres://alice:s3cret@db.example:6543/ledger").unwrap();
        assert_eq!(url.endpoint(), "db.example:6543");
        assert_eq!(url.database(), "ledger");
        assert!(!format!("{url:?}").contains("s3cret"));
    }

    #[test]
    fn refuses_a_url_without_database_or_malformed() {
        assert!(matches!(
            DatabaseUrl::parse("postgres://alice@db.example:6543"),
            Err(DatabaseUrlError::NoDatabase)
        ));
        let error = DatabaseUrl::parse("postgres://alice:s3cret@db:notaport/x").unwrap_err();
        assert!(matches!(error, DatabaseUrlError::Malformed { .. }));
        assert!(!error.to_string().contains("s3cret"));
    }
}
