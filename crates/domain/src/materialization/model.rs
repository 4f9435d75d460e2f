//! Materialization rules: which queries can be stored as a pre-computed result, what a stored result is, and
//! the status a client reads.
//!
//! A stored result is the query run with its variable predicates removed; a run applies those predicates to it.
//! That is only equal to the live answer when every variable is compared with a column the query outputs as it
//! is (a group key when it aggregates) in the outermost WHERE, and nothing after that WHERE depends on the rows
//! the predicates remove (no outermost LIMIT/OFFSET, no window function).
//!
//! An aggregating query whose variables filter other columns can still be stored as a **rollup** when every
//! aggregate can be recombined from partial results: the stored result is grouped by the query's keys plus the
//! filtered columns, with each aggregate's partial values, and a run filters those rows and aggregates them
//! again. The engine reports the facts of a query's plan as a [`QueryOutline`]; [`Eligibility::decide`] applies
//! the rules.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::endpoints::{Endpoint, EndpointName, Freshness, SyncFrequency};
use crate::query::{
    AggregateCall, AggregateKind, ColumnType, CompareOp, Query, QueryOutline, VariablePredicate, VariableType,
};

/// A variable predicate as the run applies it to the stored result: `column <op> value of variable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaterializedFilter {
    pub column: StoredColumn,
    pub op: CompareOp,
    pub variable: String,
}

/// A column of a stored result that a run filters; the engine names how it stores each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoredColumn {
    /// An output column of the query, by name: the stored result is the query's own rows.
    Output(String),
    /// A rollup's `i`th group key of the query ([`Rollup::keys`]).
    Key(usize),
    /// A rollup's `j`th filtered column ([`Rollup::columns`]).
    Filtered(usize),
}

/// A column a rollup adds to the query's grouping because a variable filters it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RollupColumn {
    /// The column as the engine names it (`events.timestamp`): opaque to the rules, which compare it with the
    /// columns of other predicates.
    pub column: String,
    /// Stored truncated to the day: every variable comparing it is a `Date` bounding a timestamp with `>=` or
    /// `<`, which a day's start answers exactly.
    pub day: bool,
}

/// How a rollup stores a query: grouped by its keys, then by the filtered columns, with each aggregate's
/// partial values (how the engine lays that out is its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollup {
    /// The query's group keys, as the engine writes them.
    pub keys: Vec<String>,
    /// The filtered columns added to the grouping.
    pub columns: Vec<RollupColumn>,
    /// The arguments of DISTINCT aggregates ([`distinct_values`]) added to the grouping, each once: a run
    /// applies the aggregate to their stored values again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distinct: Vec<String>,
}

/// Whether a query can be materialized: the filters runs apply (to the rollup's columns when it is one), or the
/// reason it cannot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Eligibility {
    Eligible {
        filters: Vec<MaterializedFilter>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rollup: Option<Rollup>,
    },
    Ineligible {
        reason: String,
    },
}

/// The aggregates [`recombinable`] accepts, as a sentence says them.
const RECOMBINABLE: &str = "COUNT, SUM, MIN, MAX and AVG can, DISTINCT of one argument without FILTER too";

/// Whether an aggregate's partial results recombine: `count` and `sum` by summing, `min` and `max` by themselves
/// (with or without DISTINCT), `avg` as a sum over a count; `count`, `sum` and `avg` of DISTINCT values by
/// storing the values ([`Rollup::distinct`]) and applying the call to them again.
fn recombinable(call: &AggregateCall) -> bool {
    use AggregateKind::{Avg, Count, Max, Min, Other, Sum};
    !call.ordered
        && match call.function {
            Count | Sum | Avg => !call.distinct || call.distinct_argument.is_some(),
            Min | Max => true,
            Other => false,
        }
}

/// The argument whose values a rollup stores for a call: a `count`, `sum` or `avg` of DISTINCT values (whose
/// partial results do not recombine; `min` and `max` of them do).
fn distinct_values(call: &AggregateCall) -> Option<&str> {
    let counted = matches!(call.function, AggregateKind::Count | AggregateKind::Sum | AggregateKind::Avg);
    call.distinct_argument.as_deref().filter(|_| counted && call.distinct)
}

/// A `Date` variable bounding a timestamp from below (`>=`) or above (`<`): the start of a day, which a
/// timestamp truncated to its day compares with exactly as the timestamp does.
fn day_bound(predicate: &VariablePredicate) -> bool {
    predicate.variable_type == VariableType::Date
        && predicate.column_type == ColumnType::Datetime
        && matches!(predicate.op, CompareOp::GtEq | CompareOp::Lt)
}

