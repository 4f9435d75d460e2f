//! External sources: rows a table reads where they are, without copying them.
//!
//! - Files (Parquet, CSV with a header, NDJSON) under a URL: anywhere in the storage's own bucket except its
//!   `projects/` area (every project's tables and stored results), or under a prefix the operator allowed with
//!   `--allow-source` (`s3://bucket/prefix/`, `file:///dir/`). Other buckets are read with the same `AWS_*`
//!   credentials as the storage.
//! - A PostgreSQL table, through the `datafusion-table-providers` provider, of a database the operator allowed
//!   (`--allow-source postgres://[user:password@]host[:port]/database[?sslmode=...]`). A URL without credentials
//!   uses those of the prefix that allows it, so callers need not know them. Connections are read-only
//!   (`default_transaction_read_only`), and TLS is never weaker than the prefix's `sslmode` (`verify-full` when
//!   it names none).
//!
//! A URL is decoded and normalised before anything is compared ([`normalise`]): what is checked is what the
//! object store reads, however the URL spells it. Local files are checked on their canonical path (symbolic
//! links resolved) and read through a store that refuses any file resolving elsewhere (`confined`). A URL is
//! checked when a table is registered and again each time a query reads it, so a prefix the operator no longer
//! allows stops being read at the next restart.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::options::JsonReadOptions;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion_table_providers_postgres::pool::PostgresConnectionPool;
use datafusion_table_providers_postgres::PostgresTableFactory;
use domain::{ExternalSource, TableFormat};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use secrecy::SecretString;
use tables_delta::{CommitError, ExternalTable};
use tokio::sync::OnceCell;
use url::Url;

use crate::tables::confined::{self, ConfinedFiles, Confinement};

/// Why a source cannot be used, for the person who named it.
pub(crate) type Refusal = String;

/// Why a registered source cannot be read now.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unreadable {
    /// It is not allowed (any more): the tenant's to fix.
    #[error("{0}")]
    Refused(Refusal),
    /// It is allowed but cannot be reached or read as its format.
    #[error("{0}")]
    Failed(String),
}

/// Whether an error of delta-rs comes from a file the confined store refused.
fn refused_store(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if matches!(
            err.downcast_ref::<object_store::Error>(),
            Some(object_store::Error::PermissionDenied { .. })
        ) {
            return true;
        }
        cause = err.source();
    }
    false
}

/// Whether a DataFusion error comes from a file the confined store refused.
fn refused_file(err: &datafusion::error::DataFusionError) -> bool {
    matches!(
        err.find_root(),
        datafusion::error::DataFusionError::ObjectStore(e)
            if matches!(**e, object_store::Error::PermissionDenied { .. })
    )
}

/// The prefixes the operator allowed, and the clients of the buckets, folders, Delta tables and databases
/// tables read.
pub(crate) struct Sources {
    /// Normalised ([`normalise`]), but for databases, which are compared as given.
    allowed: Vec<Url>,
    /// Where local files may resolve to: the allowed folders, outside the data directory.
    confinement: Confinement,
    /// The store of local files, made once.
    files: std::sync::OnceLock<Arc<ConfinedFiles>>,
    /// Object stores of buckets other than the storage's, by bucket.
    buckets: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Connection pools, by database URL (with its credentials); each made once, by the first query.
    pools: Mutex<HashMap<String, Arc<OnceCell<Arc<PostgresConnectionPool>>>>>,
    /// External Delta tables, by URL (as checked), each read once and then followed.
    delta: Mutex<HashMap<String, Arc<ExternalTable>>>,
    /// How often an external Delta table is checked for a newer version.
    delta_refresh: Duration,
}

/// How many external Delta tables a process keeps read; past it, those no query holds are read afresh.
const KEPT_DELTA_TABLES: usize = 256;

impl Default for Sources {
    fn default() -> Self {
        Self {
            allowed: Vec::new(),
            confinement: Confinement::default(),
            files: std::sync::OnceLock::new(),
            buckets: Mutex::default(),
            pools: Mutex::default(),
            delta: Mutex::default(),
            delta_refresh: crate::Storage::DEFAULT_SOURCE_REFRESH,
        }
    }
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let allowed: Vec<String> = self.allowed.iter().map(shown).collect();
        f.debug_struct("Sources").field("allowed", &allowed).finish_non_exhaustive()
    }
}

/// The scheme with its aliases folded: `s3a` is `s3`, `postgresql` is `postgres`.
fn scheme(url: &Url) -> &str {
    match url.scheme() {
        "s3a" => "s3",
        "postgresql" => "postgres",
        other => other,
    }
}

