//! The run rules: cache lookup before anything else, version selection, variable binding, refresh modes,
//! coalescing of identical cache misses, and recording of execution times.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use serde_json::{Map, Value};
use tracing::warn;

use super::cursor::{Cursor, RunOf};
use super::model::{CacheKey, CachedRun, Exported, Refresh, RunOutcome, RunRequest};
use super::ports::ResultCache;
use super::record::{Recording, RunBy};
use crate::access::{ApiKeyService, IssuedRunToken, Principal, ProjectId, RunTokenRequest};
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{Endpoint, EndpointName, EndpointStore, EndpointVersion, ExecutionTracker};
use crate::error::{EngineError, Error, Invalid, StoreError};
use crate::logs::RunLog;
use crate::materialization::{Eligibility, MaterializationPorts, MaterializedFilter, StoredResult};
use crate::query::{bind, coerce, BoundValue, QueryEngine, QueryResult, ReadAt};
use crate::recent::RecentReads;

type RunFuture = BoxFuture<'static, Result<Arc<CachedRun>, Arc<Error>>>;

/// What running works through.
pub struct RunDeps {
    pub store: Arc<dyn EndpointStore>,
    pub engine: Arc<dyn QueryEngine>,
    pub cache: Arc<dyn ResultCache>,
    pub clock: Arc<dyn Clock>,
    /// Every run is noted here (memory only); the last-execution-times lookup reads it.
    pub executions: Arc<ExecutionTracker>,
    /// `blocking` and `force_cache` runs of materialized endpoints read their stored results.
    pub materializations: MaterializationPorts,
    /// The largest page a run may write in another format than JSON.
    pub export_limit: u32,
    /// How long a run's `next` cursor may be followed.
    pub cursor_ttl: Duration,
    /// Where each run's record goes ([`super::record`]).
    pub log: Arc<dyn RunLog>,
}

/// Runs endpoints, and records each run.
pub struct RunService {
    store: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    cache: Arc<dyn ResultCache>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) executions: Arc<ExecutionTracker>,
    materializations: MaterializationPorts,
    export_limit: u32,
    cursor_ttl: Duration,
    pub(super) log: Arc<dyn RunLog>,
    /// Computations under way, held weakly: when every caller has gone the computation is dropped (and with it
    /// the engine's work and its concurrency slot), and the next identical request starts afresh.
    in_flight: Arc<Mutex<HashMap<CacheKey, WeakShared<RunFuture>>>>,
    /// Active endpoints with their current version, as computations read them from the store.
    definitions: Arc<RecentReads<(ProjectId, EndpointName), Definition>>,
    /// Materialized endpoints' stored results, as runs read them from the store.
    stored: Arc<RecentReads<(ProjectId, EndpointName), KeptResult>>,
}

/// A materialized endpoint's stored result (or none), read from the store under the endpoint's cache generation
/// and kept as a [`Definition`] is: a switch to another result changes the generation, on this process at once
/// and on the others as the store announces it.
struct KeptResult {
    generation: u64,
    result: Option<StoredResult>,
}

/// An active endpoint and its current version, read from the store under the endpoint's cache generation: kept
/// until the generation moves on (a change to the endpoint, made here or announced by another process, or a
/// table it reads written) or [`RunService::DEFINITION_TTL`] passes, whichever comes first.
struct Definition {
    generation: u64,
    endpoint: Endpoint,
    version: EndpointVersion,
}

/// An error shared between coalesced callers, rebuilt for each of them.
fn unshare(err: &Arc<Error>) -> Error {
    match &**err {
        Error::Invalid(invalid) => Error::Invalid(invalid.clone()),
        Error::NotAuthenticated(d) => Error::NotAuthenticated(d.clone()),
        Error::PermissionDenied(d) => Error::PermissionDenied(d.clone()),
        Error::NotFound(d) => Error::NotFound(d.clone()),
        Error::NameTaken(n) => Error::NameTaken(n.clone()),
        Error::InUse(d) => Error::InUse(d.clone()),
        Error::IdempotencyConflict(d) => Error::IdempotencyConflict(d.clone()),
        Error::BreakingChange { detail, changes } => {
            Error::BreakingChange { detail: detail.clone(), changes: changes.clone() }
        }
        Error::PayloadTooLarge { limit_bytes } => Error::PayloadTooLarge { limit_bytes: *limit_bytes },
        Error::QueryInvalid(d) => Error::QueryInvalid(d.clone()),
        Error::QueryTimeout(d) => Error::QueryTimeout(*d),
        Error::QueryMemoryLimit(d) => Error::QueryMemoryLimit(d.clone()),
        Error::ResultTooLarge { limit_bytes } => Error::ResultTooLarge { limit_bytes: *limit_bytes },
        Error::Throttled { retry_after } => Error::Throttled { retry_after: *retry_after },
        Error::CursorExpired(d) => Error::CursorExpired(d.clone()),
        Error::Unavailable(_) => Error::Unavailable(Box::new(SharedCause(Arc::clone(err)))),
        Error::Internal(_) => Error::Internal(Box::new(SharedCause(Arc::clone(err)))),
    }
}

