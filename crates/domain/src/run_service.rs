//! The run rules: cache lookup before anything else, version selection, variable binding, refresh modes,
//! coalescing of identical cache misses, and recording of execution times.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, FutureExt, Shared, WeakShared};
use serde_json::{Map, Value};
use tracing::warn;
use uuid::Uuid;

use crate::auth::ProjectId;
use crate::endpoint::EndpointVersion;
use crate::endpoint::{Endpoint, EndpointName};
use crate::error::Error;
use crate::executions::ExecutionTracker;
use crate::materialization::{Eligibility, StoredResult};
use crate::ports::{
    CacheKey, CachedRun, Clock, EndpointStore, MaterializationStore, Materializations, MaterializedResults,
    QueryEngine, ResultCache, StoreError,
};
use crate::run::{bind, BoundValue, QueryResult, Refresh, RunRequest};
use crate::Timestamp;

/// What a run answers: the result (or none for `force_cache` without a cached one) and how it was obtained.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub name: EndpointName,
    pub run: Option<Arc<CachedRun>>,
    pub is_cached: bool,
    pub endpoint_materialized: bool,
    pub execution_id: Uuid,
    pub client_query_id: Option<String>,
    pub limit: u32,
    pub offset: u64,
    /// Wall time spent in the service for this request.
    pub total: Duration,
}

type RunFuture = BoxFuture<'static, Result<Arc<CachedRun>, Arc<Error>>>;

/// Runs endpoints.
pub struct RunService {
    store: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    cache: Arc<dyn ResultCache>,
    clock: Arc<dyn Clock>,
    executions: Arc<ExecutionTracker>,
    materializations: Option<Materializations>,
    /// Computations under way, held weakly: when every caller has gone the computation is dropped (and with it
    /// the engine's work and its concurrency slot), and the next identical request starts afresh.
    in_flight: Arc<Mutex<HashMap<CacheKey, WeakShared<RunFuture>>>>,
}

