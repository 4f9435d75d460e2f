//! Materialization rules: which queries can be stored as a pre-computed result, what a stored result is, and
//! the status a client reads.
//!
//! A stored result is the query run with its variable predicates removed; a run applies those predicates to it.
//! That is only equal to the live answer when every variable is compared with a column the query outputs as it
//! is (a group key when it aggregates) in the outermost WHERE, and nothing after that WHERE depends on the rows
//! the predicates remove (no outermost LIMIT/OFFSET, no window function). The engine reports those facts from
//! its plan as a [`QueryOutline`]; [`Eligibility::decide`] applies the rule.

use std::fmt;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::endpoints::{Endpoint, EndpointName, SyncFrequency};
use crate::query::{CompareOp, QueryOutline};

/// A variable predicate as the run applies it to the stored result: `column <op> value of variable`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MaterializedFilter {
    pub column: String,
    pub op: CompareOp,
    pub variable: String,
}

/// Whether a query can be materialized: the filters runs apply, or the reason it cannot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Eligibility {
    Eligible { filters: Vec<MaterializedFilter> },
    Ineligible { reason: String },
}

impl Eligibility {
    /// Applies the materialization rule to the facts of a query's plan.
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
        let mut filters = Vec::with_capacity(outline.predicates.len());
        for predicate in &outline.predicates {
            let variable = &predicate.variable;
            if outline.aggregates && !predicate.group_key {
                return no(format!(
                    "Variable '{variable}' is compared with a column that is not a group key of the \
                     aggregation; add the column to GROUP BY and to the select list."
                ));
            }
            let Some(column) = &predicate.output_column else {
                return no(format!(
                    "Variable '{variable}' is compared with a column that the query does not output unchanged; \
                     add the column to the select list."
                ));
            };
            filters.push(MaterializedFilter {
                column: column.clone(),
                op: predicate.op,
                variable: variable.clone(),
            });
        }
        if outline.window_functions && !filters.is_empty() {
            return no(
                "The query computes window functions over rows its variables filter; a stored result \
                       cannot reproduce them."
                    .into(),
            );
        }
        Self::Eligible { filters }
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
            Self::Eligible { filters } => Some(filters),
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
}

impl MaterializationStatus {
    pub const ALL: [MaterializationStatus; 5] =
        [Self::Disabled, Self::Pending, Self::Running, Self::Completed, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "Disabled",
            Self::Pending => "Pending",
            Self::Running => "Running",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
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
            other => Err(other.to_owned()),
        }
    }
}

impl fmt::Display for MaterializationStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
}

/// A refresh a worker has claimed: it holds the lease until `lease_until` (renewable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub endpoint_id: Uuid,
    pub project: ProjectId,
    pub name: EndpointName,
    pub version: u32,
    pub sync_frequency: SyncFrequency,
    pub token: Uuid,
    /// The location of an attempt this claim took over (its worker crashed or was preempted), for removal.
    pub abandoned: Option<String>,
    /// When the refresh fell due (its record's next run); `None` for a first refresh.
    pub due_at: Option<Timestamp>,
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
    pub error: Option<String>,
    pub can_materialize: bool,
    pub reason: Option<String>,
}

impl MaterializationView {
    /// The status of the endpoint's current version. A version that no attempt has reached yet is Pending, due
    /// since the endpoint last changed; figures of a result of an older version are not shown as this version's.
    pub fn of(endpoint: &Endpoint, state: Option<&MaterializationState>) -> Self {
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
        view.next_run_at = Some(state.next_run_at);
        view.error = state.error.clone();
        if let Some(result) = state.result.as_ref().filter(|r| r.version == endpoint.current_version) {
            view.last_materialized_at = Some(result.materialized_at);
            view.row_count = Some(result.row_count);
        }
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::VariablePredicate;

    fn predicate(variable: &str, column: Option<&str>, group_key: bool) -> VariablePredicate {
        VariablePredicate {
            variable: variable.into(),
            op: CompareOp::GtEq,
            output_column: column.map(str::to_owned),
            group_key,
        }
    }

    #[test]
    fn a_query_without_variables_is_eligible_with_no_filters() {
        assert_eq!(Eligibility::decide(&QueryOutline::default()), Eligibility::Eligible { filters: vec![] });
    }

    #[test]
    fn predicates_on_output_group_keys_become_filters() {
        let outline = QueryOutline {
            aggregates: true,
            predicates: vec![predicate("since", Some("day"), true)],
            ..QueryOutline::default()
        };
        let filters = Eligibility::decide(&outline);
        assert_eq!(
            filters.filters().unwrap(),
            &[MaterializedFilter { column: "day".into(), op: CompareOp::GtEq, variable: "since".into() }]
        );
    }

    #[test]
    fn each_broken_rule_has_its_reason() {
        let cases = [
            (QueryOutline { limit_or_offset: true, ..QueryOutline::default() }, "LIMIT"),
            (QueryOutline { other_uses: vec!["x".into()], ..QueryOutline::default() }, "'x' is used outside"),
            (
                QueryOutline { predicates: vec![predicate("x", None, false)], ..QueryOutline::default() },
                "does not output",
            ),
            (
                QueryOutline {
                    aggregates: true,
                    predicates: vec![predicate("x", Some("c"), false)],
                    ..QueryOutline::default()
                },
                "not a group key",
            ),
            (
                QueryOutline {
                    window_functions: true,
                    predicates: vec![predicate("x", Some("c"), false)],
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

    #[test]
    fn eligibility_round_trips_through_json() {
        let eligible = Eligibility::Eligible {
            filters: vec![MaterializedFilter {
                column: "c".into(),
                op: CompareOp::NotEq,
                variable: "v".into(),
            }],
        };
        let text = serde_json::to_string(&eligible).unwrap();
        assert_eq!(text, r#"{"eligible":{"filters":[{"column":"c","op":"!=","variable":"v"}]}}"#);
        assert_eq!(serde_json::from_str::<Eligibility>(&text).unwrap(), eligible);
    }
}