#[derive(Debug)]
struct SharedCause(Arc<Error>);

impl std::fmt::Display for SharedCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl std::error::Error for SharedCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&*self.0)
    }
}

/// The request part of a cache key: everything that changes the answer, in one text. `serde_json`'s map keeps
/// its keys sorted, so the same variables in any order give the same text (were its `preserve_order` feature
/// ever enabled, differently ordered variables would only miss the cache, never share an answer).
fn request_key(request: &RunRequest) -> String {
    let mut key = Vec::with_capacity(64);
    // `serde_json` writes integers without `fmt`.
    key.extend_from_slice(b"v=");
    match request.version {
        Some(version) => {
            serde_json::to_writer(&mut key, &version).expect("a Vec takes every write");
        }
        None => key.extend_from_slice(b"latest"),
    }
    key.extend_from_slice(b";limit=");
    serde_json::to_writer(&mut key, &request.limit).expect("a Vec takes every write");
    key.extend_from_slice(b";offset=");
    serde_json::to_writer(&mut key, &request.offset).expect("a Vec takes every write");
    key.extend_from_slice(b";vars=");
    serde_json::to_writer(&mut key, &request.variables).expect("a Vec takes every write");
    // Earlier versions of the tables: another answer.
    match request.read_at() {
        ReadAt::Newest => {}
        ReadAt::AsOf(at) => {
            key.extend_from_slice(b";as_of=");
            serde_json::to_writer(&mut key, &at.unix_timestamp_nanos()).expect("a Vec takes every write");
        }
        ReadAt::Pinned(versions) => {
            key.extend_from_slice(b";pinned=");
            serde_json::to_writer(&mut key, &versions).expect("a Vec takes every write");
        }
    }
    // A cursor's run it continues: an answer is cached only once a computation checked the cursor against its
    // run, so a cursor of another run never meets that answer in the cache.
    if let Some(cursor) = &request.followed {
        key.extend_from_slice(b";run=");
        key.extend_from_slice(cursor.run_key().as_bytes());
    }
    String::from_utf8(key).expect("JSON and ASCII are UTF-8")
}

/// Bound variables as a run's answer (and its cursor's digest) gives them.
fn bound_json(variables: &BTreeMap<String, BoundValue>) -> Value {
    Value::Object(variables.iter().map(|(k, v)| (k.clone(), v.to_json())).collect::<Map<_, _>>())
}

/// An engine failure of a run that reads `at`: a version no longer kept is the cursor's expiry, a time with no
/// version a bad `as_of`.
fn pinned_error(err: EngineError, at: &ReadAt) -> Error {
    match (err, at) {
        (EngineError::NoSuchVersion(reason), ReadAt::Pinned(_)) => Error::CursorExpired(format!(
            "The cursor's snapshot is no longer kept ({}); run again without it for a new first page.",
            reason.trim_end_matches('.')
        )),
        (err, _) => run_error(err),
    }
}

/// An engine failure of a run: a saved query that no longer plans is `query_invalid`, not a bad request field.
fn run_error(err: EngineError) -> Error {
    match err {
        EngineError::InvalidQuery(reason) => Error::QueryInvalid(reason),
        other => other.into(),
    }
}

/// The endpoint `name` when it is active; an inactive one is not found, as a missing one.
async fn active(
    store: &dyn EndpointStore,
    project: ProjectId,
    name: &EndpointName,
) -> Result<Endpoint, Error> {
    match store.get(project, name).await {
        Ok(endpoint) if endpoint.is_active => Ok(endpoint),
        Ok(_) | Err(StoreError::NotFound) => Err(not_found(name.as_str())),
        Err(other) => Err(other.into()),
    }
}

