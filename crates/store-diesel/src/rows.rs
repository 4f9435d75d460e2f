//! Rows as stored, and their conversion to and from domain values.

use diesel::prelude::*;
use domain::{
    BreakingChange, CacheAge, Column, CompareOp, Eligibility, Endpoint, EndpointName, EndpointVersion,
    Freshness, Hibernation, MaterializedFilter, ProjectId, Query, Rollup, StoredColumn, SyncFrequency,
    Timestamp,
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

/// `hibernate_after_days` as stored: NULL is the default (a row written before the setting, or by an earlier
/// release), 0 is never.
pub(crate) fn hibernation(raw: Option<i64>) -> Result<Hibernation, DbError> {
    match raw {
        None => Ok(Hibernation::DEFAULT),
        Some(0) => Ok(Hibernation::NEVER),
        Some(days) => Hibernation::new(Some(days)).map_err(|e| DbError::Corrupt(e.detail)),
    }
}

/// The stored form [`hibernation`] reads.
pub(crate) fn hibernation_days(hibernation: Hibernation) -> i64 {
    hibernation.days().map_or(0, i64::from)
}

fn sync_frequency(raw: Option<&str>) -> Result<Option<SyncFrequency>, DbError> {
    raw.map(SyncFrequency::parse).transpose().map_err(|e| DbError::Corrupt(e.detail))
}

pub(crate) fn query(raw: &str) -> Result<Query, DbError> {
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

pub(crate) fn eligibility(raw: Option<&str>) -> Result<Option<Eligibility>, DbError> {
    let Some(raw) = raw else { return Ok(None) };
    let read =
        serde_json::from_str(raw).or_else(|err| match serde_json::from_str::<LegacyEligibility>(raw) {
            Ok(legacy) => legacy.try_into(),
            Err(_) => Err(format!("eligibility: {err}")),
        });
    read.map(Some).map_err(DbError::Corrupt)
}

/// Eligibility as versions written before filters named their stored column by kind: a filter's `column` is
/// the query's output column, or in a rollup `k{i}` for its `i`th group key and `f{j}` for its `j`th filtered
/// column.
#[derive(serde::Deserialize)]
#[serde(rename_all = "snake_case")]
enum LegacyEligibility {
    Eligible {
        filters: Vec<LegacyFilter>,
        #[serde(default)]
        rollup: Option<Rollup>,
    },
}

#[derive(serde::Deserialize)]
struct LegacyFilter {
    column: String,
    op: CompareOp,
    variable: String,
}

impl TryFrom<LegacyEligibility> for Eligibility {
    type Error = String;

    fn try_from(legacy: LegacyEligibility) -> Result<Self, String> {
        let LegacyEligibility::Eligible { filters, rollup } = legacy;
        let position = |raw: &str| raw.parse::<usize>().ok();
        let filters = filters
            .into_iter()
            .map(|LegacyFilter { column, op, variable }| {
                let stored = match (&rollup, column.split_at_checked(1)) {
                    (None, _) => Some(StoredColumn::Output(column.clone())),
                    (Some(_), Some(("k", i))) => position(i).map(StoredColumn::Key),
                    (Some(_), Some(("f", j))) => position(j).map(StoredColumn::Filtered),
                    (Some(_), _) => None,
                };
                let column = stored.ok_or(format!("eligibility: a rollup's filter names '{column}'"))?;
                Ok(MaterializedFilter { column, op, variable })
            })
            .collect::<Result<_, String>>()?;
        Ok(Eligibility::Eligible { filters, rollup })
    }
}

pub(crate) fn tables_text(tables: &[String]) -> Option<String> {
    serde_json::to_string(tables).ok()
}

pub(crate) fn tables(raw: Option<&str>) -> Result<Option<Vec<String>>, DbError> {
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
    pub freshness_seconds: Option<i64>,
    pub hibernate_after_days: Option<i64>,
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
            freshness: Freshness::new(self.freshness_seconds).map_err(|e| DbError::Corrupt(e.detail))?,
            hibernation: hibernation(self.hibernate_after_days)?,
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
            hibernated_at: None,
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

#[cfg(test)]
mod tests {
    use domain::{CompareOp, Eligibility, MaterializedFilter, RollupColumn, StoredColumn};

    use super::eligibility;

    #[test]
    fn eligibility_written_by_earlier_versions_reads_with_the_kind_of_each_filtered_column() {
        let filter = |column, variable: &str| MaterializedFilter {
            column,
            op: CompareOp::GtEq,
            variable: variable.into(),
        };
        let plain = r#"{"eligible":{"filters":[{"column":"k0","op":">=","variable":"v"}]}}"#;
        assert_eq!(
            eligibility(Some(plain)).unwrap(),
            Some(Eligibility::Eligible {
                filters: vec![filter(StoredColumn::Output("k0".into()), "v")],
                rollup: None
            }),
            "an output column may be named k0"
        );
        let rollup = r#"{"eligible":{"filters":[{"column":"f0","op":">=","variable":"since"},
            {"column":"k1","op":">=","variable":"country"}],
            "rollup":{"keys":["events.browser","events.country"],
                      "columns":[{"column":"events.timestamp","day":true}]}}}"#;
        let Some(Eligibility::Eligible { filters, rollup: Some(rollup) }) =
            eligibility(Some(rollup)).unwrap()
        else {
            panic!("a rollup")
        };
        assert_eq!(
            filters,
            [filter(StoredColumn::Filtered(0), "since"), filter(StoredColumn::Key(1), "country")]
        );
        assert_eq!(rollup.columns, [RollupColumn { column: "events.timestamp".into(), day: true }]);
        let ineligible = r#"{"ineligible":{"reason":"no"}}"#;
        assert_eq!(
            eligibility(Some(ineligible)).unwrap(),
            Some(Eligibility::Ineligible { reason: "no".into() })
        );
        for corrupt in [
            r#"{"eligible":{"filters":[{"column":"x0","op":">=","variable":"v"}],"rollup":{"keys":[],"columns":[]}}}"#,
            r#"{"eligible":{"filters":[{"column":"k","op":">=","variable":"v"}],"rollup":{"keys":[],"columns":[]}}}"#,
            "{}",
        ] {
            assert!(eligibility(Some(corrupt)).is_err(), "{corrupt}");
        }
    }
}
