//! A project's tables as Delta Lake tables, through delta-rs (`deltalake`).
//!
//! A table is a Delta table at its prefix of the storage (`projects/{id}/tables/{name}/`, holding `_delta_log/`
//! beside its Parquet files), so any Delta reader given read access to the storage reads exactly the files a
//! run reads. Every write is one commit of the log, written with the storage's own put-if-absent (an atomic
//! create on a local disk, `If-None-Match` on S3): two writers on two nodes never lose each other's commit.
//!
//! - An append ([`DeltaTables::append`]), or a group of appends written together, adds its files. Appends never
//!   conflict with each other or with a compaction; one that a replace with other columns overtook is refused
//!   ([`CommitError::Replaced`]) and is written again by its caller, to the table as it is now.
//! - A replace ([`DeltaTables::replace`]) removes exactly the files of the version it read and adds its own, with
//!   the new columns. When any commit landed after that read it reads the table again and removes those too, so
//!   a replace never leaves a row of the table it replaced.
//! - A compaction ([`DeltaTables::rewrite`]) removes the small files it merged and adds the merged ones without
//!   changing the data (`dataChange: false`, an `OPTIMIZE` commit); it is refused when a replace took its files.
//!
//! Each process keeps every table's snapshot ([`Snapshot`]) and moves it forward only when the log has a newer
//! commit. A read costs one existence check of the next commit's file, unless the process hears every table
//! write of every process ([`DeltaTables::hearing`], [`DeltaTables::written`]): then a snapshot checked since the
//! table's last announced write is read as it is, and the log is not asked at all.

mod changes;
mod external;
mod log;
mod snapshot;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::Schema;
use deltalake::kernel::engine::arrow_conversion::TryIntoKernel as _;
use deltalake::kernel::transaction::{
    CommitBuilder, CommitData, CommitProperties, TableReference, TransactionError,
};
use deltalake::kernel::{Action, Add, Remove, StructType};
use deltalake::logstore::{default_logstore, CommitOrBytes, LogStoreRef, StorageConfig};
pub use deltalake::operations::vacuum::Clock;
use deltalake::protocol::checkpoints::{cleanup_expired_logs_for, create_checkpoint};
use deltalake::protocol::{DeltaOperation, SaveMode};
use deltalake::table::state::DeltaTableState;
use deltalake::{DeltaTable, DeltaTableError};
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use url::Url;

pub use changes::{Changes, Commit};
pub use external::ExternalTable;
pub use snapshot::{DataFile, Snapshot};

/// Why a table could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// There is no table at the prefix (an append's, or a compaction's).
    #[error("there is no table at {0}")]
    NoTable(String),
    /// A replace with other columns landed first: the files written for the old columns are not added.
    #[error("table {0} was replaced while rows were added to it")]
    Replaced(String),
    /// The files a compaction merged are no longer the table's (a replace took them).
    #[error("table {0} changed while it was compacted")]
    Conflict(String),
    /// Another append claiming the same names ([`Claim`]) landed first: nothing was added.
    #[error("table {table}: another append of {names:?} landed first")]
    Claimed { table: String, names: Vec<String> },
    /// The version asked for is not in the table's log: never made, or cleaned up after the retention.
    #[error("table {table} has no version {version} in its log")]
    NoVersion { table: String, version: u64 },
    /// The columns cannot be a Delta table's (a type the protocol has no counterpart for, such as a decimal of
    /// more than 38 digits).
    #[error("table {table}: {reason}")]
    Columns { table: String, reason: String },
    /// The storage or the log could not be read or written.
    #[error("table {table}: {source}")]
    Storage { table: String, source: Box<dyn std::error::Error + Send + Sync> },
}

impl CommitError {
    fn storage(table: &ObjectPath, source: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> Self {
        Self::Storage { table: table.to_string(), source: source.into() }
    }
}

/// A Parquet file written under a table's prefix, to be added by a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFile {
    /// Its location from the storage's root, under the table's prefix.
    pub location: ObjectPath,
    pub size: u64,
    pub rows: u64,
    /// When it was written, in milliseconds since the Unix epoch.
    pub modified_ms: i64,
}

/// An append's claim on a name (its `Idempotency-Key`), made while the table was at version `after` or later:
/// of the appends that claim one name after a version, at most one commits ([`DeltaTables::append`]). An
/// append that took over the name of another whose writer went silent is thus never followed by the rows of
/// that writer, should it wake up, and the other way round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    pub after: u64,
}

/// The application metadata key of a commit's claimed names (see [`Claim`]): a commit's, not its files', so
/// that the table's checkpoints do not grow with them.
const CLAIMS: &str = "endpoints.claims";

/// The table property saying how the table's files are laid out (the columns they are sorted by, as its
/// writer states them): a change of it alone changes no row.
pub const LAYOUT: &str = "endpoints.clusterBy";

/// The table property naming the columns its files are to be sorted by, set by its owner in place of those its
/// writer would choose: a change of it alone changes no row either.
pub const LAYOUT_PINNED: &str = "endpoints.clusterByPinned";

/// The properties about the order of a table's files, not its rows.
pub const LAYOUT_PROPERTIES: [&str; 2] = [LAYOUT, LAYOUT_PINNED];

/// How many times a replace reads the table again when other commits keep landing before its own.
const REPLACE_ATTEMPTS: usize = 64;

/// How many times an append or a compaction follows other commits landing before its own.
const COMMIT_ATTEMPTS: usize = 64;

/// Every how many commits a checkpoint is written (Delta's default `delta.checkpointInterval`); also the most
/// commits a snapshot follows one by one before the log is read from its newest checkpoint instead.
const CHECKPOINT_INTERVAL: u64 = 100;

/// How many tables a process keeps before it forgets those not read within [`RECHECK_AFTER`].
const KEPT_TABLES: usize = 1024;

/// How long a snapshot known to be the table's newest is followed by existence checks of the next commit;
/// after that the table is read from its log afresh.
const RECHECK_AFTER: Duration = Duration::from_secs(3600);