impl Eligibility {
    /// Applies the materialization rules to the facts of a query's plan.
    pub fn decide(outline: &QueryOutline) -> Self {
        let no = |reason: String| Self::Ineligible { reason };
        if outline.limit_or_offset {
            return no(
                "The query has an outermost LIMIT or OFFSET; a stored result cannot honour it. Remove \
                       it and use the run's limit and offset instead."
                    .into(),
            );
        }
        if let Some(variable) = outline.other_uses.first() {
            return no(format!(
                "Variable '{variable}' is used outside a `column <op> {{variables.{variable}}}` condition of the \
                 outermost WHERE (op one of = != < <= > >=, conditions joined by AND)."
            ));
        }
        let plain = outline
            .predicates
            .iter()
            .all(|p| p.output_column.is_some() && (!outline.aggregates || p.group_key.is_some()));
        // An aggregation is stored as a rollup when its variables filter other columns than its group keys (its
        // final rows cannot answer them), and also when they filter only its keys, or it has none, if a rollup
        // can hold it: its partial aggregates take appended rows in by a fold, where its final rows would be
        // computed again after every append.
        if outline.aggregates && (!plain || Self::rollup_holds(outline)) {
            return Self::decide_rollup(outline);
        }
        let mut filters = Vec::with_capacity(outline.predicates.len());
        for predicate in &outline.predicates {
            let Some(column) = &predicate.output_column else {
                return no(format!(
                    "Variable '{}' is compared with a column that the query does not output unchanged; \
                     add the column to the select list.",
                    predicate.variable
                ));
            };
            filters.push(MaterializedFilter {
                column: StoredColumn::Output(column.clone()),
                op: predicate.op,
                variable: predicate.variable.clone(),
            });
        }
        if outline.window_functions && !filters.is_empty() {
            return no(Self::WINDOWS.into());
        }
        Self::Eligible { filters, rollup: None }
    }

    const WINDOWS: &'static str =
        "The query computes window functions over rows its variables filter; a stored \
                                   result cannot reproduce them.";

    /// Whether an aggregating query can be stored as a rollup: plain group keys, no window function, and every
    /// aggregate recombinable from partial results.
    fn rollup_holds(outline: &QueryOutline) -> bool {
        !outline.window_functions && !outline.grouping_sets && Self::unrecombinable(outline).is_none()
    }

    /// The first aggregate of the query that partial results cannot recombine.
    fn unrecombinable(outline: &QueryOutline) -> Option<&AggregateCall> {
        outline.aggregate_calls.iter().find(|c| !recombinable(c))
    }

    /// Why an aggregating query is stored as its final rows rather than as a rollup, if it is: those are
    /// computed again in full after every append, where a rollup's partial aggregates take appended rows in.
    pub fn final_rows_reason(outline: &QueryOutline) -> Option<String> {
        if !outline.aggregates {
            return None;
        }
        if let Some(call) = Self::unrecombinable(outline) {
            return Some(format!(
                "its aggregate `{}` cannot be recombined from partial results ({RECOMBINABLE}), so its \
                 final rows are stored",
                call.text
            ));
        }
        if outline.grouping_sets {
            return Some("it groups by GROUPING SETS, ROLLUP or CUBE, so its final rows are stored".into());
        }
        outline.window_functions.then(|| "it computes window functions over its groups".into())
    }

