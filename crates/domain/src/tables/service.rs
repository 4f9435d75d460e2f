//! The table rules: which endpoints read a table, what a write makes stale, when a table may be deleted, and a
//! preview of its rows.

use std::collections::BTreeMap;
use std::sync::Arc;

use tracing::{info, warn};

use super::idempotency::{AppendKeyState, AppendTag, BodyDigest, IdempotencyKey, IDEMPOTENCY_WINDOW};
use super::layout::{layout_pin, pinned_columns};
use super::model::{
    ExternalSource, Table, TableCommit, TableInfo, TableName, TableSource, Upload, WriteMode, Written,
};
use super::ports::{AppendKeys, TableAnnouncer, TableStore};
use crate::access::ProjectId;
use crate::clock::Clock;
use crate::endpoints::{EndpointChanges, EndpointName, EndpointStore, PlannedQuery, TableReadersChanged};
use crate::error::{EngineError, Error, Invalid, StoreError, UploadError};
use crate::materialization::MaterializationRecords;
use crate::page::{Page, PageRequest};
use crate::query::{Query, QueryEngine, QueryKind, QueryResult};

/// What the table rules work through.
pub struct TableDeps {
    pub tables: Arc<dyn TableStore>,
    /// Where the endpoints that read a table are found.
    pub endpoints: Arc<dyn EndpointStore>,
    /// Plans the queries of versions saved before the tables they read were recorded, and runs previews.
    pub engine: Arc<dyn QueryEngine>,
    /// Told of every endpoint that reads a table a write changed, so its cached runs go at once.
    pub changes: Arc<dyn EndpointChanges>,
    /// Tells the other processes of a write: the table and its readers.
    pub announcer: Arc<dyn TableAnnouncer>,
    /// Told of every materialized endpoint that reads a table a write changed, so its stored result follows
    /// within its `freshness_seconds`.
    pub materializations: Arc<dyn MaterializationRecords>,
    /// The `Idempotency-Key`s of appends.
    pub keys: Arc<dyn AppendKeys>,
    /// Told when a table's layout is set, so that its next compaction follows it (as endpoints tell it of the
    /// tables a saved version reads).
    pub layouts: Arc<dyn TableReadersChanged>,
    pub clock: Arc<dyn Clock>,
    /// How long an append under a key may be in flight before a retry takes it for cut off
    /// ([`APPEND_IN_FLIGHT`](super::APPEND_IN_FLIGHT) by default).
    pub append_in_flight: std::time::Duration,
}

/// Listing, reading, writing, deleting and previewing a project's tables.
pub struct TableService {
    tables: Arc<dyn TableStore>,
    endpoints: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    changes: Arc<dyn EndpointChanges>,
    announcer: Arc<dyn TableAnnouncer>,
    materializations: Arc<dyn MaterializationRecords>,
    keys: Arc<dyn AppendKeys>,
    layouts: Arc<dyn TableReadersChanged>,
    clock: Arc<dyn Clock>,
    append_in_flight: std::time::Duration,
}

/// An endpoint of a project and the tables its current version reads.
struct Reader {
    name: EndpointName,
    id: uuid::Uuid,
    /// Materialized and active: its stored result follows the tables it reads.
    refreshed: bool,
    tables: Vec<String>,
}

/// How a write changed a table, for what it makes stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// Rows added: the table's readers' cached runs go.
    Appended,
    /// Rows added and others set aside: the quarantine table's readers' runs go too.
    Quarantined,
    /// New content, maybe new columns: its readers are planned again.
    Replaced,
}

impl WriteKind {
    fn of(replaced: bool, written: &Written) -> Self {
        match (replaced, written.rows_quarantined) {
            (true, _) => Self::Replaced,
            (false, 0) => Self::Appended,
            (false, _) => Self::Quarantined,
        }
    }
}

/// The rows a preview shows when the caller does not say.
pub const PREVIEW_ROWS: u32 = 20;

fn not_found(name: &TableName) -> Error {
    Error::table_not_found(name.as_str())
}

/// An append's claim on its key: the write id its rows go under, and the table's version read before the claim.
#[derive(Clone, Copy)]
struct KeyClaim<'a> {
    key: &'a IdempotencyKey,
    write_id: uuid::Uuid,
    after: u64,
}