/// The one place a run token's grant meets a run: the version it was issued for, and its fixed variables (which
/// its holder may not send). A key's runs are as sent.
fn admit(caller: &Principal, name: &EndpointName, request: &mut RunRequest) -> Result<(), Error> {
    match &caller.grant {
        Some(grant) => request.admit(grant, name.as_str()),
        None => Ok(()),
    }
}

fn not_found(name: &str) -> Error {
    Error::NotFound(format!("No active endpoint named '{name}' in this project."))
}

impl RunService {
    pub fn new(deps: RunDeps) -> Self {
        let RunDeps {
            store,
            engine,
            cache,
            clock,
            executions,
            materializations,
            export_limit,
            cursor_ttl,
            log,
        } = deps;
        Self {
            store,
            engine,
            cache,
            clock,
            executions,
            materializations,
            export_limit,
            cursor_ttl,
            log,
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            definitions: Arc::new(RecentReads::new(Self::DEFINITION_TTL, 100_000)),
            stored: Arc::new(RecentReads::new(Self::DEFINITION_TTL, 100_000)),
        }
    }

    /// How long an endpoint and its current version read from the store answer computations without reading
    /// it again, when no change says otherwise: the most a change made by a process that does not announce
    /// changes (the CLI on SQLite) waits to take effect here.
    pub const DEFINITION_TTL: Duration = Duration::from_secs(1);

    /// How long a `next` cursor may be followed, unless the service says otherwise (`--cursor-ttl`).
    pub const DEFAULT_CURSOR_TTL: Duration = Duration::from_secs(3600);

    /// Runs an endpoint for `by`'s caller (authorized for `project`), and records the run, however it ends: a
    /// run token's grant is applied to the request first ([`RunRequest::admit`]). A fresh cached result is served
    /// without touching the store or the engine.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown or inactive endpoint or version; [`Error::Invalid`] for variables (and
    /// `fixed_variable` for a variable the caller's run token fixes); [`Error::PermissionDenied`] for a version
    /// the token was not issued for; the engine's [`Error::QueryTimeout`], [`Error::QueryMemoryLimit`],
    /// [`Error::Throttled`]; store failures.
    pub async fn run(
        &self,
        by: RunBy<'_>,
        project: ProjectId,
        name: EndpointName,
        request: RunRequest,
    ) -> Result<RunOutcome, Error> {
        let recording = Recording::start(self, by, project, &name);
        recording.of(self.run_unrecorded(by.caller, project, name, request), RunOutcome::ran).await
    }

    async fn run_unrecorded(
        &self,
        caller: &Principal,
        project: ProjectId,
        name: EndpointName,
        request: RunRequest,
    ) -> Result<RunOutcome, Error> {
        let started = Instant::now();
        let mut request = request;
        admit(caller, &name, &mut request)?;
        self.pin(&mut request)?;
        let generation = self.cache.generation(project, &name);
        let key = CacheKey { project, name, generation, request: request_key(&request) };
        let now = self.clock.now();
        let reads_cache = matches!(request.refresh, Refresh::Blocking | Refresh::ForceCache);
        if reads_cache {
            let fresh = |hit: &Arc<CachedRun>| {
                hit.expires_at.is_some_and(|at| at > now) && request.takes(hit.data_as_of, now)
            };
            if let Some(hit) = self.cache.get(&key).filter(fresh) {
                self.executions.record(project, &key.name, now);
                // A hit answers with the key's own name: no copy of it on this path.
                return Ok(self.outcome(project, key.name, Some(hit), true, &request, started, now));
            }
        }
        let endpoint_name = key.name.clone();
        let run = match request.refresh {
            Refresh::ForceCache => {
                // Nothing cached: a stored result answers, else say there is nothing (after checking that the
                // endpoint exists).
                let endpoint = self.active_endpoint(project, &endpoint_name).await?;
                if let Some(reason) = endpoint
                    .plan_error
                    .as_ref()
                    .filter(|_| request.version.is_none_or(|v| v == endpoint.current_version))
                {
                    return Err(Error::QueryInvalid(reason.clone()));
                }
                let stored = if endpoint.is_materialized {
                    self.stored_only(&endpoint, &request).await?
                } else {
                    None
                };
                let Some(run) = stored else {
                    return Ok(self.outcome(project, endpoint_name, None, false, &request, started, now));
                };
                let now = self.clock.now();
                self.executions.record(project, &endpoint_name, now);
                return Ok(self.outcome(project, endpoint_name, Some(run), false, &request, started, now));
            }
            // A caller with its own bound on staleness does not share a computation that may have taken an older
            // stored result.
            Refresh::Blocking if request.max_staleness.is_some() => {
                compute(self.context(), key, request.clone(), true).await?
            }
            Refresh::Blocking => self.coalesced(key, &request).await?,
            Refresh::ForceBlocking | Refresh::Direct => {
                compute(self.context(), key, request.clone(), request.refresh != Refresh::Direct).await?
            }
        };
        let now = self.clock.now();
        self.executions.record(project, &endpoint_name, now);
        Ok(self.outcome(project, endpoint_name, Some(run), false, &request, started, now))
    }

