//! The endpoint record, its versions and its name.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::settings::{CacheAge, Freshness, Hibernation, SyncFrequency};
use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::{Error, Invalid};
use crate::materialization::{Eligibility, MaterializationState};
use crate::query::{Column, ColumnType, Query, QueryDescription};

/// Values kept in memory per endpoint, by project then name, so a lookup borrows the name instead of building a
/// key. Hashed with foldhash: only names of real endpoints become keys.
pub type ByEndpoint<V> = std::collections::HashMap<
    ProjectId,
    std::collections::HashMap<EndpointName, V, foldhash::fast::RandomState>,
    foldhash::fast::RandomState,
>;

/// An endpoint name: a letter, then letters, digits, `_` and `-`, at most 128 characters. It is part of public
/// URLs, so it never changes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointName(String);

impl EndpointName {
    pub const MAX_LEN: usize = 128;

    /// The rule [`EndpointName::is_valid`] checks, as a regular expression for documents that describe names.
    pub const PATTERN: &'static str = "^[A-Za-z][A-Za-z0-9_-]{0,127}$";

    /// # Errors
    /// [`Invalid`] (attr `name`) when the name breaks the pattern.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        if Self::is_valid(raw) {
            Ok(Self(raw.to_owned()))
        } else {
            Err(Invalid::field(
                "name",
                "name must start with a letter and contain only letters, digits, '_' and '-' (at most 128 characters).",
            ))
        }
    }

    /// A name from a URL path: one that cannot be valid names no endpoint, so it is not found, not invalid.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the name breaks the pattern.
    pub fn from_path(raw: &str) -> Result<Self, Error> {
        Self::parse(raw).map_err(|_| Error::endpoint_not_found(raw))
    }

    pub fn is_valid(raw: &str) -> bool {
        let mut chars = raw.chars();
        raw.len() <= Self::MAX_LEN
            && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for EndpointName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A saved endpoint as the store holds it, with its current version's query.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    pub id: Uuid,
    pub project_id: ProjectId,
    pub name: EndpointName,
    pub description: String,
    pub query: Query,
    pub derived_from_insight: Option<String>,
    pub is_active: bool,
    pub is_materialized: bool,
    pub cache_age: CacheAge,
    /// Stored only while the endpoint is materialized.
    pub sync_frequency: Option<SyncFrequency>,
    /// How soon appended rows reach the stored result.
    pub freshness: Freshness,
    /// How long it keeps refreshing without a run.
    pub hibernation: Hibernation,
    pub current_version: u32,
    pub versions_count: u32,
    /// Output columns of the current version.
    pub columns: Vec<Column>,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub last_executed_at: Option<Timestamp>,
    /// Whether the current version can be materialized; `None` for a version saved before it was recorded.
    pub eligibility: Option<Eligibility>,
    /// The tables the current version reads; `None` for a version saved before they were recorded.
    pub tables: Option<Vec<String>>,
    /// Why the current version no longer plans, since a table it reads was replaced; `None` when it plans.
    pub plan_error: Option<String>,
    /// The materialization record, when the service has read it (the endpoint store leaves it `None`).
    pub materialization: Option<MaterializationState>,
    /// Since when it hibernates, when the service read it hibernating (the endpoint store leaves it `None`).
    pub hibernated_at: Option<Timestamp>,
}

impl Endpoint {
    /// When a materialized endpoint hibernates (or hibernated): `hibernate_after_days` after it last ran or
    /// changed, whichever was later. `None` when it is not materialized or never hibernates.
    pub fn hibernates_at(&self) -> Option<Timestamp> {
        self.hibernates_after(self.last_executed_at)
    }

    /// Whether it hibernates at `now`, having last run at `pending` if that is newer than the time the store
    /// holds (a run on this node not yet written).
    pub fn hibernating(&self, now: Timestamp, pending: Option<Timestamp>) -> bool {
        self.hibernates_after(self.last_executed_at.max(pending)).is_some_and(|at| at <= now)
    }

    /// The endpoint as read at `now` (see [`Endpoint::hibernating`]): with its newest run and since when it
    /// hibernates, if it does.
    pub fn as_of(mut self, now: Timestamp, pending: Option<Timestamp>) -> Self {
        self.last_executed_at = self.last_executed_at.max(pending);
        self.hibernated_at = self.hibernates_at().filter(|at| *at <= now);
        self
    }