/// The URL's path as its segments, without empty ones (so `postgres://h/db` and `postgres://h/db/` are the
/// same database).
fn segments(url: &Url) -> Vec<&str> {
    url.path().split('/').filter(|s| !s.is_empty()).collect()
}

/// The URL's port, or its scheme's (PostgreSQL's is 5432).
fn port(url: &Url) -> Option<u16> {
    url.port_or_known_default().or_else(|| (scheme(url) == "postgres").then_some(5432))
}

/// The host, lowercased: host names are not case-sensitive, and only special schemes' are folded by parsing.
fn host(url: &Url) -> Option<String> {
    url.host_str().map(str::to_ascii_lowercase)
}

/// Whether `url` is `prefix` or below it: same scheme, host and port, and `prefix`'s path segments first. Both
/// are normalised URLs (see [`normalise`]), so this compares what the object store reads.
fn within(url: &Url, prefix: &Url) -> bool {
    let (path, under) = (segments(url), segments(prefix));
    scheme(url) == scheme(prefix)
        && host(url) == host(prefix)
        && port(url) == port(prefix)
        && path.len() >= under.len()
        && path.iter().zip(&under).all(|(a, b)| a == b)
}

/// Whether `url` is in the area `prefix` names however its letters are cased: for the areas no source may read,
/// which a case-insensitive file system or an object store's aliases must not open by another spelling.
fn within_any_case(url: &Url, prefix: &Url) -> bool {
    let lower = |url: &Url| Url::parse(&url.as_str().to_lowercase()).ok();
    matches!((lower(url), lower(prefix)), (Some(url), Some(prefix)) if within(&url, &prefix))
}

/// The URL for people: without its password.
pub(crate) fn shown(url: &Url) -> String {
    let mut url = url.clone();
    // A URL that cannot have a password has none to hide.
    let _ = url.set_password(None);
    url.to_string()
}

/// The URL as stored, for people: without its password, or as it is when it does not parse.
pub(crate) fn shown_raw(raw: &str) -> String {
    Url::parse(raw).map_or_else(|_| raw.to_owned(), |url| shown(&url))
}

/// A URL a source may use: a scheme this engine reads, no fragment, and for files no query and no credentials.
fn parse(raw: &str) -> Result<Url, Refusal> {
    let url = Url::parse(raw).map_err(|e| format!("'{}' is not a URL: {e}.", shown_raw(raw)))?;
    let files = match scheme(&url) {
        "s3" | "file" => true,
        "postgres" => false,
        other => {
            return Err(format!("A source is read from s3://, file:// or postgres:// URLs, not {other}://."))
        }
    };
    if url.fragment().is_some() {
        return Err(format!("'{}' is not a plain URL: no '#'.", shown(&url)));
    }
    if files && (url.query().is_some() || !url.username().is_empty() || url.password().is_some()) {
        return Err("A file URL carries no query and no credentials: the operator configures those.".into());
    }
    if scheme(&url) == "s3" && url.host_str().is_none_or(str::is_empty) {
        return Err("An s3:// URL names its bucket: s3://bucket/prefix/.".into());
    }
    Ok(url)
}

/// A files URL as the object store reads it, in one spelling: the scheme's alias folded, the host lowercased,
/// the path percent-decoded into object store segments (no `.`, `..`, empty or encoded `/` segment survives) and
/// encoded again, a trailing `/` kept for a folder. Every check compares this form, and only this form is read,
/// so `project%73/` or `dat%61/` is `projects/` or `data/` to the checks as it is to the store.
fn normalise(url: &Url) -> Result<Url, Refusal> {
    let not_plain = || {
        format!(
            "'{}' is not a plain URL: no '.', '..' or empty segments, no encoded '/' or '\\'.",
            shown(url)
        )
    };
    let lowered = url.path().to_ascii_lowercase();
    if ["%5c", "\\"].iter().any(|sep| lowered.contains(sep)) {
        return Err(not_plain());
    }
    let path = ObjectPath::from_url_path(url.path()).map_err(|_| not_plain())?;
    // `file:///dir` has no host; every other scheme's URL was checked to have one.
    let host = host(url).unwrap_or_else(String::new);
    let mut normal = Url::parse(&format!("{}://{host}/", scheme(url))).map_err(|_| not_plain())?;
    {
        let mut segments = normal.path_segments_mut().map_err(|()| not_plain())?;
        segments.pop_if_empty().extend(path.parts().map(|part| part.as_ref().to_owned()));
        if url.path().ends_with('/') && path.parts().next().is_some() {
            segments.push("");
        }
    }
    Ok(normal)
}

/// `sslmode` values from the least protective to the most, as libpq orders them.
const SSL_MODES: [&str; 6] = ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"];

