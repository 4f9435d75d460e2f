//! Where project tables and stored results live: an object store, the local data directory by default or an
//! S3-compatible bucket named by URL (`s3://bucket/prefix`, credentials and endpoint from the usual `AWS_*`
//! environment variables).
//!
//! Everything is addressed by paths relative to the storage's root (`projects/{id}/tables/...`), so the same
//! layout works on both. DataFusion reads the same objects by their real URLs (`file:///...`, `s3://...`), so
//! any DataFusion process given the same storage (an executor of a distributed engine, say) finds them. A
//! query's tables are registered by the engine; SQL itself has no way to name a URL.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use domain::{Clock, EngineError, SystemClock, Timestamp};
use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ListResult, ObjectMeta, ObjectStore, ObjectStoreExt};
use url::Url;

use crate::tables::sources::Sources;
use tables_delta::DeltaTables;

/// Why a storage location cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("'{0}' is not a storage location: use a directory, file:///path or s3://bucket[/prefix]")]
    Unsupported(String),
    #[error("cannot use the directory {path}: {source}")]
    Directory { path: PathBuf, source: std::io::Error },
    #[error("cannot use {url}: {source}")]
    Store { url: String, source: object_store::Error },
    #[error("{0}")]
    Source(String),
}

/// The object store holding project tables and stored results.
#[derive(Debug, Clone)]
pub struct Storage {
    /// The objects, addressed from the storage's root: the engine's own reads and writes.
    store: Arc<dyn ObjectStore>,
    /// The root's URL, ending in `/`: `file:///var/lib/endpoints/` or `s3://bucket/prefix/`.
    root_url: Url,
    /// The root as DataFusion's object stores address it: the store's URL (`file:///`, `s3://bucket`) and the
    /// root's path in it.
    engine_url: ObjectStoreUrl,
    engine_root: ObjectPath,
    /// What DataFusion reads the root URL's scheme and host through; `None` for local files, which every
    /// DataFusion session reads already.
    engine_store: Option<Arc<dyn ObjectStore>>,
    /// The directory, when the storage is local: readiness checks that it is still there.
    local_root: Option<PathBuf>,
    /// What else tables may read: external files and databases.
    sources: Arc<Sources>,
    /// The columns of table files read so far, by the location of a table's first file: every file of a table
    /// has the columns of its first (an append must have them), so they are read once, not from every file.
    schemas: VersionSchemas,
    /// The columns of tables as the engine's scans read them (strings as views), by the same key: what a table
    /// of those files is registered with, without reading a footer per run.
    scanned: VersionSchemas,
    /// The project tables, as Delta tables, with the snapshot of each this process read.
    tables: Arc<DeltaTables>,
    /// Earlier versions of tables that cursors pinned, by table and version.
    pinned: moka::sync::Cache<(ObjectPath, u64), Arc<tables_delta::Snapshot>>,
    /// How long files no version reads any more, and commits a checkpoint made unnecessary, are kept for
    /// readers of older versions (`--table-retention`).
    retention: Duration,
    /// What time it is for everything kept here (tables' commits, the run log, `as_of`): the service's clock.
    clock: ServiceClock,
}

impl Storage {
    /// The table retention unless one is set: a week.
    pub const DEFAULT_TABLE_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
    /// The shortest table retention: a run or a reader of the version before a compaction has this long.
    pub const MIN_TABLE_RETENTION: Duration = Duration::from_secs(3600);
}

/// The Delta tables under `root_url` (`store` addresses objects from the root, `url_store` by their URL's path),
/// timed by the system clock until the storage is given the service's ([`Storage::timed_by`]).
fn tables_on(
    store: &Arc<dyn ObjectStore>,
    url_store: Arc<dyn ObjectStore>,
    root_url: &Url,
) -> (Arc<DeltaTables>, ServiceClock) {
    let clock = ServiceClock(Arc::new(SystemClock));
    let tables = DeltaTables::new(Arc::clone(store), url_store, root_url.clone(), Arc::new(clock.clone()));
    (Arc::new(tables), clock)
}

/// The service's clock, also as the Delta kernel reads it.
#[derive(Clone)]
struct ServiceClock(Arc<dyn Clock>);

impl std::fmt::Debug for ServiceClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServiceClock")
    }
}