    /// Reads the request's cursor, if it has one, and takes the page it asks for; checks `as_of`.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`cursor`, `offset`, `as_of`); [`Error::CursorExpired`].
    fn pin(&self, request: &mut RunRequest) -> Result<(), Error> {
        if request.cursor.is_none() && request.as_of.is_none() {
            return Ok(());
        }
        let now = self.clock.now();
        if let Some(raw) = request.cursor.take() {
            let cursor = Cursor::read(&raw, now, self.cursor_ttl)?;
            request.follow(cursor)?;
        }
        if request.as_of.is_some_and(|at| at > now) {
            return Err(Error::Invalid(crate::error::Invalid::field(
                "as_of",
                "as_of is in the future: send a time that has passed, or none for the newest data.",
            )));
        }
        Ok(())
    }

    /// The cursor of the page after `run`'s, when rows follow it. A stored result's pages have none: they page
    /// by `offset` (the stored result is itself one snapshot until its next refresh).
    fn next(
        &self,
        project: ProjectId,
        name: &EndpointName,
        run: Option<&CachedRun>,
        request: &RunRequest,
        now: Timestamp,
    ) -> Option<String> {
        let run = run.filter(|run| run.result.has_more && !run.endpoint_materialized)?;
        let of = RunOf { project, endpoint: name.as_str(), version: run.version, variables: &run.variables };
        let offset = request.offset + run.result.row_count as u64;
        Some(Cursor::issue(of, offset, &run.result.read, run.data_as_of, now))
    }

    #[allow(clippy::too_many_arguments)]
    fn outcome(
        &self,
        project: ProjectId,
        name: EndpointName,
        run: Option<Arc<CachedRun>>,
        is_cached: bool,
        request: &RunRequest,
        started: Instant,
        now: Timestamp,
    ) -> RunOutcome {
        RunOutcome {
            next: self.next(project, &name, run.as_deref(), request, now),
            fresh_for: run.as_ref().map_or(Duration::ZERO, |r| r.fresh_for(now)),
            name,
            endpoint_materialized: run.as_ref().is_some_and(|r| r.endpoint_materialized),
            run,
            is_cached,
            // From the thread's generator rather than the system's: no system call on the hot path.
            execution_id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
            client_query_id: request.client_query_id.clone(),
            limit: request.limit,
            offset: request.offset,
            total: started.elapsed(),
        }
    }

