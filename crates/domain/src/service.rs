//! The endpoint rules: creating, listing, reading, changing and deleting endpoints and reading their versions.

use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use crate::auth::ProjectId;
use crate::endpoint::{Endpoint, EndpointChange, EndpointFilter, EndpointName, EndpointVersion, NewEndpoint};
use crate::error::{Error, Invalid};
use crate::executions::ExecutionTracker;
use crate::fields::{parse_bool_param, Fields};
use crate::page::{Page, PageRequest};
use crate::ports::{Clock, EndpointStore, QueryEngine, ResultCache};
use crate::query::Query;
use crate::settings::{CacheAge, SyncFrequency};

/// The fields a create or update body may carry.
pub const ENDPOINT_FIELDS: [&str; 8] = [
    "name",
    "description",
    "query",
    "derived_from_insight",
    "is_active",
    "is_materialized",
    "cache_age_seconds",
    "sync_frequency",
];

/// Raw list parameters as they arrive in a query string.
#[derive(Debug, Clone, Default)]
pub struct ListParams<'a> {
    pub limit: Option<&'a str>,
    pub offset: Option<&'a str>,
    pub is_active: Option<&'a str>,
    pub is_materialized: Option<&'a str>,
    pub search: Option<&'a str>,
}

pub struct EndpointService {
    store: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    clock: Arc<dyn Clock>,
    cache: Option<Arc<dyn ResultCache>>,
    executions: Option<Arc<ExecutionTracker>>,
}

/// A name from a path: one that cannot be valid cannot exist either, so it is a 404, not a 400.
fn path_name(raw: &str) -> Result<EndpointName, Error> {
    EndpointName::parse(raw).map_err(|_| not_found(raw))
}

fn not_found(name: &str) -> Error {
    Error::NotFound(format!("No endpoint named '{name}' in this project."))
}

fn sync_frequency_field(fields: &Fields<'_>) -> Result<Option<Option<SyncFrequency>>, Invalid> {
    fields
        .nullable_string("sync_frequency")?
        .map(|raw| raw.as_deref().map(SyncFrequency::parse).transpose())
        .transpose()
}

fn cache_age_field(fields: &Fields<'_>) -> Result<Option<CacheAge>, Invalid> {
    fields.nullable_int("cache_age_seconds")?.map(CacheAge::new).transpose()
}

fn sync_needs_materialization() -> Invalid {
    Invalid::field(
        "sync_frequency",
        "sync_frequency can only be set on a materialized endpoint (is_materialized: true).",
    )
}

impl EndpointService {
    pub fn new(store: Arc<dyn EndpointStore>, engine: Arc<dyn QueryEngine>, clock: Arc<dyn Clock>) -> Self {
        Self { store, engine, clock, cache: None, executions: None }
    }

    /// Connects the run side: updates and deletes invalidate cached runs, records show pending execution times.
    #[must_use]
    pub fn with_runs(mut self, cache: Arc<dyn ResultCache>, executions: Arc<ExecutionTracker>) -> Self {
        self.cache = Some(cache);
        self.executions = Some(executions);
        self
    }

    /// The record with the newest execution time, including one not yet flushed to the store.
    fn with_pending_execution(&self, mut endpoint: Endpoint) -> Endpoint {
        if let Some(pending) =
            self.executions.as_ref().and_then(|e| e.pending(endpoint.project_id, &endpoint.name))
        {
            if endpoint.last_executed_at.is_none_or(|stored| stored < pending) {
                endpoint.last_executed_at = Some(pending);
            }
        }
        endpoint
    }

    fn invalidate(&self, project: ProjectId, name: &EndpointName) {
        if let Some(cache) = &self.cache {
            cache.invalidate(project, name);
        }
    }