/// How long a snapshot checked against the log is read without a check while the process hears every write:
/// also how long a write whose announcement was lost (its writer could not reach the database) may go unseen.
const TRUST_FOR: Duration = Duration::from_secs(60);

/// How long after the last news that every write is heard ([`DeltaTables::hearing`], each second) it is still
/// relied on: shorter than the 2 s a writer waits for a silent process before answering without it, so that a
/// process whose channel stalled checks the log again before such a write is answered.
const HEARD_WITHIN: Duration = Duration::from_millis(1500);

/// The application metadata key of a commit's row counts (for the table's versions).
pub(crate) const ROWS_ADDED: &str = "endpoints.rowsAdded";
pub(crate) const ROWS_REMOVED: &str = "endpoints.rowsRemoved";

/// The project tables of one storage, as Delta tables, with the snapshot of each kept per process.
#[derive(Debug)]
pub struct DeltaTables {
    /// The storage's objects from its root (`root`): where the engine reads and writes.
    store: Arc<dyn ObjectStore>,
    /// The objects addressed by the path of their URL (a local disk's `/`, an S3 bucket): how the Delta
    /// kernel reads the log it is given by URL.
    url_store: Arc<dyn ObjectStore>,
    /// The storage root's URL, ending in `/`.
    root: Url,
    kept: Mutex<HashMap<ObjectPath, Arc<Kept>>>,
    hearing: Hearing,
    /// How reads found their tables' versions, and the family's two counters (taken once: a read only adds).
    reads: Family<ReadSource, Counter>,
    kept_reads: Counter,
    checked_reads: Counter,
    /// What time it is for commits (a removed file's deletion time) and the vacuum's cutoff: its owner's clock.
    clock: Arc<dyn Clock>,
}

/// How a read found a table's newest version: `kept` from what this process hears (the storage not asked), or
/// `checked` against the table's log.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReadSource {
    version: &'static str,
}

/// Whether this process hears every table write of every process before that write is answered. Read on every
/// table read, so without a lock.
#[derive(Debug)]
struct Hearing {
    /// What [`Hearing::until`] counts from.
    origin: Instant,
    /// Until when the last news that every write is heard holds ([`HEARD_WITHIN`] after it came), in nanoseconds
    /// from `origin`; 0 since it was told announcements may have been missed.
    until: AtomicU64,
    /// Counts the times announcements may have been missed: a check made before the last time is not relied on.
    epoch: AtomicU64,
}

impl Default for Hearing {
    fn default() -> Self {
        Self { origin: Instant::now(), until: AtomicU64::new(0), epoch: AtomicU64::new(0) }
    }
}

impl Hearing {
    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_nanos()).unwrap_or(u64::MAX)
    }

    fn heard(&self) {
        let until = self.nanos(Instant::now() + HEARD_WITHIN);
        // The first news after a gap starts a new epoch: a check made during the gap is not relied on (a writer
        // may have answered without waiting for this process then: its heartbeat was stale, or it was reconnecting).
        if self.until.swap(until, Ordering::AcqRel) == 0 {
            self.epoch.fetch_add(1, Ordering::AcqRel);
        }
    }

    fn missed(&self) {
        // The epoch first: a read that still finds the news sees the check it relies on outdated.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.until.store(0, Ordering::Release);
    }

    /// Whether the news that every write is heard came within [`HEARD_WITHIN`].
    fn hears(&self) -> bool {
        self.nanos(Instant::now()) < self.until.load(Ordering::Acquire)
    }
}

/// What was heard when a table's snapshot was checked: relied on while nothing more is heard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Heard {
    epoch: u64,
    /// The table's announced writes.
    writes: u64,
}

/// A table's newest snapshot read or made.
#[derive(Debug)]
struct Known {
    snapshot: Arc<Snapshot>,
    /// When it was last known to be the newest.
    at: Instant,
    /// What was heard before it was known to be (see [`DeltaTables::trusted`]).
    heard: Heard,
}

/// One table as this process keeps it.
#[derive(Debug)]
struct Kept {
    log: LogStoreRef,
    /// The table's state as delta-rs reads it (its files, from the log), on which replaces and compactions are
    /// committed; moved forward under this lock by reading the commits after it (appends do not move it: they
    /// keep `snapshot` instead), or to the state a replace or compaction of this process left.
    state: tokio::sync::Mutex<Option<DeltaTableState>>,
    /// Taken by an append or a compaction for its commit.
    appending: tokio::sync::Mutex<()>,
    /// Its newest snapshot read or made.
    snapshot: Mutex<Option<Known>>,
    /// Its writes announced to this process.
    writes: AtomicU64,
    /// What its newest commits did, as this process made or followed them.
    recent: Mutex<changes::Recent>,
}

/// Why a commit did not land.
enum Failed {
    /// Another commit landed first and this one is not to be made on top of it (or the retries ran out).
    Conflict,
    Error(CommitError),
}

