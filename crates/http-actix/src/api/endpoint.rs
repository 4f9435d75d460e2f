//! The endpoint record, its versions and its materialization status.

use std::collections::BTreeMap;

use domain::{MaterializationView, Rollup};
use std::borrow::Cow;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use utoipa::ToSchema;
use uuid::Uuid;

use super::names;

/// An output column of a query.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Column {
    pub name: String,
    #[serde(rename = "type")]
    #[schema(schema_with = names::column_type)]
    pub column_type: domain::ColumnType,
}

impl From<domain::Column> for Column {
    fn from(column: domain::Column) -> Self {
        Self { name: column.name, column_type: column.column_type }
    }
}

fn columns(columns: Vec<domain::Column>) -> Vec<Column> {
    columns.into_iter().map(Column::from).collect()
}

/// A declared variable, in its canonical form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Variable {
    #[serde(rename = "type")]
    #[schema(schema_with = names::variable_type)]
    pub variable_type: Cow<'static, str>,
    /// The value used when a run does not give one; null for a required variable.
    #[schema(required = true)]
    pub default: Option<Value>,
    pub required: bool,
    #[schema(required = true)]
    pub description: Option<String>,
}

/// The saved query, in its canonical form: what a client sent, with every declaration written in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Query {
    #[schema(schema_with = names::query_kind)]
    pub kind: Cow<'static, str>,
    /// One read-only SQL statement with `{variables.NAME}` placeholders.
    pub query: String,
    pub variables: BTreeMap<String, Variable>,
}

impl From<domain::Query> for Query {
    fn from(query: domain::Query) -> Self {
        let variables = query
            .variables
            .into_iter()
            .map(|(name, v)| {
                let variable = Variable {
                    variable_type: v.variable_type.as_str().into(),
                    default: v.default,
                    required: v.required,
                    description: v.description,
                };
                (name, variable)
            })
            .collect();
        Self { kind: query.kind.as_str().into(), query: query.sql, variables }
    }
}

/// The materialization status of an endpoint's current version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Materialization {
    pub name: String,
    pub version: u32,
    pub is_materialized: bool,
    #[schema(schema_with = names::materialization_status)]
    pub status: Cow<'static, str>,
    /// How often it refreshes; null when not materialized.
    #[schema(schema_with = names::nullable_sync_frequency, required = true)]
    pub sync_frequency: Option<Cow<'static, str>>,
    /// When the stored result of this version was computed.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub last_materialized_at: Option<OffsetDateTime>,
    /// When the next refresh is due; null while it hibernates.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub next_run_at: Option<OffsetDateTime>,
    /// Rows of the stored result of this version.
    #[schema(required = true)]
    pub row_count: Option<u64>,
    /// Seconds within which appended rows reach the stored result.
    pub freshness_seconds: u32,
    /// The time up to which appended rows are in the stored result of this version: when its refresh began
    /// reading the tables.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub data_as_of: Option<OffsetDateTime>,
    /// Since when rows appended to a table the query reads wait for the stored result; null when none wait.
    /// The refresh that includes them is due `freshness_seconds` later (`next_run_at`).
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub appended_since: Option<OffsetDateTime>,
    /// Refreshes completed, each computing the whole result.
    pub full_refreshes: u64,
    /// When rows appended since the result before were last folded into the stored result (without computing
    /// it again).
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub last_folded_at: Option<OffsetDateTime>,
    /// Rows folds added to the stored results.
    pub rows_folded: u64,
    /// Days nobody runs or changes it before it hibernates; null never.
    #[schema(required = true)]
    pub hibernate_after_days: Option<u32>,
    /// Since when it hibernates (status `Hibernating`): nobody ran or changed it for `hibernate_after_days`, so
    /// it is neither refreshed nor folded, and its next run answers live and wakes it. Null while awake.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub hibernated_at: Option<OffsetDateTime>,
    /// How rows appended to a table the query reads reach the stored result: `incremental` (folded in: the
    /// query over the appended rows alone, added to the stored rows or to a rollup's partial aggregates) or
    /// `full_refresh_only` (computed again in full, for `fold_reason`). Null until a stored result of this
    /// version says.
    #[schema(schema_with = names::nullable_fold, required = true)]
    pub fold: Option<Cow<'static, str>>,
    /// Why every change computes the stored result in full, when `fold` is `full_refresh_only`.
    #[schema(required = true)]
    pub fold_reason: Option<String>,
    /// When the query is stored as a rollup, what the stored rows are grouped by: the query's group keys, then
    /// the columns its variables filter (a timestamp bounded by `Date` variables as `date_trunc('day', ...)`),
    /// then the arguments of its `count`, `sum` and `avg` of DISTINCT values;
    /// null when the stored result is the query's own rows (or it cannot be materialized).
    #[schema(required = true)]
    pub grouping: Option<Vec<String>>,
    /// Why the last refresh failed.
    #[schema(required = true)]
    pub error: Option<String>,
    /// Whether the query and the endpoint allow materialization.
    pub can_materialize: bool,
    /// Why not, when `can_materialize` is false.
    #[schema(required = true)]
    pub reason: Option<String>,
}