    /// Issues a run token once its grant is checked: each endpoint it names is an active
    /// endpoint of the project, and each variable it fixes is declared, with a value of its type, by the current
    /// version of every one of them. A version saved later without the variable makes the token's runs of that
    /// endpoint fail (`unknown_variable`) rather than widen.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a name that is not an active endpoint of the project; [`Error::Invalid`] on
    /// `fixed_variables.NAME`; the key service's errors.
    pub async fn issue_run_token(
        &self,
        keys: &ApiKeyService,
        issuer: &Principal,
        project: ProjectId,
        request: RunTokenRequest,
    ) -> Result<IssuedRunToken, Error> {
        for raw in &request.endpoints {
            let name = EndpointName::parse(raw).map_err(|_| not_found(raw))?;
            let endpoint = self.active_endpoint(project, &name).await?;
            let version = self.store.get_version(project, &name, endpoint.current_version).await?;
            for (variable, value) in &request.fixed_variables {
                let attr = format!("fixed_variables.{variable}");
                let Some(declared) = version.query.variables.get(variable) else {
                    return Err(Invalid::field(
                        attr,
                        format!(
                            "The endpoint '{name}' has no variable '{variable}': a token may only fix variables \
                             that every endpoint it names declares."
                        ),
                    )
                    .into());
                };
                coerce(declared.variable_type, value).map_err(|expected| {
                    Invalid::field(
                        attr,
                        format!("The variable '{variable}' of '{name}' has a bad value: {expected}."),
                    )
                })?;
            }
        }
        for (raw, numbers) in &request.versions {
            let name = EndpointName::parse(raw).map_err(|_| not_found(raw))?;
            for number in numbers {
                match self.store.get_version(project, &name, *number).await {
                    Ok(_) => {}
                    Err(StoreError::VersionNotFound(_) | StoreError::NotFound) => {
                        return Err(Invalid::field(
                            format!("versions.{raw}"),
                            format!("The endpoint '{raw}' has no version {number}."),
                        )
                        .into())
                    }
                    Err(other) => return Err(other.into()),
                }
            }
        }
        keys.issue_run_token(issuer, project, request).await
    }

    async fn active_endpoint(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, Error> {
        active(self.store.as_ref(), project, name).await
    }

    /// Runs an endpoint for a page in another format than JSON (the request's `format`), within the export
    /// limit. Such a page does not go through the run cache (it holds JSON pages): it is computed live, or, for a
    /// materialized endpoint in the `blocking` and `force_cache` modes, read from its fresh stored result like a
    /// JSON run's. A `force_cache` run with no fresh stored result is a page of no rows.
    ///
    /// Recorded as [`RunService::run`] is.
    ///
    /// # Errors
    /// As [`RunService::run`], and [`Error::Invalid`] (attr `limit`) past the export limit.
    pub async fn export(
        &self,
        by: RunBy<'_>,
        project: ProjectId,
        name: EndpointName,
        request: RunRequest,
    ) -> Result<Exported, Error> {
        let recording = Recording::start(self, by, project, &name);
        recording.of(self.export_unrecorded(by.caller, project, name, request), Exported::ran).await
    }

    async fn export_unrecorded(
        &self,
        caller: &Principal,
        project: ProjectId,
        name: EndpointName,
        request: RunRequest,
    ) -> Result<Exported, Error> {
        let mut request = request;
        admit(caller, &name, &mut request)?;
        if request.limit > self.export_limit {
            return Err(Invalid::field(
                "limit",
                format!(
                    "limit must be an integer between 1 and {} for a {} page.",
                    self.export_limit,
                    request.format.as_str()
                ),
            )
            .into());
        }
        // Pages of other formats are written from the newest data as they stream; they page by `offset`.
        for (attr, sent) in [("as_of", request.as_of.is_some()), ("cursor", request.cursor.is_some())] {
            if sent {
                return Err(Invalid::field(
                    attr,
                    format!("{attr} is for JSON runs; a page in another format reads the newest data (use offset)."),
                )
                .into());
            }
        }
        let endpoint = self.active_endpoint(project, &name).await?;
        let context = self.context();
        let version = context.version(&endpoint, request.version).await?;
        let variables = bind(&version.query, &request.variables)?;
        let (limit, offset, format) = (request.limit, request.offset, request.format);
        let results = &self.materializations.results;
        let started_at = self.clock.now();
        let exported = context
            .stored_else_live(
                &endpoint,
                &version,
                &variables,
                &request,
                |location, filters| {
                    let results = Arc::clone(results);
                    async move { results.export(project, &location, filters, limit, offset, format).await }
                },
                async || {
                    let export =
                        self.engine.export(project, &version.query, &variables, limit, offset, format);
                    export.await.map_err(Error::from)
                },
            )
            .await?;
        let (export, stored) = match exported {
            Some((export, stored, _)) => {
                self.executions.record(project, &name, self.clock.now());
                let data_as_of = stored.as_ref().map_or(started_at, |s| s.data_as_of);
                (export, Some((stored, data_as_of)))
            }
            // Nothing fresh is stored and nothing may run: a page of no rows, with the query's columns (the engine
            // plans it but reads nothing), so that every format's answer is a page of that format.
            None => (self.engine.export(project, &version.query, &variables, 0, 0, format).await?, None),
        };
        Ok(Exported {
            name,
            version: version.version,
            export,
            materialized_at: stored
                .as_ref()
                .and_then(|(stored, _)| stored.as_ref().map(|s| s.materialized_at)),
            data_as_of: stored.map(|(_, at)| at),
            execution_id: uuid::Builder::from_random_bytes(rand::random()).into_uuid(),
        })
    }

    /// A `force_cache` answer from the endpoint's fresh stored result, if it has one.
    async fn stored_only(
        &self,
        endpoint: &Endpoint,
        request: &RunRequest,
    ) -> Result<Option<Arc<CachedRun>>, Error> {
        let context = self.context();
        let version = context.version(endpoint, request.version).await?;
        let variables = bind(&version.query, &request.variables)?;
        let (limit, offset) = (request.limit, request.offset);
        let results = &self.materializations.results;
        let page = context
            .stored_else_live(
                endpoint,
                &version,
                &variables,
                request,
                |location, filters| {
                    let (results, project) = (Arc::clone(results), endpoint.project_id);
                    async move { results.read(project, &location, filters, limit, offset).await }
                },
                async || Err(Error::Internal("a force_cache run is never answered live".into())),
            )
            .await?;
        let now = self.clock.now();
        Ok(page.map(|page| context.answer(&version, &variables, page, false, now)))
    }

    fn context(&self) -> Context {
        Context {
            store: Arc::clone(&self.store),
            engine: Arc::clone(&self.engine),
            cache: Arc::clone(&self.cache),
            clock: Arc::clone(&self.clock),
            executions: Arc::clone(&self.executions),
            materializations: self.materializations.clone(),
            definitions: Arc::clone(&self.definitions),
            stored: Arc::clone(&self.stored),
        }
    }

    /// Identical cache misses share one computation; it is cancelled only when every caller has gone.
    async fn coalesced(&self, key: CacheKey, request: &RunRequest) -> Result<Arc<CachedRun>, Error> {
        let shared: Shared<RunFuture> = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(PoisonError::into_inner);
            match in_flight.get(&key).and_then(WeakShared::upgrade) {
                Some(existing) => existing,
                None => {
                    let registry = Arc::clone(&self.in_flight);
                    let context = self.context();
                    let request = request.clone();
                    let own_key = key.clone();
                    let future: Shared<RunFuture> = async move {
                        let result = compute(context, own_key.clone(), request, true).await.map_err(Arc::new);
                        registry.lock().unwrap_or_else(PoisonError::into_inner).remove(&own_key);
                        result
                    }
                    .boxed()
                    .shared();
                    if let Some(weak) = future.downgrade() {
                        in_flight.insert(key.clone(), weak);
                    }
                    future
                }
            }
        };
        let result = shared.await.map_err(|e| unshare(&e));
        // Entries of computations dropped by all their callers never reached their own cleanup.
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|_, weak| weak.upgrade().is_some());
        result
    }
}