impl Kept {
    fn recent(&self) -> std::sync::MutexGuard<'_, changes::Recent> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Commits onto the state `guard` keeps (none: the table's first commit), and keeps the state it leaves.
    async fn commit(
        &self,
        table: &ObjectPath,
        guard: &mut Option<DeltaTableState>,
        builder: CommitBuilder,
        operation: DeltaOperation,
        heard: Heard,
    ) -> Result<u64, Failed> {
        let read = guard.as_ref().map(|state| state as &dyn TableReference);
        match builder.build(read, Arc::clone(&self.log), operation).await {
            Ok(done) => {
                let version = done.version();
                self.adopt(table, guard, done.snapshot, heard).map_err(Failed::Error)?;
                Ok(version)
            }
            Err(DeltaTableError::Transaction {
                source:
                    TransactionError::CommitConflict(_)
                    | TransactionError::VersionAlreadyExists(_)
                    | TransactionError::MaxCommitAttempts(_),
            }) => Err(Failed::Conflict),
            Err(err) => Err(Failed::Error(CommitError::storage(table, err))),
        }
    }

    /// The newest snapshot this process read or made.
    fn newest(&self) -> Option<Arc<Snapshot>> {
        self.known(|_| true)
    }

    /// The newest snapshot, when it was known to be the newest within [`RECHECK_AFTER`]: only then is the
    /// commit after it sure to be in the log if it was made (the log's clean-up removes commits older than the
    /// table's retention, days). Then the table is read afresh from the log.
    fn checked_newest(&self) -> Option<Arc<Snapshot>> {
        self.known(|known| known.at.elapsed() < RECHECK_AFTER)
    }

    fn known(&self, usable: impl Fn(&Known) -> bool) -> Option<Arc<Snapshot>> {
        let kept = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        kept.as_ref().filter(|known| usable(known)).map(|known| Arc::clone(&known.snapshot))
    }

    /// Keeps `snapshot` when it is newer than the one kept, as known to be the newest now, by a check that began
    /// after `heard`; answers the newest.
    fn advance(&self, snapshot: Arc<Snapshot>, heard: Heard) -> Arc<Snapshot> {
        let mut kept = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        let (newest, heard) = match kept.as_ref() {
            // Known since a later check: its news hold for this one too (both counters only grow).
            Some(known) if known.snapshot.version >= snapshot.version => {
                (Arc::clone(&known.snapshot), known.heard.max(heard))
            }
            Some(known) => (snapshot, known.heard.max(heard)),
            None => (snapshot, heard),
        };
        *kept = Some(Known { snapshot: Arc::clone(&newest), at: Instant::now(), heard });
        newest
    }

    /// Takes the state a commit of this process left (the log is not read again for it), made after `heard`.
    fn adopt(
        &self,
        table: &ObjectPath,
        state: &mut Option<DeltaTableState>,
        done: DeltaTableState,
        heard: Heard,
    ) -> Result<(), CommitError> {
        let fresh = Arc::new(Snapshot::of(table, &done).map_err(|e| CommitError::storage(table, e))?);
        // A replace, a compaction or a change of properties: not followed step by step.
        self.recent().forget();
        *state = Some(done);
        self.advance(fresh, heard);
        Ok(())
    }
}

impl DeltaTables {
    /// The tables under `root`: `store` addresses objects from the root, `url_store` by their URL's path; their
    /// commits and vacuums are timed by `clock` (its owner's, so that its tests set the time).
    pub fn new(
        store: Arc<dyn ObjectStore>,
        url_store: Arc<dyn ObjectStore>,
        root: Url,
        clock: Arc<dyn Clock>,
    ) -> Self {
        let reads = Family::<ReadSource, Counter>::default();
        let counter = |version| reads.get_or_create(&ReadSource { version }).clone();
        let (kept_reads, checked_reads) = (counter("kept"), counter("checked"));
        Self {
            store,
            url_store,
            root,
            kept: Mutex::default(),
            hearing: Hearing::default(),
            reads,
            kept_reads,
            checked_reads,
            clock,
        }
    }

    /// The same tables with nothing kept yet, their commits and vacuums timed by `clock`.
    #[must_use]
    pub fn timed_by(&self, clock: Arc<dyn Clock>) -> Self {
        Self::new(Arc::clone(&self.store), Arc::clone(&self.url_store), self.root.clone(), clock)
    }

    fn now_ms(&self) -> i64 {
        self.clock.current_timestamp_millis()
    }

