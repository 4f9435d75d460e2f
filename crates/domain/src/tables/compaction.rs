//! The upkeep of tables fed by appends: the tables a process appended to have their small files merged, one
//! compaction of a table at a time across processes (a lease in the store), so that a table fed by a stream of
//! small appends keeps few, full files, sorted by the columns its endpoints filter on (see [`cluster_columns`]);
//! and append keys past their window are forgotten.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tracing::{debug, warn};
use uuid::Uuid;

use super::idempotency::IDEMPOTENCY_WINDOW;
use super::layout::cluster_columns;
use super::model::{Compaction, Findable, TableName};
use super::ports::{AppendKeys, TableAnnouncer, TableLeases, TableStore};
use crate::access::ProjectId;
use crate::clock::{Clock, Timestamp};
use crate::endpoints::{EndpointStore, TableReadersChanged};
use crate::error::{EngineError, Error, StoreError};
use crate::query::{QueryEngine, QueryOutline};

/// What happened to one table a pass looked at.
#[derive(Debug)]
pub enum CompactionOutcome {
    /// Its small files were merged.
    Compacted(Compaction),
    /// It had too few small files to be worth it.
    NothingToDo,
    /// Another process holds its lease (it is compacting it): it stays a candidate.
    Leased,
    Failed(Error),
}

/// How long the columns chosen for a table's layout are reused before its endpoints are planned again, and the
/// least time between two sorts of a table by different columns: an endpoint saved with another filter changes
/// the layout at the next compaction, unless the table was sorted by other columns less than this ago (then at
/// the first compaction after it). A table's files are rewritten for a new layout at most once in this time, so
/// endpoints saved in a loop cannot keep its compaction re-sorting it.
pub const LAYOUT_RECHECK: Duration = Duration::from_secs(300);

/// The most endpoints reading a table that are planned to choose its layout (the first by name): the choice
/// follows the bulk of them, and the cost of choosing stays bounded with thousands.
pub const LAYOUT_READERS: usize = 100;

/// The columns a table's layout was chosen to be, and what bounds the next choice.
#[derive(Debug, Clone)]
struct Chosen {
    /// The columns compactions are given.
    columns: Vec<String>,
    /// When they were chosen: they are reused until [`LAYOUT_RECHECK`] after.
    at: Timestamp,
    /// The last columns the table was sorted by (not empty), and since when.
    sorted: Option<(Vec<String>, Timestamp)>,
    /// Set when other columns were wanted while the table was sorted by `sorted` less than [`LAYOUT_RECHECK`]
    /// ago: when the table is a candidate again and its layout is chosen again.
    held_until: Option<Timestamp>,
    /// The table's readers changed since: chosen again at its next compaction.
    stale: bool,
}

impl Chosen {
    /// The columns to give compactions when `wanted` are wanted at `now`, after the table was last `sorted`
    /// (columns and since when). No columns is always taken (nothing is rewritten for it); other columns than
    /// the table was last sorted by only once [`LAYOUT_RECHECK`] has passed since.
    fn wanted(wanted: Vec<String>, sorted: Option<(Vec<String>, Timestamp)>, now: Timestamp) -> Self {
        let chosen =
            |columns, sorted, held_until| Self { columns, at: now, sorted, held_until, stale: false };
        match sorted {
            _ if wanted.is_empty() => chosen(wanted, sorted, None),
            Some((columns, since)) if columns != wanted && now < since + LAYOUT_RECHECK => {
                chosen(columns.clone(), Some((columns, since)), Some(since + LAYOUT_RECHECK))
            }
            Some((columns, since)) if columns == wanted => chosen(wanted, Some((columns, since)), None),
            _ => chosen(wanted.clone(), Some((wanted, now)), None),
        }
    }

    /// Whether the columns are still to be given without choosing again.
    fn fresh(&self, now: Timestamp) -> bool {
        !self.stale && now < self.at + LAYOUT_RECHECK && self.held_until.is_none_or(|due| now < due)
    }

    /// Whether it still says something a later choice needs.
    fn needed(&self, now: Timestamp) -> bool {
        self.fresh(now)
            || self.held_until.is_some()
            || self.sorted.as_ref().is_some_and(|(_, since)| now < *since + LAYOUT_RECHECK)
    }
}