    fn hibernates_after(&self, last_run: Option<Timestamp>) -> Option<Timestamp> {
        let after = self.hibernation.after().filter(|_| self.is_materialized)?;
        Some(last_run.map_or(self.updated_at, |ran| ran.max(self.updated_at)) + after)
    }
}

/// One immutable query of an endpoint, with the settings it was saved with.
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointVersion {
    pub endpoint_id: Uuid,
    pub version: u32,
    pub query: Query,
    pub description: String,
    pub columns: Vec<Column>,
    pub cache_age: CacheAge,
    pub sync_frequency: Option<SyncFrequency>,
    pub created_at: Timestamp,
    pub is_current: bool,
    /// Whether this version can be materialized; `None` for a version saved before it was recorded.
    pub eligibility: Option<Eligibility>,
    /// The tables this version reads; `None` for a version saved before they were recorded.
    pub tables: Option<Vec<String>>,
    /// Why this version no longer plans, since a table it reads was replaced; `None` when it plans.
    pub plan_error: Option<String>,
    /// The output columns of the version before it that this version removed or retyped.
    pub breaking_changes: Vec<BreakingChange>,
}

impl EndpointVersion {
    /// The version record of the endpoint's current query, as a store keeps it.
    pub fn current_of(endpoint: &Endpoint) -> Self {
        Self {
            endpoint_id: endpoint.id,
            version: endpoint.current_version,
            query: endpoint.query.clone(),
            description: endpoint.description.clone(),
            columns: endpoint.columns.clone(),
            cache_age: endpoint.cache_age,
            sync_frequency: endpoint.sync_frequency,
            created_at: endpoint.updated_at,
            is_current: true,
            eligibility: endpoint.eligibility.clone(),
            tables: endpoint.tables.clone(),
            plan_error: endpoint.plan_error.clone(),
            breaking_changes: Vec::new(),
        }
    }
}

/// How a version changed an output column of the version before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnChange {
    Removed,
    TypeChanged,
}

impl ColumnChange {
    pub const ALL: [ColumnChange; 2] = [Self::Removed, Self::TypeChanged];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Removed => "removed",
            Self::TypeChanged => "type_changed",
        }
    }
}

/// A change of a version's output that breaks a caller reading the version before it: a column it no longer
/// outputs (a rename is a removal, plus an addition, which breaks nothing), or outputs with another type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BreakingChange {
    pub column: String,
    pub change: ColumnChange,
    /// The column's type in the version before.
    pub from: ColumnType,
    /// Its type in the new version; `None` when it was removed.
    pub to: Option<ColumnType>,
}

impl BreakingChange {
    /// What `after` breaks of `before`: each column of `before` that `after` does not output by the same name,
    /// or outputs with another type, in `before`'s order.
    pub fn between(before: &[Column], after: &[Column]) -> Vec<Self> {
        before
            .iter()
            .filter_map(|old| match after.iter().find(|new| new.name == old.name) {
                None => Some(Self {
                    column: old.name.clone(),
                    change: ColumnChange::Removed,
                    from: old.column_type,
                    to: None,
                }),
                Some(new) if new.column_type != old.column_type => Some(Self {
                    column: old.name.clone(),
                    change: ColumnChange::TypeChanged,
                    from: old.column_type,
                    to: Some(new.column_type),
                }),
                Some(_) => None,
            })
            .collect()
    }

    fn type_name(ty: ColumnType) -> String {
        match serde_json::to_value(ty) {
            Ok(serde_json::Value::String(name)) => name,
            _ => unreachable!("a column type serializes as its name"),
        }
    }

    /// The change in words: `column 'n' (integer) is removed`.
    pub fn describe(&self) -> String {
        match self.to {
            None => format!("column '{}' ({}) is removed", self.column, Self::type_name(self.from)),
            Some(to) => format!(
                "column '{}' changes from {} to {}",
                self.column,
                Self::type_name(self.from),
                Self::type_name(to)
            ),
        }
    }
}

/// What planning a version's query again (after a table it reads was replaced) told: what it now outputs and
/// reads, or why it no longer plans.
pub type Replanned = Result<PlannedQuery, String>;