    /// Exposes how reads found their tables' versions in `registry`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "table_version_reads",
            "Reads of a table's newest version: kept (known from the writes this process hears, the storage not \
             asked) or checked against the table's log",
            self.reads.clone(),
        );
    }

    /// How many reads found their version kept, and how many checked it against the log.
    pub fn reads(&self) -> (u64, u64) {
        (self.kept_reads.get(), self.checked_reads.get())
    }

    /// Whether this process hears every table write of every process before the write is answered (`true`, told
    /// again each second while it does), or may have missed some (`false`). While it hears them, a table's
    /// snapshot checked since its last announced write ([`DeltaTables::written`]) is read without asking the log.
    pub fn hearing(&self, heard: bool) {
        if heard {
            self.hearing.heard();
        } else {
            self.hearing.missed();
        }
    }

    /// Some process wrote the table: the log is asked at its next read.
    pub fn written(&self, table: &ObjectPath) {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        // A table not kept is read from its log anyway.
        if let Some(kept) = kept.get(table) {
            kept.writes.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// What is heard now of the table: taken before a check of its log, and kept with what the check found.
    fn heard(&self, kept: &Kept) -> Heard {
        Heard {
            epoch: self.hearing.epoch.load(Ordering::Acquire),
            writes: kept.writes.load(Ordering::Acquire),
        }
    }

    /// The table's kept snapshot, when it can be read without asking the log: this process hears every write,
    /// nothing was heard since the snapshot was checked, and that was within [`TRUST_FOR`].
    fn trusted(&self, kept: &Kept) -> Option<Arc<Snapshot>> {
        if !self.hearing.hears() {
            return None;
        }
        let now = self.heard(kept);
        kept.known(|known| known.heard == now && known.at.elapsed() < TRUST_FOR)
    }

    /// The table's location as a URL, ending in `/`.
    pub fn url_of(&self, table: &ObjectPath) -> Url {
        // A prefix of the storage is a valid relative URL: its parts are percent-encoded by `ObjectPath`.
        self.root.join(&format!("{table}/")).unwrap_or_else(|_| self.root.clone())
    }

    fn log_store(&self, table: &ObjectPath) -> LogStoreRef {
        let location = self.url_of(table);
        let prefixed: Arc<dyn ObjectStore> =
            Arc::new(PrefixStore::new(Arc::clone(&self.store), table.clone()));
        log::ProbedLog::wrapping(default_logstore(
            prefixed,
            Arc::clone(&self.url_store),
            &location,
            &StorageConfig::default(),
        ))
    }

    fn kept(&self, table: &ObjectPath) -> Arc<Kept> {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= KEPT_TABLES && !kept.contains_key(table) {
            // Tables not read for a while, and not in use now, are read afresh when they are read again.
            kept.retain(|_, table| Arc::strong_count(table) > 1 || table.checked_newest().is_some());
        }
        Arc::clone(kept.entry(table.clone()).or_insert_with(|| {
            Arc::new(Kept {
                log: self.log_store(table),
                state: tokio::sync::Mutex::new(None),
                appending: tokio::sync::Mutex::new(()),
                snapshot: Mutex::new(None),
                writes: AtomicU64::new(0),
                recent: Mutex::new(changes::Recent::default()),
            })
        }))
    }

    /// Whether the prefix holds a Delta table (a commit in its log).
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn exists(&self, table: &ObjectPath) -> Result<bool, CommitError> {
        self.log_store(table).is_delta_table_location().await.map_err(|e| CommitError::storage(table, e))
    }

    /// The table's newest snapshot, `None` when the prefix holds no Delta table. Nothing is read when it is
    /// known to be the newest from what this process hears ([`DeltaTables::hearing`]); else one existence check
    /// of the next commit when this process read the table before, and the log's new commits when there are some.
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn snapshot(&self, table: &ObjectPath) -> Result<Option<Arc<Snapshot>>, CommitError> {
        let kept = self.kept(table);
        if let Some(trusted) = self.trusted(&kept) {
            self.kept_reads.inc();
            return Ok(Some(trusted));
        }
        self.check(table, &kept).await
    }

    /// The table's newest snapshot as its log says it is now, whatever this process heard: for a question a
    /// missed announcement must not answer wrong, such as whether a writer that stopped between its commit and
    /// its announcement wrote its rows ([`TRUST_FOR`] is how long such a commit may otherwise go unseen).
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn checked_snapshot(&self, table: &ObjectPath) -> Result<Option<Arc<Snapshot>>, CommitError> {
        let kept = self.kept(table);
        self.check(table, &kept).await
    }

    /// The table's newest snapshot checked against its log: one existence check of the commit after the one
    /// kept, and the new commits when there are some.
    async fn check(&self, table: &ObjectPath, kept: &Kept) -> Result<Option<Arc<Snapshot>>, CommitError> {
        self.checked_reads.inc();
        let heard = self.heard(kept);
        if let Some(known) = kept.checked_newest() {
            let next = table.clone().join("_delta_log").join(format!("{:020}.json", known.version + 1));
            match self.store.head(&next).await {
                Err(object_store::Error::NotFound { .. }) => return Ok(Some(kept.advance(known, heard))),
                Err(e) => return Err(CommitError::storage(table, e)),
                Ok(_) => {}
            }
            // From the commit just found: it is not asked for again.
            let latest = kept
                .log
                .get_latest_version(known.version + 1)
                .await
                .map_err(|e| CommitError::storage(table, e))?;
            if let Some((followed, _)) = self.follow(table, kept, &known, latest).await? {
                return Ok(Some(kept.advance(Arc::new(followed), heard)));
            }
        }
        self.refresh(table, kept, heard).await
    }

    /// `base` moved to version `to` by the commits after it, when they only added and removed files (`None`
    /// when one changed the columns or properties, or is no longer in the log: the log is read in full then),
    /// with the names each commit that claimed some claimed ([`Claim`]). Each commit is read once; the files of
    /// the version are not listed again.
    async fn follow(
        &self,
        table: &ObjectPath,
        kept: &Kept,
        base: &Snapshot,
        to: u64,
    ) -> Result<Option<(Snapshot, Vec<(u64, Vec<String>)>)>, CommitError> {
        if to.saturating_sub(base.version) > CHECKPOINT_INTERVAL {
            return Ok(None);
        }
        let (mut next, mut claims) = (base.clone(), Vec::new());
        for version in base.version + 1..=to {
            let Some(actions) = self.actions(table, version).await? else { return Ok(None) };
            if actions.iter().any(|a| matches!(a, Action::Metadata(_) | Action::Protocol(_))) {
                return Ok(None);
            }
            apply(table, &mut next, version, &actions);
            kept.recent().made(table, version, &actions);
            let names = claimed_in(&actions);
            if !names.is_empty() {
                claims.push((version, names));
            }
        }
        Ok(Some((next, claims)))
    }

    /// Reads the table's log forward from what this process knows of it, or afresh from its newest checkpoint
    /// when that fails (the commits after the state it knows were cleaned up, or it knows none).
    async fn refresh(
        &self,
        table: &ObjectPath,
        kept: &Kept,
        heard: Heard,
    ) -> Result<Option<Arc<Snapshot>>, CommitError> {
        let mut guard = kept.state.lock().await;
        let followed = match guard.as_mut() {
            Some(state) => state.update(kept.log.as_ref(), None).await.is_ok(),
            None => false,
        };
        // Read from the log in bulk: the commits it read are not told one by one.
        kept.recent().forget();
        if !followed {
            if !self.exists(table).await? {
                return Ok(None);
            }
            let read = DeltaTableState::try_new(kept.log.as_ref(), None).await;
            *guard = Some(read.map_err(|e| CommitError::storage(table, e))?);
        }
        let state = guard.as_ref().expect("the state was read above");
        if let Some(known) = kept.newest().filter(|known| known.version == state.version()) {
            return Ok(Some(kept.advance(known, heard)));
        }
        let fresh = Arc::new(Snapshot::of(table, state).map_err(|e| CommitError::storage(table, e))?);
        Ok(Some(kept.advance(fresh, heard)))
    }

    /// The table as it was at `at_ms` (milliseconds since the Unix epoch): its newest version committed at or
    /// before then, `None` when the table has no version that old (or no table is there).
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn snapshot_at(&self, table: &ObjectPath, at_ms: i64) -> Result<Option<Snapshot>, CommitError> {
        if !self.exists(table).await? {
            return Ok(None);
        }
        let Some(at) = chrono::DateTime::from_timestamp_millis(at_ms) else { return Ok(None) };
        let mut delta = DeltaTable::new(self.log_store(table));
        // A binary search of the commits by their times.
        delta.load_with_datetime(at).await.map_err(|e| CommitError::storage(table, e))?;
        let state = delta.snapshot().map_err(|e| CommitError::storage(table, e))?;
        let snapshot = Snapshot::of(table, state).map_err(|e| CommitError::storage(table, e))?;
        // Earlier than its oldest version the log keeps: the search stops at that version.
        Ok((snapshot.committed_ms <= at_ms).then_some(snapshot))
    }

    /// The table at one of its versions.
    ///
    /// # Errors
    /// [`CommitError::NoVersion`] for a version the log does not have (any more); [`CommitError::Storage`].
    pub async fn snapshot_of_version(
        &self,
        table: &ObjectPath,
        version: u64,
    ) -> Result<Snapshot, CommitError> {
        let log = self.log_store(table);
        let mut delta = DeltaTable::new(Arc::clone(&log));
        if let Err(err) = delta.load_version(version).await {
            // A storage that cannot be read is not a version that is gone: only the log's answer tells them apart.
            return Err(match log.read_commit_entry(version).await {
                Ok(None) => CommitError::NoVersion { table: table.to_string(), version },
                Ok(Some(_)) | Err(_) => CommitError::storage(table, err),
            });
        }
        let state = delta.snapshot().map_err(|e| CommitError::storage(table, e))?;
        Snapshot::of(table, state).map_err(|e| CommitError::storage(table, e))
    }

    /// Adds `files`, written for the table's version `read` (its columns), in one commit; answers the version it
    /// made. `note` goes with the commit (application metadata, shown by the table's versions), and so do the
    /// names of `claims`: the commit is made only if no commit after a claim's version names its name.
    ///
    /// # Errors
    /// [`CommitError::NoTable`]; [`CommitError::Replaced`] when a commit since `read` changed the table's columns
    /// or properties (nothing was added: write the rows again); [`CommitError::Claimed`] when a commit named a
    /// claim's name (nothing was added: write the rows of the other appends again); [`CommitError::Storage`].
    pub async fn append(
        &self,
        table: &ObjectPath,
        read: u64,
        files: &[NewFile],
        note: HashMap<String, serde_json::Value>,
        claims: &[Claim],
    ) -> Result<u64, CommitError> {
        let kept = self.kept(table);
        if self.snapshot(table).await?.is_none() {
            return Err(CommitError::NoTable(table.to_string()));
        }
        // One append of this process at a time (a replace or compaction reading the log in full, under the
        // state's lock, does not hold appends up); the newest snapshot once it is this one's turn.
        let _turn = kept.appending.lock().await;
        let Some(base) = kept.newest() else { return Err(CommitError::NoTable(table.to_string())) };
        // Commits up to the snapshot the commit is based on: any since the version the files were written for
        // that changed the metadata took the table, and any since a claim that names its name took the claim.
        // Those after the snapshot are followed below.
        let from = claims.iter().map(|claim| claim.after).fold(read, u64::min);
        for version in from + 1..=base.version {
            let Some(actions) = self.actions(table, version).await? else {
                return Err(CommitError::Replaced(table.to_string()));
            };
            claimed(table, claims, version, &claimed_in(&actions))?;
            if version > read
                && actions.iter().any(|a| matches!(a, Action::Metadata(_) | Action::Protocol(_)))
            {
                return Err(CommitError::Replaced(table.to_string()));
            }
        }
        let rows: u64 = files.iter().map(|f| f.rows).sum();
        let mut note = note;
        note.insert(ROWS_ADDED.into(), rows.into());
        if !claims.is_empty() {
            let names: Vec<&str> = claims.iter().map(|claim| claim.name.as_str()).collect();
            note.insert(CLAIMS.into(), names.into());
        }
        let operation = DeltaOperation::Write { mode: SaveMode::Append, partition_by: None, predicate: None };
        let commit = CommitData::new(adds(table, files, true)?, operation, note, Vec::new());
        // Appends of other nodes landing first are followed; only one claiming a name of this one is in its way.
        let admit = |_: &Snapshot, followed: Option<&[(u64, Vec<String>)]>| match followed {
            Some(followed) => {
                followed.iter().try_for_each(|(version, names)| claimed(table, claims, *version, names))
            }
            // The commits since were not read one by one: the claims are checked again from the start.
            None if !claims.is_empty() => Err(CommitError::Replaced(table.to_string())),
            None => Ok(()),
        };
        let landed = self.commit_next(table, &kept, base, &commit, admit, CommitError::Replaced).await?;
        Ok(landed)
    }

    /// Makes `commit`, which adds and removes files only, the version after `base`, by a put-if-absent of its log
    /// entry; when another commit took that version, the commits since are followed one by one and `admit` is
    /// asked whether this one still holds on top of them, given the names each of them claimed (`None` when the
    /// log was read afresh instead; a change of columns or properties among them is `refused`). Keeps the snapshot it leaves, built from `base` and the commit's actions (the log is not read
    /// again), and answers its version.
    async fn commit_next(
        &self,
        table: &ObjectPath,
        kept: &Kept,
        mut base: Arc<Snapshot>,
        commit: &CommitData,
        admit: impl Fn(&Snapshot, Option<&[(u64, Vec<String>)]>) -> Result<(), CommitError>,
        refused: fn(String) -> CommitError,
    ) -> Result<u64, CommitError> {
        if let Some(reason) = &base.unwritable {
            return Err(CommitError::storage(table, reason.clone()));
        }
        admit(&base, Some(&[]))?;
        let bytes = commit.get_bytes().map_err(|e| CommitError::storage(table, e))?;
        for _ in 0..COMMIT_ATTEMPTS {
            let version = base.version + 1;
            let entry = CommitOrBytes::LogBytes(bytes.clone());
            let heard = self.heard(kept);
            match kept.log.write_commit_entry(version, entry, uuid::Uuid::new_v4()).await {
                Ok(()) => {
                    let mut next = Snapshot::clone(&base);
                    apply(table, &mut next, version, &commit.actions);
                    kept.recent().made(table, version, &commit.actions);
                    kept.advance(Arc::new(next), heard);
                    self.checkpoint_after(table, kept, version);
                    return Ok(version);
                }
                Err(TransactionError::VersionAlreadyExists(_)) => {
                    let latest = kept
                        .log
                        .get_latest_version(version)
                        .await
                        .map_err(|e| CommitError::storage(table, e))?;
                    match self.follow(table, kept, &base, latest).await? {
                        Some((followed, claims)) => {
                            base = kept.advance(Arc::new(followed), heard);
                            admit(&base, Some(&claims))?;
                        }
                        // Too many commits to follow one by one: the log is read, and the commit holds if the
                        // columns and properties are still those it was made for.
                        None => {
                            base = match self.refresh(table, kept, heard).await? {
                                Some(now)
                                    if now.schema == base.schema && now.properties == base.properties =>
                                {
                                    now
                                }
                                _ => return Err(refused(table.to_string())),
                            };
                            admit(&base, None)?;
                        }
                    }
                }
                Err(err) => return Err(CommitError::storage(table, err)),
            }
        }
        Err(CommitError::storage(table, format!("other writes kept landing first {COMMIT_ATTEMPTS} times")))
    }

    /// Writes the table's checkpoint at `version` when the version is one of the interval's (every 100th
    /// commit), in the background: a checkpoint reads every file of the table, which an append does not wait
    /// for. Another node writing the same checkpoint writes the same content.
    fn checkpoint_after(&self, table: &ObjectPath, kept: &Kept, version: u64) {
        if (version + 1) % CHECKPOINT_INTERVAL != 0 {
            return;
        }
        let (log, table) = (Arc::clone(&kept.log), table.clone());
        tokio::spawn(async move {
            let mut delta = DeltaTable::new(log);
            let written = match delta.load_version(version).await {
                Ok(()) => create_checkpoint(&delta, None).await,
                Err(err) => Err(err),
            };
            if let Err(err) = written {
                tracing::warn!(%table, version, error = %err, "the table's checkpoint was not written");
            }
        });
    }

    /// Makes `files`, with columns `schema`, the table's whole content in one commit, creating the table when
    /// there is none; answers the version and whether there was no Delta table before. `properties` become the
    /// table's (its metadata's configuration, replacing the ones it had), but for [`LAYOUT_PINNED`], which its
    /// owner set: it stays unless `properties` name it or the table is created anew. With `created_ms` the table is created
    /// anew then (a new metadata: a table converted from an earlier layout keeps its time, one written again
    /// after it was deleted is created now); without, it keeps its metadata's id and creation time.
    ///
    /// # Errors
    /// [`CommitError::Columns`], [`CommitError::Storage`].
    pub async fn replace(
        &self,
        table: &ObjectPath,
        schema: &Schema,
        files: &[NewFile],
        properties: &HashMap<String, String>,
        created_ms: Option<i64>,
    ) -> Result<(u64, bool), CommitError> {
        let written = self.write_whole(table, (schema, files, properties), created_ms, false).await?;
        Ok(written.expect("a replace commits over a table that is there"))
    }

    /// Creates the table with `files`, as [`DeltaTables::replace`] does when there is none; `None` (nothing
    /// committed) when there is a table already, also one another node created meanwhile. How one table is
    /// converted from an earlier layout exactly once by nodes starting together.
    ///
    /// # Errors
    /// [`CommitError::Columns`], [`CommitError::Storage`].
    pub async fn create(
        &self,
        table: &ObjectPath,
        schema: &Schema,
        files: &[NewFile],
        properties: &HashMap<String, String>,
        created_ms: Option<i64>,
    ) -> Result<Option<u64>, CommitError> {
        let written = self.write_whole(table, (schema, files, properties), created_ms, true).await?;
        Ok(written.map(|(version, _)| version))
    }

    /// A replace, or with `only_new` a creation that leaves a table that is there as it is (`None`).
    async fn write_whole(
        &self,
        table: &ObjectPath,
        (schema, files, properties): (&Schema, &[NewFile], &HashMap<String, String>),
        created_ms: Option<i64>,
        only_new: bool,
    ) -> Result<Option<(u64, bool)>, CommitError> {
        let kernel: StructType = (&snapshot::loggable(schema)).try_into_kernel().map_err(|err| {
            // The kernel's message, without the backtrace it carries on the following lines.
            let text = err.to_string();
            let reason = text.lines().next().unwrap_or("an unsupported column type");
            CommitError::Columns {
                table: table.to_string(),
                reason: format!("the columns cannot be a Delta table's: {}", reason.trim()),
            }
        })?;
        let rows: u64 = files.iter().map(|f| f.rows).sum();
        let kept = self.kept(table);
        for _ in 0..REPLACE_ATTEMPTS {
            let heard = self.heard(&kept);
            let current = self.refresh(table, &kept, heard).await?;
            let mut guard = kept.state.lock().await;
            // The files to remove are those of the state the commit is made on: read again if it moved since.
            if guard.as_ref().map(DeltaTableState::version) != current.as_ref().map(|c| c.version) {
                continue;
            }
            let mut note = HashMap::from([(ROWS_ADDED.to_owned(), serde_json::Value::from(rows))]);
            let (actions, operation) = match &current {
                None => {
                    let metadata = snapshot::metadata(&kernel, None, properties, created_ms)
                        .map_err(|e| CommitError::storage(table, e))?;
                    let protocol = snapshot::protocol(&kernel);
                    let mut actions = vec![Action::Protocol(protocol), Action::Metadata(metadata)];
                    actions.extend(adds(table, files, true)?);
                    let operation = DeltaOperation::Write {
                        mode: SaveMode::ErrorIfExists,
                        partition_by: None,
                        predicate: None,
                    };
                    (actions, operation)
                }
                Some(_) if only_new => return Ok(None),
                Some(current) => {
                    let Some(state) = guard.as_ref() else { continue };
                    let mut actions = Vec::new();
                    // Columns that need a table feature the table does not have yet bring it.
                    if snapshot::needs_timestamp_ntz(&kernel) && state.protocol().min_reader_version() < 3 {
                        actions.push(Action::Protocol(snapshot::protocol(&kernel)));
                    }
                    let anew = created_ms.is_some();
                    let properties = &kept_pin(&current.properties, properties, anew);
                    if anew || *state.snapshot().schema() != kernel || current.properties != *properties {
                        let metadata =
                            snapshot::metadata(&kernel, Some(state.metadata()), properties, created_ms)
                                .map_err(|e| CommitError::storage(table, e))?;
                        actions.push(Action::Metadata(metadata));
                    }
                    let now = self.now_ms();
                    actions.extend(current.files.iter().map(|file| remove(table, file, true, now)));
                    actions.extend(adds(table, files, true)?);
                    let removed: u64 = current.files.iter().filter_map(|f| f.rows).sum();
                    note.insert(ROWS_REMOVED.into(), removed.into());
                    let operation = DeltaOperation::Write {
                        mode: SaveMode::Overwrite,
                        partition_by: None,
                        predicate: None,
                    };
                    (actions, operation)
                }
            };
            // No retry inside the commit: a commit that landed after the read may have added files this one
            // must remove, so the table is read again instead.
            let builder = CommitBuilder::from(commit_properties())
                .with_actions(actions)
                .with_app_metadata(note)
                .with_max_retries(0);
            match kept.commit(table, &mut guard, builder, operation, heard).await {
                Ok(version) => return Ok(Some((version, current.is_none()))),
                Err(Failed::Conflict) => continue,
                Err(Failed::Error(err)) => return Err(err),
            }
        }
        Err(CommitError::storage(table, format!("other writes kept landing first {REPLACE_ATTEMPTS} times")))
    }

    /// Replaces the table's files `removed` (of the snapshot at `read_version`) by `added`, which hold the same
    /// rows (an `OPTIMIZE` commit: `dataChange` false). Commits landed since that add files are kept.
    ///
    /// # Errors
    /// [`CommitError::Conflict`] when a replace removed some of `removed` since (nothing changed);
    /// [`CommitError::NoTable`]; [`CommitError::Storage`].
    pub async fn rewrite(
        &self,
        table: &ObjectPath,
        removed: &[DataFile],
        added: &[NewFile],
    ) -> Result<u64, CommitError> {
        let kept = self.kept(table);
        if self.snapshot(table).await?.is_none() {
            return Err(CommitError::NoTable(table.to_string()));
        }
        // In turn with this process's appends.
        let _turn = kept.appending.lock().await;
        let Some(base) = kept.newest() else { return Err(CommitError::NoTable(table.to_string())) };
        let now = self.now_ms();
        let mut actions: Vec<Action> = removed.iter().map(|file| remove(table, file, false, now)).collect();
        actions.extend(adds(table, added, false)?);
        let target_size = added.iter().map(|f| f.size).max().unwrap_or(0);
        let operation = DeltaOperation::Optimize {
            predicate: None,
            target_size: i64::try_from(target_size).unwrap_or(i64::MAX),
        };
        let commit = CommitData::new(actions, operation, HashMap::new(), Vec::new());
        // Every file merged must still be the table's in the version the commit follows (a replace since took
        // them); appends landing first are kept.
        let still_there = |version: &Snapshot, _: Option<&[(u64, Vec<String>)]>| {
            let present: std::collections::HashSet<&ObjectPath> =
                version.files.iter().map(|f| &f.location).collect();
            if removed.iter().all(|file| present.contains(&file.location)) {
                Ok(())
            } else {
                Err(CommitError::Conflict(table.to_string()))
            }
        };
        self.commit_next(table, &kept, base, &commit, still_there, CommitError::Conflict).await
    }

    /// Sets one of the table's [`LAYOUT_PROPERTIES`] (`property`) to `layout` (`None` removes it), keeping the
    /// others, with one metadata commit (`SET TBLPROPERTIES`); answers its version, or `None` when it already
    /// held (nothing committed). The rows stay as they were: stored results following the table's appends go on
    /// following them ([`DeltaTables::changes_since`]). Appends written for an earlier version are refused
    /// ([`CommitError::Replaced`]) and written again, as after any change of the table's metadata.
    ///
    /// # Errors
    /// [`CommitError::NoTable`], [`CommitError::Storage`]; [`CommitError::Storage`] too for a property not
    /// among [`LAYOUT_PROPERTIES`] (a change of any other could change rows).
    pub async fn set_layout(
        &self,
        table: &ObjectPath,
        property: &str,
        layout: Option<String>,
    ) -> Result<Option<u64>, CommitError> {
        if !LAYOUT_PROPERTIES.contains(&property) {
            return Err(CommitError::storage(table, format!("{property} is not a layout property")));
        }
        let set = HashMap::from([(property.to_owned(), layout)]);
        let kept = self.kept(table);
        for _ in 0..REPLACE_ATTEMPTS {
            let heard = self.heard(&kept);
            let Some(current) = self.refresh(table, &kept, heard).await? else {
                return Err(CommitError::NoTable(table.to_string()));
            };
            let mut properties = current.properties.clone();
            for (key, value) in &set {
                match value {
                    Some(value) => properties.insert(key.clone(), value.clone()),
                    None => properties.remove(key),
                };
            }
            if properties == current.properties {
                return Ok(None);
            }
            let mut guard = kept.state.lock().await;
            let Some(state) = guard.as_ref().filter(|state| state.version() == current.version) else {
                continue;
            };
            let schema = state.snapshot().schema();
            let metadata = snapshot::metadata(&schema, Some(state.metadata()), &properties, None)
                .map_err(|e| CommitError::storage(table, e))?;
            let changed = set.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
            let builder = CommitBuilder::from(commit_properties())
                .with_actions(vec![Action::Metadata(metadata)])
                .with_max_retries(0);
            let operation = DeltaOperation::SetTableProperties { properties: changed };
            match kept.commit(table, &mut guard, builder, operation, heard).await {
                Ok(version) => return Ok(Some(version)),
                Err(Failed::Conflict) => continue,
                Err(Failed::Error(err)) => return Err(err),
            }
        }
        Err(CommitError::storage(table, format!("other writes kept landing first {REPLACE_ATTEMPTS} times")))
    }

    /// Removes the files no version newer than `retention` reads (a vacuum), and the log's commits older than
    /// `retention` that a checkpoint made unnecessary; answers how many data files it removed. (Commits do not
    /// clean the log up themselves: that lists the whole log, on every commit.)
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn vacuum(
        &self,
        table: &ObjectPath,
        retention: std::time::Duration,
    ) -> Result<usize, CommitError> {
        let kept = self.kept(table);
        if self.refresh(table, &kept, self.heard(&kept)).await?.is_none() {
            return Ok(0);
        }
        let mut delta = DeltaTable::new(Arc::clone(&kept.log));
        delta.load().await.map_err(|e| CommitError::storage(table, e))?;
        let Some(version) = delta.version() else { return Ok(0) };
        let retention = chrono::Duration::from_std(retention).unwrap_or(chrono::Duration::MAX);
        let (_, metrics) = delta
            .vacuum()
            .with_clock(Arc::clone(&self.clock))
            .with_retention_period(retention)
            .with_enforce_retention_duration(false)
            .await
            .map_err(|e| CommitError::storage(table, e))?;
        let cutoff = self.now_ms().saturating_sub(retention.num_milliseconds());
        cleanup_expired_logs_for(version, kept.log.as_ref(), cutoff, None)
            .await
            .map_err(|e| CommitError::storage(table, e))?;
        Ok(metrics.files_deleted.len())
    }
}

/// Checkpoints as the table's interval says (every 100 commits by default), so that opening a table reads one
/// checkpoint and the commits after it.
/// `properties` for a table that had `had`: with its [`LAYOUT_PINNED`] kept, unless `properties` name it or the
/// table is created `anew`.
fn kept_pin(
    had: &HashMap<String, String>,
    properties: &HashMap<String, String>,
    anew: bool,
) -> HashMap<String, String> {
    let mut kept = properties.clone();
    if let Some(pin) = had.get(LAYOUT_PINNED).filter(|_| !anew) {
        kept.entry(LAYOUT_PINNED.to_owned()).or_insert_with(|| pin.clone());
    }
    kept
}

fn commit_properties() -> CommitProperties {
    CommitProperties::default().with_create_checkpoint(true).with_cleanup_expired_logs(Some(false))
}

/// Moves `snapshot` to `version` by a commit of `actions` that adds and removes files only.
/// The names a commit claimed ([`Claim`]), from its application metadata.
fn claimed_in(actions: &[Action]) -> Vec<String> {
    let info = actions.iter().find_map(|action| match action {
        Action::CommitInfo(info) => info.info.get(CLAIMS),
        _ => None,
    });
    let names = info.and_then(serde_json::Value::as_array).map_or(&[][..], Vec::as_slice);
    names.iter().filter_map(|name| name.as_str().map(str::to_owned)).collect()
}

/// [`CommitError::Claimed`] when the commit at `version` claimed a name that one of `claims` claimed before it.
fn claimed(table: &ObjectPath, claims: &[Claim], version: u64, names: &[String]) -> Result<(), CommitError> {
    let taken: Vec<String> = claims
        .iter()
        .filter(|claim| version > claim.after && names.contains(&claim.name))
        .map(|claim| claim.name.clone())
        .collect();
    if taken.is_empty() {
        Ok(())
    } else {
        Err(CommitError::Claimed { table: table.to_string(), names: taken })
    }
}

fn apply(table: &ObjectPath, snapshot: &mut Snapshot, version: u64, actions: &[Action]) {
    let mut removed = std::collections::HashSet::new();
    for action in actions {
        match action {
            Action::Add(add) => snapshot.files.push(changes::data_file(table, add)),
            Action::Remove(gone) => {
                removed.insert(changes::location(table, &gone.path));
            }
            Action::Metadata(metadata) => snapshot.properties = metadata.configuration().clone(),
            Action::CommitInfo(info) => {
                snapshot.committed_ms =
                    info.in_commit_timestamp.or(info.timestamp).unwrap_or(snapshot.committed_ms);
            }
            _ => {}
        }
    }
    if !removed.is_empty() {
        snapshot.files.retain(|file| !removed.contains(&file.location));
    }
    snapshot.version = version;
}

/// A file's path as the log keeps it: relative to the table's root.
fn relative<'a>(
    table: &ObjectPath,
    location: &'a ObjectPath,
) -> Option<Vec<object_store::path::PathPart<'a>>> {
    location.prefix_match(table).map(Iterator::collect)
}