impl tables_delta::Clock for ServiceClock {
    fn current_timestamp_millis(&self) -> i64 {
        i64::try_from(self.0.now().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
    }
}

/// The columns of table versions, by prefix.
pub(crate) type VersionSchemas = moka::sync::Cache<ObjectPath, datafusion::arrow::datatypes::SchemaRef>;

/// The object store URL of `root` (its scheme and host), which DataFusion finds the store by.
fn engine_url(root: &Url) -> ObjectStoreUrl {
    let base = &root[..url::Position::BeforePath];
    ObjectStoreUrl::parse(base).unwrap_or_else(|_| ObjectStoreUrl::local_filesystem())
}

/// The path of `root` in its object store (`var/lib/endpoints`, `prefix`).
fn engine_root(root: &Url) -> Result<ObjectPath, StorageError> {
    ObjectPath::from_url_path(root.path()).map_err(|_| StorageError::Unsupported(root.to_string()))
}

/// Room for the versions pinned by cursors, weighed by their files (a few hundred bytes each): about 64 MiB
/// whatever the tables' sizes, so that cursors of versions of a table of many files cannot fill the memory.
fn pinned_snapshots() -> moka::sync::Cache<(ObjectPath, u64), Arc<tables_delta::Snapshot>> {
    const FILES: u64 = 256 * 1024;
    moka::sync::Cache::builder()
        .weigher(|_: &(ObjectPath, u64), snapshot: &Arc<tables_delta::Snapshot>| {
            u32::try_from(snapshot.files.len() + 1).unwrap_or(u32::MAX)
        })
        .max_capacity(FILES)
        .build()
}

fn version_schemas() -> VersionSchemas {
    moka::sync::Cache::new(10_000)
}

impl Storage {
    /// The directory `dir` (created when missing).
    ///
    /// # Errors
    /// [`StorageError::Directory`] when it cannot be created or read.
    pub fn local(dir: &Path) -> Result<Self, StorageError> {
        let failed = |source| StorageError::Directory { path: dir.to_path_buf(), source };
        std::fs::create_dir_all(dir).map_err(failed)?;
        let root = std::fs::canonicalize(dir).map_err(failed)?;
        let store = LocalFileSystem::new_with_prefix(&root)
            .map_err(|e| StorageError::Store { url: root.display().to_string(), source: e })?
            // Removing a stored result's last file removes its directories too, as removing a prefix does on S3.
            .with_automatic_cleanup(true);
        let root_url = Url::from_directory_path(&root)
            .map_err(|()| StorageError::Unsupported(root.display().to_string()))?;
        let store: Arc<dyn ObjectStore> = Arc::new(store);
        // The Delta kernel reads a local table's log by its URL's path, from the file system's root.
        let (tables, clock) = tables_on(&store, Arc::new(LocalFileSystem::new()), &root_url);
        Ok(Self {
            store,
            engine_url: engine_url(&root_url),
            engine_root: engine_root(&root_url)?,
            root_url,
            engine_store: None,
            local_root: Some(root),
            sources: Arc::default(),
            schemas: version_schemas(),
            scanned: version_schemas(),
            tables,
            pinned: pinned_snapshots(),
            retention: Self::DEFAULT_TABLE_RETENTION,
            clock,
        })
    }