/// The `sslmode` a PostgreSQL URL asks for, by rank in [`SSL_MODES`]; `None` when it names none.
fn ssl_mode(url: &Url) -> Result<Option<usize>, Refusal> {
    let Some((_, mode)) = url.query_pairs().find(|(key, _)| key == "sslmode") else { return Ok(None) };
    SSL_MODES.iter().position(|known| *known == mode).map(Some).ok_or_else(|| {
        format!("sslmode={mode} is not a PostgreSQL SSL mode: use one of {}.", SSL_MODES.join(", "))
    })
}

/// A database URL as it is connected to: the tenant's host, port, database and (if any) credentials, the
/// prefix's credentials otherwise, and TLS at least as strict as the prefix says (`verify-full` when it says
/// nothing, the provider's default). The tenant may name a stricter `sslmode` and an `application_name`;
/// certificates are the operator's to configure.
fn database_url(mut url: Url, prefix: &Url) -> Result<Url, Refusal> {
    let floor = ssl_mode(prefix)?.unwrap_or(SSL_MODES.len() - 1);
    let asked = ssl_mode(&url)?;
    if let Some(asked) = asked.filter(|asked| *asked < floor) {
        return Err(format!(
            "sslmode={} is weaker than this server allows for {} (sslmode={}): the operator's credentials never \
             travel with less protection than the operator set.",
            SSL_MODES[asked],
            shown(prefix),
            SSL_MODES[floor]
        ));
    }
    let mut params = vec![("sslmode".to_owned(), SSL_MODES[asked.unwrap_or(floor)].to_owned())];
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "sslmode" => {}
            "application_name" => params.push((key.into_owned(), value.into_owned())),
            "sslrootcert" => return Err("sslrootcert is set by the operator, in the allowed prefix.".into()),
            other => return Err(format!("Unknown parameter '{other}' in a PostgreSQL URL: use sslmode.")),
        }
    }
    params.extend(
        prefix
            .query_pairs()
            .filter(|(key, _)| key == "sslrootcert")
            .map(|(k, v)| (k.into_owned(), v.into_owned())),
    );
    if url.username().is_empty() && !prefix.username().is_empty() {
        url.set_username(prefix.username())
            .map_err(|()| "the prefix's user name does not fit the URL".to_owned())?;
        url.set_password(prefix.password())
            .map_err(|()| "the prefix's password does not fit the URL".to_owned())?;
    }
    url.query_pairs_mut().clear().extend_pairs(params);
    Ok(url)
}

impl Sources {
    /// The prefixes `--allow-source` gave; no `file://` source may be in `data_dir` (the local storage's
    /// directory) whatever they cover.
    ///
    /// # Errors
    /// A message naming a prefix that is not an `s3://`, `file://` or `postgres://` URL, or not a plain one.
    pub(crate) fn allowing(prefixes: &[String], data_dir: Option<&Path>) -> Result<Self, String> {
        let mut allowed = Vec::new();
        let mut folders = Vec::new();
        for raw in prefixes {
            let refused = |why: String| format!("--allow-source {}: {why}", shown_raw(raw));
            let url = Url::parse(raw).map_err(|e| refused(format!("not a URL: {e}")))?;
            let url = match scheme(&url) {
                "s3" => normalise(&url).map_err(refused)?,
                "file" => {
                    let url = normalise(&url).map_err(refused)?;
                    let folder = url.to_file_path().map_err(|()| refused("not a local path".into()))?;
                    folders.push(folder);
                    url
                }
                "postgres" => {
                    ssl_mode(&url).map_err(refused)?;
                    url
                }
                _ => return Err(refused("use s3://, file:// or postgres:// URLs".into())),
            };
            allowed.push(url);
        }
        let confinement = Confinement::new(folders, data_dir.map(Path::to_path_buf));
        Ok(Self { allowed, confinement, ..Self::default() })
    }

    /// The URL a source is read from, once allowed: files in `storage_bucket` (the storage's `s3://bucket/`)
    /// outside `storage_projects` (its `projects/` area), or under an allowed prefix, in the one spelling the
    /// object store reads ([`normalise`]); local files at their canonical path under [`confined::ROOT`]; a
    /// database with the credentials and TLS of the prefix that allows it ([`database_url`]).
    ///
    /// # Errors
    /// Why the URL may not be read.
    pub(crate) fn check(
        &self,
        raw: &str,
        storage_bucket: Option<&Url>,
        storage_projects: &Url,
    ) -> Result<Url, Refusal> {
        let url = parse(raw)?;
        let url = if scheme(&url) == "postgres" { url } else { normalise(&url)? };
        if within_any_case(&url, storage_projects) {
            return Err(
                "The storage's own projects/ area (every project's tables and results) is not a source."
                    .into(),
            );
        }
        if storage_bucket.is_some_and(|bucket| within(&url, bucket)) {
            return Ok(url);
        }
        let Some(prefix) = self.allowed.iter().find(|prefix| within(&url, prefix)) else {
            return Err(format!(
                "{} is not under a source this server allows (the storage's bucket, or a prefix the operator \
                 allowed with --allow-source).",
                shown(&url)
            ));
        };
        match scheme(&url) {
            "postgres" => database_url(url, prefix),
            "file" => self.confined(&url),
            _ => Ok(url),
        }
    }