    /// Creates an endpoint from a request body; its query becomes version 1.
    ///
    /// # Errors
    /// [`Error::Invalid`] for any field that breaks a rule (including SQL the engine refuses),
    /// [`Error::NameTaken`], store and engine failures.
    pub async fn create(&self, project: ProjectId, body: &Value) -> Result<Endpoint, Error> {
        let fields = Fields::new(body, &ENDPOINT_FIELDS)?;
        let name = match fields.nullable_string("name")? {
            Some(Some(name)) => EndpointName::parse(&name)?,
            _ => return Err(Invalid::required("name").into()),
        };
        let query = match fields.get("query") {
            None | Some(Value::Null) => return Err(Invalid::required("query").into()),
            Some(raw) => Query::from_json(raw)?,
        };
        let is_materialized = fields.bool("is_materialized")?.unwrap_or(false);
        let sync_frequency = match sync_frequency_field(&fields)?.flatten() {
            Some(_) if !is_materialized => return Err(sync_needs_materialization().into()),
            Some(freq) => Some(freq),
            None => is_materialized.then(SyncFrequency::default),
        };
        let endpoint = NewEndpoint {
            id: Uuid::new_v4(),
            project_id: project,
            name,
            description: fields.nullable_string("description")?.flatten().unwrap_or_default(),
            columns: Vec::new(),
            query,
            derived_from_insight: fields.nullable_string("derived_from_insight")?.flatten(),
            is_active: fields.bool("is_active")?.unwrap_or(true),
            is_materialized,
            cache_age: cache_age_field(&fields)?.unwrap_or_default(),
            sync_frequency,
            created_at: self.clock.now(),
        };
        let columns = self.engine.describe(project, &endpoint.query).await?;
        Ok(self.store.insert(NewEndpoint { columns, ..endpoint }).await?)
    }