    /// The storage a `--storage` value names: a directory path, `file:///path`, or `s3://bucket[/prefix]` (with
    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ALLOW_HTTP` and the
    /// rest of the `AWS_*` variables the AWS tools read).
    ///
    /// # Errors
    /// [`StorageError`] for another scheme, an unusable directory or an S3 configuration that does not build.
    pub fn open(raw: &str) -> Result<Self, StorageError> {
        let Ok(url) = Url::parse(raw) else { return Self::local(Path::new(raw)) };
        match url.scheme() {
            "file" => {
                let dir = url.to_file_path().map_err(|()| StorageError::Unsupported(raw.into()))?;
                Self::local(&dir)
            }
            "s3" | "s3a" => {
                let bucket = url.host_str().filter(|b| !b.is_empty());
                let Some(bucket) = bucket else { return Err(StorageError::Unsupported(raw.into())) };
                let s3: Arc<dyn ObjectStore> = Arc::new(
                    AmazonS3Builder::from_env()
                        .with_bucket_name(bucket)
                        .with_retry(crate::tables::sources::retries())
                        .build()
                        .map_err(|e| StorageError::Store { url: raw.into(), source: e })?,
                );
                let prefix = url.path().trim_matches('/');
                let (store, root): (Arc<dyn ObjectStore>, String) = if prefix.is_empty() {
                    (Arc::clone(&s3), format!("s3://{bucket}/"))
                } else {
                    (Arc::new(PrefixStore::new(Arc::clone(&s3), prefix)), format!("s3://{bucket}/{prefix}/"))
                };
                let root_url = Url::parse(&root).map_err(|_| StorageError::Unsupported(raw.into()))?;
                let (tables, clock) = tables_on(&store, Arc::clone(&s3), &root_url);
                Ok(Self {
                    store,
                    engine_url: engine_url(&root_url),
                    engine_root: engine_root(&root_url)?,
                    root_url,
                    engine_store: Some(s3),
                    local_root: None,
                    sources: Arc::default(),
                    schemas: version_schemas(),
                    scanned: version_schemas(),
                    tables,
                    pinned: pinned_snapshots(),
                    retention: Self::DEFAULT_TABLE_RETENTION,
                    clock,
                })
            }
            _ => Err(StorageError::Unsupported(raw.into())),
        }
    }

    /// An object store whose paths are those under `root_url`'s scheme and host (a store with no prefix), for
    /// tests and for other adapters.
    ///
    /// # Panics
    /// When `root_url` is not a URL.
    pub fn from_store(store: Arc<dyn ObjectStore>, root_url: &str) -> Self {
        let root_url = Url::parse(root_url).expect("a storage root is a URL");
        let (tables, clock) = tables_on(&store, Arc::clone(&store), &root_url);
        Self {
            store: Arc::clone(&store),
            engine_url: engine_url(&root_url),
            engine_root: engine_root(&root_url).expect("a storage root's path is an object path"),
            root_url,
            engine_store: Some(store),
            local_root: None,
            sources: Arc::default(),
            schemas: version_schemas(),
            scanned: version_schemas(),
            tables,
            pinned: pinned_snapshots(),
            retention: Self::DEFAULT_TABLE_RETENTION,
            clock,
        }
    }

    /// How often an external Delta table is checked for a newer version unless the operator says
    /// (`--source-refresh-secs`).
    pub const DEFAULT_SOURCE_REFRESH: Duration = Duration::from_secs(10);

    /// The same storage, its tables also reading the external sources under `prefixes` (`--allow-source`:
    /// `s3://bucket/prefix/`, `file:///dir/`, `postgres://host/db`), besides files of its own bucket; an
    /// external Delta table is checked for a newer version at most once per `delta_refresh`
    /// (`--source-refresh-secs`).
    ///
    /// # Errors
    /// [`StorageError::Source`] for a prefix that is not such a URL.
    pub fn allowing_sources(
        mut self,
        prefixes: &[String],
        delta_refresh: Duration,
    ) -> Result<Self, StorageError> {
        let sources =
            Sources::allowing(prefixes, self.local_root.as_deref()).map_err(StorageError::Source)?;
        self.sources = Arc::new(sources.refreshing_delta_every(delta_refresh));
        Ok(self)
    }

    /// The same storage, keeping what no version reads any more for `retention` (at least an hour).
    #[must_use]
    pub fn retaining_tables_for(mut self, retention: Duration) -> Self {
        self.retention = retention.max(Self::MIN_TABLE_RETENTION);
        self
    }

    /// The same storage, telling the time by `clock` (the service's: its tests set it). Call it before the
    /// storage is used: the tables' snapshots kept so far are not carried over.
    #[must_use]
    pub fn timed_by(mut self, clock: Arc<dyn Clock>) -> Self {
        let clock = ServiceClock(clock);
        self.tables = Arc::new(self.tables.timed_by(Arc::new(clock.clone())));
        self.clock = clock;
        self
    }

    /// Now, by the storage's clock.
    pub(crate) fn now(&self) -> Timestamp {
        self.clock.0.now()
    }