/// Compacts the tables this process appended to, and forgets expired append keys.
pub struct TableMaintenance {
    tables: Arc<dyn TableStore>,
    leases: Arc<dyn TableLeases>,
    keys: Arc<dyn AppendKeys>,
    announcer: Arc<dyn TableAnnouncer>,
    endpoints: Arc<dyn EndpointStore>,
    engine: Arc<dyn QueryEngine>,
    clock: Arc<dyn Clock>,
    /// How long a lease lasts: longer than a compaction takes, and how long a crashed holder keeps others out.
    lease: Duration,
    /// This process, as the holder of the leases it takes.
    holder: Uuid,
    /// The columns each table's layout was chosen to be.
    layouts: Mutex<HashMap<(ProjectId, TableName), Chosen>>,
    /// Tables whose readers changed since this process last compacted them: candidates, their layout chosen
    /// again.
    reread: Mutex<BTreeSet<(ProjectId, TableName)>>,
}

/// What table upkeep works through.
pub struct MaintenanceDeps {
    pub tables: Arc<dyn TableStore>,
    pub leases: Arc<dyn TableLeases>,
    pub keys: Arc<dyn AppendKeys>,
    /// Tells the other processes of a compaction, so that they read the merged files.
    pub announcer: Arc<dyn TableAnnouncer>,
    /// The endpoints reading a table, whose filters choose its layout.
    pub endpoints: Arc<dyn EndpointStore>,
    /// Plans those endpoints' queries.
    pub engine: Arc<dyn QueryEngine>,
    pub clock: Arc<dyn Clock>,
    /// How long a lease lasts.
    pub lease: Duration,
}

impl TableMaintenance {
    pub fn new(deps: MaintenanceDeps) -> Self {
        let MaintenanceDeps { tables, leases, keys, announcer, endpoints, engine, clock, lease } = deps;
        Self {
            tables,
            leases,
            keys,
            announcer,
            endpoints,
            engine,
            clock,
            lease,
            holder: Uuid::new_v4(),
            layouts: Mutex::default(),
            reread: Mutex::default(),
        }
    }

    /// The tables appended to since this process last compacted them, those whose readers changed, and those
    /// whose new layout was held back and is due.
    pub fn candidates(&self) -> Vec<(ProjectId, TableName)> {
        let now = self.clock.now();
        let mut all: BTreeSet<_> = self.tables.appended().into_iter().collect();
        all.extend(self.reread.lock().unwrap_or_else(PoisonError::into_inner).iter().cloned());
        let layouts = self.layouts.lock().unwrap_or_else(PoisonError::into_inner);
        let due = layouts.iter().filter(|(_, chosen)| chosen.held_until.is_some_and(|due| due <= now));
        all.extend(due.map(|(table, _)| table.clone()));
        all.into_iter().collect()
    }

    /// Compacts one table if its lease is free, its files laid out for the endpoints that read it. A table
    /// looked at for its readers stays a candidate until a compaction under its lease ends without failing: the
    /// lease may be a stopped process's, which holds it until it expires, and the table is not appended to.
    pub async fn compact(&self, project: ProjectId, table: &TableName) -> CompactionOutcome {
        let key = (project, table.clone());
        // Taken first: readers changing during the compaction make it a candidate again.
        let reread = self.reread.lock().unwrap_or_else(PoisonError::into_inner).remove(&key);
        let outcome = self.compact_claimed(project, table).await;
        if reread && matches!(outcome, CompactionOutcome::Leased | CompactionOutcome::Failed(_)) {
            self.reread.lock().unwrap_or_else(PoisonError::into_inner).insert(key);
        }
        outcome
    }

    async fn compact_claimed(&self, project: ProjectId, table: &TableName) -> CompactionOutcome {
        let now = self.clock.now();
        let until = now + self.lease;
        match self.leases.claim(project, table, self.holder, now, until).await {
            Ok(true) => {}
            Ok(false) => return CompactionOutcome::Leased,
            Err(err) => return CompactionOutcome::Failed(err.into()),
        }
        let compacted = self.compact_leased(project, table).await;
        if let Err(err) = self.leases.release(project, table, self.holder).await {
            warn!(%project, %table, error = %err, "could not give a table's lease back; it will expire");
        }
        match compacted {
            Ok(Some(done)) => {
                debug!(%project, %table, ?done, "compacted a table");
                // Not waited for: the rows are the same; a process that has not heard yet reads the files merged.
                if let Err(err) = self.announcer.announce(project, vec![table.clone()], Vec::new()).await {
                    warn!(%project, %table, error = %err, "cannot tell other processes of a compaction");
                }
                CompactionOutcome::Compacted(done)
            }
            Ok(None) => CompactionOutcome::NothingToDo,
            Err(err) => {
                warn!(%project, %table, cause = ?err, "could not compact a table; will retry");
                CompactionOutcome::Failed(err)
            }
        }
    }