    /// # Errors
    /// [`Error::Invalid`] for bad paging or filter parameters; store failures.
    pub async fn list(&self, project: ProjectId, params: ListParams<'_>) -> Result<Page<Endpoint>, Error> {
        let page = PageRequest::parse(params.limit, params.offset)?;
        let filter = EndpointFilter {
            is_active: params.is_active.map(|raw| parse_bool_param("is_active", raw)).transpose()?,
            is_materialized: params
                .is_materialized
                .map(|raw| parse_bool_param("is_materialized", raw))
                .transpose()?,
            search: params.search.map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned),
        };
        let mut page = self.store.list(project, &filter, page).await?;
        page.items = page.items.into_iter().map(|e| self.with_pending_execution(e)).collect();
        Ok(page)
    }

    /// # Errors
    /// [`Error::NotFound`]; store failures.
    pub async fn get(&self, project: ProjectId, name: &str) -> Result<Endpoint, Error> {
        let name = path_name(name)?;
        let endpoint = self.store.get(project, &name).await.map_err(|e| self.name_error(e, &name))?;
        Ok(self.with_pending_execution(endpoint))
    }

    /// Applies a partial update. Only a change of the query's canonical form makes a new version; a body that
    /// changes nothing writes nothing.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Invalid`] for a rename, a bad field or SQL the engine refuses; store and
    /// engine failures.
    pub async fn update(&self, project: ProjectId, name: &str, body: &Value) -> Result<Endpoint, Error> {
        let name = path_name(name)?;
        let fields = Fields::new(body, &ENDPOINT_FIELDS)?;
        let current = self.store.get(project, &name).await.map_err(|e| self.name_error(e, &name))?;
        if let Some(requested) = fields.nullable_string("name")? {
            if requested.as_deref() != Some(name.as_str()) {
                return Err(Invalid::field(
                    "name",
                    "An endpoint cannot be renamed: its name is part of its URL.",
                )
                .into());
            }
        }
        let mut change = EndpointChange {
            description: fields.nullable_string("description")?.map(Option::unwrap_or_default),
            derived_from_insight: fields.nullable_string("derived_from_insight")?,
            is_active: fields.bool("is_active")?,
            is_materialized: fields.bool("is_materialized")?,
            cache_age: cache_age_field(&fields)?,
            sync_frequency: None,
            query: None,
        };
        let materialized = change.is_materialized.unwrap_or(current.is_materialized);
        change.sync_frequency = match sync_frequency_field(&fields)? {
            Some(Some(_)) if !materialized => return Err(sync_needs_materialization().into()),
            Some(freq) if materialized => Some(Some(freq.unwrap_or_default())),
            _ if !materialized => current.sync_frequency.is_some().then_some(None),
            _ => current.sync_frequency.is_none().then_some(Some(SyncFrequency::default())),
        };
        if let Some(raw) = fields.get("query").filter(|v| !v.is_null()) {
            let query = Query::from_json(raw)?;
            if query.canonical() != current.query.canonical() {
                let columns = self.engine.describe(project, &query).await?;
                change.query = Some((query, columns));
            }
        } else if fields.contains("query") {
            return Err(Invalid::field("query", "query cannot be null.").into());
        }
        drop_unchanged(&mut change, &current);
        if change.is_empty() {
            return Ok(current);
        }
        let at = self.clock.now();
        let updated =
            self.store.update(project, &name, change, at).await.map_err(|e| self.name_error(e, &name))?;
        self.invalidate(project, &name);
        Ok(self.with_pending_execution(updated))
    }

    /// Deletes the endpoint with all its versions.
    ///
    /// # Errors
    /// [`Error::NotFound`]; store failures.
    pub async fn delete(&self, project: ProjectId, name: &str) -> Result<(), Error> {
        let name = path_name(name)?;
        self.store.delete(project, &name).await.map_err(|e| self.name_error(e, &name))?;
        self.invalidate(project, &name);
        if let Some(executions) = &self.executions {
            executions.forget(project, &name);
        }
        Ok(())
    }

    /// Versions, newest first.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Invalid`] for bad paging; store failures.
    pub async fn versions(
        &self,
        project: ProjectId,
        name: &str,
        limit: Option<&str>,
        offset: Option<&str>,
    ) -> Result<Page<EndpointVersion>, Error> {
        let name = path_name(name)?;
        let page = PageRequest::parse(limit, offset)?;
        self.store.list_versions(project, &name, page).await.map_err(|e| self.name_error(e, &name))
    }

    /// One version by its number as written in the path.
    ///
    /// # Errors
    /// [`Error::Invalid`] when the number is not a positive integer; [`Error::NotFound`] for an unknown endpoint
    /// or version; store failures.
    pub async fn version(
        &self,
        project: ProjectId,
        name: &str,
        number: &str,
    ) -> Result<EndpointVersion, Error> {
        let name = path_name(name)?;
        let number =
            number.parse::<u32>().ok().filter(|n| *n > 0).ok_or_else(|| {
                Invalid::field("version_number", "version_number must be a positive integer.")
            })?;
        self.store.get_version(project, &name, number).await.map_err(|e| self.name_error(e, &name))
    }

    /// The endpoint with its current version, or the version named by a `?version=` parameter.
    ///
    /// # Errors
    /// [`Error::Invalid`] (attr `version`) when the parameter is not a positive integer; [`Error::NotFound`] for an
    /// unknown endpoint or version; store failures.
    pub async fn with_version(
        &self,
        project: ProjectId,
        name: &str,
        version: Option<&str>,
    ) -> Result<(Endpoint, EndpointVersion), Error> {
        let endpoint = self.get(project, name).await?;
        let number = match version {
            None => endpoint.current_version,
            Some(raw) => raw
                .parse::<u32>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| Invalid::field("version", "version must be a positive integer."))?,
        };
        let version = self
            .store
            .get_version(project, &endpoint.name, number)
            .await
            .map_err(|e| self.name_error(e, &endpoint.name))?;
        Ok((endpoint, version))
    }

    fn name_error(&self, err: crate::ports::StoreError, name: &EndpointName) -> Error {
        match err {
            crate::ports::StoreError::NotFound => not_found(name.as_str()),
            other => other.into(),
        }
    }
}

/// Clears the parts of a change that would leave a field as it already is, so a no-op PATCH writes nothing.
fn drop_unchanged(change: &mut EndpointChange, current: &Endpoint) {
    if change.description.as_ref() == Some(&current.description) {
        change.description = None;
    }
    if change.derived_from_insight.as_ref() == Some(&current.derived_from_insight) {
        change.derived_from_insight = None;
    }
    if change.is_active == Some(current.is_active) {
        change.is_active = None;
    }
    if change.is_materialized == Some(current.is_materialized) {
        change.is_materialized = None;
    }
    if change.cache_age == Some(current.cache_age) {
        change.cache_age = None;
    }
    if change.sync_frequency == Some(current.sync_frequency) {
        change.sync_frequency = None;
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