    /// Now in milliseconds since the epoch, as the tables' log keeps times.
    pub(crate) fn now_ms(&self) -> i64 {
        tables_delta::Clock::current_timestamp_millis(&self.clock)
    }

    pub(crate) fn table_retention(&self) -> Duration {
        self.retention
    }

    pub(crate) fn sources(&self) -> &Sources {
        &self.sources
    }

    /// Whether the storage is a directory of this machine.
    pub(crate) fn is_local(&self) -> bool {
        self.local_root.is_some()
    }

    /// The storage's bucket (`s3://bucket/`), where external files may be; `None` for a local storage.
    pub(crate) fn bucket(&self) -> Option<Url> {
        let host = self.root_url.host_str().filter(|_| self.root_url.scheme() == "s3")?;
        Url::parse(&format!("s3://{host}/")).ok()
    }

    /// The URL of the storage's `projects/` area, which no external source may name.
    pub(crate) fn projects_url(&self) -> Url {
        self.root_url.join("projects/").unwrap_or_else(|_| self.root_url.clone())
    }

    /// Where it is, for people and logs: `file:///var/lib/endpoints`, `s3://bucket/prefix`.
    pub fn location(&self) -> &str {
        let root = self.root_url.as_str();
        root.strip_suffix('/').unwrap_or(root)
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// The table at `version`, as a cursor pinned it: versions never change, so each is read from the log once
    /// while it is among the most recently pinned.
    pub(crate) async fn pinned_snapshot(
        &self,
        table: &ObjectPath,
        version: u64,
    ) -> Result<Arc<tables_delta::Snapshot>, tables_delta::CommitError> {
        let key = (table.clone(), version);
        if let Some(kept) = self.pinned.get(&key) {
            return Ok(kept);
        }
        let snapshot = Arc::new(self.tables.snapshot_of_version(table, version).await?);
        self.pinned.insert(key, Arc::clone(&snapshot));
        Ok(snapshot)
    }

    /// The project tables, as Delta tables.
    pub(crate) fn tables(&self) -> &DeltaTables {
        &self.tables
    }

    pub(crate) fn version_schemas(&self) -> &VersionSchemas {
        &self.schemas
    }

    /// The columns of tables as scans read them, by the location of a table's first file.
    pub(crate) fn scanned_schemas(&self) -> &VersionSchemas {
        &self.scanned
    }

    /// The URL DataFusion reads the objects under `prefix` from (a directory-like URL, ending in `/`).
    pub(crate) fn url_of(&self, prefix: &ObjectPath) -> String {
        format!("{}{prefix}/", self.root_url)
    }

    /// The URL DataFusion reads one object from.
    pub(crate) fn url_of_object(&self, object: &ObjectPath) -> String {
        format!("{}{object}", self.root_url)
    }

    /// The object store DataFusion reads the storage's objects from (`file://`, `s3://bucket`).
    pub(crate) fn engine_store_url(&self) -> &ObjectStoreUrl {
        &self.engine_url
    }

    /// Where `object` is in the [`Self::engine_store_url`] store: under the root's own path.
    pub(crate) fn engine_path(&self, object: &ObjectPath) -> ObjectPath {
        ObjectPath::from_iter(self.engine_root.parts().chain(object.parts()))
    }

    /// Makes the storage readable by sessions on `runtime` (local files are already).
    pub(crate) fn register(&self, runtime: &RuntimeEnv) {
        if let Some(store) = &self.engine_store {
            runtime.register_object_store(&self.root_url, Arc::clone(store));
        }
    }

    /// Whether the storage answers: the directory is there, or the bucket can be listed.
    pub(crate) async fn ping(&self) -> Result<(), EngineError> {
        if let Some(root) = &self.local_root {
            let usable = tokio::fs::metadata(root).await.is_ok_and(|m| m.is_dir())
                && tokio::fs::metadata(root.join("projects")).await.map_or(true, |m| m.is_dir());
            return if usable {
                Ok(())
            } else {
                Err(EngineError::Unavailable(format!("{} is not a directory", root.display()).into()))
            };
        }
        self.store
            .list_with_delimiter(Some(&ObjectPath::from("projects")))
            .await
            .map(|_| ())
            .map_err(|e| EngineError::Unavailable(Box::new(e)))
    }

    /// What is directly under `prefix`: its objects and its "directories". A prefix with nothing under it lists
    /// as empty, on a local disk as on S3.
    async fn listing(&self, prefix: &ObjectPath) -> Result<ListResult, object_store::Error> {
        match self.store.list_with_delimiter(Some(prefix)).await {
            Err(object_store::Error::NotFound { .. }) => {
                Ok(ListResult { common_prefixes: Vec::new(), objects: Vec::new() })
            }
            listed => listed,
        }
    }

    /// The names of the "directories" directly under `prefix`.
    pub(crate) async fn children(&self, prefix: &ObjectPath) -> Result<Vec<String>, object_store::Error> {
        let listed = self.listing(prefix).await?;
        Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_owned)).collect())
    }

    /// The objects directly under `prefix` (not in its "subdirectories").
    pub(crate) async fn objects(&self, prefix: &ObjectPath) -> Result<Vec<ObjectMeta>, object_store::Error> {
        Ok(self.listing(prefix).await?.objects)
    }

    /// Copies `objects` into `to` under their own names: on a local disk as hard links, made in one blocking
    /// task (a task each, as the object store makes them, took a millisecond for a stored result of 30 parts);
    /// on S3 as copies in the bucket, several at once.
    pub(crate) async fn copy_into(
        &self,
        objects: &[ObjectPath],
        to: &ObjectPath,
    ) -> Result<(), object_store::Error> {
        let named = objects
            .iter()
            .map(|object| match object.filename() {
                Some(name) => Ok((object.clone(), to.clone().join(name))),
                None => Err(object_store::Error::Generic {
                    store: "copy",
                    source: format!("an object without a name: {object}").into(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?;
        let Some(root) = self.local_root.clone() else {
            let store = Arc::clone(&self.store);
            let copies = named.into_iter().map(move |(from, into)| {
                let store = Arc::clone(&store);
                async move { store.copy(&from, &into).await }
            });
            let mut copies = futures_util::stream::iter(copies).buffer_unordered(COPIES_AT_ONCE);
            while let Some(copied) = copies.next().await {
                copied?;
            }
            return Ok(());
        };
        let target = root.join(to.as_ref());
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&target)?;
            named.iter().try_for_each(|(from, into)| {
                std::fs::hard_link(root.join(from.as_ref()), root.join(into.as_ref()))
            })
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined)))
        .map_err(|e| object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) })
    }

    /// Removes everything under `prefix`; removing nothing is not an error. On a local disk this includes
    /// the staging files of writes that never finished (a killed process leaves those) and the directories left
    /// empty; on S3 an unfinished upload is never an object, and a bucket lifecycle rule aborts it.
    pub(crate) async fn remove_prefix(&self, prefix: &ObjectPath) -> Result<(), object_store::Error> {
        let Some(root) = self.local_root.clone() else {
            let listed: Vec<ObjectPath> =
                self.store.list(Some(prefix)).map_ok(|meta| meta.location).try_collect().await?;
            return self.delete(listed).await;
        };
        let dir = root.join(prefix.as_ref());
        let removed = tokio::task::spawn_blocking(move || {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            // Parents left empty go too, as they would on S3; one still in use is not empty and stays.
            let mut parent = dir.parent();
            while let Some(current) = parent.filter(|p| *p != root && p.starts_with(&root)) {
                if std::fs::remove_dir(current).is_err() {
                    break;
                }
                parent = current.parent();
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|joined| Err(std::io::Error::other(joined)));
        removed.map_err(|e| object_store::Error::Generic { store: "LocalFileSystem", source: Box::new(e) })
    }

    /// Deletes the objects at `paths`; one already gone is not an error.
    pub(crate) async fn delete(&self, paths: Vec<ObjectPath>) -> Result<(), object_store::Error> {
        let paths = futures_util::stream::iter(paths.into_iter().map(Ok)).boxed();
        let mut deleted = self.store.delete_stream(paths);
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// How many objects a copy into a bucket copies at once.
const COPIES_AT_ONCE: usize = 8;

/// A storage that cannot be read or written is unavailable (503, worth retrying), as a database that cannot be
/// reached is.
pub(crate) fn unavailable(err: object_store::Error) -> EngineError {
    EngineError::Unavailable(Box::new(err))
}
