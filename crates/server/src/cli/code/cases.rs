//! `endpoints test`: each case of `tests/<name>.yaml` run against the server, its answer compared with what
//! the case expects; a JUnit report for CI.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::client::{Api, RunAnswer};
use super::files::{Expectation, TestCase};

/// One case's outcome: its differences from what it expects (none: passed), or why it could not run.
#[derive(Debug)]
pub struct Outcome {
    pub endpoint: String,
    pub case: String,
    pub took: Duration,
    pub result: Result<Vec<String>, String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        matches!(&self.result, Ok(differences) if differences.is_empty())
    }
}

/// Runs every case, endpoint by endpoint, case by case in file order.
pub async fn run_all(api: &Api, tests: &BTreeMap<String, Vec<TestCase>>) -> Vec<Outcome> {
    let mut outcomes = Vec::new();
    for (endpoint, cases) in tests {
        for case in cases {
            let began = Instant::now();
            let answer = api.run(endpoint, &Value::Object(case.variables.clone())).await;
            outcomes.push(Outcome {
                endpoint: endpoint.clone(),
                case: case.name.clone(),
                took: began.elapsed(),
                result: answer
                    .map(|answer| differences(&case.expect, &answer))
                    .map_err(|err| err.to_string()),
            });
        }
    }
    outcomes
}

/// What differs between an answer and what a case expects, one line each: values compare exactly, types
/// included (`1` is not `1.0`, `"1"` is not `1`), rows in order.
pub fn differences(expect: &Expectation, answer: &RunAnswer) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(count) = expect.row_count {
        if count != answer.results.len() {
            found.push(format!("row_count: expected {count}, got {}", answer.results.len()));
        }
    }
    if let Some(columns) = &expect.columns {
        if *columns != answer.columns {
            found.push(format!("columns: expected {columns:?}, got {:?}", answer.columns));
        }
    }
    if let Some(rows) = &expect.rows {
        if rows.len() != answer.results.len() {
            found.push(format!("rows: expected {} rows, got {}", rows.len(), answer.results.len()));
        }
        for (i, (expected, got)) in rows.iter().zip(&answer.results).enumerate() {
            if expected != got {
                found.push(format!(
                    "row {}: expected {}, got {}",
                    i + 1,
                    Value::Object(expected.clone()),
                    Value::Object(got.clone())
                ));
            }
        }
    }
    found
}

/// The outcomes as a JUnit XML report: a suite per endpoint, a test case per case.
///
/// # Errors
/// The report cannot be written as XML (none that a case can make).
pub fn junit(outcomes: &[Outcome]) -> Result<String, String> {
    use quick_junit::{NonSuccessKind, Report, TestCase as JunitCase, TestCaseStatus, TestSuite};
    let mut report = Report::new("endpoints");
    let mut suites: BTreeMap<&str, TestSuite> = BTreeMap::new();
    for outcome in outcomes {
        let status = match &outcome.result {
            Ok(differences) if differences.is_empty() => TestCaseStatus::success(),
            Ok(differences) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Failure);
                status.set_message(format!("{} difference(s)", differences.len()));
                status.set_description(differences.join("\n"));
                status
            }
            Err(err) => {
                let mut status = TestCaseStatus::non_success(NonSuccessKind::Error);
                status.set_message(err.clone());
                status
            }
        };
        let mut case = JunitCase::new(outcome.case.clone(), status);
        case.set_classname(outcome.endpoint.clone()).set_time(outcome.took);
        suites
            .entry(&outcome.endpoint)
            .or_insert_with(|| TestSuite::new(outcome.endpoint.clone()))
            .add_test_case(case);
    }
    report.add_test_suites(suites.into_values());
    report.to_string().map_err(|err| err.to_string())
}