impl TableService {
    pub fn new(deps: TableDeps) -> Self {
        let TableDeps {
            tables,
            endpoints,
            engine,
            changes,
            announcer,
            materializations,
            keys,
            layouts,
            clock,
            append_in_flight,
        } = deps;
        Self {
            tables,
            endpoints,
            engine,
            changes,
            announcer,
            materializations,
            keys,
            layouts,
            clock,
            append_in_flight,
        }
    }

    /// The endpoints whose current version reads any of `tables` (the store's index), each with the tables it
    /// reads. An endpoint whose tables were not recorded (a version written before they were) is planned to
    /// tell, waiting for the project's busy slots; one deleted meanwhile, or that no longer plans, reads nothing;
    /// one that cannot be planned now (the storage unavailable, the wait past the query timeout) is taken to read
    /// them all, so that its cached runs are dropped.
    async fn readers(&self, project: ProjectId, tables: &[&TableName]) -> Result<Vec<Reader>, Error> {
        let names: Vec<String> = tables.iter().map(|t| t.as_str().to_owned()).collect();
        let mut readers = Vec::new();
        for reader in self.endpoints.readers(project, &names).await? {
            let tables = match reader.tables {
                Some(tables) => tables,
                None => match self.endpoints.get(project, &reader.name).await {
                    Ok(endpoint) => match self.engine.describe_queued(project, &endpoint.query).await {
                        Ok(described) => described.tables,
                        Err(EngineError::InvalidQuery(_)) => Vec::new(),
                        Err(_) => names.clone(),
                    },
                    Err(StoreError::NotFound) => Vec::new(),
                    Err(err) => return Err(err.into()),
                },
            };
            readers.push(Reader { name: reader.name, id: reader.id, refreshed: reader.refreshed, tables });
        }
        Ok(readers)
    }

