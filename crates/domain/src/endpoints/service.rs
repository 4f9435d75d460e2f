//! The endpoint rules: creating, listing, reading, changing and deleting endpoints and reading their versions.

use std::sync::Arc;

use uuid::Uuid;

use super::commands::{CreateEndpoint, EndpointPatch, CONFIRM_BREAKING};
use super::executions::ExecutionTracker;
use super::model::{
    BreakingChange, Endpoint, EndpointChange, EndpointFilter, EndpointName, EndpointVersion, NewEndpoint,
    NewVersion, PlannedQuery,
};
use super::ports::{EndpointChanges, EndpointStore, TableReadersChanged};
use super::settings::{CacheAge, Freshness, Hibernation, SyncFrequency};
use crate::access::ProjectId;
use crate::clock::Clock;
use crate::error::{Error, Invalid, StoreError};
use crate::materialization::{endpoint_location, Eligibility, MaterializationPorts, MaterializationView};
use crate::page::{Page, PageRequest};
use crate::query::QueryEngine;
use crate::version::VersionNumber;

/// A new version that breaks its callers needs [`CONFIRM_BREAKING`] when the endpoint ran within this long.
pub const BREAKING_WINDOW: time::Duration = time::Duration::days(7);

/// What the endpoint rules work through.
pub struct EndpointDeps {
    pub store: Arc<dyn EndpointStore>,
    /// Plans every new query, for its columns and whether it can be materialized.
    pub engine: Arc<dyn QueryEngine>,
    pub clock: Arc<dyn Clock>,
    /// Records are read for the status; stored results go with the endpoint or its materialization.
    pub materializations: MaterializationPorts,
    /// Runs not yet written to the store show in the record; a deleted endpoint's are dropped.
    pub executions: Arc<ExecutionTracker>,
    /// Told of each update and delete, so this process's cached runs of the endpoint go at once.
    pub changes: Arc<dyn EndpointChanges>,
}

/// Creating, listing, reading, changing and deleting endpoints, and reading their versions.
pub struct EndpointService {
    store: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    clock: Arc<dyn Clock>,
    materializations: MaterializationPorts,
    executions: Arc<ExecutionTracker>,
    changes: Arc<dyn EndpointChanges>,
    /// Told of the tables each saved version reads, so that their layout follows its filters.
    readers: Option<Arc<dyn TableReadersChanged>>,
}

fn not_found(name: &EndpointName) -> Error {
    Error::endpoint_not_found(name.as_str())
}

/// Materialization needs an active endpoint and a query the materialization rule accepts.
fn check_materializable(is_active: bool, eligibility: &Eligibility) -> Result<(), Invalid> {
    if !is_active {
        return Err(Invalid::field(
            "is_materialized",
            "An inactive endpoint cannot be materialized; set is_materialized to false as well.",
        ));
    }
    match eligibility.reason() {
        Some(reason) => {
            Err(Invalid::field("is_materialized", format!("This query cannot be materialized. {reason}")))
        }
        None => Ok(()),
    }
}

fn sync_needs_materialization() -> Invalid {
    Invalid::field(
        "sync_frequency",
        "sync_frequency can only be set on a materialized endpoint (is_materialized: true).",
    )
}

impl EndpointService {
    pub fn new(deps: EndpointDeps) -> Self {
        let EndpointDeps { store, engine, clock, materializations, executions, changes } = deps;
        Self { store, engine, clock, materializations, executions, changes, readers: None }
    }

    /// Tells `readers` of the tables each version saved from now on reads.
    #[must_use]
    pub fn with_table_readers(mut self, readers: Arc<dyn TableReadersChanged>) -> Self {
        self.readers = Some(readers);
        self
    }

    fn saved(&self, endpoint: &Endpoint) {
        if let (Some(readers), Some(tables)) = (&self.readers, &endpoint.tables) {
            readers.readers_changed(endpoint.project_id, tables);
        }
    }

    /// The endpoint with its materialization record, when it is materialized.
    async fn materialization_attached(&self, mut endpoint: Endpoint) -> Result<Endpoint, Error> {
        if endpoint.is_materialized {
            endpoint.materialization = self.materializations.states.get(endpoint.id).await?;
        }
        Ok(endpoint)
    }

    /// The current version's eligibility, analysed now for a version saved before it was recorded.
    async fn eligibility(&self, endpoint: &Endpoint) -> Result<Eligibility, Error> {
        match &endpoint.eligibility {
            Some(eligibility) => Ok(eligibility.clone()),
            None => Ok(Eligibility::decide(
                &self.engine.describe(endpoint.project_id, &endpoint.query).await?.outline,
            )),
        }
    }

