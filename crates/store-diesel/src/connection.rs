//! One connection type for both backends, the r2d2 pool around it and the embedded migrations.

use std::path::Path;
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, ConnectionError, PgConnection, SqliteConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use domain::StoreError;

use crate::error::DbError;

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations/sqlite");
const POSTGRES_MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations/postgres");

/// A connection to either backend. Every query is written once against this type.
#[derive(diesel::MultiConnection)]
pub enum AnyConnection {
    Postgresql(PgConnection),
    Sqlite(SqliteConnection),
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// How to reach the database.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    /// `sqlite://PATH` (or `sqlite:PATH`) or `postgres://...` / `postgresql://...`.
    pub url: String,
    pub pool_size: u32,
    /// How long a request waits for a free connection before the store reports itself unavailable.
    pub acquire_timeout: Duration,
}

impl DatabaseConfig {
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), pool_size: 8, acquire_timeout: Duration::from_secs(5) }
    }
}

/// What the manager connects to: the backend and its native connection string.
#[derive(Debug, Clone)]
struct DatabaseAddress {
    backend: Backend,
    address: String,
}

impl DatabaseAddress {
    fn parse(url: &str) -> Result<Self, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(Self { backend: Backend::Postgres, address: url.to_owned() });
        }
        let path =
            url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")).ok_or_else(|| {
                format!("unsupported database URL (expected sqlite://PATH or postgres://...): {url}")
            })?;
        if path.is_empty() {
            return Err("the sqlite:// URL has no file path".into());
        }
        Ok(Self { backend: Backend::Sqlite, address: path.to_owned() })
    }
}

/// Opens connections for the pool, with the SQLite settings every connection needs.
#[derive(Debug)]
struct Manager {
    target: DatabaseAddress,
}

/// SQLite settings applied to each new connection: WAL so readers never wait for the writer, foreign keys for
/// cascading deletes, and a busy timeout so concurrent writers queue instead of failing.
const SQLITE_PRAGMAS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
                              PRAGMA foreign_keys = ON; PRAGMA busy_timeout = 5000;";

#[derive(Debug, thiserror::Error)]
enum ManagerError {
    #[error(transparent)]
    Connect(#[from] ConnectionError),
    #[error(transparent)]
    Query(#[from] diesel::result::Error),
}

impl r2d2::ManageConnection for Manager {
    type Connection = AnyConnection;
    type Error = ManagerError;

    fn connect(&self) -> Result<AnyConnection, ManagerError> {
        match self.target.backend {
            Backend::Postgres => {
                Ok(AnyConnection::Postgresql(PgConnection::establish(&self.target.address)?))
            }
            Backend::Sqlite => {
                let mut conn = SqliteConnection::establish(&self.target.address)?;
                conn.batch_execute(SQLITE_PRAGMAS)?;
                Ok(AnyConnection::Sqlite(conn))
            }
        }
    }

    fn is_valid(&self, conn: &mut AnyConnection) -> Result<(), ManagerError> {
        Ok(conn.batch_execute("SELECT 1")?)
    }

    fn has_broken(&self, _conn: &mut AnyConnection) -> bool {
        // Checked on checkout by `is_valid` instead.
        false
    }
}

/// A snapshot of the connection pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolState {
    pub open: u32,
    pub idle: u32,
    pub max: u32,
}

/// A pooled database. Cheap to clone.
#[derive(Clone)]
pub struct Database {
    pool: r2d2::Pool<Manager>,
    backend: Backend,
    /// The native connection string (for the change listener's own connection).
    address: String,
    /// This process's name among the processes serving the database (`endpoints_nodes`).
    node: String,
    /// This process's writers waiting for the others' acknowledgements, which its listener completes.
    waiters: std::sync::Arc<crate::waiters::Waiters>,
    /// What this process's writers send next on the change channel, one statement at a time.
    outbox: std::sync::Arc<crate::waiters::Outbox>,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database").field("backend", &self.backend).finish_non_exhaustive()
    }
}