/// The ports a computation needs, owned, so a shared computation outlives the request that started it.
struct Context {
    store: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    cache: Arc<dyn ResultCache>,
    clock: Arc<dyn Clock>,
    executions: Arc<ExecutionTracker>,
    materializations: MaterializationPorts,
    definitions: Arc<RecentReads<(ProjectId, EndpointName), Definition>>,
    stored: Arc<RecentReads<(ProjectId, EndpointName), KeptResult>>,
}

impl Context {
    /// The active endpoint `key` names and the version a computation runs: kept from an earlier computation
    /// under the same cache generation (see [`Definition`]), else read from the store, and kept when it is the
    /// current version.
    async fn definition(&self, key: &CacheKey, requested: Option<u32>) -> Result<Arc<Definition>, Error> {
        let now = self.clock.now();
        let found = (key.project, key.name.clone());
        let kept = self.definitions.get(&found, now).filter(|kept| {
            kept.generation == key.generation && requested.is_none_or(|v| v == kept.version.version)
        });
        if let Some(kept) = kept {
            return Ok(kept);
        }
        let endpoint = active(self.store.as_ref(), key.project, &key.name).await?;
        let version = self.version(&endpoint, requested).await?;
        let current = version.version == endpoint.current_version;
        let definition = Arc::new(Definition { generation: key.generation, endpoint, version });
        if current {
            self.definitions.put(found, &definition, now);
        }
        Ok(definition)
    }