    /// A `file://` URL's canonical path (links resolved), checked, as the URL its confined store reads.
    fn confined(&self, url: &Url) -> Result<Url, Refusal> {
        let path = url.to_file_path().map_err(|()| format!("{} is not a local path.", shown(url)))?;
        let real = self.confinement.resolve(&path)?;
        let real = ObjectPath::from_absolute_path(&real)
            .map_err(|_| format!("{} is not a path this server reads.", path.display()))?;
        let mut confined = Url::parse(confined::ROOT).map_err(|e| e.to_string())?;
        {
            let mut segments = confined.path_segments_mut().map_err(|()| "not a path".to_owned())?;
            segments.pop_if_empty().extend(real.parts().map(|part| part.as_ref().to_owned()));
            if url.path().ends_with('/') {
                segments.push("");
            }
        }
        Ok(confined)
    }

    /// Makes `ctx` read `url` (as [`Sources::check`] gave it) when its store is not one every session reads
    /// already: the confined store of local files, the bucket of another than the storage's.
    fn register_store(
        &self,
        ctx: &SessionContext,
        url: &Url,
        storage_bucket: Option<&Url>,
    ) -> Result<(), Refusal> {
        if url.as_str().starts_with(confined::ROOT) {
            let root = Url::parse(confined::ROOT).map_err(|e| e.to_string())?;
            let store =
                Arc::clone(self.files.get_or_init(|| Arc::new(ConfinedFiles::new(self.confinement.clone()))));
            ctx.runtime_env().register_object_store(&root, store);
            return Ok(());
        }
        if scheme(url) != "s3" || storage_bucket.is_some_and(|bucket| within(url, bucket)) {
            return Ok(());
        }
        let bucket = host(url).ok_or("An s3:// URL names its bucket.")?;
        let store = {
            let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
            match buckets.get(&bucket) {
                Some(store) => Arc::clone(store),
                None => {
                    let store: Arc<dyn ObjectStore> = Arc::new(
                        AmazonS3Builder::from_env()
                            .with_bucket_name(&bucket)
                            .with_retry(retries())
                            .build()
                            .map_err(|e| format!("cannot read bucket {bucket}: {e}"))?,
                    );
                    buckets.insert(bucket.clone(), Arc::clone(&store));
                    store
                }
            }
        };
        let root = Url::parse(&format!("s3://{bucket}/")).map_err(|e| e.to_string())?;
        ctx.runtime_env().register_object_store(&root, store);
        Ok(())
    }

    /// Registers `source` in `ctx` as table `name`, once checked. Runs on the engine's runtime: a database's
    /// connections live there.
    ///
    /// # Errors
    /// Why the source cannot be read (not allowed, unreachable, no files, not its format).
    pub(crate) async fn register(
        &self,
        ctx: &SessionContext,
        name: &str,
        source: &ExternalSource,
        storage_bucket: Option<&Url>,
        storage_projects: &Url,
    ) -> Result<(), Unreadable> {
        let table = TableReference::bare(name);
        match source {
            ExternalSource::Files { url: raw, format } => {
                let url = self.check(raw, storage_bucket, storage_projects).map_err(Unreadable::Refused)?;
                self.register_store(ctx, &url, storage_bucket).map_err(Unreadable::Failed)?;
                // A prefix holds the files of the format's extension; one file is read whatever its name.
                let ext = if url.path().ends_with('/') { extension(*format) } else { "" };
                let registered = match format {
                    TableFormat::Parquet => {
                        let options = ParquetReadOptions { file_extension: ext, ..Default::default() };
                        ctx.register_parquet(table, url.as_str(), options).await
                    }
                    TableFormat::Csv => {
                        let options = CsvReadOptions::new().has_header(true).file_extension(ext);
                        ctx.register_csv(table, url.as_str(), options).await
                    }
                    TableFormat::NdJson => {
                        let options = JsonReadOptions::default().file_extension(ext);
                        ctx.register_json(table, url.as_str(), options).await
                    }
                };
                registered.map_err(|e| unreadable(raw, &url, &e))
            }
            ExternalSource::Delta { url: raw } => {
                let (provider, _) = self.delta_table(ctx, raw, storage_bucket, storage_projects).await?;
                ctx.register_table(table, provider)
                    .map(|_| ())
                    .map_err(|e| Unreadable::Failed(crate::message(&e)))
            }
            ExternalSource::Postgres { url, table: remote } => {
                let url = self.check(url, storage_bucket, storage_projects).map_err(Unreadable::Refused)?;
                let provider = self.postgres_table(&url, remote).await.map_err(Unreadable::Failed)?;
                ctx.register_table(table, provider)
                    .map(|_| ())
                    .map_err(|e| Unreadable::Failed(crate::message(&e)))
            }
        }
    }