fn adds(table: &ObjectPath, files: &[NewFile], data_change: bool) -> Result<Vec<Action>, CommitError> {
    files
        .iter()
        .map(|file| {
            let Some(parts) = relative(table, &file.location).filter(|parts| !parts.is_empty()) else {
                return Err(CommitError::storage(
                    table,
                    format!("{} is not a file of the table", file.location),
                ));
            };
            let path = ObjectPath::from_iter(parts);
            Ok(Action::Add(Add {
                path: path.to_string(),
                size: i64::try_from(file.size).unwrap_or(i64::MAX),
                modification_time: file.modified_ms,
                data_change,
                stats: Some(serde_json::json!({ "numRecords": file.rows }).to_string()),
                ..Add::default()
            }))
        })
        .collect()
}

fn remove(table: &ObjectPath, file: &DataFile, data_change: bool, now: i64) -> Action {
    let path = relative(table, &file.location).map_or_else(|| file.location.clone(), ObjectPath::from_iter);
    Action::Remove(Remove {
        path: path.to_string(),
        data_change,
        deletion_timestamp: Some(now),
        extended_file_metadata: Some(true),
        partition_values: Some(HashMap::new()),
        size: Some(i64::try_from(file.size).unwrap_or(i64::MAX)),
        ..Remove::default()
    })
}

#[cfg(test)]
mod tests;