    async fn version(&self, endpoint: &Endpoint, requested: Option<u32>) -> Result<EndpointVersion, Error> {
        let name = &endpoint.name;
        let number = requested.unwrap_or(endpoint.current_version);
        let version =
            self.store.get_version(endpoint.project_id, name, number).await.map_err(|e| match e {
                StoreError::VersionNotFound(_) | StoreError::NotFound => {
                    Error::NotFound(format!("Endpoint '{name}' has no version {number}."))
                }
                other => other.into(),
            })?;
        match &version.plan_error {
            Some(reason) => Err(Error::QueryInvalid(reason.clone())),
            None => Ok(version),
        }
    }

    /// The endpoint's stored result and the filters that select a run's rows in it, when a result of this
    /// version is complete, not older than one sync period, and recent enough for the request, and the endpoint
    /// does not hibernate (its result stopped following the tables: its first run answers live, and wakes it).
    async fn stored_source(
        &self,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        variables: &BTreeMap<String, BoundValue>,
        request: &RunRequest,
    ) -> Option<(StoredResult, Vec<(MaterializedFilter, BoundValue)>)> {
        let period = endpoint.sync_frequency?.period();
        let now = self.clock.now();
        if endpoint.hibernating(now, self.executions.pending(endpoint.project_id, &endpoint.name)) {
            return None;
        }
        let stored = self.stored_result(endpoint, now).await?.filter(|r| {
            r.version == version.version
                && r.materialized_at + period >= now
                && request.takes(r.data_as_of, now)
        })?;
        let eligibility = match &version.eligibility {
            Some(eligibility) => eligibility.clone(),
            // A version saved before eligibility was recorded: plan it now.
            None => Eligibility::decide(
                &self.engine.describe(endpoint.project_id, &version.query).await.ok()?.outline,
            ),
        };
        let filters = eligibility.filters()?;
        let bound = filters
            .iter()
            .map(|f| variables.get(&f.variable).map(|value| (f.clone(), value.clone())))
            .collect::<Option<Vec<_>>>()?;
        Some((stored, bound))
    }

    /// The endpoint's stored result as the store holds it: kept from an earlier run under the same cache
    /// generation (see [`KeptResult`]), else read; `None` when it cannot be read.
    async fn stored_result(&self, endpoint: &Endpoint, now: Timestamp) -> Option<Option<StoredResult>> {
        let key = (endpoint.project_id, endpoint.name.clone());
        // Taken before the read: a switch during it moves the generation on, and what is kept is not used.
        let generation = self.cache.generation(endpoint.project_id, &endpoint.name);
        if let Some(kept) = self.stored.get(&key, now).filter(|kept| kept.generation == generation) {
            return Some(kept.result.clone());
        }
        let result = match self.materializations.states.get(endpoint.id).await {
            Ok(state) => state.and_then(|state| state.result),
            Err(err) => {
                warn!(endpoint = %endpoint.name, error = %err, "cannot read the materialization record; running live");
                return None;
            }
        };
        self.stored.put(key, &Arc::new(KeptResult { generation, result: result.clone() }), now);
        Some(result)
    }