/// What a rollup's rows are grouped by, as the status shows it: the query's keys, then the filtered columns (a
/// timestamp stored by day as the SQL that truncates it).
fn grouping(rollup: &Rollup) -> Vec<String> {
    let filtered = rollup.columns.iter().map(|c| match c.day {
        true => format!("date_trunc('day', {})", c.column),
        false => c.column.clone(),
    });
    rollup.keys.iter().cloned().chain(filtered).chain(rollup.distinct.iter().cloned()).collect()
}

impl From<MaterializationView> for Materialization {
    fn from(view: MaterializationView) -> Self {
        Self {
            name: view.name.as_str().to_owned(),
            version: view.version,
            is_materialized: view.is_materialized,
            status: view.status.as_str().into(),
            sync_frequency: view.sync_frequency.map(|f| f.as_str().into()),
            last_materialized_at: view.last_materialized_at,
            next_run_at: view.next_run_at,
            row_count: view.row_count,
            freshness_seconds: view.freshness.seconds(),
            data_as_of: view.data_as_of,
            appended_since: view.appended_since,
            full_refreshes: view.full_refreshes,
            last_folded_at: view.last_folded_at,
            rows_folded: view.rows_folded,
            hibernate_after_days: view.hibernate_after_days,
            hibernated_at: view.hibernated_at,
            fold: view.fold.as_ref().map(|f| f.as_str().into()),
            fold_reason: view.fold.as_ref().and_then(|f| f.reason().map(str::to_owned)),
            grouping: view.rollup.as_ref().map(grouping),
            error: view.error,
            can_materialize: view.can_materialize,
            reason: view.reason,
        }
    }
}

/// An endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Endpoint {
    pub id: Uuid,
    pub name: String,
    pub description: String,
    pub query: Query,
    #[schema(required = true)]
    pub derived_from_insight: Option<String>,
    pub is_active: bool,
    pub is_materialized: bool,
    /// How long a run's result is served from the cache; null for the server default (300).
    #[schema(required = true)]
    pub cache_age_seconds: Option<u32>,
    /// How often the stored result refreshes; set only while materialized.
    #[schema(schema_with = names::nullable_sync_frequency, required = true)]
    pub sync_frequency: Option<Cow<'static, str>>,
    /// Seconds within which rows appended to a table the query reads reach the stored result, once
    /// materialized (60 unless set).
    pub freshness_seconds: u32,
    /// Days a materialized endpoint nobody runs or changes keeps refreshing before it hibernates (7 unless
    /// set); null never.
    #[schema(required = true)]
    pub hibernate_after_days: Option<u32>,
    pub current_version: u32,
    pub versions_count: u32,
    /// The output columns of the current version; null while it does not plan (`plan_error`).
    #[schema(required = true)]
    pub columns: Option<Vec<Column>>,
    /// Why the current version's query no longer plans, since a table it reads was replaced; null when it
    /// plans. Its runs answer 400 `query_invalid` meanwhile.
    #[schema(required = true)]
    pub plan_error: Option<String>,
    /// Where the endpoint runs.
    pub endpoint_path: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub last_executed_at: Option<OffsetDateTime>,
    pub materialization: Materialization,
}