    /// The rollup of an aggregating query (see [`Eligibility::rollup_holds`]); one whose variables filter columns
    /// it does not output as group keys cannot be stored otherwise, so it is refused with the reason when a
    /// rollup cannot hold it.
    fn decide_rollup(outline: &QueryOutline) -> Self {
        let no = |reason: String| Self::Ineligible { reason };
        if outline.window_functions {
            return no(Self::WINDOWS.into());
        }
        if outline.grouping_sets {
            return no("The query groups by GROUPING SETS, ROLLUP or CUBE, whose subtotals a stored rollup \
                       cannot filter; group by plain keys."
                .into());
        }
        if let Some(call) = Self::unrecombinable(outline) {
            let predicate = outline.predicates.iter().find(|p| p.group_key.is_none());
            let (variable, column) = predicate.map_or(("", ""), |p| (p.variable.as_str(), p.column.as_str()));
            return no(format!(
                "The aggregate `{}` cannot be recombined from partial results ({RECOMBINABLE}), so it \
                 cannot be stored grouped by `{column}`, which variable '{variable}' filters. Add `{column}` to \
                 GROUP BY and to the select list, or use recombinable aggregates.",
                call.text
            ));
        }
        let mut columns: Vec<RollupColumn> = Vec::new();
        for predicate in outline.predicates.iter().filter(|p| p.group_key.is_none()) {
            if !columns.iter().any(|c| c.column == predicate.column) {
                let day = outline
                    .predicates
                    .iter()
                    .filter(|p| p.group_key.is_none() && p.column == predicate.column)
                    .all(day_bound);
                columns.push(RollupColumn { column: predicate.column.clone(), day });
            }
        }
        let filters = outline
            .predicates
            .iter()
            .map(|p| MaterializedFilter {
                column: match p.group_key {
                    Some(i) => StoredColumn::Key(i),
                    None => StoredColumn::Filtered(
                        columns
                            .iter()
                            .position(|c| c.column == p.column)
                            .expect("every filter's column is among the filter columns"),
                    ),
                },
                op: p.op,
                variable: p.variable.clone(),
            })
            .collect();
        let mut distinct: Vec<String> = Vec::new();
        for argument in outline.aggregate_calls.iter().filter_map(distinct_values) {
            if !distinct.iter().any(|d| d == argument) {
                distinct.push(argument.to_owned());
            }
        }
        Self::Eligible {
            filters,
            rollup: Some(Rollup { keys: outline.group_keys.clone(), columns, distinct }),
        }
    }

    pub fn is_eligible(&self) -> bool {
        matches!(self, Self::Eligible { .. })
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Eligible { .. } => None,
            Self::Ineligible { reason } => Some(reason),
        }
    }

    pub fn filters(&self) -> Option<&[MaterializedFilter]> {
        match self {
            Self::Eligible { filters, .. } => Some(filters),
            Self::Ineligible { .. } => None,
        }
    }

    /// The rollup a stored result is, when it is one.
    pub fn rollup(&self) -> Option<&Rollup> {
        match self {
            Self::Eligible { rollup, .. } => rollup.as_ref(),
            Self::Ineligible { .. } => None,
        }
    }
}

/// Where a materialization stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaterializationStatus {
    Disabled,
    Pending,
    Running,
    Completed,
    Failed,
    /// Not run for its `hibernate_after_days`: neither refreshed nor folded until a run wakes it. A status of
    /// the endpoint, never of a stored record (whose last attempt's outcome it hides meanwhile).
    Hibernating,
}

impl MaterializationStatus {
    pub const ALL: [MaterializationStatus; 6] =
        [Self::Disabled, Self::Pending, Self::Running, Self::Completed, Self::Failed, Self::Hibernating];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "Disabled",
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
            Self::Hibernating => "Hibernating",
        }
    }

    /// # Errors
    /// The unknown text back.
    pub fn parse(raw: &str) -> Result<Self, String> {
        match raw {
            "Disabled" => Ok(Self::Disabled),
            "Pending" => Ok(Self::Pending),
            "Running" => Ok(Self::Running),
            "Completed" => Ok(Self::Completed),
            "Failed" => Ok(Self::Failed),
            "Hibernating" => Ok(Self::Hibernating),
            other => Err(other.to_owned()),
        }
    }
}

impl fmt::Display for MaterializationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How rows appended to its tables reach a stored result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fold {
    /// They are folded into it: the query over the appended rows alone, added to the stored rows or to a
    /// rollup's partial aggregates.
    Incremental,
    /// It is computed again in full, for the reason.
    FullRefreshOnly { reason: String },
}

impl Fold {
    /// Every kind's name, as [`Fold::as_str`] says it.
    pub const NAMES: [&'static str; 2] = ["incremental", "full_refresh_only"];

    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Incremental => "incremental",
            Self::FullRefreshOnly { .. } => "full_refresh_only",
        }
    }

    /// Why every change computes the result in full, when it does.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Incremental => None,
            Self::FullRefreshOnly { reason } => Some(reason),
        }
    }

    /// The fold of its stored text and reason (see [`Fold::as_str`]); `None` for what no release wrote.
    pub fn parse(raw: &str, reason: Option<String>) -> Option<Self> {
        match (raw, reason) {
            ("incremental", None) => Some(Self::Incremental),
            ("full_refresh_only", Some(reason)) => Some(Self::FullRefreshOnly { reason }),
            _ => None,
        }
    }
}

