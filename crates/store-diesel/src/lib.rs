//! The store adapter: the domain's `EndpointStore`, `MaterializationRecords`, `ProjectStore`, `ApiKeyStore` and
//! `TableLeases` ports on diesel 2 with an r2d2 pool, over SQLite (the embedded default) or PostgreSQL through
//! one code path.
//!
//! It owns the schema, the embedded migrations of both backends and the translation of database errors into
//! the domain's `StoreError`. It knows nothing of HTTP or of the query engine.

mod changes;
mod connection;
mod endpoints;
mod error;
mod keys;
mod materializations;
mod projects;
mod rows;
mod schema;
mod tables;
mod waiters;

pub use changes::ChangeListener;
pub use connection::{Backend, Database, DatabaseConfig, PoolState};

/// The three store ports over one database.
#[derive(Clone)]
pub struct DieselStore {
    db: Database,
}

impl DieselStore {
    pub fn new(db: Database) -> Self {
        Self { db }
    }

    pub fn database(&self) -> &Database {
        &self.db
    }
}

#[cfg(test)]
mod contract_tests;