    /// The same sources, checking an external Delta table for a newer version at most once per `every`.
    pub(crate) fn refreshing_delta_every(mut self, every: Duration) -> Self {
        self.delta_refresh = every;
        self
    }

    /// The Delta table at the folder `raw` names, once allowed: a provider reading its newest version (within
    /// the refresh interval), and that version's files. The table is read with the store `ctx` reads its folder
    /// with, so a local table's files are confined as any source's are.
    ///
    /// # Errors
    /// Why the table cannot be read: not allowed, not a Delta table, a reader feature this server lacks, or the
    /// storage failing.
    pub(crate) async fn delta_table(
        &self,
        ctx: &SessionContext,
        raw: &str,
        storage_bucket: Option<&Url>,
        storage_projects: &Url,
    ) -> Result<(Arc<dyn TableProvider>, tables_delta::Snapshot), Unreadable> {
        // A Delta table is a folder, however the URL ends.
        let folder = if raw.ends_with('/') { raw.to_owned() } else { format!("{raw}/") };
        let url = self.check(&folder, storage_bucket, storage_projects).map_err(Unreadable::Refused)?;
        self.register_store(ctx, &url, storage_bucket).map_err(Unreadable::Failed)?;
        let cannot = |why: String| format!("cannot read the Delta table {}: {why}", shown_raw(raw));
        let table = {
            let mut kept = self.delta.lock().unwrap_or_else(PoisonError::into_inner);
            match kept.get(url.as_str()) {
                Some(table) => Arc::clone(table),
                None => {
                    let root = datafusion::execution::object_store::ObjectStoreUrl::parse(
                        &url[..url::Position::BeforePath],
                    )
                    .map_err(|e| Unreadable::Failed(cannot(crate::message(&e))))?;
                    let store = ctx
                        .runtime_env()
                        .object_store(&root)
                        .map_err(|e| Unreadable::Failed(cannot(crate::message(&e))))?;
                    let table = ExternalTable::new(store, &url, self.delta_refresh)
                        .map_err(|e| Unreadable::Failed(cannot(e.to_string())))?;
                    if kept.len() >= KEPT_DELTA_TABLES {
                        kept.retain(|_, table| Arc::strong_count(table) > 1);
                    }
                    let table = Arc::new(table);
                    kept.insert(url.to_string(), Arc::clone(&table));
                    table
                }
            }
        };
        table.read().await.map_err(|err| {
            // The server's own spelling of the folder (a confined path) is never shown.
            let why = err.to_string().replace(url.as_str(), raw);
            match err {
                CommitError::NoTable(_) => {
                    Unreadable::Refused(cannot("no Delta table is there (no _delta_log/)".into()))
                }
                CommitError::Columns { reason, .. } => Unreadable::Refused(cannot(reason)),
                CommitError::Storage { source, .. } if refused_store(source.as_ref()) => {
                    Unreadable::Refused(cannot(first_line(&source.to_string()).to_owned()))
                }
                _ => Unreadable::Failed(cannot(why)),
            }
        })
    }

    async fn postgres_table(&self, url: &Url, table: &str) -> Result<Arc<dyn TableProvider>, Refusal> {
        let cell = {
            let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
            Arc::clone(pools.entry(url.to_string()).or_default())
        };
        let pool = cell
            .get_or_try_init(|| async {
                let pool = PostgresConnectionPool::new(postgres_params(url)?).await.map_err(|e| {
                    format!("cannot connect to {}: {}", shown(url), first_line(&e.to_string()))
                })?;
                Ok::<_, Refusal>(Arc::new(pool.with_io_runtime(tokio::runtime::Handle::current())))
            })
            .await?;
        PostgresTableFactory::new(Arc::clone(pool)).table_provider(TableReference::from(table)).await.map_err(
            |e| format!("cannot read table {table} of {}: {}", shown(url), first_line(&e.to_string())),
        )
    }

