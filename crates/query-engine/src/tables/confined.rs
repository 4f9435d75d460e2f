//! The object store external `file://` sources are read through: read-only, and confined to the folders the
//! operator allowed.
//!
//! A source's URL is checked on its canonical path when a table is registered and again at each query (see
//! `sources`), but a folder's files are found by listing it, and a listing follows symbolic links: a link inside
//! an allowed folder to another project's tables, or to `/etc`, would be read as one of its files. Here every
//! object is resolved to its canonical path before it is read or listed, and one that resolves outside the
//! allowed folders, or inside the server's own data directory, is refused. What is opened is the canonical
//! path, so a link swapped after the check is not followed either.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// The URL scheme and host DataFusion reads confined files under (`source-file://local/srv/data/a.csv`): not
/// `file://`, whose store reads the storage's own files without these checks.
pub(crate) const ROOT: &str = "source-file://local/";

/// Which folders files may resolve into.
#[derive(Debug, Clone, Default)]
pub(crate) struct Confinement {
    /// The folders the operator allowed (`--allow-source file:///...`), as configured.
    allowed: Vec<PathBuf>,
    /// The server's data directory, canonical: never a source, whatever an allowed folder covers.
    refused: Option<PathBuf>,
}

impl Confinement {
    pub(crate) fn new(allowed: Vec<PathBuf>, refused: Option<PathBuf>) -> Self {
        Self { allowed, refused }
    }

    /// The canonical path of `path`, when it exists and resolves inside an allowed folder and outside the data
    /// directory; else why not, in words for the tenant (which never name where a link leads).
    pub(crate) fn resolve(&self, path: &Path) -> std::result::Result<PathBuf, String> {
        self.resolve_or_missing(path).map_err(Unresolved::into_reason)
    }

    /// [`Confinement::resolve`], telling a file that is not there in a folder that may be read
    /// ([`Unresolved::Missing`], as a store answers "not found") from one that may not be read at all: readers
    /// of a table format ask for files that may not exist (Delta's `_last_checkpoint`).
    fn resolve_or_missing(&self, path: &Path) -> std::result::Result<PathBuf, Unresolved> {
        let real = match std::fs::canonicalize(path) {
            Ok(real) => real,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let missing = format!("{} does not exist.", path.display());
                // Only where its folder may be read: elsewhere, whether a file exists is not told either.
                return match path.parent().map(|folder| self.resolve_or_missing(folder)) {
                    Some(Ok(_)) => Err(Unresolved::Missing(missing)),
                    _ => Err(Unresolved::Refused(missing)),
                };
            }
            Err(_) => return Err(Unresolved::Refused(format!("cannot read {}.", path.display()))),
        };
        self.check(path, real).map_err(|(shown, why)| Unresolved::Left { shown, why })
    }

    /// `real` (the canonical form of `path`), when it is inside an allowed folder and outside the data
    /// directory. A refusal names the first part of `path` that leads elsewhere (a link, not the files behind it),
    /// and says the same whether it leads into the data directory or anywhere else, so that it tells nothing of
    /// where the data directory is.
    fn check(&self, path: &Path, real: PathBuf) -> std::result::Result<PathBuf, (String, String)> {
        if self.may_read(&real) {
            return Ok(real);
        }
        // The part after the deepest one that may be read: where the path leaves the allowed folders.
        let mut ancestors: Vec<&Path> = path.ancestors().collect();
        ancestors.reverse();
        let mut shown = path;
        let mut inside = false;
        for part in ancestors {
            let readable = std::fs::canonicalize(part).is_ok_and(|real| self.may_read(&real));
            if inside && !readable {
                shown = part;
                break;
            }
            inside |= readable;
        }
        let shown = shown.display().to_string();
        let why = format!(
            "{shown} is not under a source this server allows (a prefix the operator allowed with --allow-source; \
             symbolic links are followed to where they lead)."
        );
        Err((shown, why))
    }

    /// Whether a canonical path is inside an allowed folder and outside the data directory.
    fn may_read(&self, real: &Path) -> bool {
        if self.refused.as_ref().is_some_and(|data| real.starts_with(data)) {
            return false;
        }
        // An allowed folder may itself be a link: it is compared as it resolves now.
        self.allowed
            .iter()
            .filter_map(|folder| std::fs::canonicalize(folder).ok())
            .any(|folder| real.starts_with(folder))
    }
}

