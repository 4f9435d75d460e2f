//! External sources: rows a table reads where they are, without copying them.
//!
//! - Files (Parquet, CSV with a header, NDJSON) under a URL: anywhere in the storage's own bucket except its
//!   `projects/` area (every project's tables and stored results), or under a prefix the operator allowed with
//!   `--allow-source` (`s3://bucket/prefix/`, `file:///dir/`). Other buckets are read with the same `AWS_*`
//!   credentials as the storage.
//! - A PostgreSQL table, through the `datafusion-table-providers` provider, of a database the operator allowed
//!   (`--allow-source postgres://[user:password@]host[:port]/database`). A URL without credentials uses those of
//!   the prefix that allows it, so callers need not know them. Connections are read-only
//!   (`default_transaction_read_only`), and TLS is verified unless the URL's `sslmode` says otherwise.
//!
//! A URL is checked when a table is registered and again each time a query reads it, so a prefix the operator
//! no longer allows stops being read at the next restart.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::file_format::options::JsonReadOptions;
use datafusion::prelude::{CsvReadOptions, ParquetReadOptions, SessionContext};
use datafusion_table_providers_postgres::pool::PostgresConnectionPool;
use datafusion_table_providers_postgres::PostgresTableFactory;
use domain::{ExternalSource, TableFormat};
use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use secrecy::SecretString;
use tokio::sync::OnceCell;
use url::Url;

/// Why a source cannot be used, for the person who named it.
pub(crate) type Refusal = String;

/// The prefixes the operator allowed, and the clients of the buckets and databases tables read.
#[derive(Default)]
pub(crate) struct Sources {
    allowed: Vec<Url>,
    /// Object stores of buckets other than the storage's, by bucket.
    buckets: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// Connection pools, by database URL (with its credentials); each made once, by the first query.
    pools: Mutex<HashMap<String, Arc<OnceCell<Arc<PostgresConnectionPool>>>>>,
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

/// The URL's path as its segments, without empty ones (so `s3://b/p` and `s3://b/p/` are the same prefix).
fn segments(url: &Url) -> Vec<&str> {
    url.path().split('/').filter(|s| !s.is_empty()).collect()
}

/// The URL's port, or its scheme's (PostgreSQL's is 5432).
fn port(url: &Url) -> Option<u16> {
    url.port_or_known_default().or_else(|| (scheme(url) == "postgres").then_some(5432))
}

/// Whether `url` is `prefix` or below it: same scheme, host and port, and `prefix`'s path segments first.
fn within(url: &Url, prefix: &Url) -> bool {
    let (path, under) = (segments(url), segments(prefix));
    scheme(url) == scheme(prefix)
        && url.host_str() == prefix.host_str()
        && port(url) == port(prefix)
        && path.len() >= under.len()
        && path.iter().zip(&under).all(|(a, b)| a == b)
}

/// The URL for people: without its password.
pub(crate) fn shown(url: &Url) -> String {
    let mut url = url.clone();
    let _ = url.set_password(None);
    url.to_string()
}

/// The URL as stored, for people: without its password, or as it is when it does not parse.
pub(crate) fn shown_raw(raw: &str) -> String {
    Url::parse(raw).map_or_else(|_| raw.to_owned(), |url| shown(&url))
}

/// A URL a source may use: a scheme this engine reads, no encoded separators, no fragment, and for files no
/// query and no credentials.
fn parse(raw: &str) -> Result<Url, Refusal> {
    let url = Url::parse(raw).map_err(|e| format!("'{}' is not a URL: {e}.", shown_raw(raw)))?;
    let files = match scheme(&url) {
        "s3" | "file" => true,
        "postgres" => false,
        other => {
            return Err(format!("A source is read from s3://, file:// or postgres:// URLs, not {other}://."))
        }
    };
    // Parsing resolves `.` and `..` segments (encoded too); an encoded separator would hide one from that.
    let path = url.path().to_ascii_lowercase();
    let hidden = ["%2f", "%5c", "\\"].iter().any(|sep| path.contains(sep));
    if hidden || url.fragment().is_some() {
        return Err(format!("'{}' is not a plain URL: no encoded '/' or '\\', no '#'.", shown(&url)));
    }
    if files && (url.query().is_some() || !url.username().is_empty() || url.password().is_some()) {
        return Err("A file URL carries no query and no credentials: the operator configures those.".into());
    }
    if scheme(&url) == "s3" && url.host_str().is_none_or(str::is_empty) {
        return Err("An s3:// URL names its bucket: s3://bucket/prefix/.".into());
    }
    Ok(url)
}

impl Sources {
    /// The prefixes `--allow-source` gave.
    ///
    /// # Errors
    /// A message naming a prefix that is not an `s3://`, `file://` or `postgres://` URL.
    pub(crate) fn allowing(prefixes: &[String]) -> Result<Self, String> {
        let mut allowed = Vec::new();
        for raw in prefixes {
            let url =
                Url::parse(raw).map_err(|e| format!("--allow-source {}: not a URL: {e}", shown_raw(raw)))?;
            if !matches!(scheme(&url), "s3" | "file" | "postgres") {
                return Err(format!(
                    "--allow-source {}: use s3://, file:// or postgres:// URLs",
                    shown(&url)
                ));
            }
            allowed.push(url);
        }
        Ok(Self { allowed, ..Self::default() })
    }