    /// The files a files source reads now, and the object store they are in (`ctx`'s, in which the source is
    /// registered).
    ///
    /// # Errors
    /// Why they cannot be listed.
    pub(crate) async fn files(
        &self,
        ctx: &SessionContext,
        raw: &str,
        format: TableFormat,
        storage_bucket: Option<&Url>,
        storage_projects: &Url,
    ) -> Result<(Arc<dyn ObjectStore>, Vec<object_store::ObjectMeta>), Unreadable> {
        use futures_util::TryStreamExt;
        let url = self.check(raw, storage_bucket, storage_projects).map_err(Unreadable::Refused)?;
        let failed = |e: datafusion::error::DataFusionError| unreadable(raw, &url, &e);
        self.register_store(ctx, &url, storage_bucket).map_err(Unreadable::Failed)?;
        let listing =
            datafusion::datasource::listing::ListingTableUrl::parse(url.as_str()).map_err(failed)?;
        let store = ctx.runtime_env().object_store(listing.object_store()).map_err(failed)?;
        let ext = if url.path().ends_with('/') { extension(format) } else { "" };
        let state = ctx.state();
        let found = listing.list_all_files(&state, store.as_ref(), ext).await.map_err(failed)?;
        let files = found.try_collect().await.map_err(failed)?;
        Ok((store, files))
    }
}

/// Why the files at `url` (the source `raw`, as checked) cannot be read, naming them as the tenant wrote them,
/// never as the server reads them.
fn unreadable(raw: &str, url: &Url, err: &datafusion::error::DataFusionError) -> Unreadable {
    let why = crate::message(err).replace(url.as_str(), raw);
    let text = format!("cannot read {}: {why}", shown_raw(raw));
    if refused_file(err) {
        Unreadable::Refused(text)
    } else {
        Unreadable::Failed(text)
    }
}

/// The extension of a prefix's files of `format`.
pub(crate) fn extension(format: TableFormat) -> &'static str {
    match format {
        TableFormat::Parquet => ".parquet",
        TableFormat::Csv => ".csv",
        TableFormat::NdJson => ".ndjson",
    }
}

/// How long the S3 client keeps retrying a failed request: an unreachable storage is reported within about a
/// second instead of after the client's default of three minutes.
pub(crate) fn retries() -> object_store::RetryConfig {
    object_store::RetryConfig {
        max_retries: 3,
        retry_timeout: std::time::Duration::from_secs(10),
        ..object_store::RetryConfig::default()
    }
}

/// The provider's messages add advice on lines of their own; the first line says what happened.
fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or(text).trim()
}