    /// Compacts a table whose lease this process holds. The files of appends not answered yet stay as they are,
    /// so that their retries can find them: those pending now, and those committed after the version read
    /// first (their appends may have been claimed after the list was read).
    async fn compact_leased(
        &self,
        project: ProjectId,
        table: &TableName,
    ) -> Result<Option<Compaction>, Error> {
        let Some(after) = self.tables.newest_version(project, table).await? else { return Ok(None) };
        let pending = self.keys.pending(project, table).await?;
        let cluster_by = self.layout(project, table).await?;
        Ok(self.tables.compact(project, table, Findable { pending, after }, cluster_by).await?)
    }

    /// The columns the table is to be sorted by: chosen within [`LAYOUT_RECHECK`] and kept, else chosen again:
    /// the columns set for the table if any, else from the outlines of the endpoints that read it (as
    /// [`Chosen::wanted`] bounds). When the project is too
    /// busy to plan them, the columns its files were last laid out by are kept.
    async fn layout(&self, project: ProjectId, table: &TableName) -> Result<Vec<String>, Error> {
        let now = self.clock.now();
        let key = (project, table.clone());
        let kept = self.layouts.lock().unwrap_or_else(PoisonError::into_inner).get(&key).cloned();
        if let Some(kept) = kept.as_ref().filter(|kept| kept.fresh(now)) {
            return Ok(kept.columns.clone());
        }
        let Some(info) = self.tables.get(project, table).await? else { return Ok(Vec::new()) };
        let wanted = match info.layout.pinned {
            Some(pinned) => pinned,
            None => match self.reader_outlines(project, table).await? {
                Some(outlines) => cluster_columns(&info.columns, &outlines),
                None => info.layout.cluster_by,
            },
        };
        let chosen = Chosen::wanted(wanted, kept.and_then(|kept| kept.sorted), now);
        if chosen.held_until.is_some() {
            debug!(%project, %table, columns = ?chosen.columns, "a table's new layout waits for its recheck");
        }
        let columns = chosen.columns.clone();
        let mut layouts = self.layouts.lock().unwrap_or_else(PoisonError::into_inner);
        layouts.retain(|_, chosen| chosen.needed(now));
        layouts.insert(key, chosen);
        Ok(columns)
    }

    /// The plan outlines of the endpoints whose current version reads the table (at most [`LAYOUT_READERS`]),
    /// each planned as the service plans its own work, waiting for the project's busy slots; `None` when the
    /// project is too busy for them. An endpoint deleted meanwhile, or whose query no longer plans, filters
    /// nothing.
    async fn reader_outlines(
        &self,
        project: ProjectId,
        table: &TableName,
    ) -> Result<Option<Vec<QueryOutline>>, Error> {
        let names = [table.as_str().to_owned()];
        let mut readers = self.endpoints.readers(project, &names).await?;
        readers.retain(|reader| reader.may_read(&names));
        readers.sort_by(|a, b| a.name.cmp(&b.name));
        let mut outlines = Vec::new();
        for reader in readers.into_iter().take(LAYOUT_READERS) {
            let endpoint = match self.endpoints.get(project, &reader.name).await {
                Ok(endpoint) => endpoint,
                Err(StoreError::NotFound) => continue,
                Err(err) => return Err(err.into()),
            };
            match self.engine.describe_queued(project, &endpoint.query).await {
                Ok(described) if described.tables.iter().any(|t| t == table.as_str()) => {
                    outlines.push(described.outline);
                }
                Ok(_) | Err(EngineError::InvalidQuery(_)) => {}
                Err(EngineError::Busy { .. } | EngineError::Timeout(_)) => {
                    debug!(%project, %table, "the project is too busy to plan its endpoints; its layout is kept");
                    return Ok(None);
                }
                Err(err) => return Err(err.into()),
            }
        }
        Ok(Some(outlines))
    }

    /// Makes every table some endpoint reads a candidate of the next pass, and answers how many: how a process
    /// starting looks at the tables written before it (by the CLI, another process, an earlier release), whose
    /// layout nothing it did has asked for yet. A table laid out already costs a look at its log.
    ///
    /// # Errors
    /// Store failures.
    pub async fn look_at_read_tables(&self) -> Result<usize, Error> {
        let read = self.endpoints.read_tables().await?;
        let tables =
            read.into_iter().filter_map(|(project, table)| Some((project, TableName::parse(&table).ok()?)));
        let mut reread = self.reread.lock().unwrap_or_else(PoisonError::into_inner);
        let before = reread.len();
        reread.extend(tables);
        Ok(reread.len() - before)
    }

