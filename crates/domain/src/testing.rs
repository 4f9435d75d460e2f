//! Test support, for the domain's own tests and (with the `mocks` feature) for the adapters': a clock moved by
//! hand, a run log kept in memory, and fixtures of the records services read. Tests change what they need with struct update syntax.

use std::sync::Mutex;
use std::time::Duration;

use time::macros::datetime;
use uuid::Uuid;

use crate::access::{hash_secret, ApiKey, Principal, ProjectId, Scope};
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{CacheAge, Endpoint, EndpointName, EndpointVersion, Freshness, Hibernation};
use crate::error::EngineError;
use crate::logs::{LogFilter, LogRecord, RunLog, UsageBucket, UsageQuery};
use crate::materialization::Eligibility;
use crate::query::{ColumnType, Query};
use crate::tables::{TableColumn, TableInfo, TableLayout, TableName, TableSource};

/// The instant fixtures are made at, and a manual clock's usual start.
pub const T0: Timestamp = datetime!(2026-11-22 10:00 UTC);

/// A clock the test moves by hand.
#[derive(Debug)]
pub struct ManualClock(Mutex<Timestamp>);

impl ManualClock {
    pub fn new(at: Timestamp) -> Self {
        Self(Mutex::new(at))
    }

    pub fn advance(&self, by: Duration) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A run log that keeps each record it is given, in order, for the test to read; it finds none.
#[derive(Debug, Default)]
pub struct KeptRunLog(Mutex<Vec<LogRecord>>);

impl KeptRunLog {
    /// The records given so far, oldest first.
    pub fn records(&self) -> Vec<LogRecord> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

#[async_trait::async_trait]
impl RunLog for KeptRunLog {
    fn record(&self, record: LogRecord) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(record);
    }

    async fn records(&self, _: ProjectId, _: &str, _: &LogFilter) -> Result<Vec<LogRecord>, EngineError> {
        Ok(Vec::new())
    }

    async fn usage(&self, _: ProjectId, _: &str, _: &UsageQuery) -> Result<Vec<UsageBucket>, EngineError> {
        Ok(Vec::new())
    }
}

/// A project id; panics on one that is not positive.
pub fn project(id: i64) -> ProjectId {
    ProjectId::new(id).expect("a positive project id")
}

/// A live key of project 1 with the given secret, as the store holds it.
/// A key of project `id` with every scope, as a run's caller.
pub fn caller(id: i64) -> Principal {
    Principal {
        key_id: Uuid::nil(),
        project_id: project(id),
        scopes: Scope::ALL.to_vec(),
        grant: None,
        label: std::sync::Arc::from("test-key"),
    }
}

pub fn api_key(secret: &str, scopes: Vec<Scope>) -> ApiKey {
    ApiKey {
        id: Uuid::nil(),
        project_id: project(1),
        label: "ci".into(),
        scopes,
        secret_hash: hash_secret(secret),
        prefix: secret.chars().take(10).collect(),
        created_at: T0,
        expires_at: None,
        revoked_at: None,
        last_used_at: None,
    }
}

/// A query from its JSON form; panics on one that does not parse.
pub fn query(json: serde_json::Value) -> Query {
    Query::try_from(&json).expect("a valid query")
}

/// An active endpoint of project 1 at its first version, not materialized, with the default cache age and no
/// recorded columns; its query can be materialized.
pub fn endpoint(name: &str, query: Query) -> Endpoint {
    Endpoint {
        id: Uuid::nil(),
        project_id: project(1),
        name: EndpointName::parse(name).expect("a valid endpoint name"),
        description: String::new(),
        query,
        derived_from_insight: None,
        is_active: true,
        is_materialized: false,
        cache_age: CacheAge::default(),
        sync_frequency: None,
        freshness: Freshness::default(),
        hibernation: Hibernation::default(),
        current_version: 1,
        versions_count: 1,
        columns: Vec::new(),
        created_at: T0,
        updated_at: T0,
        last_executed_at: None,
        eligibility: Some(Eligibility::Eligible { filters: Vec::new(), rollup: None }),
        tables: Some(Vec::new()),
        plan_error: None,
        materialization: None,
        hibernated_at: None,
    }
}

/// The endpoint's current version, as the store holds it.
pub fn current_version(endpoint: &Endpoint) -> EndpointVersion {
    EndpointVersion::current_of(endpoint)
}

/// An uploaded table `name` of nullable `columns`, with 3 rows in one file, made at [`T0`].
pub fn table_info(name: &str, columns: &[(&str, ColumnType)]) -> TableInfo {
    TableInfo {
        name: TableName::parse(name).expect("a valid table name"),
        columns: columns
            .iter()
            .map(|(name, column_type)| TableColumn {
                name: (*name).into(),
                column_type: *column_type,
                nullable: true,
            })
            .collect(),
        row_count: Some(3),
        bytes: Some(100),
        files: Some(1),
        last_compacted_at: None,
        layout: TableLayout::default(),
        source: TableSource::Upload,
        created_at: T0,
        updated_at: T0,
    }
}