impl From<domain::Endpoint> for Endpoint {
    fn from(e: domain::Endpoint) -> Self {
        let materialization = MaterializationView::of(&e, e.materialization.as_ref()).into();
        Self {
            id: e.id,
            endpoint_path: format!("/api/projects/{}/endpoints/{}/run", e.project_id, e.name),
            name: e.name.as_str().to_owned(),
            description: e.description,
            query: e.query.into(),
            derived_from_insight: e.derived_from_insight,
            is_active: e.is_active,
            is_materialized: e.is_materialized,
            cache_age_seconds: e.cache_age.configured(),
            sync_frequency: e.sync_frequency.map(|f| f.as_str().into()),
            freshness_seconds: e.freshness.seconds(),
            hibernate_after_days: e.hibernation.days(),
            current_version: e.current_version,
            versions_count: e.versions_count,
            columns: e.plan_error.is_none().then(|| columns(e.columns)),
            plan_error: e.plan_error,
            created_at: e.created_at,
            updated_at: e.updated_at,
            last_executed_at: e.last_executed_at,
            materialization,
        }
    }
}

/// One version of an endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Version {
    pub version: u32,
    pub query: Query,
    pub description: String,
    /// Its output columns; null while it does not plan (`plan_error`).
    #[schema(required = true)]
    pub columns: Option<Vec<Column>>,
    /// Why its query no longer plans, since a table it reads was replaced; null when it plans.
    #[schema(required = true)]
    pub plan_error: Option<String>,
    #[schema(required = true)]
    pub cache_age_seconds: Option<u32>,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    pub is_current: bool,
    /// The output columns of the version before it that this version removed or retyped; empty when it breaks
    /// nothing (and for version 1).
    pub breaking_changes: Vec<BreakingChange>,
}

/// An output column of the version before that a version removed (`to` null) or retyped. A renamed column is
/// a removal (and an addition, which breaks nothing).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct BreakingChange {
    pub column: String,
    #[schema(schema_with = names::column_change)]
    pub change: Cow<'static, str>,
    /// Its type in the version before.
    #[schema(schema_with = names::column_type)]
    pub from: domain::ColumnType,
    /// Its type in this version; null when removed.
    #[schema(schema_with = names::nullable_column_type, required = true)]
    pub to: Option<domain::ColumnType>,
}

/// As a person reads it: `column total retyped (integer -> float)`, `column total removed`.
impl std::fmt::Display for BreakingChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name =
            |t: domain::ColumnType| serde_json::to_value(t).ok().and_then(|v| v.as_str().map(str::to_owned));
        match (name(self.from), self.to.and_then(name)) {
            (Some(from), Some(to)) => write!(f, "column {} {} ({from} -> {to})", self.column, self.change),
            _ => write!(f, "column {} {}", self.column, self.change),
        }
    }
}

impl From<domain::BreakingChange> for BreakingChange {
    fn from(change: domain::BreakingChange) -> Self {
        Self {
            column: change.column,
            change: change.change.as_str().into(),
            from: change.from,
            to: change.to,
        }
    }
}

impl From<domain::EndpointVersion> for Version {
    fn from(v: domain::EndpointVersion) -> Self {
        Self {
            version: v.version,
            query: v.query.into(),
            description: v.description,
            columns: v.plan_error.is_none().then(|| columns(v.columns)),
            plan_error: v.plan_error,
            cache_age_seconds: v.cache_age.configured(),
            created_at: v.created_at,
            is_current: v.is_current,
            breaking_changes: v.breaking_changes.into_iter().map(BreakingChange::from).collect(),
        }
    }
}