    fn readers_of<'r>(readers: &'r [Reader], table: &TableName) -> Vec<&'r Reader> {
        readers.iter().filter(|r| r.tables.iter().any(|t| t == table.as_str())).collect()
    }

    fn used_by(readers: &[Reader], table: &TableName) -> Vec<EndpointName> {
        Self::readers_of(readers, table).into_iter().map(|r| r.name.clone()).collect()
    }

    /// The project's tables by name, a page of them.
    ///
    /// # Errors
    /// [`Error::Invalid`] for bad paging; store and engine failures.
    pub async fn list(&self, project: ProjectId, request: PageRequest) -> Result<Page<Table>, Error> {
        let all = self.tables.list(project).await?;
        let total = all.len() as u64;
        let start = usize::try_from(request.offset).unwrap_or(usize::MAX);
        let infos: Vec<TableInfo> = all.into_iter().skip(start).take(request.limit as usize).collect();
        let names: Vec<&TableName> = infos.iter().map(|info| &info.name).collect();
        let readers = if infos.is_empty() { Vec::new() } else { self.readers(project, &names).await? };
        let items = infos
            .into_iter()
            .map(|info| Table { used_by: Self::used_by(&readers, &info.name), info })
            .collect();
        Ok(Page { items, total, request })
    }

    /// # Errors
    /// [`Error::NotFound`]; store and engine failures.
    pub async fn get(&self, project: ProjectId, name: &TableName) -> Result<Table, Error> {
        let info = self.tables.get(project, name).await?.ok_or_else(|| not_found(name))?;
        let readers = self.readers(project, &[name]).await?;
        Ok(Table { used_by: Self::used_by(&readers, name), info })
    }

    /// The table's versions (the commits of its log), newest first.
    ///
    /// # Errors
    /// [`Error::NotFound`]; engine failures.
    pub async fn versions(
        &self,
        project: ProjectId,
        name: &TableName,
        request: PageRequest,
    ) -> Result<Page<TableCommit>, Error> {
        self.tables.versions(project, name, request).await?.ok_or_else(|| not_found(name))
    }

    /// Writes an upload into a table, and makes the cached runs of every endpoint that reads it stale.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name or a body that does not read or fit (the detail says where),
    /// [`Error::PayloadTooLarge`], [`Error::NotFound`] for an append to a missing table; store and engine
    /// failures. On any error the table is as it was.
    pub async fn write(
        &self,
        project: ProjectId,
        name: &TableName,
        upload: Upload,
    ) -> Result<(Table, Written), Error> {
        let replaced = upload.mode == WriteMode::Replace;
        let written = self.tables.write(project, name, upload).await?;
        Ok((self.changed(project, name, WriteKind::of(replaced, &written)).await?, written))
    }

    /// Appends an upload once under an `Idempotency-Key`: the first append with the key (per table, within
    /// [`IDEMPOTENCY_WINDOW`]) writes its rows; a retry with the same body adds nothing and gets the first
    /// append's answer (with the table as it is now). An append cut off before it was answered (its process
    /// stopped) is found by a retry as soon as its process is known to have stopped, or once it has been in
    /// flight too long (`append_in_flight`): in the table if its rows were written, else the retry writes them.
    ///
    /// # Errors
    /// As [`TableService::write`]; [`Error::IdempotencyConflict`] for the key used with another body, or while
    /// its first append is in flight.
    pub async fn append_once(
        &self,
        project: ProjectId,
        name: &TableName,
        upload: Upload,
        key: &IdempotencyKey,
    ) -> Result<(Table, Written), Error> {
        let write_id = uuid::Uuid::new_v4();
        // Read before the key is claimed: any other append under the key that can still land (one that takes
        // it over from this one, or this one's writer if this append takes it over) commits after it.
        let after = self.tables.newest_version(project, name).await?.unwrap_or(0);
        let claim = KeyClaim { key, write_id, after };
        let now = self.clock.now();
        let state = self.keys.claim(project, name, key, write_id, now, now - IDEMPOTENCY_WINDOW).await?;
        match state {
            AppendKeyState::Claimed => self.append_claimed(project, name, upload, claim).await,
            AppendKeyState::Answered { body_sha256, written } => {
                Self::same_body(upload, &body_sha256, key).await?;
                Ok((self.get(project, name).await?, written))
            }
            AppendKeyState::Pending { write_id: theirs, since, writer_gone } => {
                if !writer_gone && now - since < self.append_in_flight {
                    return Err(Error::IdempotencyConflict(format!(
                        "An append with Idempotency-Key '{}' is still being written; retry in a few seconds.",
                        key.as_str()
                    )));
                }
                if let Some(found) = self.tables.holds(project, name, theirs).await? {
                    Self::same_body(upload, &found.body_sha256, key).await?;
                    self.keys.answer(project, name, key, theirs, &found.body_sha256, found.written).await?;
                    // The append that wrote them may have stopped before it made its readers' runs stale.
                    let table = self.changed(project, name, WriteKind::of(false, &found.written)).await?;
                    return Ok((table, found.written));
                }
                if !self.keys.take_over(project, name, key, theirs, write_id, now).await? {
                    return Err(Error::IdempotencyConflict(format!(
                        "Another append with Idempotency-Key '{}' took it over; retry in a few seconds.",
                        key.as_str()
                    )));
                }
                self.append_claimed(project, name, upload, claim).await
            }
        }
    }

    /// Writes an append whose key is pending under its write id, then records its answer. A failure that wrote
    /// nothing frees the key; any other leaves it pending, for a retry to resolve. When a retry took the key
    /// over meanwhile and wrote first, nothing is written and the key is the retry's.
    async fn append_claimed(
        &self,
        project: ProjectId,
        name: &TableName,
        mut upload: Upload,
        KeyClaim { key, write_id, after }: KeyClaim<'_>,
    ) -> Result<(Table, Written), Error> {
        let digest = BodyDigest::default();
        upload.body = digest.wrap(upload.body);
        upload.tag = Some(AppendTag { write_id, digest: digest.clone(), key: key.clone(), after });
        let written = match self.tables.write(project, name, upload).await {
            Ok(written) => written,
            Err(UploadError::TakenOver) => {
                return Err(Error::IdempotencyConflict(format!(
                    "Another append with Idempotency-Key '{}' (a retry) wrote its rows first; nothing was \
                     written. Retry to get its answer.",
                    key.as_str()
                )))
            }
            Err(err) => {
                let wrote_nothing = !matches!(err, UploadError::Engine(_));
                if wrote_nothing {
                    if let Err(forget) = self.keys.forget(project, name, key, write_id).await {
                        warn!(table = %name, error = %forget, "cannot free the key of an append that failed");
                    }
                }
                return Err(err.into());
            }
        };
        if let Err(err) = self.keys.answer(project, name, key, write_id, &digest.hex(), written).await {
            // The rows are in: a retry finds them by the write id once the key has been pending long enough.
            warn!(table = %name, error = %err, "cannot record the answer of an append");
        }
        Ok((self.changed(project, name, WriteKind::of(false, &written)).await?, written))
    }

    /// Refuses a retry whose body is not the one first sent with its key.
    async fn same_body(upload: Upload, sha256: &str, key: &IdempotencyKey) -> Result<(), Error> {
        if BodyDigest::of(upload.body, upload.limit_bytes).await? == sha256 {
            Ok(())
        } else {
            Err(Error::IdempotencyConflict(format!(
                "Idempotency-Key '{}' was used with another body within 24 hours; use a new key for new rows.",
                key.as_str()
            )))
        }
    }

    /// Makes a table read an external source where it is (creating it, or replacing what it had), from a body
    /// `{"source": {...}}`; returns the table and whether it was created. The endpoints that read it plan again
    /// and their cached runs go, as after a replace.
    ///
    /// # Errors
    /// [`Error::Invalid`] for a bad name, a body that names no source, or a source that is not allowed or
    /// cannot be read; store and engine failures. On any error the table is as it was.
    pub async fn register(
        &self,
        project: ProjectId,
        name: &TableName,
        source: ExternalSource,
    ) -> Result<(Table, bool), Error> {
        let created = self.tables.register(project, name, source).await?;
        Ok((self.changed(project, name, WriteKind::Replaced).await?, created))
    }

    /// After rows were written to a table outside this service (a bulk import straight into the storage): what a
    /// write through it does next, as for a replace or an append.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the table is not there; store and engine failures.
    pub async fn imported(
        &self,
        project: ProjectId,
        name: &TableName,
        replaced: bool,
    ) -> Result<Table, Error> {
        let how = if replaced { WriteKind::Replaced } else { WriteKind::Appended };
        self.changed(project, name, how).await
    }

    /// After a write: plans the table's readers again when it was replaced, makes their cached runs stale here
    /// and on other processes, makes the stored results of the materialized ones due within their freshness,
    /// and returns the table as it now is.
    async fn changed(&self, project: ProjectId, name: &TableName, how: WriteKind) -> Result<Table, Error> {
        let at = self.clock.now();
        let quarantine = name.quarantine().ok().filter(|_| how == WriteKind::Quarantined);
        let written: Vec<&TableName> = std::iter::once(name).chain(quarantine.as_ref()).collect();
        let readers = self.readers(project, &written).await?;
        let used_by = Self::used_by(&readers, name);
        let mut changed = Self::readers_of(&readers, name);
        if let Some(quarantine) = &quarantine {
            let more = Self::readers_of(&readers, quarantine);
            changed.extend(more.into_iter().filter(|r| !used_by.contains(&r.name)));
        }
        let refreshed: Vec<uuid::Uuid> = changed.iter().filter(|r| r.refreshed).map(|r| r.id).collect();
        // Recorded before the write is answered: an append answered is never left out of a stored result for
        // longer than its freshness, whichever process refreshes it.
        if !refreshed.is_empty() {
            self.materializations.appended(refreshed, at).await?;
        }
        let stale: Vec<EndpointName> = changed.into_iter().map(|r| r.name.clone()).collect();
        for endpoint in &stale {
            if how == WriteKind::Replaced {
                self.replan(project, endpoint).await;
            }
            self.changes.changed(project, endpoint);
        }
        self.tell(project, &written, stale).await;
        let info = self.tables.get(project, name).await?.ok_or_else(|| not_found(name))?;
        Ok(Table { info, used_by })
    }

    /// Tells the other processes that `tables` were written and that the `stale` endpoints changed with them, and
    /// waits until they applied it: a run on any process after the write was answered reads it, without asking
    /// the storage for the table's newest version. The write is made whatever happens here: a process that
    /// missed the announcement asks the storage again within a minute.
    async fn tell(&self, project: ProjectId, tables: &[&TableName], stale: Vec<EndpointName>) {
        let tables = tables.iter().map(|&name| name.clone()).collect();
        self.announcer.announce_and_settle(project, tables, stale).await;
    }

    /// Plans an endpoint's current version again after a table it reads was replaced, and records what that
    /// told: its new columns, or why it no longer plans. A project whose queries take every slot delays this
    /// (planning waits for a slot) rather than losing it. When the engine fails for another reason (unavailable,
    /// the wait past the query timeout) the version is left as it was, and the failure logged.
    async fn replan(&self, project: ProjectId, name: &EndpointName) {
        let endpoint = match self.endpoints.get(project, name).await {
            Ok(endpoint) => endpoint,
            Err(err) => {
                warn!(endpoint = %name, error = %err, "cannot read an endpoint to plan it again");
                return;
            }
        };
        let replanned = match self.engine.describe_queued(project, &endpoint.query).await {
            Ok(description) => Ok(PlannedQuery::new(endpoint.query.clone(), description)),
            Err(EngineError::InvalidQuery(reason)) => Err(reason),
            Err(err) => {
                warn!(endpoint = %name, error = %err, "cannot plan an endpoint again after its table was replaced");
                return;
            }
        };
        if let Err(reason) = &replanned {
            info!(endpoint = %name, reason, "a table was replaced and the endpoint's query no longer plans");
        }
        if let Err(err) = self.endpoints.replan(endpoint.id, endpoint.current_version, replanned).await {
            warn!(endpoint = %name, error = %err, "cannot record an endpoint's new plan");
        }
    }

    /// Sets the columns the table is sorted by (`PATCH tables/{name}`'s `body`: `cluster_by`, a list of its
    /// columns, or `null` for its endpoints' filters to choose again), which its next compaction follows.
    ///
    /// # Errors
    /// [`Error::Invalid`] (attr `cluster_by`) for a body that does not say it, a column the table lacks or
    /// whose values have no order, or a table read where it is (its files are not the service's to sort);
    /// [`Error::NotFound`]; store and engine failures.
    pub async fn pin_layout(
        &self,
        project: ProjectId,
        name: &TableName,
        body: &serde_json::Value,
    ) -> Result<Table, Error> {
        let asked = layout_pin(body)?;
        let info = self.tables.get(project, name).await?.ok_or_else(|| not_found(name))?;
        if let TableSource::External(_) = info.source {
            return Err(Invalid::field(
                "cluster_by",
                format!("Table '{name}' reads its rows where they are: its files are not sorted here."),
            )
            .into());
        }
        let pinned = asked.map(|asked| pinned_columns(&info.columns, asked)).transpose()?;
        if !self.tables.pin_layout(project, name, pinned).await? {
            return Err(not_found(name));
        }
        self.layouts.readers_changed(project, &[name.as_str().to_owned()]);
        self.get(project, name).await
    }

    /// Deletes a table no endpoint reads.
    ///
    /// # Errors
    /// [`Error::InUse`] naming the endpoints whose current version reads it; [`Error::NotFound`]; store and
    /// engine failures.
    pub async fn delete(&self, project: ProjectId, name: &TableName) -> Result<(), Error> {
        let used_by = Self::used_by(&self.readers(project, &[name]).await?, name);
        if !used_by.is_empty() {
            let names: Vec<&str> = used_by.iter().map(EndpointName::as_str).collect();
            return Err(Error::InUse(format!(
                "Table '{name}' is read by the current version of: {}. Change or delete those endpoints first.",
                names.join(", ")
            )));
        }
        if self.tables.delete(project, name).await? {
            self.tell(project, &[name], Vec::new()).await;
            Ok(())
        } else {
            Err(not_found(name))
        }
    }

    /// The first `limit` rows of a table (20 when the caller does not say), in the row format of a run, and
    /// how many were asked for.
    ///
    /// # Errors
    /// [`Error::Invalid`] (attr `limit`) outside `1..=1000`; [`Error::NotFound`]; engine failures.
    pub async fn preview(
        &self,
        project: ProjectId,
        name: &TableName,
        limit: Option<i64>,
    ) -> Result<(QueryResult, u32), Error> {
        let limit = limit.map_or(Ok(PREVIEW_ROWS), PageRequest::checked_limit)?;
        if self.tables.get(project, name).await?.is_none() {
            return Err(not_found(name));
        }
        // The name is letters, digits and '_' only, so quoting it is all it takes to name it in SQL as it is.
        let query = Query {
            kind: QueryKind::Sql,
            sql: format!("SELECT * FROM \"{name}\""),
            variables: BTreeMap::new(),
        };
        Ok((self.engine.execute(project, &query, &BTreeMap::new(), limit, 0).await?, limit))
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
