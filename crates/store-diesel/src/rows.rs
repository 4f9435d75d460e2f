//! Rows as stored, and their conversion to and from domain values.

use diesel::prelude::*;
use domain::{
    BreakingChange, CacheAge, Column, Eligibility, Endpoint, EndpointName, EndpointVersion, ProjectId, Query,
    SyncFrequency, Timestamp,
};
use uuid::Uuid;

use crate::error::DbError;
use crate::schema::{endpoint_versions, endpoints};

pub(crate) fn micros(at: Timestamp) -> i64 {
    // i64 microseconds cover ±292,000 years; the domain never produces instants outside that.
    i64::try_from(at.unix_timestamp_nanos() / 1_000).unwrap_or(i64::MAX)
}

pub(crate) fn instant(micros: i64) -> Result<Timestamp, DbError> {
    Timestamp::from_unix_timestamp_nanos(i128::from(micros) * 1_000)
        .map_err(|e| DbError::Corrupt(format!("timestamp {micros}: {e}")))
}

pub(crate) fn uuid(raw: &str) -> Result<Uuid, DbError> {
    Uuid::parse_str(raw).map_err(|e| DbError::Corrupt(format!("uuid {raw}: {e}")))
}

pub(crate) fn version_number(raw: i64) -> Result<u32, DbError> {
    u32::try_from(raw).map_err(|_| DbError::Corrupt(format!("version {raw}")))
}

fn cache_age(raw: Option<i64>) -> Result<CacheAge, DbError> {
    CacheAge::new(raw).map_err(|e| DbError::Corrupt(e.detail))
}

fn sync_frequency(raw: Option<&str>) -> Result<Option<SyncFrequency>, DbError> {
    raw.map(SyncFrequency::parse).transpose().map_err(|e| DbError::Corrupt(e.detail))
}

fn query(raw: &str) -> Result<Query, DbError> {
    let value: serde_json::Value =
        serde_json::from_str(raw).map_err(|e| DbError::Corrupt(format!("query: {e}")))?;
    Query::try_from(&value).map_err(|e| DbError::Corrupt(format!("query: {}", e.detail)))
}

pub(crate) fn columns_text(columns: &[Column]) -> String {
    serde_json::to_string(columns).unwrap_or_else(|_| "[]".into())
}

pub(crate) fn eligibility_text(eligibility: &Eligibility) -> Option<String> {
    serde_json::to_string(eligibility).ok()
}

fn eligibility(raw: Option<&str>) -> Result<Option<Eligibility>, DbError> {
    raw.map(|raw| serde_json::from_str(raw).map_err(|e| DbError::Corrupt(format!("eligibility: {e}"))))
        .transpose()
}

pub(crate) fn tables_text(tables: &[String]) -> Option<String> {
    serde_json::to_string(tables).ok()
}

fn tables(raw: Option<&str>) -> Result<Option<Vec<String>>, DbError> {
    raw.map(|raw| serde_json::from_str(raw).map_err(|e| DbError::Corrupt(format!("tables: {e}")))).transpose()
}

pub(crate) fn breaking_changes_text(changes: &[BreakingChange]) -> String {
    serde_json::to_string(changes).unwrap_or_else(|_| "[]".into())
}

fn breaking_changes(raw: &str) -> Result<Vec<BreakingChange>, DbError> {
    serde_json::from_str(raw).map_err(|e| DbError::Corrupt(format!("breaking_changes: {e}")))
}

fn columns(raw: &str) -> Result<Vec<Column>, DbError> {
    serde_json::from_str(raw).map_err(|e| DbError::Corrupt(format!("columns: {e}")))
}

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = endpoints)]
pub(crate) struct EndpointRow {
    pub id: String,
    pub project_id: i64,
    pub name: String,
    pub description: String,
    pub derived_from_insight: Option<String>,
    pub is_active: bool,
    pub is_materialized: bool,
    pub cache_age_seconds: Option<i64>,
    pub sync_frequency: Option<String>,
    pub current_version: i64,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_executed_at: Option<i64>,
}

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = endpoint_versions)]
pub(crate) struct VersionRow {
    pub endpoint_id: String,
    pub version: i64,
    pub query: String,
    pub description: String,
    pub output_columns: String,
    pub cache_age_seconds: Option<i64>,
    pub sync_frequency: Option<String>,
    pub created_at: i64,
    pub eligibility: Option<String>,
    pub source_tables: Option<String>,
    pub plan_error: Option<String>,
    pub breaking_changes: String,
}

impl EndpointRow {
    /// The endpoint with its current version's query and columns.
    pub(crate) fn into_domain(self, current: &VersionRow) -> Result<Endpoint, DbError> {
        Ok(Endpoint {
            id: uuid(&self.id)?,
            project_id: ProjectId::new(self.project_id).map_err(|e| DbError::Corrupt(e.detail))?,
            name: EndpointName::parse(&self.name).map_err(|e| DbError::Corrupt(e.detail))?,
            description: self.description,
            query: query(&current.query)?,
            derived_from_insight: self.derived_from_insight,
            is_active: self.is_active,
            is_materialized: self.is_materialized,
            cache_age: cache_age(self.cache_age_seconds)?,
            sync_frequency: sync_frequency(self.sync_frequency.as_deref())?,
            current_version: version_number(self.current_version)?,
            // Versions are never deleted one by one and are numbered from 1 without gaps.
            versions_count: version_number(self.current_version)?,
            columns: columns(&current.output_columns)?,
            created_at: instant(self.created_at)?,
            updated_at: instant(self.updated_at)?,
            last_executed_at: self.last_executed_at.map(instant).transpose()?,
            eligibility: eligibility(current.eligibility.as_deref())?,
            tables: tables(current.source_tables.as_deref())?,
            plan_error: current.plan_error.clone(),
            materialization: None,
        })
    }
}

impl VersionRow {
    pub(crate) fn into_domain(self, current_version: i64) -> Result<EndpointVersion, DbError> {
        Ok(EndpointVersion {
            endpoint_id: uuid(&self.endpoint_id)?,
            version: version_number(self.version)?,
            query: query(&self.query)?,
            description: self.description,
            columns: columns(&self.output_columns)?,
            cache_age: cache_age(self.cache_age_seconds)?,
            sync_frequency: sync_frequency(self.sync_frequency.as_deref())?,
            created_at: instant(self.created_at)?,
            is_current: self.version == current_version,
            eligibility: eligibility(self.eligibility.as_deref())?,
            tables: tables(self.source_tables.as_deref())?,
            plan_error: self.plan_error,
            breaking_changes: breaking_changes(&self.breaking_changes)?,
        })
    }
}