/// The pool's parameters from a `postgres://` URL: host, port, user, password, database, `sslmode` (the
/// provider's default, `verify-full`, when the URL has none), and read-only sessions.
fn postgres_params(url: &Url) -> Result<HashMap<String, SecretString>, Refusal> {
    let decode = |raw: &str| {
        percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map(|s| s.into_owned())
            .map_err(|e| e.to_string())
    };
    let mut params = HashMap::new();
    let mut set = |key: &str, value: String| {
        params.insert(key.to_owned(), SecretString::from(value));
    };
    set("host", url.host_str().unwrap_or("localhost").to_owned());
    set("port", url.port().unwrap_or(5432).to_string());
    if !url.username().is_empty() {
        set("user", decode(url.username())?);
    }
    if let Some(password) = url.password() {
        set("pass", decode(password)?);
    }
    let database = segments(url);
    match database.as_slice() {
        [] => {}
        [database] => set("db", decode(database)?),
        _ => return Err(format!("{} names more than a database.", shown(url))),
    }
    for (key, value) in url.query_pairs() {
        match key.as_ref() {
            "sslmode" | "sslrootcert" | "application_name" => set(&key, value.into_owned()),
            other => return Err(format!("Unknown parameter '{other}' in a PostgreSQL URL: use sslmode.")),
        }
    }
    set("options", "-c default_transaction_read_only=on".into());
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(raw: &str) -> Url {
        Url::parse(raw).unwrap()
    }

    #[test]
    fn a_url_is_read_only_under_the_storages_bucket_or_an_allowed_prefix() {
        let sources = Sources::allowing(
            &["s3://lake/exports".into(), "postgres://reader:pw@db:5432/analytics?sslmode=require".into()],
            None,
        )
        .unwrap();
        let bucket = url("s3://store/");
        let projects = url("s3://store/root/projects/");
        let check = |raw: &str| sources.check(raw, Some(&bucket), &projects);
        for ok in [
            "s3://lake/exports/",
            "s3://lake/exports/2026/orders.parquet",
            "s3a://lake/exports/x/",
            "s3://store/incoming/",
            "s3://store/root/other/",
            "postgres://db/analytics",
            "postgresql://me:mine@db:5432/analytics?sslmode=verify-full",
        ] {
            assert!(check(ok).is_ok(), "{ok}: {:?}", check(ok));
        }
        for (refused, why) in [
            ("s3://lake/exportsx/", "not under"),
            ("s3://lake/", "not under"),
            ("s3://other/exports/", "not under"),
            ("s3://store/root/projects/1/tables/t/", "projects/"),
            ("s3://store/root/projects", "projects/"),
            ("s3://lake/exports/../secrets/", "not under"),
            ("s3://lake/exports/%2e%2e/secrets/", "not under"),
            ("s3://lake/exports/x%2F..%2F..%2Fsecrets/", "plain"),
            ("s3://lake/exports/x%5C..%5Csecrets/", "plain"),
            ("s3://lake/exports//x/", "plain"),
            ("s3://lake/exports/x#y", "plain"),
            ("s3://lake/exports/x?versionId=1", "no query"),
            ("s3://key:secret@lake/exports/", "no query"),
            ("file:///etc/passwd", "not under"),
            ("http://lake/exports/", "not http"),
            ("postgres://db/other", "not under"),
            ("postgres://db:5433/analytics", "not under"),
            ("postgres://elsewhere/analytics", "not under"),
            ("not a url", "not a URL"),
        ] {
            let err = check(refused).unwrap_err();
            assert!(err.contains(why), "{refused}: {err}");
        }
        assert!(!check("postgres://x:hunter2@db/other").unwrap_err().contains("hunter2"));
        // A database URL without credentials takes the allowing prefix's; one with its own keeps them.
        let with = check("postgres://db/analytics").unwrap();
        assert_eq!((with.username(), with.password()), ("reader", Some("pw")));
        let own = check("postgres://me:mine@db/analytics").unwrap();
        assert_eq!((own.username(), own.password()), ("me", Some("mine")));
        // Without an S3 storage, only the allowed prefixes are sources.
        let local = sources.check("s3://store/incoming/", None, &url("file:///var/lib/endpoints/projects/"));
        assert!(local.unwrap_err().contains("not under"));
        assert!(Sources::allowing(&["http://x/".into()], None).is_err());
        assert!(Sources::allowing(&["nope".into()], None).is_err());
        assert!(Sources::allowing(&["postgres://db/x?sslmode=sometimes".into()], None).is_err());
    }

    /// The storage's projects/ area however a URL spells it: the object store decodes percent-encoding, and
    /// an S3-compatible store or a case-insensitive disk may read another case as the same key.
    #[test]
    fn the_projects_area_is_unreachable_however_it_is_spelled() {
        let sources = Sources::allowing(&["s3://store/".into()], None).unwrap();
        let bucket = url("s3://store/");
        let projects = url("s3://store/root/projects/");
        for spelled in [
            "s3://store/root/project%73/2/tables/secret/",
            "s3://store/root/%70rojects/2/tables/secret/",
            "s3://store/r%6Fot/projects/2/",
            "s3://store/root/PROJECTS/2/tables/secret/",
            "s3://STORE/root/projects/2/",
            "s3a://store/root/Projects/",
            "s3://store/root/x/../projects/2/",
            "s3://store/root/x/%2E%2E/projects/2/",
            "s3://store/root/projects%2F2/tables/",
        ] {
            for (storage_bucket, why) in [(Some(&bucket), "projects/"), (None, "projects/")] {
                let err = sources.check(spelled, storage_bucket, &projects).unwrap_err();
                assert!(err.contains(why), "{spelled}: {err}");
            }
        }
        // What is read is the normalised URL, the one that was checked.
        let read = sources.check("s3a://STORE/inc%6Fming/a%20b/", Some(&bucket), &projects).unwrap();
        assert_eq!(read.as_str(), "s3://store/incoming/a%20b/");
    }

    #[test]
    fn local_files_are_checked_on_their_canonical_path() {
        let boxed = crate::tests::temp_dir("qe-box");
        let data = boxed.join("data");
        let lake = crate::tests::temp_dir("qe-lake");
        let outside = crate::tests::temp_dir("qe-outside");
        let table = data.join("projects/2/tables/secret/v1");
        std::fs::create_dir_all(&table).unwrap();
        std::fs::write(table.join("a.csv"), "secret\n1\n").unwrap();
        std::fs::write(lake.join("ok.csv"), "a\n1\n").unwrap();
        std::fs::write(outside.join("x.csv"), "a\n1\n").unwrap();
        std::os::unix::fs::symlink(data.join("projects"), lake.join("to-projects")).unwrap();
        std::os::unix::fs::symlink(outside.join("x.csv"), lake.join("to-outside.csv")).unwrap();
        std::os::unix::fs::symlink("/etc", lake.join("etc")).unwrap();
        let data_dir = std::fs::canonicalize(&data).unwrap();
        // The operator allowed the lake, and (carelessly) a prefix over the data directory too.
        let parent = boxed.display().to_string();
        let sources = Sources::allowing(
            &[format!("file://{}/", lake.display()), format!("file://{parent}/")],
            Some(&data_dir),
        )
        .unwrap();
        let projects = Url::from_directory_path(data_dir.join("projects")).unwrap();
        let check = |raw: String| sources.check(&raw, None, &projects);
        let ok = check(format!("file://{}/ok.csv", lake.display())).unwrap();
        assert!(ok.as_str().starts_with(confined::ROOT) && ok.as_str().ends_with("/ok.csv"), "{ok}");
        let name = "data";
        let spelled_name = "dat%61";
        for (raw, why) in [
            (format!("file://{}/to-projects/2/tables/secret/", lake.display()), "to-projects is not under"),
            (format!("file://{}/to-outside.csv", lake.display()), "not under"),
            (format!("file://{}/etc/passwd", lake.display()), "not under"),
            (format!("file://{parent}/x/../{name}/projects/"), "projects/"),
            (format!("file://{parent}/{name}/project%73/2/tables/secret/"), "projects/"),
            (format!("file://{parent}/{spelled_name}/projects/2/"), "projects/"),
            (format!("file://{parent}/{name}/PROJECTS/2/"), "projects/"),
            (format!("file://{parent}/{name}/"), "not under"),
            (format!("file://{}/missing.csv", lake.display()), "does not exist"),
        ] {
            let err = check(raw.clone()).unwrap_err();
            assert!(err.contains(why), "{raw}: {err}");
            assert!(
                !err.contains("qe-box") || raw.contains("qe-box"),
                "a refusal names where a link leads: {err}"
            );
        }
    }

    #[test]
    fn a_database_url_cannot_lower_the_operators_tls() {
        let strict = Sources::allowing(&["postgres://op:pw@db/app".into()], None).unwrap();
        let relaxed = Sources::allowing(&["postgres://op:pw@db/app?sslmode=prefer".into()], None).unwrap();
        let projects = url("s3://store/projects/");
        let check = |sources: &Sources, raw: &str| sources.check(raw, None, &projects);
        for weaker in ["disable", "allow", "prefer", "require", "verify-ca"] {
            let err = check(&strict, &format!("postgres://db/app?sslmode={weaker}")).unwrap_err();
            assert!(err.contains("weaker") && !err.contains("pw"), "{weaker}: {err}");
            // Not with the tenant's own credentials either: the rule is the operator's.
            assert!(check(&strict, &format!("postgres://me:mine@db/app?sslmode={weaker}")).is_err());
        }
        let mode = |url: Url| url.query_pairs().find(|(k, _)| k == "sslmode").map(|(_, v)| v.into_owned());
        assert_eq!(mode(check(&strict, "postgres://db/app").unwrap()).as_deref(), Some("verify-full"));
        assert!(check(&relaxed, "postgres://db/app?sslmode=disable").is_err());
        assert_eq!(mode(check(&relaxed, "postgres://db/app").unwrap()).as_deref(), Some("prefer"));
        let stricter = check(&relaxed, "postgres://db/app?sslmode=verify-full&application_name=x").unwrap();
        assert_eq!(mode(stricter).as_deref(), Some("verify-full"));
        let err = check(&strict, "postgres://db/app?sslrootcert=/tmp/mine.pem").unwrap_err();
        assert!(err.contains("operator"), "{err}");
        assert!(check(&strict, "postgres://db/app?sslmode=bogus").is_err());
    }

    #[test]
    fn database_parameters_come_from_the_url() {
        let params = postgres_params(&url("postgres://me:p%40ss@db:6543/app?sslmode=disable")).unwrap();
        let get = |key: &str| secrecy::ExposeSecret::expose_secret(&params[key]).to_owned();
        assert_eq!(
            [get("host"), get("port"), get("user"), get("pass"), get("db"), get("sslmode")],
            ["db", "6543", "me", "p@ss", "app", "disable"].map(String::from)
        );
        assert!(get("options").contains("default_transaction_read_only=on"));
        assert!(postgres_params(&url("postgres://db/app?host=evil")).is_err());
        assert!(postgres_params(&url("postgres://db/app/x")).is_err());
        assert_eq!(shown(&url("postgres://me:secret@db/app")), "postgres://me@db/app");
    }
}