    /// Removes an endpoint's stored results (the store removed its record with the change that turned
    /// materialization off, or with the endpoint). A failure is logged and left to the worker's sweep.
    async fn drop_stored_results(&self, project: ProjectId, id: Uuid, name: &EndpointName) {
        if let Err(err) = self.materializations.results.remove(project, &endpoint_location(id)).await {
            tracing::warn!(endpoint = %name, error = %err, "cannot remove stored results; the sweep will");
        }
    }

    /// The materialization status of the endpoint's current version.
    ///
    /// # Errors
    /// [`Error::NotFound`]; store and engine failures.
    pub async fn materialization_status(
        &self,
        project: ProjectId,
        name: &EndpointName,
    ) -> Result<MaterializationView, Error> {
        let mut endpoint = self.get(project, name).await?;
        if endpoint.eligibility.is_none() {
            // A query that no longer plans cannot be materialized: a GET says why rather than failing.
            endpoint.eligibility = Some(match self.eligibility(&endpoint).await {
                Ok(eligibility) => eligibility,
                Err(Error::Invalid(invalid)) => Eligibility::Ineligible { reason: invalid.detail },
                Err(other) => return Err(other),
            });
        }
        Ok(MaterializationView::of(&endpoint, endpoint.materialization.as_ref()))
    }

    /// The record as of now: with the newest execution time, including one not yet flushed to the store, and
    /// whether it hibernates.
    fn newest_execution(&self, endpoint: Endpoint) -> Endpoint {
        let pending = self.executions.pending(endpoint.project_id, &endpoint.name);
        endpoint.as_of(self.clock.now(), pending)
    }

    /// Creates an endpoint; its query becomes version 1.
    ///
    /// # Errors
    /// [`Error::Invalid`] for any field that breaks a rule (including SQL the engine refuses),
    /// [`Error::NameTaken`], store and engine failures.
    pub async fn create(&self, project: ProjectId, command: CreateEndpoint) -> Result<Endpoint, Error> {
        let endpoint = self.planned_create(project, command).await?;
        let created = self.store.insert(endpoint).await?;
        self.saved(&created);
        self.materialization_attached(created).await
    }

    /// Checks a create as [`create`](Self::create) does, the name's availability included, and answers
    /// the endpoint it would make, without saving anything (a dry run).
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub async fn check_create(&self, project: ProjectId, command: CreateEndpoint) -> Result<Endpoint, Error> {
        let endpoint = self.planned_create(project, command).await?;
        match self.store.get(project, &endpoint.name).await {
            Ok(_) => Err(Error::NameTaken(endpoint.name.to_string())),
            Err(StoreError::NotFound) => Ok(endpoint.unsaved()),
            Err(other) => Err(other.into()),
        }
    }

    /// A create checked, with its query planned: the endpoint to insert.
    async fn planned_create(
        &self,
        project: ProjectId,
        command: CreateEndpoint,
    ) -> Result<NewEndpoint, Error> {
        let (is_materialized, is_active) = (command.materialized(), command.active());
        let sync_frequency = match command.sync_frequency {
            Some(_) if !is_materialized => return Err(sync_needs_materialization().into()),
            Some(freq) => Some(freq),
            None => is_materialized.then_some(SyncFrequency::DEFAULT),
        };
        let endpoint = NewEndpoint {
            id: Uuid::new_v4(),
            project_id: project,
            name: command.name,
            description: command.description.unwrap_or_else(String::new),
            columns: Vec::new(),
            eligibility: Eligibility::Eligible { filters: Vec::new(), rollup: None },
            tables: Vec::new(),
            query: command.query,
            derived_from_insight: command.derived_from_insight,
            is_active,
            is_materialized,
            cache_age: command.cache_age.unwrap_or(CacheAge::DEFAULT),
            sync_frequency,
            freshness: command.freshness.unwrap_or(Freshness::DEFAULT),
            hibernation: command.hibernation.unwrap_or(Hibernation::DEFAULT),
            created_at: self.clock.now(),
        };
        let description = self.engine.describe(project, &endpoint.query).await?;
        let eligibility = Eligibility::decide(&description.outline);
        if endpoint.is_materialized {
            check_materializable(endpoint.is_active, &eligibility)?;
        }
        Ok(NewEndpoint { columns: description.columns, tables: description.tables, eligibility, ..endpoint })
    }