/// A complete stored result, as switched to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResult {
    pub version: u32,
    /// Where the result engine keeps it, relative to the project (see [`attempt_location`]).
    pub location: String,
    pub row_count: u64,
    pub materialized_at: Timestamp,
    /// The time up to which appended rows are in it: a refresh includes every append answered before it began
    /// reading the tables.
    pub data_as_of: Timestamp,
    /// What of its tables it holds, for folding appended rows into it.
    pub coverage: Option<Coverage>,
    /// How appended rows reach it; `None` for a result of a release that did not say.
    pub fold: Option<Fold>,
}

/// The materialization record of one endpoint, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaterializationState {
    pub endpoint_id: Uuid,
    /// The version the last refresh attempt materialized (or is materializing).
    pub version: u32,
    /// Pending, Running, Completed or Failed: the outcome of the last attempt, or Running during one.
    pub status: MaterializationStatus,
    pub next_run_at: Timestamp,
    pub error: Option<String>,
    /// The result runs read, if one was ever completed. It stays readable while a newer attempt runs.
    pub result: Option<StoredResult>,
    /// The running attempt's token and lease.
    pub lease: Option<(Uuid, Timestamp)>,
    /// Since when rows appended to a table the query reads (or a replace of one) are not in the result: the
    /// refresh that includes them is due `freshness_seconds` after it. `None` when nothing is pending.
    pub appended_since: Option<Timestamp>,
    /// Refreshes completed, for this record's whole life.
    pub full_refreshes: u64,
    /// When appended rows were last folded into the result.
    pub last_folded_at: Option<Timestamp>,
    /// Rows folded into results, for this record's whole life.
    pub rows_folded: u64,
}

impl MaterializationState {
    /// When the next refresh is due: at the next scheduled run, or `freshness` after the first append it does
    /// not include, whichever comes first.
    pub fn due_at(&self, freshness: Freshness) -> Timestamp {
        match self.appended_since {
            Some(since) => self.next_run_at.min(since + freshness.effective()),
            None => self.next_run_at,
        }
    }
}

/// A refresh a worker has claimed: it holds the lease until `lease_until` (renewable). It carries what the
/// refresh reads of the store (the claimed version's query, and the result a fold starts from), read with the
/// claim: a refresh's only round trip to the store is its switch.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub endpoint_id: Uuid,
    pub project: ProjectId,
    pub name: EndpointName,
    pub version: u32,
    pub sync_frequency: SyncFrequency,
    /// How stale the endpoint's stored result may grow (see [`Stored::changes_with_time`]).
    pub freshness: Freshness,
    pub token: Uuid,
    /// The location of an attempt this claim took over (its worker crashed or was preempted), for removal.
    pub abandoned: Option<String>,
    /// When the refresh fell due (its record's next run); `None` for a first refresh.
    pub due_at: Option<Timestamp>,
    /// The claimed version's query (versions do not change once written).
    pub query: Query,
    /// Whether the claimed version can be materialized, when it was decided as the version was written.
    pub eligibility: Option<Eligibility>,
    /// The record's result when claimed: no other worker switches it while the claim holds.
    pub current: Option<StoredResult>,
}

/// How finishing a claimed refresh ended in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Switch {
    /// The new result is the one runs read now; the one it replaced (if any) is for removal.
    Switched { replaced: Option<String> },
    /// The claim is no longer held (the endpoint was deleted or turned off, or the lease passed to another
    /// worker); nothing was changed, and the new result is for removal.
    Lost,
}

/// What of its tables a stored result holds, as the engine that wrote it says it (opaque to the rules): a fold
/// starts from it to find the rows appended since.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Coverage(pub String);

/// A stored result written: its rows, and what of its tables it holds, when the engine can tell (a result it
/// cannot tell of is refreshed in full after every change).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The rows the result holds (after a fold, the earlier ones too).
    pub rows: u64,
    /// For a fold, the rows it added; `None` for a result computed in full.
    pub folded: Option<u64>,
    pub coverage: Option<Coverage>,
    /// The query's answer changes while its tables do not: it calls a function whose answer its arguments do
    /// not fix (`now()`, `current_date`, `random()`). Such a result is computed again within its freshness,
    /// rows appended or not (and never folded).
    pub changes_with_time: bool,
    /// How rows appended to its tables reach it from now on.
    pub fold: Fold,
}

/// The directory of one endpoint's stored results, relative to its project.
pub fn endpoint_location(endpoint_id: Uuid) -> String {
    endpoint_id.to_string()
}

/// A fresh location for one refresh attempt: never reused, so a reader of the previous result never sees it
/// change under its feet.
pub fn attempt_location(endpoint_id: Uuid, version: u32, token: Uuid) -> String {
    format!("{endpoint_id}/v{version}-{token}")
}