/// Why a path is not read.
enum Unresolved {
    /// Nothing is there, in a folder that may be read.
    Missing(String),
    /// It may not be read (or it is not there, in a folder that may not be read).
    Refused(String),
    /// It leads out of the allowed folders at `shown` (a link, named instead of the files behind it).
    Left { shown: String, why: String },
}

impl Unresolved {
    fn into_reason(self) -> String {
        match self {
            Self::Missing(why) | Self::Refused(why) | Self::Left { why, .. } => why,
        }
    }
}

/// Local files, read-only, each resolved and checked by a [`Confinement`] before it is read or listed.
#[derive(Debug)]
pub(crate) struct ConfinedFiles {
    files: LocalFileSystem,
    confinement: Arc<Confinement>,
}

impl std::fmt::Display for ConfinedFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ConfinedFiles")
    }
}

impl ConfinedFiles {
    pub(crate) fn new(confinement: Confinement) -> Self {
        Self { files: LocalFileSystem::new(), confinement: Arc::new(confinement) }
    }

    /// The object's canonical location, once checked.
    async fn resolve(
        files: &LocalFileSystem,
        confinement: &Arc<Confinement>,
        location: &ObjectPath,
    ) -> Result<ObjectPath> {
        let path = files.path_to_filesystem(location)?;
        let confinement = Arc::clone(confinement);
        let shown = location.to_string();
        let real = tokio::task::spawn_blocking(move || confinement.resolve_or_missing(&path))
            .await
            .map_err(|e| object_store::Error::Generic { store: "ConfinedFiles", source: Box::new(e) })?
            .map_err(|unresolved| match unresolved {
                Unresolved::Missing(why) => object_store::Error::NotFound { path: shown, source: why.into() },
                Unresolved::Left { shown, why } => {
                    object_store::Error::PermissionDenied { path: shown, source: why.into() }
                }
                Unresolved::Refused(why) => {
                    object_store::Error::PermissionDenied { path: shown, source: why.into() }
                }
            })?;
        Ok(ObjectPath::from_absolute_path(real)?)
    }

    async fn checked(&self, location: &ObjectPath) -> Result<ObjectPath> {
        Self::resolve(&self.files, &self.confinement, location).await
    }
}

fn read_only() -> object_store::Error {
    object_store::Error::NotSupported { source: "external sources are read, never written".into() }
}

#[async_trait]
impl ObjectStore for ConfinedFiles {
    async fn put_opts(&self, _: &ObjectPath, _: PutPayload, _: PutOptions) -> Result<PutResult> {
        Err(read_only())
    }

    async fn put_multipart_opts(
        &self,
        _: &ObjectPath,
        _: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        Err(read_only())
    }

    async fn get_opts(&self, location: &ObjectPath, options: GetOptions) -> Result<GetResult> {
        let real = self.checked(location).await?;
        let mut result = self.files.get_opts(&real, options).await?;
        // The object is known by the name it was listed as, which a link's target does not have.
        result.meta.location = location.clone();
        Ok(result)
    }

    async fn get_ranges(&self, location: &ObjectPath, ranges: &[Range<u64>]) -> Result<Vec<Bytes>> {
        let real = self.checked(location).await?;
        self.files.get_ranges(&real, ranges).await
    }

    fn delete_stream(
        &self,
        locations: BoxStream<'static, Result<ObjectPath>>,
    ) -> BoxStream<'static, Result<ObjectPath>> {
        locations.map(|_| Err(read_only())).boxed()
    }

    fn list(&self, prefix: Option<&ObjectPath>) -> BoxStream<'static, Result<ObjectMeta>> {
        let files = Arc::new(LocalFileSystem::new());
        let confinement = Arc::clone(&self.confinement);
        self.files
            .list(prefix)
            .and_then(move |meta| {
                let (files, confinement) = (Arc::clone(&files), Arc::clone(&confinement));
                async move {
                    Self::resolve(&files, &confinement, &meta.location).await?;
                    Ok(meta)
                }
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&ObjectPath>) -> Result<ListResult> {
        let listed = self.files.list_with_delimiter(prefix).await?;
        for meta in &listed.objects {
            self.checked(&meta.location).await?;
        }
        Ok(listed)
    }

    async fn copy_opts(&self, _: &ObjectPath, _: &ObjectPath, _: CopyOptions) -> Result<()> {
        Err(read_only())
    }
}