    /// A page of the project's endpoints that pass the filter, by name.
    ///
    /// # Errors
    /// Store failures.
    pub async fn list(
        &self,
        project: ProjectId,
        filter: &EndpointFilter,
        page: PageRequest,
    ) -> Result<Page<Endpoint>, Error> {
        let mut page = self.store.list(project, filter, page).await?;
        page.items = page.items.into_iter().map(|e| self.newest_execution(e)).collect();
        let ids: Vec<_> = page.items.iter().filter(|e| e.is_materialized).map(|e| e.id).collect();
        if !ids.is_empty() {
            let mut records = self.materializations.states.get_many(ids).await?;
            for endpoint in page.items.iter_mut().filter(|e| e.is_materialized) {
                endpoint.materialization =
                    records.iter().position(|r| r.endpoint_id == endpoint.id).map(|i| records.swap_remove(i));
            }
        }
        Ok(page)
    }

    /// # Errors
    /// [`Error::NotFound`]; store failures.
    pub async fn get(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, Error> {
        let endpoint = self.store.get(project, name).await.map_err(|e| name_error(e, name))?;
        self.materialization_attached(self.newest_execution(endpoint)).await
    }

    /// Applies a partial update. Only a change of the query's canonical form makes a new version; a body that
    /// changes nothing writes nothing.
    ///
    /// # Errors
    /// [`Error::NotFound`]; [`Error::Invalid`] for a rename, a bad field or SQL the engine refuses; store and
    /// engine failures.
    pub async fn update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        patch: EndpointPatch,
    ) -> Result<Endpoint, Error> {
        // A new version is decided against the version it follows; when another change saves a version first,
        // this one is decided again against that one. Every retry follows a change that was saved, so together
        // they always progress.
        let (current, updated, at) = loop {
            let (current, change) = self.planned_update(project, name, patch.clone()).await?;
            if change.is_empty() {
                return self.materialization_attached(current).await;
            }
            let at = self.clock.now();
            match self.store.update(project, name, change, at).await {
                Err(StoreError::Superseded { .. }) => continue,
                saved => break (current, saved.map_err(|e| name_error(e, name))?, at),
            }
        };
        let rescheduled = updated.is_materialized
            && current.is_materialized
            && updated.sync_frequency != current.sync_frequency;
        self.changes.changed(project, name);
        self.changes.settled().await;
        if updated.current_version != current.current_version {
            self.saved(&updated);
        }
        if current.is_materialized && !updated.is_materialized {
            self.drop_stored_results(project, updated.id, name).await;
        } else if rescheduled {
            // The change is saved; a failure here only delays the refresh to the old schedule.
            if let Err(err) = self.materializations.states.reschedule(updated.id, at).await {
                tracing::warn!(endpoint = %name, error = %err, "cannot reschedule the materialization");
            }
        }
        self.materialization_attached(self.newest_execution(updated)).await
    }