impl Database {
    /// Opens the pool and checks that one connection works. Creates the SQLite file's directory if needed.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when the database cannot be reached; `Internal` for a bad URL.
    pub fn connect(config: &DatabaseConfig) -> Result<Self, StoreError> {
        let target = DatabaseAddress::parse(&config.url).map_err(|e| StoreError::Internal(e.into()))?;
        if target.backend == Backend::Sqlite {
            if let Some(dir) = Path::new(&target.address).parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).map_err(|e| StoreError::Unavailable(Box::new(e)))?;
            }
        }
        let (backend, address) = (target.backend, target.address.clone());
        // No idle minimum: the pool then never opens connections in the background on its own, which matters
        // because libpq must not be connecting on r2d2's thread while the process exits (OpenSSL's exit-time
        // cleanup would pull the rug out from under it, a segfault seen with short-lived CLI commands).
        let pool = r2d2::Pool::builder()
            .max_size(config.pool_size)
            .min_idle(Some(0))
            .connection_timeout(config.acquire_timeout)
            .build_unchecked(Manager { target });
        // Fail fast when the database is unreachable, with the driver's own reason.
        pool.get().map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let node = uuid::Uuid::new_v4().simple().to_string();
        Ok(Self {
            pool,
            backend,
            address,
            node,
            waiters: std::sync::Arc::default(),
            outbox: std::sync::Arc::default(),
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The native connection string (for a connection of its own, outside the pool).
    pub(crate) fn address(&self) -> &str {
        &self.address
    }

    /// This process's name among the processes serving the database.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// This process's writers waiting for the other processes.
    pub(crate) fn waiters(&self) -> &std::sync::Arc<crate::waiters::Waiters> {
        &self.waiters
    }

    pub(crate) fn outbox(&self) -> &std::sync::Arc<crate::waiters::Outbox> {
        &self.outbox
    }

    /// Runs `work` on a connection of the pool, on this thread (a blocking one).
    pub(crate) fn on_connection<T>(&self, work: impl FnOnce(&mut AnyConnection) -> T) -> Result<T, String> {
        let mut conn = self.pool.get().map_err(|err| err.to_string())?;
        Ok(work(&mut conn))
    }

    /// Applies every pending migration of this backend and returns the versions applied.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] without a connection; `Internal` when a migration fails.
    pub fn migrate(&self) -> Result<Vec<String>, StoreError> {
        let mut conn = self.pool.get().map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        let applied = match &mut *conn {
            AnyConnection::Sqlite(c) => c.run_pending_migrations(SQLITE_MIGRATIONS),
            AnyConnection::Postgresql(c) => c.run_pending_migrations(POSTGRES_MIGRATIONS),
        }
        .map_err(StoreError::Internal)?;
        Ok(applied.into_iter().map(|v| v.to_string()).collect())
    }

    /// Whether migrations of this backend are waiting to be applied.
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] without a connection; `Internal` when the migration table cannot be read.
    pub fn has_pending_migrations(&self) -> Result<bool, StoreError> {
        let mut conn = self.pool.get().map_err(|e| StoreError::Unavailable(Box::new(e)))?;
        match &mut *conn {
            AnyConnection::Sqlite(c) => c.has_pending_migration(SQLITE_MIGRATIONS),
            AnyConnection::Postgresql(c) => c.has_pending_migration(POSTGRES_MIGRATIONS),
        }
        .map_err(StoreError::Internal)
    }

    /// Whether a connection can be had and answers (for readiness).
    ///
    /// # Errors
    /// [`StoreError::Unavailable`] when no connection answers within the pool's acquire timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        self.run(|conn| Ok(conn.batch_execute("SELECT 1")?)).await.map_err(StoreError::from)
    }

    /// Connections open, idle, and the most the pool opens: its saturation.
    pub fn pool_state(&self) -> PoolState {
        let state = self.pool.state();
        PoolState { open: state.connections, idle: state.idle_connections, max: self.pool.max_size() }
    }

    /// Runs blocking diesel work on the blocking thread pool with a pooled connection.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, DbError>
    where
        F: FnOnce(&mut AnyConnection) -> Result<T, DbError> + Send + 'static,
        T: Send + 'static,
    {
        let pool = self.pool.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.get()?;
            work(&mut conn)
        })
        .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_select_the_backend() {
        assert_eq!(DatabaseAddress::parse("sqlite://data/x.db").unwrap().address, "data/x.db");
        assert_eq!(DatabaseAddress::parse("sqlite:x.db").unwrap().backend, Backend::Sqlite);
        assert_eq!(DatabaseAddress::parse("postgres://u@h/db").unwrap().backend, Backend::Postgres);
        assert_eq!(DatabaseAddress::parse("postgresql://u@h/db").unwrap().backend, Backend::Postgres);
        assert!(DatabaseAddress::parse("mysql://h/db").is_err());
        assert!(DatabaseAddress::parse("sqlite://").is_err());
    }
}