    /// How long a lease lasts: a compaction running longer renews it ([`TableMaintenance::renew`]) every third.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Extends this process's lease on the table by a lease's length; `false` when another process holds it
    /// (this one's expired meanwhile): the compaction under way is then to be abandoned.
    ///
    /// # Errors
    /// Store failures.
    pub async fn renew(&self, project: ProjectId, table: &TableName) -> Result<bool, Error> {
        let now = self.clock.now();
        Ok(self.leases.claim(project, table, self.holder, now, now + self.lease).await?)
    }

    /// Forgets the append keys past their window; answers how many.
    ///
    /// # Errors
    /// Store failures.
    pub async fn forget_expired_keys(&self) -> Result<u64, Error> {
        Ok(self.keys.sweep(self.clock.now() - IDEMPOTENCY_WINDOW).await?)
    }
}

impl TableReadersChanged for TableMaintenance {
    fn readers_changed(&self, project: ProjectId, tables: &[String]) {
        let tables: Vec<TableName> = tables.iter().filter_map(|t| TableName::parse(t).ok()).collect();
        let mut layouts = self.layouts.lock().unwrap_or_else(PoisonError::into_inner);
        let mut reread = self.reread.lock().unwrap_or_else(PoisonError::into_inner);
        for table in tables {
            if let Some(chosen) = layouts.get_mut(&(project, table.clone())) {
                chosen.stale = true;
            }
            reread.insert((project, table));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoints::MockEndpointStore;
    use crate::error::EngineError;
    use crate::query::{
        ColumnType, CompareOp, MockQueryEngine, QueryDescription, VariablePredicate, VariableType,
    };
    use crate::tables::{MockAppendKeys, MockTableAnnouncer, MockTableLeases, MockTableStore, TableInfo};
    use crate::testing::{endpoint, project, query, table_info, ManualClock, T0};
    use crate::TableReader;

    /// A service whose compactions announce nothing (`announcer` expects nothing).
    fn service(tables: MockTableStore, leases: MockTableLeases) -> TableMaintenance {
        announcing(tables, leases, MockTableAnnouncer::new())
    }

    /// A service over a table no endpoint reads.
    fn announcing(
        mut tables: MockTableStore,
        leases: MockTableLeases,
        announcer: MockTableAnnouncer,
    ) -> TableMaintenance {
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_readers().returning(|_, _| Ok(Vec::new()));
        with_readers(tables, leases, announcer, (endpoints, MockQueryEngine::new()), Arc::default())
    }

    /// A service whose endpoints' queries are never planned, announcing nothing, on a clock stopped at `T0`.
    fn planning_nothing(
        tables: MockTableStore,
        leases: MockTableLeases,
        endpoints: MockEndpointStore,
    ) -> TableMaintenance {
        with_readers(
            tables,
            leases,
            MockTableAnnouncer::new(),
            (endpoints, MockQueryEngine::new()),
            Arc::default(),
        )
    }

    fn with_readers(
        mut tables: MockTableStore,
        leases: MockTableLeases,
        announcer: MockTableAnnouncer,
        (endpoints, engine): (MockEndpointStore, MockQueryEngine),
        clock: Arc<ManualClock>,
    ) -> TableMaintenance {
        tables.expect_newest_version().returning(|_, _| Ok(Some(5)));
        let pending = uuid::Uuid::from_u128(7);
        let mut keys = MockAppendKeys::new();
        keys.expect_pending().returning(move |_, _| Ok(vec![pending]));
        keys.expect_sweep().withf(|expired| *expired == T0 - IDEMPOTENCY_WINDOW).returning(|_| Ok(3));
        TableMaintenance::new(MaintenanceDeps {
            tables: Arc::new(tables),
            leases: Arc::new(leases),
            keys: Arc::new(keys),
            announcer: Arc::new(announcer),
            endpoints: Arc::new(endpoints),
            engine: Arc::new(engine),
            clock,
            lease: Duration::from_secs(60),
        })
    }

    impl Default for ManualClock {
        fn default() -> Self {
            ManualClock::new(T0)
        }
    }

    /// `events` with columns `user_id` and `ts`.
    fn info() -> TableInfo {
        table_info("events", &[("user_id", ColumnType::String), ("ts", ColumnType::Datetime)])
    }

    fn events() -> TableName {
        TableName::parse("events").unwrap()
    }

    #[tokio::test]
    async fn a_table_is_compacted_under_its_lease_which_is_then_given_back() {
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(|| vec![(project(1), events())]);
        let done = Compaction { files_before: 40, files_after: 1, files_merged: 40, rows_merged: 200 };
        tables
            .expect_compact()
            .withf(|_, _, keep, cluster_by| {
                // The version was read before the pending appends: what was committed after it is kept too.
                *keep == Findable { pending: vec![uuid::Uuid::from_u128(7)], after: 5 }
                    && cluster_by.is_empty()
            })
            .times(1)
            .returning(move |_, _, _, _| Ok(Some(done)));
        let mut leases = MockTableLeases::new();
        leases
            .expect_claim()
            .withf(|project_id, table, _, now, until| {
                *project_id == project(1)
                    && table.as_str() == "events"
                    && *now == T0
                    && *until == T0 + Duration::from_secs(60)
            })
            .times(1)
            .returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(1).returning(|_, _, _| Ok(()));
        // Other processes are told, so that they read the merged files.
        let mut announcer = MockTableAnnouncer::new();
        announcer
            .expect_announce()
            .withf(|p, tables, readers| *p == project(1) && *tables == vec![events()] && readers.is_empty())
            .times(1)
            .returning(|_, _, _| Ok(()));
        let service = announcing(tables, leases, announcer);
        assert_eq!(service.candidates(), vec![(project(1), events())]);
        let outcome = service.compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Compacted(d) if d == done));
        assert_eq!(service.forget_expired_keys().await.unwrap(), 3);
    }