/// An error shared between coalesced callers, rebuilt for each of them.
fn unshare(err: &Arc<Error>) -> Error {
    match &**err {
        Error::Invalid(invalid) => Error::Invalid(invalid.clone()),
        Error::NotAuthenticated(d) => Error::NotAuthenticated(d.clone()),
        Error::PermissionDenied(d) => Error::PermissionDenied(d.clone()),
        Error::NotFound(d) => Error::NotFound(d.clone()),
        Error::NameTaken(n) => Error::NameTaken(n.clone()),
        Error::QueryTimeout(d) => Error::QueryTimeout(*d),
        Error::QueryMemoryLimit(d) => Error::QueryMemoryLimit(d.clone()),
        Error::ResultTooLarge { limit_bytes } => Error::ResultTooLarge { limit_bytes: *limit_bytes },
        Error::Throttled { retry_after } => Error::Throttled { retry_after: *retry_after },
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
    // `serde_json` writes integers without `fmt`, and writing into a Vec cannot fail.
    key.extend_from_slice(b"v=");
    match request.version {
        Some(version) => {
            let _ = serde_json::to_writer(&mut key, &version);
        }
        None => key.extend_from_slice(b"latest"),
    }
    key.extend_from_slice(b";limit=");
    let _ = serde_json::to_writer(&mut key, &request.limit);
    key.extend_from_slice(b";offset=");
    let _ = serde_json::to_writer(&mut key, &request.offset);
    key.extend_from_slice(b";vars=");
    let _ = serde_json::to_writer(&mut key, &request.variables);
    String::from_utf8(key).unwrap_or_default()
}

fn not_found(name: &str) -> Error {
    Error::NotFound(format!("No active endpoint named '{name}' in this project."))
}

impl RunService {
    pub fn new(
        store: Arc<dyn EndpointStore>,
        engine: Arc<dyn QueryEngine>,
        cache: Arc<dyn ResultCache>,
        clock: Arc<dyn Clock>,
        executions: Arc<ExecutionTracker>,
    ) -> Self {
        Self {
            store,
            engine,
            cache,
            clock,
            executions,
            materializations: None,
            in_flight: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Serves `blocking` and `force_cache` runs of materialized endpoints from their stored results.
    #[must_use]
    pub fn with_materializations(
        mut self,
        states: Arc<dyn MaterializationStore>,
        results: Arc<dyn MaterializedResults>,
    ) -> Self {
        self.materializations = Some(Materializations { states, results });
        self
    }

    /// Runs an endpoint. A fresh cached result is served without touching the store or the engine.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown or inactive endpoint or version; [`Error::Invalid`] for variables;
    /// the engine's [`Error::QueryTimeout`], [`Error::QueryMemoryLimit`], [`Error::Throttled`]; store failures.
    pub async fn run(
        &self,
        project: ProjectId,
        name: &str,
        request: RunRequest,
    ) -> Result<RunOutcome, Error> {
        let started = Instant::now();
        let name = EndpointName::parse(name).map_err(|_| not_found(name))?;
        let generation = self.cache.generation(project, &name);
        let key = CacheKey { project, name, generation, request: request_key(&request) };
        let now = self.clock.now();
        let reads_cache = matches!(request.refresh, Refresh::Blocking | Refresh::ForceCache);
        if reads_cache {
            if let Some(hit) = self.cache.get(&key).filter(|hit| hit.expires_at.is_some_and(|at| at > now)) {
                self.executions.record(project, &key.name, now);
                // A hit answers with the key's own name: no copy of it on this path.
                return Ok(self.outcome(key.name, Some(hit), true, &request, started));
            }
        }
        let endpoint_name = key.name.clone();
        let run = match request.refresh {
            Refresh::ForceCache => {
                // Nothing cached: a stored result answers, else say there is nothing (after checking that the
                // endpoint exists).
                let endpoint = self.active_endpoint(project, &endpoint_name).await?;
                let stored = if endpoint.is_materialized {
                    self.stored_only(&endpoint, &request).await?
                } else {
                    None
                };
                let Some(run) = stored else {
                    return Ok(self.outcome(endpoint_name, None, false, &request, started));
                };
                self.executions.record(project, &endpoint_name, self.clock.now());
                return Ok(self.outcome(endpoint_name, Some(run), false, &request, started));
            }
            Refresh::Blocking => self.coalesced(key, &request).await?,
            Refresh::ForceBlocking | Refresh::Direct => {
                compute(self.context(), key, request.clone(), request.refresh != Refresh::Direct).await?
            }
        };
        self.executions.record(project, &endpoint_name, self.clock.now());
        Ok(self.outcome(endpoint_name, Some(run), false, &request, started))
    }

    fn outcome(
        &self,
        name: EndpointName,
        run: Option<Arc<CachedRun>>,
        is_cached: bool,
        request: &RunRequest,
        started: Instant,
    ) -> RunOutcome {
        RunOutcome {
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

    async fn active_endpoint(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, Error> {
        match self.store.get(project, name).await {
            Ok(endpoint) if endpoint.is_active => Ok(endpoint),
            Ok(_) | Err(StoreError::NotFound) => Err(not_found(name.as_str())),
            Err(other) => Err(other.into()),
        }
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
        Ok(context.stored(endpoint, &version, &variables, request).await.map(|(result, stored, took)| {
            context.answer(&version, &variables, result, Some(stored), took, false)
        }))
    }

    fn context(&self) -> Context {
        Context {
            store: Arc::clone(&self.store),
            engine: Arc::clone(&self.engine),
            cache: Arc::clone(&self.cache),
            clock: Arc::clone(&self.clock),
            materializations: self.materializations.clone(),
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
    materializations: Option<Materializations>,
}

impl Context {
    async fn version(&self, endpoint: &Endpoint, requested: Option<u32>) -> Result<EndpointVersion, Error> {
        let name = &endpoint.name;
        let number = requested.unwrap_or(endpoint.current_version);
        self.store.get_version(endpoint.project_id, name, number).await.map_err(|e| match e {
            StoreError::VersionNotFound(_) | StoreError::NotFound => {
                Error::NotFound(format!("Endpoint '{name}' has no version {number}."))
            }
            other => other.into(),
        })
    }

    /// The page read from the endpoint's stored result, when one of this version is complete and not older than
    /// one sync period. A read that fails is logged and answered by the live path instead.
    async fn stored(
        &self,
        endpoint: &Endpoint,
        version: &EndpointVersion,
        variables: &BTreeMap<String, BoundValue>,
        request: &RunRequest,
    ) -> Option<(QueryResult, StoredResult, Duration)> {
        let Materializations { states, results } = self.materializations.as_ref()?;
        let period = endpoint.sync_frequency?.period();
        let state = match states.get(endpoint.id).await {
            Ok(state) => state?,
            Err(err) => {
                warn!(endpoint = %endpoint.name, error = %err, "cannot read the materialization record; running live");
                return None;
            }
        };
        let stored = state
            .result
            .filter(|r| r.version == version.version && r.materialized_at + period >= self.clock.now())?;
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
        let started = Instant::now();
        match results.read(endpoint.project_id, &stored.location, bound, request.limit, request.offset).await
        {
            Ok(result) => Some((result, stored, started.elapsed())),
            Err(err) => {
                warn!(endpoint = %endpoint.name, location = %stored.location, error = %err,
                      "cannot read the stored result; running live");
                None
            }
        }
    }

    fn answer(
        &self,
        version: &EndpointVersion,
        variables: &BTreeMap<String, BoundValue>,
        result: QueryResult,
        stored: Option<StoredResult>,
        query_time: Duration,
        cacheable: bool,
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
            materialized_at: stored.map(|s| s.materialized_at),
            variables: Value::Object(
                variables.iter().map(|(k, v)| (k.clone(), v.to_json())).collect::<Map<_, _>>(),
            ),
            rendered: std::sync::OnceLock::new(),
        })
    }
}

async fn compute(
    context: Context,
    key: CacheKey,
    request: RunRequest,
    write_cache: bool,
) -> Result<Arc<CachedRun>, Error> {
    let name = key.name.clone();
    let endpoint = match context.store.get(key.project, &name).await {
        Ok(endpoint) if endpoint.is_active => endpoint,
        Ok(_) | Err(StoreError::NotFound) => return Err(not_found(name.as_str())),
        Err(other) => return Err(other.into()),
    };
    let version = context.version(&endpoint, request.version).await?;
    let variables = bind(&version.query, &request.variables)?;
    let stored = match (request.refresh, endpoint.is_materialized) {
        (Refresh::Blocking, true) => context.stored(&endpoint, &version, &variables, &request).await,
        _ => None,
    };
    let (result, stored, query_time) = match stored {
        Some((result, stored, took)) => (result, Some(stored), took),
        None => {
            let started = Instant::now();
            let result = context
                .engine
                .execute(key.project, &version.query, &variables, request.limit, request.offset)
                .await?;
            (result, None, started.elapsed())
        }
    };
    let cacheable = write_cache && !version.cache_age.effective().is_zero();
    let run = context.answer(&version, &variables, result, stored, query_time, cacheable);
    if cacheable {
        context.cache.put(key, Arc::clone(&run));
    }
    Ok(run)
}

/// The answer of a last-execution-times lookup.
#[derive(Debug, Clone, PartialEq)]
pub struct LastExecutions {
    pub id: Uuid,
    /// Names that ran in the window, with their last time, ordered by name.
    pub results: Vec<(EndpointName, Timestamp)>,
    pub names_requested: usize,
    /// Rows the store returned for the lookup.
    pub rows_read: u64,
    /// Bytes of the names and times read.
    pub bytes_read: u64,
    pub start_time: Timestamp,
    pub end_time: Timestamp,
    pub elapsed: Duration,
}

/// The most names one lookup accepts.
pub const MAX_NAMES: usize = 1000;

/// The same instant six calendar months earlier (the day clamped to the month's length).
pub fn six_months_before(now: Timestamp) -> Timestamp {
    let mut year = now.year();
    let mut month = i32::from(u8::from(now.month())) - 6;
    if month <= 0 {
        month += 12;
        year -= 1;
    }
    let month = u8::try_from(month).ok().and_then(|m| time::Month::try_from(m).ok()).unwrap_or(now.month());
    let day = now.day().min(month.length(year));
    time::Date::from_calendar_date(year, month, day).map_or(now, |date| now.replace_date(date))
}

fn parse_names(body: &Value) -> Result<Vec<EndpointName>, Error> {
    let fields = crate::fields::Fields::new(body, &["names"])?;
    let invalid = |detail: String| Error::Invalid(crate::error::Invalid::field("names", detail));
    let items = match fields.get("names") {
        None | Some(Value::Null) => return Err(crate::error::Invalid::required("names").into()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("names must be an array of endpoint names.".into())),
    };
    if items.is_empty() || items.len() > MAX_NAMES {
        return Err(invalid(format!("names must hold between 1 and {MAX_NAMES} endpoint names.")));
    }
    let mut names = Vec::with_capacity(items.len());
    for item in items {
        let raw = item.as_str().ok_or_else(|| invalid("names must be an array of strings.".into()))?;
        let name = EndpointName::parse(raw)
            .map_err(|_| invalid(format!("'{raw}' is not a valid endpoint name.")))?;
        if !names.contains(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

impl RunService {
    /// Last execution times within the past six months of the listed endpoints; unknown names and older runs
    /// are left out.
    ///
    /// # Errors
    /// [`Error::Invalid`] (attr `names`) for a missing, empty, oversized or malformed list; store failures.
    pub async fn last_execution_times(
        &self,
        project: ProjectId,
        body: &Value,
    ) -> Result<LastExecutions, Error> {
        let names = parse_names(body)?;
        let started = Instant::now();
        let start_time = self.clock.now();
        let since = six_months_before(start_time);
        let (results, rows_read) = self.executions.last_executed(project, &names, since).await?;
        let bytes_read = results.iter().map(|(name, _)| name.as_str().len() as u64 + 8).sum();
        Ok(LastExecutions {
            id: Uuid::new_v4(),
            results,
            names_requested: names.len(),
            rows_read,
            bytes_read,
            start_time,
            end_time: self.clock.now(),
            elapsed: started.elapsed(),
        })
    }
}

#[cfg(test)]
#[path = "run_service_tests.rs"]
mod tests;