/// An endpoint's materialization status, as its record and its `materialization_status` show it.
#[derive(Debug, Clone, PartialEq)]
pub struct MaterializationView {
    pub name: EndpointName,
    pub version: u32,
    pub is_materialized: bool,
    pub status: MaterializationStatus,
    pub sync_frequency: Option<SyncFrequency>,
    pub last_materialized_at: Option<Timestamp>,
    pub next_run_at: Option<Timestamp>,
    pub row_count: Option<u64>,
    /// How soon appended rows reach the stored result.
    pub freshness: Freshness,
    /// The time up to which appended rows are in the stored result.
    pub data_as_of: Option<Timestamp>,
    /// Since when appended rows wait for the stored result; `None` when none do.
    pub appended_since: Option<Timestamp>,
    /// Refreshes completed.
    pub full_refreshes: u64,
    /// When appended rows were last folded into the stored result.
    pub last_folded_at: Option<Timestamp>,
    /// Rows folded into stored results.
    pub rows_folded: u64,
    /// Days without a run after which it hibernates; `None` for never.
    pub hibernate_after_days: Option<u32>,
    /// Since when it hibernates; `None` while it refreshes.
    pub hibernated_at: Option<Timestamp>,
    /// How appended rows reach the stored result; `None` before a result of this version says.
    pub fold: Option<Fold>,
    /// The rollup the stored result is, when it is one.
    pub rollup: Option<Rollup>,
    pub error: Option<String>,
    pub can_materialize: bool,
    pub reason: Option<String>,
}

impl MaterializationView {
    /// The status of the endpoint's current version. A version that no attempt has reached yet is Pending, due
    /// since the endpoint last changed; figures of a result of an older version are not shown as this version's.
    /// A hibernating endpoint is Hibernating (unless an attempt still runs), with nothing due.
    pub fn of(endpoint: &Endpoint, state: Option<&MaterializationState>) -> Self {
        let mut view = Self::of_record(endpoint, state);
        if let Some(since) = endpoint.hibernated_at.filter(|_| view.status != MaterializationStatus::Running)
        {
            view.status = MaterializationStatus::Hibernating;
            view.hibernated_at = Some(since);
            view.next_run_at = None;
        }
        view
    }