    #[tokio::test]
    async fn a_renewal_extends_the_compactions_own_lease_and_says_when_another_took_it() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().returning(|_, _, _, _| Ok(None));
        let holders = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = Arc::clone(&holders);
        let mut leases = MockTableLeases::new();
        leases
            .expect_claim()
            .withf(|_, table, _, now, until| {
                table.as_str() == "events" && *now == T0 && *until == T0 + Duration::from_secs(60)
            })
            .times(3)
            .returning(move |_, _, holder, _, _| {
                let mut holders = seen.lock().unwrap();
                holders.push(holder);
                // The third claim finds the lease taken by another process.
                Ok(holders.len() < 3)
            });
        leases.expect_release().returning(|_, _, _| Ok(()));
        let service = service(tables, leases);
        assert!(matches!(service.compact(project(1), &events()).await, CompactionOutcome::NothingToDo));
        assert!(service.renew(project(1), &events()).await.unwrap());
        assert!(!service.renew(project(1), &events()).await.unwrap());
        let holders = holders.lock().unwrap();
        assert!(holders.iter().all(|h| *h == holders[0]), "renewed as the holder that claimed it");
        assert_eq!(service.lease(), Duration::from_secs(60));
    }

    #[tokio::test]
    async fn a_table_leased_elsewhere_is_left_alone() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().never();
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(false));
        leases.expect_release().never();
        let outcome = service(tables, leases).compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Leased));
    }

    #[tokio::test]
    async fn a_failed_compaction_gives_its_lease_back_and_says_why() {
        let mut tables = MockTableStore::new();
        tables.expect_compact().returning(|_, _, _, _| Err(EngineError::Unavailable("disk gone".into())));
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(1).returning(|_, _, _| Ok(()));
        let outcome = service(tables, leases).compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Failed(Error::Unavailable(_))));
    }

    /// The endpoints reading `events`: each query's text is its name, and `engine` plans it with the filters
    /// `filters` gives that name (a query filtering nothing plans with no predicate).
    fn readers(
        names: &'static [&'static str],
        filters: impl Fn(&str) -> Vec<(&'static str, CompareOp)> + Send + Sync + 'static,
    ) -> (MockEndpointStore, MockQueryEngine, Arc<std::sync::atomic::AtomicUsize>) {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_readers().returning(move |_, tables| {
            assert_eq!(tables, ["events".to_owned()]);
            let all = names.iter().map(|name| TableReader {
                tables: Some(vec!["events".into()]),
                ..TableReader::of(&endpoint(
                    name,
                    query(serde_json::json!({"kind": "SQLQuery", "query": name})),
                ))
            });
            Ok(all.collect())
        });
        endpoints.expect_get().returning(|_, name| {
            Ok(endpoint(
                name.as_str(),
                query(serde_json::json!({"kind": "SQLQuery", "query": name.as_str()})),
            ))
        });
        let planned = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&planned);
        let mut engine = MockQueryEngine::new();
        engine.expect_describe_queued().returning(move |_, query| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let predicates = filters(&query.sql)
                .into_iter()
                .map(|(column, op)| VariablePredicate {
                    variable: "v".into(),
                    variable_type: VariableType::String,
                    op,
                    column: format!("events.{column}"),
                    column_type: ColumnType::String,
                    output_column: None,
                    group_key: None,
                })
                .collect();
            let outline = QueryOutline { predicates, ..QueryOutline::default() };
            Ok(QueryDescription { columns: Vec::new(), outline, tables: vec!["events".into()] })
        });
        (endpoints, engine, planned)
    }

    /// A compaction's layout is chosen from the filters of the endpoints reading the table, kept for
    /// [`LAYOUT_RECHECK`], and chosen again after it, when an endpoint filtering another column has come.
    #[tokio::test]
    async fn the_layout_follows_the_endpoints_filters_and_is_chosen_again_after_a_while() {
        let (endpoints, engine, planned) = readers(&["by_user", "by_day"], |name| match name {
            "by_user" => vec![("user_id", CompareOp::Eq)],
            "by_day" => vec![("ts", CompareOp::GtEq), ("ts", CompareOp::Lt)],
            _ => Vec::new(),
        });
        let mut tables = MockTableStore::new();
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        tables.expect_compact().returning(move |_, _, _, cluster_by| {
            seen.lock().unwrap().push(cluster_by);
            Ok(None)
        });
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().returning(|_, _, _| Ok(()));
        let clock = Arc::new(ManualClock::new(T0));
        let service =
            with_readers(tables, leases, MockTableAnnouncer::new(), (endpoints, engine), Arc::clone(&clock));
        service.compact(project(1), &events()).await;
        // Within the recheck, the choice is kept: nobody is planned again.
        clock.advance(LAYOUT_RECHECK - Duration::from_secs(1));
        service.compact(project(1), &events()).await;
        assert_eq!(planned.load(std::sync::atomic::Ordering::SeqCst), 2);
        clock.advance(Duration::from_secs(1));
        service.compact(project(1), &events()).await;
        assert_eq!(planned.load(std::sync::atomic::Ordering::SeqCst), 4);
        // One endpoint each, a tie: the equality first.
        let asked = asked.lock().unwrap();
        assert_eq!(*asked, vec![vec!["user_id".to_owned(), "ts".to_owned()]; 3]);
    }

    #[tokio::test]
    async fn a_layout_that_cannot_be_chosen_fails_the_compaction_which_gives_its_lease_back() {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_readers().returning(|_, _| Err(StoreError::Unavailable("database gone".into())));
        let mut tables = MockTableStore::new();
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        tables.expect_compact().never();
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(1).returning(|_, _, _| Ok(()));
        let service = planning_nothing(tables, leases, endpoints);
        let outcome = service.compact(project(1), &events()).await;
        assert!(matches!(outcome, CompactionOutcome::Failed(Error::Unavailable(_))));
    }

    #[tokio::test]
    async fn endpoints_that_no_longer_plan_or_are_gone_filter_nothing() {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_readers().returning(|_, _| {
            let reader = |name| TableReader {
                tables: None,
                ..TableReader::of(&endpoint(
                    name,
                    query(serde_json::json!({"kind": "SQLQuery", "query": name})),
                ))
            };
            Ok(vec![reader("gone"), reader("broken")])
        });
        endpoints.expect_get().returning(|_, name| match name.as_str() {
            "gone" => Err(StoreError::NotFound),
            other => Ok(endpoint(other, query(serde_json::json!({"kind": "SQLQuery", "query": other})))),
        });
        let mut engine = MockQueryEngine::new();
        engine.expect_describe_queued().returning(|_, _| Err(EngineError::InvalidQuery("no column".into())));
        let mut tables = MockTableStore::new();
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        tables
            .expect_compact()
            .withf(|_, _, _, cluster_by| cluster_by.is_empty())
            .times(1)
            .returning(|_, _, _, _| Ok(None));
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().returning(|_, _, _| Ok(()));
        let service =
            with_readers(tables, leases, MockTableAnnouncer::new(), (endpoints, engine), Arc::default());
        assert!(matches!(service.compact(project(1), &events()).await, CompactionOutcome::NothingToDo));
    }

    /// The columns each compaction of `service` is given, recorded by its store.
    fn recording_compactions(mut tables: MockTableStore) -> (MockTableStore, Arc<Mutex<Vec<Vec<String>>>>) {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        tables.expect_compact().returning(move |_, _, _, cluster_by| {
            seen.lock().unwrap().push(cluster_by);
            Ok(None)
        });
        (tables, asked)
    }

    /// A service compacting `events` (`info()` as `edit` leaves it) under free leases, and the columns each
    /// compaction is given.
    fn compacting(
        edit: fn(&mut TableInfo),
        readers: (MockEndpointStore, MockQueryEngine),
    ) -> (TableMaintenance, Arc<Mutex<Vec<Vec<String>>>>) {
        let mut tables = MockTableStore::new();
        tables.expect_get().returning(move |_, _| {
            let mut table = info();
            edit(&mut table);
            Ok(Some(table))
        });
        let (tables, asked) = recording_compactions(tables);
        (with_readers(tables, free_leases(), MockTableAnnouncer::new(), readers, Arc::default()), asked)
    }

    fn free_leases() -> MockTableLeases {
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().returning(|_, _, _| Ok(()));
        leases
    }

    /// Endpoints saved in a loop, each filtering another column, cannot keep a table's compaction re-sorting its
    /// files: once sorted, the table is sorted by other columns only [`LAYOUT_RECHECK`] later, when it is a
    /// candidate again by itself. Dropping the layout, or coming back to the columns it is sorted by, rewrites
    /// nothing and is taken at once.
    #[tokio::test]
    async fn a_table_is_sorted_by_other_columns_at_most_once_per_recheck() {
        let filtered = Arc::new(Mutex::new(Some("user_id")));
        let current = Arc::clone(&filtered);
        let (endpoints, engine, _) = readers(&["reader"], move |_| {
            current.lock().unwrap().map(|column| vec![(column, CompareOp::Eq)]).unwrap_or_default()
        });
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(Vec::new);
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        let (tables, asked) = recording_compactions(tables);
        let clock = Arc::new(ManualClock::new(T0));
        let service = with_readers(
            tables,
            free_leases(),
            MockTableAnnouncer::new(),
            (endpoints, engine),
            Arc::clone(&clock),
        );
        let save = |column| {
            *filtered.lock().unwrap() = column;
            service.readers_changed(project(1), &["events".to_owned()]);
        };
        let last = || asked.lock().unwrap().last().cloned().unwrap();
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["user_id"]);

        clock.advance(Duration::from_secs(10));
        save(Some("ts"));
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["user_id"], "held: sorted by user_id 10 s ago");
        save(None);
        service.compact(project(1), &events()).await;
        assert!(last().is_empty(), "no columns rewrite nothing");
        save(Some("user_id"));
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["user_id"], "the columns its files are sorted by");
        save(Some("ts"));
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["user_id"]);

        // The held choice is due when the recheck has passed since the table was sorted, not before.
        clock.advance(LAYOUT_RECHECK - Duration::from_secs(11));
        assert!(service.candidates().is_empty());
        clock.advance(Duration::from_secs(1));
        assert_eq!(service.candidates(), vec![(project(1), events())]);
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["ts"]);
        assert!(service.candidates().is_empty(), "taken by its compaction");
        save(Some("user_id"));
        service.compact(project(1), &events()).await;
        assert_eq!(last(), ["ts"], "held again: sorted by ts just now");
    }

    /// A process starting looks at every table endpoints read (a name that is not a table's is not).
    #[tokio::test]
    async fn a_starting_process_looks_at_every_table_endpoints_read() {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_read_tables().times(1).returning(|| {
            Ok(vec![
                (project(1), "events".into()),
                (project(2), "events".into()),
                (project(2), "not a table".into()),
            ])
        });
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(|| vec![(project(1), events())]);
        let service = planning_nothing(tables, MockTableLeases::new(), endpoints);
        assert_eq!(service.look_at_read_tables().await.unwrap(), 2);
        assert_eq!(service.candidates(), vec![(project(1), events()), (project(2), events())]);
    }

    /// A table looked at for its readers whose lease another process holds (one stopped while compacting it
    /// holds it until it expires), or whose compaction fails, is looked at again at the next pass, though
    /// nothing appends to it; one compacted is not.
    #[tokio::test]
    async fn a_table_looked_at_stays_a_candidate_until_a_compaction_under_its_lease_ends() {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_read_tables().times(1).returning(|| Ok(vec![(project(1), "events".into())]));
        endpoints.expect_readers().returning(|_, _| Ok(Vec::new()));
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(Vec::new);
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        let mut compactions = mockall::Sequence::new();
        tables
            .expect_compact()
            .times(1)
            .in_sequence(&mut compactions)
            .returning(|_, _, _, _| Err(EngineError::Unavailable("disk gone".into())));
        tables.expect_compact().times(1).in_sequence(&mut compactions).returning(|_, _, _, _| Ok(None));
        let mut leases = MockTableLeases::new();
        let mut claims = mockall::Sequence::new();
        leases.expect_claim().times(1).in_sequence(&mut claims).returning(|_, _, _, _, _| Ok(false));
        leases.expect_claim().times(2).in_sequence(&mut claims).returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().times(2).returning(|_, _, _| Ok(()));
        let service = planning_nothing(tables, leases, endpoints);
        service.look_at_read_tables().await.unwrap();
        let events = vec![(project(1), events())];
        assert!(matches!(service.compact(project(1), &events[0].1).await, CompactionOutcome::Leased));
        assert_eq!(service.candidates(), events, "still a candidate once the lease is free");
        assert!(matches!(service.compact(project(1), &events[0].1).await, CompactionOutcome::Failed(_)));
        assert_eq!(service.candidates(), events, "still a candidate after a failure");
        assert!(matches!(service.compact(project(1), &events[0].1).await, CompactionOutcome::NothingToDo));
        assert!(service.candidates().is_empty(), "looked at");
    }

    /// Columns set for a table take the place of its endpoints' choice: nobody is planned.
    #[tokio::test]
    async fn a_table_with_columns_set_is_sorted_by_them_whatever_its_endpoints_filter() {
        let (endpoints, engine, planned) = readers(&["by_user"], |_| vec![("user_id", CompareOp::Eq)]);
        let (service, asked) =
            compacting(|table| table.layout.pinned = Some(vec!["ts".into()]), (endpoints, engine));
        service.compact(project(1), &events()).await;
        assert_eq!(*asked.lock().unwrap(), vec![vec!["ts".to_owned()]]);
        assert_eq!(planned.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    /// A project too busy to plan its endpoints does not fail its tables' compactions: they keep the columns
    /// their files were last laid out by.
    #[tokio::test]
    async fn a_busy_project_keeps_its_tables_recorded_layout() {
        let mut endpoints = MockEndpointStore::new();
        endpoints.expect_readers().returning(|_, _| {
            Ok(vec![TableReader {
                tables: Some(vec!["events".into()]),
                ..TableReader::of(&endpoint(
                    "reader",
                    query(serde_json::json!({"kind": "SQLQuery", "query": "reader"})),
                ))
            }])
        });
        endpoints.expect_get().returning(|_, name| {
            Ok(endpoint(name.as_str(), query(serde_json::json!({"kind": "SQLQuery", "query": "reader"}))))
        });
        let mut engine = MockQueryEngine::new();
        engine
            .expect_describe_queued()
            .times(1)
            .returning(|_, _| Err(EngineError::Busy { retry_after: Duration::from_secs(1) }));
        let (service, asked) =
            compacting(|table| table.layout.cluster_by = vec!["ts".into()], (endpoints, engine));
        assert!(matches!(service.compact(project(1), &events()).await, CompactionOutcome::NothingToDo));
        assert_eq!(*asked.lock().unwrap(), vec![vec!["ts".to_owned()]]);
    }

    /// An endpoint saved with a version reading the table makes it a candidate at once, its layout chosen
    /// again without waiting for [`LAYOUT_RECHECK`]; the candidate is taken by its compaction.
    #[tokio::test]
    async fn a_saved_reader_makes_the_table_a_candidate_whose_layout_is_chosen_again() {
        let (endpoints, engine, planned) = readers(&["by_user"], |_| vec![("user_id", CompareOp::Eq)]);
        let mut tables = MockTableStore::new();
        tables.expect_appended().returning(Vec::new);
        tables.expect_get().returning(|_, _| Ok(Some(info())));
        tables.expect_compact().returning(|_, _, _, _| Ok(None));
        let mut leases = MockTableLeases::new();
        leases.expect_claim().returning(|_, _, _, _, _| Ok(true));
        leases.expect_release().returning(|_, _, _| Ok(()));
        let service =
            with_readers(tables, leases, MockTableAnnouncer::new(), (endpoints, engine), Arc::default());
        assert!(service.candidates().is_empty());
        service.compact(project(1), &events()).await;
        assert_eq!(planned.load(std::sync::atomic::Ordering::SeqCst), 1);

        service.readers_changed(project(1), &["events".to_owned(), "not a table".to_owned()]);
        assert_eq!(service.candidates(), vec![(project(1), events())]);
        service.compact(project(1), &events()).await;
        assert_eq!(planned.load(std::sync::atomic::Ordering::SeqCst), 2, "planned again at once");
        assert!(service.candidates().is_empty(), "taken by its compaction");
    }
}