    /// The URL a source reads, once allowed: files in `storage_bucket` (the storage's `s3://bucket/`) outside
    /// `storage_projects` (its `projects/` area), or anything under an allowed prefix. A database URL without
    /// credentials takes those of the prefix that allows it.
    ///
    /// # Errors
    /// Why the URL may not be read.
    pub(crate) fn check(
        &self,
        raw: &str,
        storage_bucket: Option<&Url>,
        storage_projects: &Url,
    ) -> Result<Url, Refusal> {
        let mut url = parse(raw)?;
        if within(&url, storage_projects) {
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
        if scheme(&url) == "postgres" && url.username().is_empty() && !prefix.username().is_empty() {
            let _ = url.set_username(prefix.username());
            let _ = url.set_password(prefix.password());
        }
        Ok(url)
    }

    /// Makes `ctx` read `url`'s bucket when it is not the storage's (which every session reads already).
    fn register_bucket(
        &self,
        ctx: &SessionContext,
        url: &Url,
        storage_bucket: Option<&Url>,
    ) -> Result<(), Refusal> {
        if scheme(url) != "s3" || storage_bucket.is_some_and(|bucket| within(url, bucket)) {
            return Ok(());
        }
        let bucket = url.host_str().unwrap_or_default().to_owned();
        let store = {
            let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
            match buckets.get(&bucket) {
                Some(store) => Arc::clone(store),
                None => {
                    let store: Arc<dyn ObjectStore> = Arc::new(
                        AmazonS3Builder::from_env()
                            .with_bucket_name(&bucket)
                            .with_retry(crate::storage::retries())
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
    ) -> Result<(), Refusal> {
        let table = TableReference::bare(name);
        match source {
            ExternalSource::Files { url, format } => {
                let url = self.check(url, storage_bucket, storage_projects)?;
                self.register_bucket(ctx, &url, storage_bucket)?;
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
                registered.map_err(|e| format!("cannot read {}: {}", shown(&url), crate::message(&e)))
            }
            ExternalSource::Postgres { url, table: remote } => {
                let url = self.check(url, storage_bucket, storage_projects)?;
                let provider = self.postgres_table(&url, remote).await?;
                ctx.register_table(table, provider).map(|_| ()).map_err(|e| crate::message(&e))
            }
        }
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
}

/// The files a registered files source reads now, and the object store they are in (`ctx`'s).
///
/// # Errors
/// Why they cannot be listed.
pub(crate) async fn files(
    ctx: &SessionContext,
    url: &str,
    format: TableFormat,
) -> Result<(Arc<dyn ObjectStore>, Vec<object_store::ObjectMeta>), Refusal> {
    use futures_util::TryStreamExt;
    let failed = |e: datafusion::error::DataFusionError| {
        format!("cannot list {}: {}", shown_raw(url), crate::message(&e))
    };
    let listing = datafusion::datasource::listing::ListingTableUrl::parse(url).map_err(failed)?;
    let store = ctx.runtime_env().object_store(listing.object_store()).map_err(failed)?;
    let ext = if url.ends_with('/') { extension(format) } else { "" };
    let state = ctx.state();
    let found = listing.list_all_files(&state, store.as_ref(), ext).await.map_err(failed)?;
    let files = found.try_collect().await.map_err(failed)?;
    Ok((store, files))
}

/// The extension of a prefix's files of `format`.
pub(crate) fn extension(format: TableFormat) -> &'static str {
    match format {
        TableFormat::Parquet => ".parquet",
        TableFormat::Csv => ".csv",
        TableFormat::NdJson => ".ndjson",
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
        let sources = Sources::allowing(&[
            "s3://lake/exports".into(),
            "file:///srv/data/".into(),
            "postgres://reader:pw@db:5432/analytics".into(),
        ])
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
            "file:///srv/data/a.csv",
            "postgres://db/analytics",
            "postgresql://me:mine@db:5432/analytics?sslmode=disable",
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
            ("s3://lake/exports/x#y", "plain"),
            ("s3://lake/exports/x?versionId=1", "no query"),
            ("s3://key:secret@lake/exports/", "no query"),
            ("file:///srv/database/", "not under"),
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
        assert!(Sources::allowing(&["http://x/".into()]).is_err());
        assert!(Sources::allowing(&["nope".into()]).is_err());
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