/// A validated endpoint to insert as version 1.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEndpoint {
    pub id: Uuid,
    pub project_id: ProjectId,
    pub name: EndpointName,
    pub description: String,
    pub query: Query,
    pub columns: Vec<Column>,
    pub eligibility: Eligibility,
    /// The tables the query reads.
    pub tables: Vec<String>,
    pub derived_from_insight: Option<String>,
    pub is_active: bool,
    pub is_materialized: bool,
    pub cache_age: CacheAge,
    pub sync_frequency: Option<SyncFrequency>,
    pub freshness: Freshness,
    pub hibernation: Hibernation,
    pub created_at: Timestamp,
}

/// A validated change to an endpoint. `None` leaves a field as it is.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndpointChange {
    pub description: Option<String>,
    pub derived_from_insight: Option<Option<String>>,
    pub is_active: Option<bool>,
    pub is_materialized: Option<bool>,
    pub cache_age: Option<CacheAge>,
    pub sync_frequency: Option<Option<SyncFrequency>>,
    pub freshness: Option<Freshness>,
    pub hibernation: Option<Hibernation>,
    /// A new version to save: the domain made one because the query's canonical form changed.
    pub query: Option<NewVersion>,
}

/// The version a changed query becomes. The store saves it only while the endpoint's current version is the one
/// before it, and answers [`StoreError::Superseded`](crate::error::StoreError::Superseded) otherwise, so that a new
/// version is always decided against the version it follows.
#[derive(Debug, Clone, PartialEq)]
pub struct NewVersion {
    pub number: u32,
    pub planned: PlannedQuery,
}

impl NewVersion {
    /// The version after `current`, with the query planned.
    pub fn after(current: u32, planned: PlannedQuery) -> Self {
        Self { number: current + 1, planned }
    }
}

/// A query with what planning it told: its output columns, whether it can be materialized, the tables it reads.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedQuery {
    pub query: Query,
    pub columns: Vec<Column>,
    pub eligibility: Eligibility,
    pub tables: Vec<String>,
    /// What it breaks of the version it follows (none for a first version).
    pub breaking_changes: Vec<BreakingChange>,
}

impl PlannedQuery {
    /// A query with what the engine's description of it tells.
    pub fn new(query: Query, description: QueryDescription) -> Self {
        Self {
            eligibility: Eligibility::decide(&description.outline),
            columns: description.columns,
            tables: description.tables,
            breaking_changes: Vec::new(),
            query,
        }
    }
}

impl NewEndpoint {
    /// The endpoint as the store would save it, for a dry run that saves nothing.
    pub fn unsaved(self) -> Endpoint {
        Endpoint {
            id: self.id,
            project_id: self.project_id,
            name: self.name,
            description: self.description,
            query: self.query,
            derived_from_insight: self.derived_from_insight,
            is_active: self.is_active,
            is_materialized: self.is_materialized,
            cache_age: self.cache_age,
            sync_frequency: self.sync_frequency,
            freshness: self.freshness,
            hibernation: self.hibernation,
            current_version: 1,
            versions_count: 1,
            columns: self.columns,
            created_at: self.created_at,
            updated_at: self.created_at,
            last_executed_at: None,
            eligibility: Some(self.eligibility),
            tables: Some(self.tables),
            plan_error: None,
            materialization: None,
            hibernated_at: None,
        }
    }
}

impl EndpointChange {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The endpoint as it would be after this change at `at`: what a dry run answers, and what a store without
    /// transactions of its own saves.
    pub fn applied_to(self, mut endpoint: Endpoint, at: Timestamp) -> Endpoint {
        let Self {
            description,
            derived_from_insight,
            is_active,
            is_materialized,
            cache_age,
            sync_frequency,
            freshness,
            hibernation,
            query,
        } = self;
        endpoint.description = description.unwrap_or(endpoint.description);
        endpoint.derived_from_insight = derived_from_insight.unwrap_or(endpoint.derived_from_insight);
        endpoint.is_active = is_active.unwrap_or(endpoint.is_active);
        endpoint.is_materialized = is_materialized.unwrap_or(endpoint.is_materialized);
        endpoint.cache_age = cache_age.unwrap_or(endpoint.cache_age);
        endpoint.sync_frequency = sync_frequency.unwrap_or(endpoint.sync_frequency);
        endpoint.freshness = freshness.unwrap_or(endpoint.freshness);
        endpoint.hibernation = hibernation.unwrap_or(endpoint.hibernation);
        if let Some(NewVersion { number, planned }) = query {
            endpoint.current_version = number;
            endpoint.versions_count = number;
            endpoint.query = planned.query;
            endpoint.columns = planned.columns;
            endpoint.eligibility = Some(planned.eligibility);
            endpoint.tables = Some(planned.tables);
            endpoint.plan_error = None;
        }
        endpoint.updated_at = at;
        endpoint
    }
}