    /// A page from the endpoint's stored result when the run may read one (a `blocking` or `force_cache` run of
    /// a materialized endpoint) and a fresh one exists (see [`Context::stored_source`]), else from the live
    /// tables; a stored result that cannot be read is logged and the page computed live. A `force_cache` run is
    /// never computed live: without a stored page it has none. Answers the page, the stored result it was read
    /// from, and how long reading or computing it took.
    ///
    /// The record kept may name a result that another process switched away from, and removed, before the
    /// switch's announcement arrived here: a read that fails has the record read again, and reads the result it
    /// names when that is another one.
    async fn stored_else_live<T, Read>(
        &self,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        variables: &BTreeMap<String, BoundValue>,
        request: &RunRequest,
        stored: impl Fn(String, Vec<(MaterializedFilter, BoundValue)>) -> Read,
        live: impl AsyncFnOnce() -> Result<T, Error>,
    ) -> Result<Option<(T, Option<StoredResult>, Duration)>, Error>
    where
        Read: Future<Output = Result<T, EngineError>>,
    {
        let refresh = request.refresh;
        // A stored result holds the newest data it was refreshed with: earlier versions are read live.
        let reads_stored = endpoint.is_materialized
            && matches!(refresh, Refresh::Blocking | Refresh::ForceCache)
            && request.read_at().is_newest();
        let source =
            if reads_stored { self.stored_source(endpoint, version, variables, request).await } else { None };
        if let Some((result, filters)) = source {
            let started = Instant::now();
            let failed = match stored(result.location.clone(), filters).await {
                Ok(page) => return Ok(Some((page, Some(result), started.elapsed()))),
                Err(err) => err,
            };
            // The record read again: the result it names now, when that is another one, is read once.
            self.stored.forget(&(endpoint.project_id, endpoint.name.clone()));
            let switched = self.stored_source(endpoint, version, variables, request).await;
            let (result, failed) = match switched.filter(|(read, _)| read.location != result.location) {
                Some((switched, filters)) => match stored(switched.location.clone(), filters).await {
                    Ok(page) => return Ok(Some((page, Some(switched), started.elapsed()))),
                    Err(err) => (switched, err),
                },
                None => (result, failed),
            };
            warn!(endpoint = %endpoint.name, location = %result.location, error = %failed,
                  "cannot read the stored result; running live");
        }
        if refresh == Refresh::ForceCache {
            return Ok(None);
        }
        let started = Instant::now();
        live().await.map(|page| Some((page, None, started.elapsed())))
    }

    /// A computed run from a page as [`Context::stored_else_live`] answers it; a live one (no stored result)
    /// has the data as of `started_at`.
    fn answer(
        &self,
        version: &EndpointVersion,
        variables: &BTreeMap<String, BoundValue>,
        (result, stored, query_time): (QueryResult, Option<StoredResult>, Duration),
        cacheable: bool,
        started_at: Timestamp,
    ) -> Arc<CachedRun> {
        let computed_at = self.clock.now();
        let age = version.cache_age.effective();
        Arc::new(CachedRun {
            version: version.version,
            version_created_at: version.created_at,
            result,
            computed_at,
            expires_at: cacheable.then(|| computed_at + age),
            query_time,
            endpoint_materialized: stored.is_some(),
            data_as_of: stored.as_ref().map_or(started_at, |s| s.data_as_of),
            materialized_at: stored.map(|s| s.materialized_at),
            variables: bound_json(variables),
            rendered: std::sync::OnceLock::new(),
            tag: std::sync::OnceLock::new(),
            as_of: std::sync::OnceLock::new(),
        })
    }
}

async fn compute(
    context: Context,
    key: CacheKey,
    request: RunRequest,
    write_cache: bool,
) -> Result<Arc<CachedRun>, Error> {
    let definition = context.definition(&key, request.version).await?;
    let Definition { endpoint, version, .. } = &*definition;
    let variables = bind(&version.query, &request.variables)?;
    if let Some(cursor) = &request.followed {
        cursor.check(RunOf {
            project: key.project,
            endpoint: key.name.as_str(),
            version: version.version,
            variables: &bound_json(&variables),
        })?;
    }
    let (limit, offset) = (request.limit, request.offset);
    let results = &context.materializations.results;
    // A live computation includes every append answered before it starts reading; one of earlier versions
    // has the data of their time.
    let started_at = request.pinned_as_of().unwrap_or_else(|| context.clock.now());
    let at = request.read_at();
    let page = context
        .stored_else_live(
            endpoint,
            version,
            &variables,
            &request,
            |location, filters| {
                let (results, project) = (Arc::clone(results), key.project);
                async move { results.read(project, &location, filters, limit, offset).await }
            },
            async || {
                let engine = &context.engine;
                let result = match &at {
                    ReadAt::Newest => {
                        engine.execute(key.project, &version.query, &variables, limit, offset).await
                    }
                    at => engine.execute_at(key.project, &version.query, &variables, limit, offset, at).await,
                };
                result.map_err(|err| pinned_error(err, &at))
            },
        )
        .await?
        .ok_or_else(|| Error::Internal("a run that computes live always has a page".into()))?;
    let cacheable = write_cache && !version.cache_age.effective().is_zero();
    let run = context.answer(version, &variables, page, cacheable, started_at);
    if cacheable {
        context.cache.put(key, Arc::clone(&run));
    }
    Ok(run)
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
