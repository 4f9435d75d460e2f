//! The query engine port: planning a query without running it, and running it with bound variables.

use std::collections::BTreeMap;

use async_trait::async_trait;

use super::binding::BoundValue;
use super::export::{Export, ResultFormat};
use super::model::Query;
use super::plan::{QueryDescription, QueryResult};
use super::snapshot::ReadAt;
use crate::access::ProjectId;
use crate::error::EngineError;

/// Plans and runs queries over a project's tables.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait QueryEngine: Send + Sync {
    /// Plans the query without running it and returns its output columns. Placeholders are planned as typed
    /// parameters of their declared variables.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] for SQL that is not one read-only statement, names an unknown table or column,
    /// or has duplicate output column names; [`EngineError::Busy`] when the project's queries take every slot it
    /// has; `Unavailable`, `Internal`.
    async fn describe(&self, project: ProjectId, query: &Query) -> Result<QueryDescription, EngineError>;

    /// Plans the query as [`QueryEngine::describe`] does, for the service's own work that a busy project must not
    /// make it lose (planning an endpoint again after its table was replaced, planning a refresh): it waits for
    /// one of the project's slots, within the query timeout, where `describe` is refused. An engine without
    /// slots plans at once.
    ///
    /// # Errors
    /// As [`QueryEngine::describe`], with [`EngineError::Timeout`] instead of `Busy`.
    async fn describe_queued(
        &self,
        project: ProjectId,
        query: &Query,
    ) -> Result<QueryDescription, EngineError> {
        self.describe(project, query).await
    }

    /// Runs the query with its variables bound as typed parameters and returns the page `offset..offset+limit`
    /// of its rows, with whether more rows follow.
    ///
    /// # Errors
    /// [`EngineError::InvalidQuery`] when the query no longer plans (a table changed);
    /// [`EngineError::Timeout`], [`EngineError::MemoryLimit`], [`EngineError::Busy`]; `Unavailable`, `Internal`.
    async fn execute(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        limit: u32,
        offset: u64,
    ) -> Result<QueryResult, EngineError>;

    /// Runs the query like [`QueryEngine::execute`], reading each table at the version `at` says. An engine that
    /// keeps no versions reads only the newest.
    ///
    /// # Errors
    /// As [`QueryEngine::execute`]; [`EngineError::NoSuchVersion`] when a table has no version at that time, or
    /// the pinned one is no longer kept.
    async fn execute_at(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        limit: u32,
        offset: u64,
        at: &ReadAt,
    ) -> Result<QueryResult, EngineError> {
        match at {
            ReadAt::Newest => self.execute(project, query, variables, limit, offset).await,
            _ => {
                Err(EngineError::NoSuchVersion("this engine reads only the newest version of tables".into()))
            }
        }
    }

    /// Runs the query like [`QueryEngine::execute`] and writes the page `offset..offset+limit` of its rows in
    /// `format`, without holding them in memory. With `limit` 0 the query is planned, not run: the page has its
    /// columns (a CSV header, a Parquet or Arrow schema) and no rows.
    ///
    /// # Errors
    /// As [`QueryEngine::execute`]; `Internal` when the page cannot be written.
    async fn export(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError>;
}