    /// Checks an update as [`update`](Self::update) does and answers the endpoint as it would be (with
    /// the next version when the query changes), without saving anything (a dry run).
    ///
    /// # Errors
    /// As [`update`](Self::update).
    pub async fn check_update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        patch: EndpointPatch,
    ) -> Result<Endpoint, Error> {
        let (current, change) = self.planned_update(project, name, patch).await?;
        let updated = if change.is_empty() { current } else { change.applied_to(current, self.clock.now()) };
        self.materialization_attached(self.newest_execution(updated)).await
    }

    /// An update checked against the endpoint, with a changed query planned: the endpoint as it is and the
    /// change to save, empty when the update changes nothing.
    async fn planned_update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        patch: EndpointPatch,
    ) -> Result<(Endpoint, EndpointChange), Error> {
        let current = self.store.get(project, name).await.map_err(|e| name_error(e, name))?;
        if let Some(requested) = patch.name {
            if requested.as_deref() != Some(name.as_str()) {
                return Err(Invalid::field(
                    "name",
                    "An endpoint cannot be renamed: its name is part of its URL.",
                )
                .into());
            }
        }
        let mut change = EndpointChange {
            description: patch.description.map(Option::unwrap_or_default),
            derived_from_insight: patch.derived_from_insight,
            is_active: patch.is_active,
            is_materialized: patch.is_materialized,
            cache_age: patch.cache_age,
            sync_frequency: None,
            freshness: patch.freshness,
            hibernation: patch.hibernation,
            query: None,
        };
        let materialized = change.is_materialized.unwrap_or(current.is_materialized);
        change.sync_frequency = match patch.sync_frequency {
            Some(Some(_)) if !materialized => return Err(sync_needs_materialization().into()),
            Some(freq) if materialized => Some(Some(freq.unwrap_or(SyncFrequency::DEFAULT))),
            _ if !materialized => current.sync_frequency.is_some().then_some(None),
            _ => current.sync_frequency.is_none().then_some(Some(SyncFrequency::DEFAULT)),
        };
        if let Some(query) = patch.query {
            if query.canonical() != current.query.canonical() {
                let description = self.engine.describe(project, &query).await?;
                let mut planned = PlannedQuery::new(query, description);
                planned.breaking_changes = BreakingChange::between(&current.columns, &planned.columns);
                if !patch.confirm_breaking {
                    self.refuse_unconfirmed_breaks(&current, &planned.breaking_changes)?;
                }
                change.query = Some(NewVersion::after(current.current_version, planned));
            }
        }
        drop_unchanged(&mut change, &current);
        if change.is_empty() {
            return Ok((current, change));
        }
        let active = change.is_active.unwrap_or(current.is_active);
        if materialized
            && (change.is_materialized.is_some() || change.is_active.is_some() || change.query.is_some())
        {
            let eligibility = match &change.query {
                Some(version) => version.planned.eligibility.clone(),
                None => self.eligibility(&current).await?,
            };
            check_materializable(active, &eligibility)?;
        }
        Ok((current, change))
    }

    /// Refuses changes that break the callers of an endpoint run within [`BREAKING_WINDOW`].
    fn refuse_unconfirmed_breaks(&self, current: &Endpoint, changes: &[BreakingChange]) -> Result<(), Error> {
        let pending = self.executions.pending(current.project_id, &current.name);
        let Some(last_run) = current.last_executed_at.max(pending) else { return Ok(()) };
        if changes.is_empty() || last_run + BREAKING_WINDOW < self.clock.now() {
            return Ok(());
        }
        let listed: Vec<String> = changes.iter().map(BreakingChange::describe).collect();
        Err(Error::BreakingChange {
            detail: format!(
                "The new version breaks what callers of '{}' read, and it ran within the last {} days: {}. \
                 Nothing was changed; send \"{CONFIRM_BREAKING}\": true with the same change to save it anyway.",
                current.name,
                BREAKING_WINDOW.whole_days(),
                listed.join("; ")
            ),
            changes: serde_json::to_value(changes).expect("breaking changes are plain records"),
        })
    }

    /// Deletes the endpoint with all its versions.
    ///
    /// # Errors
    /// [`Error::NotFound`]; store failures.
    pub async fn delete(&self, project: ProjectId, name: &EndpointName) -> Result<(), Error> {
        let id = self.store.delete(project, name).await.map_err(|e| name_error(e, name))?;
        self.changes.changed(project, name);
        self.changes.settled().await;
        self.executions.forget(project, name);
        // A refresh running now finds its claim gone at its next lease renewal (or when it finishes), stops and
        // removes what it wrote.
        self.drop_stored_results(project, id, name).await;
        Ok(())
    }

    /// Versions, newest first.
    ///
    /// # Errors
    /// [`Error::NotFound`]; store failures.
    pub async fn versions(
        &self,
        project: ProjectId,
        name: &EndpointName,
        page: PageRequest,
    ) -> Result<Page<EndpointVersion>, Error> {
        self.store.list_versions(project, name, page).await.map_err(|e| name_error(e, name))
    }

    /// One version by its number.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown endpoint or version; store failures.
    pub async fn version(
        &self,
        project: ProjectId,
        name: &EndpointName,
        number: VersionNumber,
    ) -> Result<EndpointVersion, Error> {
        self.store.get_version(project, name, number.get()).await.map_err(|e| name_error(e, name))
    }

    /// The endpoint with its current version, or with the version named.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown endpoint or version; store failures.
    pub async fn endpoint_version(
        &self,
        project: ProjectId,
        name: &EndpointName,
        version: Option<VersionNumber>,
    ) -> Result<(Endpoint, EndpointVersion), Error> {
        let endpoint = self.get(project, name).await?;
        let number = version.map_or(endpoint.current_version, VersionNumber::get);
        let version = self
            .store
            .get_version(project, &endpoint.name, number)
            .await
            .map_err(|e| name_error(e, &endpoint.name))?;
        Ok((endpoint, version))
    }
}

/// A store error about a named endpoint: `NotFound` names it.
fn name_error(err: StoreError, name: &EndpointName) -> Error {
    match err {
        StoreError::NotFound => not_found(name),
        other => other.into(),
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
    if change.freshness == Some(current.freshness) {
        change.freshness = None;
    }
    if change.hibernation == Some(current.hibernation) {
        change.hibernation = None;
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
