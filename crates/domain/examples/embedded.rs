//! The domain embedded in another Rust program, with its ports implemented in memory: a store of endpoints and
//! their versions, a result cache, and an engine that answers `SELECT <integer or variable> AS <name>`. It
//! creates an endpoint, runs it, saves a second version, runs both versions, and lists the history.
//!
//! `cargo run -p domain --example embedded` (also run by `make test`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use domain::{
    BoundValue, CacheKey, CachedRun, Claim, Column, ColumnType, CreateEndpoint, Endpoint, EndpointChange,
    EndpointDeps, EndpointFilter, EndpointName, EndpointPatch, EndpointService, EndpointStore,
    EndpointVersion, EngineError, ExecutionTracker, Export, MaterializationPorts, MaterializationRecords,
    MaterializationState, MaterializedFilter, NewEndpoint, NoRunLog, Page, PageRequest, Principal, ProjectId,
    Query, QueryDescription, QueryEngine, QueryResult, Refresh, Replanned, ResultCache, ResultFormat,
    ResultStorage, RunBy, RunDeps, RunRequest, RunService, Scope, Statistics, StoreError, StoredResult,
    Switch, SystemClock, TableReader, Timestamp, Transport, Variable, VariableType, VersionNumber,
};
use serde_json::{json, Map};
use uuid::Uuid;

/// Each endpoint with its versions, oldest first, by project and name.
type Endpoints = HashMap<(ProjectId, EndpointName), (Endpoint, Vec<EndpointVersion>)>;

/// Endpoints and their versions in memory.
#[derive(Default)]
struct MemoryStore {
    endpoints: Mutex<Endpoints>,
}