/// An endpoint as a reader of tables: what a write to one of them needs to know of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableReader {
    pub id: Uuid,
    pub name: EndpointName,
    /// Materialized and active: its stored result follows the tables it reads.
    pub refreshed: bool,
    /// The tables its current version reads; `None` when they were not recorded (a version written before they
    /// were), so its query must be planned to tell.
    pub tables: Option<Vec<String>>,
}

impl TableReader {
    #[must_use]
    pub fn of(endpoint: &Endpoint) -> Self {
        Self {
            id: endpoint.id,
            name: endpoint.name.clone(),
            refreshed: endpoint.is_materialized && endpoint.is_active,
            tables: endpoint.tables.clone(),
        }
    }

    /// Whether it may read one of `tables`: it reads one, or what it reads is unknown.
    #[must_use]
    pub fn may_read(&self, tables: &[String]) -> bool {
        self.tables.as_ref().is_none_or(|read| read.iter().any(|t| tables.contains(t)))
    }
}

/// Filters of the endpoint list.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndpointFilter {
    pub is_active: Option<bool>,
    pub is_materialized: Option<bool>,
    /// Case-insensitive substring of name or description.
    pub search: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::materialization::{MaterializationStatus, MaterializationView};
    use crate::testing::{endpoint, query, T0};

    /// A materialized endpoint hibernates `hibernate_after_days` after its last run or change, whichever came
    /// later; its status says since when, and a run (even one not yet written to the store) wakes it.
    #[test]
    fn an_unused_materialized_endpoint_hibernates_until_it_runs() {
        let day = Duration::from_secs(86_400);
        let mut kpi =
            endpoint("kpi", query(serde_json::json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"})));
        kpi.is_materialized = true;
        kpi.sync_frequency = Some(SyncFrequency::DEFAULT);
        assert_eq!(kpi.hibernates_at(), Some(T0 + 7 * day), "a week after its creation by default");
        let six_days = kpi.clone().as_of(T0 + 6 * day, None);
        assert_eq!(six_days.hibernated_at, None);
        let asleep = kpi.clone().as_of(T0 + 8 * day, None);
        assert_eq!(asleep.hibernated_at, Some(T0 + 7 * day));
        let view = MaterializationView::of(&asleep, None);
        assert_eq!(
            (view.status, view.hibernated_at, view.next_run_at),
            (MaterializationStatus::Hibernating, Some(T0 + 7 * day), None)
        );
        // A run two days ago (pending on this node) wakes it for another week; so does a change.
        let woken = kpi.clone().as_of(T0 + 8 * day, Some(T0 + 6 * day));
        assert_eq!((woken.hibernated_at, woken.hibernates_at()), (None, Some(T0 + 13 * day)));
        let changed = Endpoint { updated_at: T0 + 5 * day, ..kpi.clone() }.as_of(T0 + 8 * day, None);
        assert_eq!(changed.hibernated_at, None);
        assert_eq!(MaterializationView::of(&changed, None).status, MaterializationStatus::Pending);
        // Never, when it says so; nor an endpoint that is not materialized.
        let never = Endpoint { hibernation: Hibernation::NEVER, ..kpi.clone() }.as_of(T0 + 800 * day, None);
        assert_eq!(never.hibernated_at, None);
        let live = Endpoint { is_materialized: false, ..kpi }.as_of(T0 + 800 * day, None);
        assert_eq!(
            (live.hibernated_at, MaterializationView::of(&live, None).status),
            (None, MaterializationStatus::Disabled)
        );
    }

    #[test]
    fn names_follow_the_pattern() {
        for ok in ["a", "Daily_revenue-2", &format!("a{}", "b".repeat(127))] {
            assert!(EndpointName::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1abc", "_a", "-a", "a b", "a/b", "a.b", "é", &format!("a{}", "b".repeat(128))] {
            let err = EndpointName::parse(bad).unwrap_err();
            assert_eq!(err.attr.as_deref(), Some("name"), "{bad}");
        }
    }
}