    fn of_record(endpoint: &Endpoint, state: Option<&MaterializationState>) -> Self {
        let eligibility = endpoint.eligibility.as_ref();
        let mut view = Self {
            name: endpoint.name.clone(),
            version: endpoint.current_version,
            is_materialized: endpoint.is_materialized,
            status: MaterializationStatus::Disabled,
            sync_frequency: endpoint.sync_frequency,
            last_materialized_at: None,
            next_run_at: None,
            row_count: None,
            freshness: endpoint.freshness,
            data_as_of: None,
            appended_since: None,
            full_refreshes: 0,
            last_folded_at: None,
            rows_folded: 0,
            hibernate_after_days: endpoint.hibernation.days(),
            hibernated_at: None,
            fold: None,
            rollup: eligibility.and_then(Eligibility::rollup).cloned(),
            error: None,
            can_materialize: eligibility.is_some_and(Eligibility::is_eligible) && endpoint.is_active,
            reason: match eligibility {
                Some(e) if !endpoint.is_active && e.is_eligible() => {
                    Some("The endpoint is inactive; only an active endpoint can be materialized.".into())
                }
                Some(e) => e.reason().map(str::to_owned),
                None => Some("The query has not been analysed yet.".into()),
            },
        };
        if !endpoint.is_materialized {
            return view;
        }
        view.status = MaterializationStatus::Pending;
        view.next_run_at = Some(endpoint.updated_at);
        let Some(state) = state.filter(|s| s.version == endpoint.current_version) else {
            return view;
        };
        view.status = state.status;
        view.next_run_at = Some(state.due_at(endpoint.freshness));
        view.error = state.error.clone();
        view.full_refreshes = state.full_refreshes;
        view.last_folded_at = state.last_folded_at;
        view.rows_folded = state.rows_folded;
        if let Some(result) = state.result.as_ref().filter(|r| r.version == endpoint.current_version) {
            view.last_materialized_at = Some(result.materialized_at);
            view.row_count = Some(result.row_count);
            view.data_as_of = Some(result.data_as_of);
            view.appended_since = state.appended_since;
            view.fold = result.fold.clone();
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn predicate(variable: &str, column: Option<&str>, group_key: Option<usize>) -> VariablePredicate {
        VariablePredicate {
            variable: variable.into(),
            variable_type: VariableType::String,
            op: CompareOp::GtEq,
            column: format!("t.{}", column.unwrap_or("hidden")),
            column_type: ColumnType::String,
            output_column: column.map(str::to_owned),
            group_key,
        }
    }

    fn call(function: AggregateKind, distinct: bool) -> AggregateCall {
        let name = format!("{function:?}").to_lowercase();
        AggregateCall {
            text: format!("{name}({}t.x)", if distinct { "DISTINCT " } else { "" }),
            function,
            distinct,
            ordered: false,
            distinct_argument: None,
        }
    }

    /// A DISTINCT call of one argument, `t.{column}`.
    fn distinct_of(function: AggregateKind, column: &str) -> AggregateCall {
        let name = format!("{function:?}").to_lowercase();
        AggregateCall {
            text: format!("{name}(DISTINCT t.{column})"),
            function,
            distinct: true,
            ordered: false,
            distinct_argument: Some(format!("t.{column}")),
        }
    }

    /// `count`, `sum` and `avg` of the DISTINCT values of one argument are stored as a rollup with the argument
    /// among its grouping (once, whatever calls share it), whether variables filter the keys or other columns;
    /// `min` and `max` of DISTINCT values recombine as they are; a DISTINCT call of several arguments or with a
    /// FILTER does not.
    #[test]
    fn distinct_aggregates_of_one_argument_store_its_values() {
        let calls = vec![
            distinct_of(AggregateKind::Count, "user"),
            distinct_of(AggregateKind::Sum, "amount"),
            distinct_of(AggregateKind::Avg, "user"),
            distinct_of(AggregateKind::Max, "other"),
            call(AggregateKind::Sum, false),
        ];
        for predicates in [vec![predicate("since", Some("day"), Some(0))], vec![predicate("x", None, None)]] {
            let outline = QueryOutline {
                aggregates: true,
                group_keys: vec!["t.day".into()],
                aggregate_calls: calls.clone(),
                predicates,
                ..QueryOutline::default()
            };
            let rollup = Eligibility::decide(&outline).rollup().cloned().expect("a rollup");
            assert_eq!(rollup.distinct, vec!["t.user".to_owned(), "t.amount".to_owned()]);
            assert_eq!(Eligibility::final_rows_reason(&outline), None);
            let several =
                QueryOutline { aggregate_calls: vec![call(AggregateKind::Count, true)], ..outline.clone() };
            assert_eq!(Eligibility::decide(&several).rollup(), None);
        }
    }

    #[test]
    fn a_query_without_variables_is_eligible_with_no_filters() {
        assert_eq!(
            Eligibility::decide(&QueryOutline::default()),
            Eligibility::Eligible { filters: vec![], rollup: None }
        );
    }

    /// An aggregation whose variables filter only its group keys is a rollup of its keys when its aggregates
    /// recombine (so that appended rows fold in), and its final rows otherwise.
    #[test]
    fn predicates_on_output_group_keys_filter_a_rollup_of_the_keys_or_the_final_rows() {
        let outline = QueryOutline {
            aggregates: true,
            group_keys: vec!["t.day".into()],
            aggregate_calls: vec![call(AggregateKind::Sum, false), call(AggregateKind::Max, true)],
            predicates: vec![predicate("since", Some("day"), Some(0))],
            ..QueryOutline::default()
        };
        let decided = Eligibility::decide(&outline);
        let filter = |column| MaterializedFilter { column, op: CompareOp::GtEq, variable: "since".into() };
        assert_eq!(decided.filters().unwrap(), &[filter(StoredColumn::Key(0))]);
        let keys = Rollup { keys: vec!["t.day".into()], columns: vec![], distinct: vec![] };
        assert_eq!(decided.rollup(), Some(&keys));
        // Without variables too.
        let unfiltered = QueryOutline { predicates: vec![], ..outline.clone() };
        assert_eq!(Eligibility::decide(&unfiltered).rollup().map(|r| r.keys.len()), Some(1));
        for kept in [
            QueryOutline { aggregate_calls: vec![call(AggregateKind::Count, true)], ..outline.clone() },
            QueryOutline { aggregate_calls: vec![call(AggregateKind::Other, false)], ..outline.clone() },
            QueryOutline { grouping_sets: true, ..outline.clone() },
        ] {
            let decided = Eligibility::decide(&kept);
            assert_eq!(decided.filters().unwrap(), &[filter(StoredColumn::Output("day".into()))], "{kept:?}");
            assert_eq!(decided.rollup(), None);
            // Its final rows are computed again after every append, and the status says why.
            assert!(Eligibility::final_rows_reason(&kept).is_some(), "{kept:?}");
        }
        let reason = |outline: &QueryOutline| Eligibility::final_rows_reason(outline);
        assert_eq!(reason(&outline), None, "a rollup takes appended rows in");
        assert_eq!(reason(&QueryOutline::default()), None, "rows without an aggregation are not final rows");
        let distinct = QueryOutline { aggregate_calls: vec![call(AggregateKind::Count, true)], ..outline };
        assert!(reason(&distinct).unwrap().contains("`count(DISTINCT t.x)` cannot be recombined"));
    }

    /// The status shows how appended rows reach the current version's stored result, and nothing for a result
    /// of another version or before one says.
    #[test]
    fn the_status_says_how_appended_rows_reach_the_current_result() {
        let mut endpoint = crate::testing::endpoint(
            "kpi",
            crate::testing::query(serde_json::json!({"kind": "SQLQuery", "query": "SELECT 1 AS n"})),
        );
        endpoint.is_materialized = true;
        let full = Fold::FullRefreshOnly { reason: "the query reads `t` 2 times".into() };
        let result = StoredResult {
            version: endpoint.current_version,
            location: "loc".into(),
            row_count: 1,
            materialized_at: crate::testing::T0,
            data_as_of: crate::testing::T0,
            coverage: None,
            fold: Some(full.clone()),
        };
        let state = |result: StoredResult| MaterializationState {
            endpoint_id: endpoint.id,
            version: result.version,
            status: MaterializationStatus::Completed,
            next_run_at: crate::testing::T0,
            error: None,
            result: Some(result),
            lease: None,
            appended_since: None,
            full_refreshes: 1,
            last_folded_at: None,
            rows_folded: 0,
        };
        let view = MaterializationView::of(&endpoint, Some(&state(result.clone())));
        assert_eq!((view.fold.as_ref(), full.reason()), (Some(&full), Some("the query reads `t` 2 times")));
        let older = StoredResult { version: endpoint.current_version - 1, ..result.clone() };
        assert_eq!(MaterializationView::of(&endpoint, Some(&state(older))).fold, None);
        assert_eq!(MaterializationView::of(&endpoint, None).fold, None);
        // Stored as its kind and reason, and read back.
        for fold in [Fold::Incremental, full] {
            assert_eq!(Fold::parse(fold.as_str(), fold.reason().map(str::to_owned)), Some(fold));
        }
        assert_eq!(Fold::parse("full_refresh_only", None), None, "a reason goes with it");
    }

    #[test]
    fn each_broken_rule_has_its_reason() {
        let cases = [
            (QueryOutline { limit_or_offset: true, ..QueryOutline::default() }, "LIMIT"),
            (QueryOutline { other_uses: vec!["x".into()], ..QueryOutline::default() }, "'x' is used outside"),
            (
                QueryOutline { predicates: vec![predicate("x", None, None)], ..QueryOutline::default() },
                "does not output",
            ),
            (
                QueryOutline {
                    aggregates: true,
                    predicates: vec![predicate("x", None, None)],
                    aggregate_calls: vec![call(AggregateKind::Sum, false), call(AggregateKind::Count, true)],
                    ..QueryOutline::default()
                },
                "`count(DISTINCT t.x)` cannot be recombined",
            ),
            (
                QueryOutline {
                    aggregates: true,
                    predicates: vec![predicate("x", None, None)],
                    aggregate_calls: vec![call(AggregateKind::Other, false)],
                    ..QueryOutline::default()
                },
                "`other(t.x)` cannot be recombined",
            ),
            (
                QueryOutline {
                    aggregates: true,
                    grouping_sets: true,
                    predicates: vec![predicate("x", None, None)],
                    ..QueryOutline::default()
                },
                "GROUPING SETS",
            ),
            (
                QueryOutline {
                    window_functions: true,
                    predicates: vec![predicate("x", Some("c"), None)],
                    ..QueryOutline::default()
                },
                "window functions",
            ),
            (
                QueryOutline {
                    aggregates: true,
                    window_functions: true,
                    predicates: vec![predicate("x", None, None)],
                    ..QueryOutline::default()
                },
                "window functions",
            ),
        ];
        for (outline, expected) in cases {
            let decided = Eligibility::decide(&outline);
            assert!(decided.reason().is_some_and(|r| r.contains(expected)), "{outline:?}: {decided:?}");
        }
        // Window functions without variables read the same rows either way.
        let windows = QueryOutline { window_functions: true, ..QueryOutline::default() };
        assert!(Eligibility::decide(&windows).is_eligible());
    }

    fn dated(variable: &str, op: CompareOp, variable_type: VariableType) -> VariablePredicate {
        VariablePredicate {
            variable: variable.into(),
            variable_type,
            op,
            column: "events.timestamp".into(),
            column_type: ColumnType::Datetime,
            output_column: None,
            group_key: None,
        }
    }

    #[test]
    fn an_aggregation_filtered_on_other_columns_is_a_rollup_grouped_by_keys_then_filtered_columns() {
        let outline = QueryOutline {
            aggregates: true,
            group_keys: vec!["events.country".into()],
            aggregate_calls: vec![
                call(AggregateKind::Count, false),
                call(AggregateKind::Sum, false),
                call(AggregateKind::Avg, false),
                call(AggregateKind::Max, true),
            ],
            predicates: vec![
                dated("since", CompareOp::GtEq, VariableType::Date),
                dated("until", CompareOp::Lt, VariableType::Date),
                predicate("browser", None, None),
                predicate("country", Some("country"), Some(0)),
            ],
            ..QueryOutline::default()
        };
        let decided = Eligibility::decide(&outline);
        let rollup = decided.rollup().expect("a rollup");
        assert_eq!(rollup.keys, ["events.country"]);
        assert_eq!(
            rollup.columns,
            [
                RollupColumn { column: "events.timestamp".into(), day: true },
                RollupColumn { column: "t.hidden".into(), day: false }
            ]
        );
        let filters: Vec<_> =
            decided.filters().unwrap().iter().map(|f| (f.column.clone(), f.variable.as_str())).collect();
        use StoredColumn::{Filtered, Key};
        assert_eq!(
            filters,
            [(Filtered(0), "since"), (Filtered(0), "until"), (Filtered(1), "browser"), (Key(0), "country")]
        );
    }

    #[test]
    fn a_date_compared_otherwise_than_by_a_days_start_keeps_the_timestamp_whole() {
        for (op, ty) in [
            (CompareOp::Gt, VariableType::Date),
            (CompareOp::LtEq, VariableType::Date),
            (CompareOp::Eq, VariableType::Date),
            (CompareOp::GtEq, VariableType::DateTime),
        ] {
            let outline = QueryOutline {
                aggregates: true,
                predicates: vec![dated("since", CompareOp::GtEq, VariableType::Date), dated("other", op, ty)],
                ..QueryOutline::default()
            };
            let decided = Eligibility::decide(&outline);
            let whole = RollupColumn { column: "events.timestamp".into(), day: false };
            assert_eq!(decided.rollup().unwrap().columns, [whole], "{op:?} {ty:?}");
        }
    }

    #[test]
    fn group_keys_the_query_outputs_stay_plain_filters() {
        let outline = QueryOutline {
            aggregates: true,
            group_keys: vec!["t.day".into()],
            aggregate_calls: vec![call(AggregateKind::Count, true)],
            predicates: vec![predicate("since", Some("day"), Some(0))],
            ..QueryOutline::default()
        };
        assert_eq!(Eligibility::decide(&outline).rollup(), None);
        assert!(Eligibility::decide(&outline).is_eligible());
    }

    #[test]
    fn a_rollup_round_trips_through_json_and_older_records_read_without_one() {
        let outline = QueryOutline {
            aggregates: true,
            predicates: vec![dated("since", CompareOp::GtEq, VariableType::Date)],
            ..QueryOutline::default()
        };
        let decided = Eligibility::decide(&outline);
        let text = serde_json::to_string(&decided).unwrap();
        assert_eq!(serde_json::from_str::<Eligibility>(&text).unwrap(), decided);
        let older = r#"{"eligible":{"filters":[]}}"#;
        assert_eq!(
            serde_json::from_str::<Eligibility>(older).unwrap(),
            Eligibility::Eligible { filters: vec![], rollup: None }
        );
    }

    #[test]
    fn eligibility_round_trips_through_json() {
        let eligible = Eligibility::Eligible {
            filters: vec![MaterializedFilter {
                column: StoredColumn::Output("c".into()),
                op: CompareOp::NotEq,
                variable: "v".into(),
            }],
            rollup: None,
        };
        let text = serde_json::to_string(&eligible).unwrap();
        assert_eq!(text, r#"{"eligible":{"filters":[{"column":{"output":"c"},"op":"!=","variable":"v"}]}}"#);
        assert_eq!(serde_json::from_str::<Eligibility>(&text).unwrap(), eligible);
    }
}