impl MemoryStore {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<(ProjectId, EndpointName), (Endpoint, Vec<EndpointVersion>)>) -> T,
    ) -> T {
        f(&mut self.endpoints.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[async_trait]
impl EndpointStore for MemoryStore {
    async fn insert(&self, new: NewEndpoint) -> Result<Endpoint, StoreError> {
        let endpoint = new.unsaved();
        self.with(|all| {
            let key = (endpoint.project_id, endpoint.name.clone());
            if all.contains_key(&key) {
                return Err(StoreError::NameTaken(endpoint.name.to_string()));
            }
            all.insert(key, (endpoint.clone(), vec![EndpointVersion::current_of(&endpoint)]));
            Ok(endpoint)
        })
    }

    async fn get(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, StoreError> {
        self.with(|all| all.get(&(project, name.clone())).map(|(e, _)| e.clone()).ok_or(StoreError::NotFound))
    }

    async fn list(
        &self,
        project: ProjectId,
        filter: &EndpointFilter,
        page: PageRequest,
    ) -> Result<Page<Endpoint>, StoreError> {
        let mut found: Vec<Endpoint> = self.with(|all| {
            all.values()
                .map(|(e, _)| e)
                .filter(|e| e.project_id == project && filter.is_active.is_none_or(|a| a == e.is_active))
                .cloned()
                .collect()
        });
        found.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(paged(found, page))
    }

    async fn readers(&self, project: ProjectId, tables: &[String]) -> Result<Vec<TableReader>, StoreError> {
        Ok(self.with(|all| {
            all.values()
                .filter(|(e, _)| e.project_id == project)
                .map(|(e, _)| TableReader::of(e))
                .filter(|reader| reader.may_read(tables))
                .collect()
        }))
    }

    async fn read_tables(&self) -> Result<Vec<(ProjectId, String)>, StoreError> {
        Ok(self.with(|all| {
            let read: std::collections::BTreeSet<(ProjectId, String)> = all
                .values()
                .flat_map(|(e, _)| e.tables.iter().flatten().map(|t| (e.project_id, t.clone())))
                .collect();
            read.into_iter().collect()
        }))
    }

    async fn update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        change: EndpointChange,
        at: Timestamp,
    ) -> Result<Endpoint, StoreError> {
        self.with(|all| {
            let (endpoint, versions) = all.get_mut(&(project, name.clone())).ok_or(StoreError::NotFound)?;
            let new_version = change.query.is_some();
            if change.query.as_ref().is_some_and(|v| v.number != endpoint.current_version + 1) {
                return Err(StoreError::Superseded { current: endpoint.current_version });
            }
            *endpoint = change.applied_to(endpoint.clone(), at);
            if new_version {
                versions.iter_mut().for_each(|v| v.is_current = false);
                versions.push(EndpointVersion::current_of(endpoint));
            }
            Ok(endpoint.clone())
        })
    }

    async fn replan(&self, _: Uuid, _: u32, _: Replanned) -> Result<bool, StoreError> {
        Ok(false)
    }

    async fn announce(&self, _: ProjectId, _: Vec<EndpointName>) -> Result<(), StoreError> {
        Ok(())
    }

    async fn delete(&self, project: ProjectId, name: &EndpointName) -> Result<Uuid, StoreError> {
        self.with(|all| all.remove(&(project, name.clone())).map(|(e, _)| e.id).ok_or(StoreError::NotFound))
    }

    async fn list_versions(
        &self,
        project: ProjectId,
        name: &EndpointName,
        page: PageRequest,
    ) -> Result<Page<EndpointVersion>, StoreError> {
        let versions = self.with(|all| all.get(&(project, name.clone())).map(|(_, v)| v.clone()));
        let mut versions = versions.ok_or(StoreError::NotFound)?;
        versions.reverse();
        Ok(paged(versions, page))
    }

    async fn get_version(
        &self,
        project: ProjectId,
        name: &EndpointName,
        version: u32,
    ) -> Result<EndpointVersion, StoreError> {
        let versions = self.with(|all| all.get(&(project, name.clone())).map(|(_, v)| v.clone()));
        let versions = versions.ok_or(StoreError::NotFound)?;
        versions.into_iter().find(|v| v.version == version).ok_or(StoreError::VersionNotFound(version))
    }

    async fn record_executions(
        &self,
        _: Vec<(ProjectId, EndpointName, Timestamp)>,
    ) -> Result<(), StoreError> {
        Ok(())
    }

    async fn last_executions(
        &self,
        _: ProjectId,
        _: Vec<EndpointName>,
        _: Timestamp,
    ) -> Result<(Vec<(EndpointName, Timestamp)>, u64), StoreError> {
        Ok((Vec::new(), 0))
    }
}

/// An engine for `SELECT <integer> AS <name>` and `SELECT {variables.NAME} AS <name>`, nothing else.
struct TinyEngine;

impl TinyEngine {
    /// The output column's name, and the value's source: a literal or a variable.
    fn read(query: &Query) -> Result<(String, Result<i64, String>), EngineError> {
        let refuse = || {
            EngineError::InvalidQuery("This engine runs only SELECT <integer or variable> AS <name>.".into())
        };
        let rest = query.sql.strip_prefix("SELECT ").ok_or_else(refuse)?;
        let (value, name) = rest.split_once(" AS ").ok_or_else(refuse)?;
        let source = match value.strip_prefix("{variables.").and_then(|v| v.strip_suffix('}')) {
            Some(variable) => Err(variable.to_owned()),
            None => Ok(value.parse().map_err(|_| refuse())?),
        };
        Ok((name.to_owned(), source))
    }
}

#[async_trait]
impl QueryEngine for TinyEngine {
    async fn describe(&self, _: ProjectId, query: &Query) -> Result<QueryDescription, EngineError> {
        let (name, _) = Self::read(query)?;
        Ok(QueryDescription {
            columns: vec![Column { name, column_type: ColumnType::Integer }],
            outline: Default::default(),
            tables: Vec::new(),
        })
    }

    async fn execute(
        &self,
        _: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        _: u32,
        _: u64,
    ) -> Result<QueryResult, EngineError> {
        let (name, source) = Self::read(query)?;
        let value = match source {
            Ok(literal) => literal,
            Err(variable) => match variables.get(&variable) {
                Some(BoundValue::Integer(n)) => *n,
                _ => {
                    return Err(EngineError::InvalidQuery(format!(
                        "{{variables.{variable}}} is not an integer"
                    )))
                }
            },
        };
        Ok(QueryResult {
            columns: vec![Column { name: name.clone(), column_type: ColumnType::Integer }],
            rows_json: json!([{ name: value }]).to_string(),
            row_count: 1,
            has_more: false,
            statistics: Statistics::default(),
            read: Vec::new(),
        })
    }

    async fn export(
        &self,
        _: ProjectId,
        _: &Query,
        _: &BTreeMap<String, BoundValue>,
        _: u32,
        _: u64,
        _: ResultFormat,
    ) -> Result<Export, EngineError> {
        Err(EngineError::InvalidQuery("This engine writes JSON only.".into()))
    }
}

/// Answers kept in memory until the domain says they are stale.
#[derive(Default)]
struct MemoryCache {
    runs: Mutex<HashMap<CacheKey, Arc<CachedRun>>>,
    generations: Mutex<HashMap<(ProjectId, EndpointName), u64>>,
}

impl ResultCache for MemoryCache {
    fn generation(&self, project: ProjectId, name: &EndpointName) -> u64 {
        let generations = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        generations.get(&(project, name.clone())).copied().unwrap_or(0)
    }

    fn get(&self, key: &CacheKey) -> Option<Arc<CachedRun>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner).get(key).cloned()
    }

    fn put(&self, key: CacheKey, run: Arc<CachedRun>) {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner).insert(key, run);
    }

    fn invalidate(&self, project: ProjectId, name: &EndpointName) {
        let mut generations = self.generations.lock().unwrap_or_else(PoisonError::into_inner);
        *generations.entry((project, name.clone())).or_insert(0) += 1;
    }

    fn invalidate_all(&self) {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

/// Tells the cache of every change the endpoint rules make. One process: nothing to wait for on others.
struct ClearCache(Arc<MemoryCache>);

#[async_trait]
impl domain::EndpointChanges for ClearCache {
    fn changed(&self, project: ProjectId, name: &EndpointName) {
        self.0.invalidate(project, name);
    }

    async fn settled(&self) {}
}

/// No endpoint here is materialized: no records, no stored results.
struct NoMaterializations;

#[async_trait]
impl MaterializationRecords for NoMaterializations {
    async fn get(&self, _: Uuid) -> Result<Option<MaterializationState>, StoreError> {
        Ok(None)
    }
    async fn get_many(&self, _: Vec<Uuid>) -> Result<Vec<MaterializationState>, StoreError> {
        Ok(Vec::new())
    }
    async fn claim_due(&self, _: Timestamp, _: Timestamp, _: usize) -> Result<Vec<Claim>, StoreError> {
        Ok(Vec::new())
    }
    async fn renew(&self, _: Uuid, _: Uuid, _: Timestamp) -> Result<bool, StoreError> {
        Ok(false)
    }
    async fn complete(
        &self,
        _: Uuid,
        _: Uuid,
        _: StoredResult,
        _: Timestamp,
        _: Option<u64>,
    ) -> Result<Switch, StoreError> {
        Err(StoreError::NotFound)
    }
    async fn fail(&self, _: Uuid, _: Uuid, _: String, _: Timestamp) -> Result<bool, StoreError> {
        Ok(false)
    }
    async fn reschedule(&self, _: Uuid, _: Timestamp) -> Result<(), StoreError> {
        Ok(())
    }
    async fn appended(&self, _: Vec<Uuid>, _: Timestamp) -> Result<(), StoreError> {
        Ok(())
    }
    async fn all(&self) -> Result<Vec<MaterializationState>, StoreError> {
        Ok(Vec::new())
    }
}

fn nothing_materialized() -> EngineError {
    EngineError::InvalidQuery("nothing is materialized here".into())
}

#[async_trait]
impl ResultStorage for NoMaterializations {
    async fn write(&self, _: ProjectId, _: &Query, _: &str) -> Result<domain::Stored, EngineError> {
        Err(nothing_materialized())
    }
    async fn fold(
        &self,
        _: ProjectId,
        _: &Query,
        _: &StoredResult,
        _: &str,
    ) -> Result<domain::Stored, EngineError> {
        Err(nothing_materialized())
    }
    async fn read(
        &self,
        _: ProjectId,
        _: &str,
        _: Vec<(MaterializedFilter, BoundValue)>,
        _: u32,
        _: u64,
    ) -> Result<QueryResult, EngineError> {
        Err(nothing_materialized())
    }
    async fn export(
        &self,
        _: ProjectId,
        _: &str,
        _: Vec<(MaterializedFilter, BoundValue)>,
        _: u32,
        _: u64,
        _: ResultFormat,
    ) -> Result<Export, EngineError> {
        Err(nothing_materialized())
    }
    async fn remove(&self, _: ProjectId, _: &str) -> Result<(), EngineError> {
        Ok(())
    }
    async fn locations(&self) -> Result<Vec<(ProjectId, String)>, EngineError> {
        Ok(Vec::new())
    }
}

fn rows(run: &domain::RunOutcome) -> &str {
    run.run.as_ref().map_or("(no rows)", |r| r.result.rows_json.as_str())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), domain::Error> {
    let store = Arc::new(MemoryStore::default());
    let engine = Arc::new(TinyEngine);
    let cache = Arc::new(MemoryCache::default());
    let clock = Arc::new(SystemClock);
    let executions = Arc::new(ExecutionTracker::new(store.clone()));
    let materializations =
        MaterializationPorts { states: Arc::new(NoMaterializations), results: Arc::new(NoMaterializations) };
    let endpoints = EndpointService::new(EndpointDeps {
        store: store.clone(),
        engine: engine.clone(),
        clock: clock.clone(),
        materializations: materializations.clone(),
        executions: executions.clone(),
        changes: Arc::new(ClearCache(cache.clone())),
    });
    let runs = RunService::new(RunDeps {
        store,
        engine,
        cache,
        clock,
        executions,
        materializations,
        export_limit: RunRequest::DEFAULT_EXPORT_LIMIT,
        cursor_ttl: RunService::DEFAULT_CURSOR_TTL,
        // Each run's record goes to the log; this program keeps none.
        log: Arc::new(NoRunLog),
    });

    let project = ProjectId::new(1)?;
    // Runs are asked for by a caller of the project: a key (a run token would have its grant applied).
    let owner = Principal {
        key_id: Uuid::nil(),
        project_id: project,
        scopes: Scope::ALL.to_vec(),
        grant: None,
        label: Arc::from("embedded"),
    };
    // Who asks, and how: what a run's record would say of it.
    let by = RunBy::now(&owner, Transport::Rest);
    let name = EndpointName::parse("answer")?;
    let created = endpoints
        .create(project, CreateEndpoint::new(name.clone(), Query::sql("SELECT 41 AS n", BTreeMap::new())?))
        .await?;
    println!("created '{}' at version {}", created.name, created.current_version);
    let first = runs.run(by, project, name.clone(), RunRequest::default()).await?;
    println!("run: {}", rows(&first));
    assert_eq!(rows(&first), r#"[{"n":41}]"#);

    // A new query makes version 2; the variable `n` has a default, so a run may leave it out.
    let n = Variable {
        variable_type: VariableType::Integer,
        default: Some(json!(42)),
        required: false,
        description: None,
    };
    let patch = EndpointPatch {
        query: Some(Query::sql("SELECT {variables.n} AS n", BTreeMap::from([("n".to_owned(), n)]))?),
        ..EndpointPatch::default()
    };
    let updated = endpoints.update(project, &name, patch).await?;
    println!("updated to version {}", updated.current_version);
    let second = runs.run(by, project, name.clone(), RunRequest::default()).await?;
    println!("run: {}", rows(&second));
    assert_eq!(rows(&second), r#"[{"n":42}]"#, "the change made the cached answer stale");
    let variables = Map::from_iter([("n".to_owned(), json!(7))]);
    let seven = RunRequest { variables, refresh: Refresh::Direct, ..RunRequest::default() };
    println!("run with n = 7: {}", rows(&runs.run(by, project, name.clone(), seven).await?));
    let old = RunRequest { version: Some(1), ..RunRequest::default() };
    let first_again = runs.run(by, project, name.clone(), old).await?;
    println!("version 1 again: {}", rows(&first_again));
    assert_eq!(rows(&first_again), r#"[{"n":41}]"#);

    let history = endpoints.versions(project, &name, PageRequest::default()).await?;
    for version in &history.items {
        println!("version {}: {}", version.version, version.query.sql);
    }
    let one = endpoints.version(project, &name, VersionNumber::FIRST).await?;
    assert_eq!(one.query.sql, "SELECT 41 AS n");
    let refused = endpoints
        .create(project, CreateEndpoint::new(name.clone(), Query::sql("DELETE everything", BTreeMap::new())?))
        .await;
    println!(
        "a query the engine refuses: {}",
        refused.map(|_| "saved".to_owned()).unwrap_or_else(|e| e.to_string())
    );
    Ok(())
}

/// The page `page` asks for of all the items.
fn paged<T>(items: Vec<T>, page: PageRequest) -> Page<T> {
    let total = items.len() as u64;
    let skip = usize::try_from(page.offset).unwrap_or(usize::MAX);
    let items = items.into_iter().skip(skip).take(page.limit as usize).collect();
    Page { items, total, request: page }
}
