//! How far an import has read its files: a local file system that counts the bytes read through it, so the
//! CLI shows a progress bar of bytes, whatever the format and however DataFusion reads it.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, GetResultPayload, ListResult, MultipartUpload, ObjectMeta,
    ObjectStore, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};

/// The local file system, counting the bytes of every read.
#[derive(Debug)]
pub(crate) struct CountingFiles {
    inner: LocalFileSystem,
    read: Arc<AtomicU64>,
}

impl CountingFiles {
    /// The file system, and the count of bytes read through it.
    pub(crate) fn new() -> (Self, Arc<AtomicU64>) {
        let read = Arc::new(AtomicU64::new(0));
        (Self { inner: LocalFileSystem::new(), read: Arc::clone(&read) }, read)
    }
}

impl fmt::Display for CountingFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counting({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for CountingFiles {
    async fn put_opts(&self, location: &Path, payload: PutPayload, opts: PutOptions) -> Result<PutResult> {
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    /// The bytes as a stream that counts them as they are read (a local read is otherwise a file handle).
    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        let got = self.inner.get_opts(location, options).await?;
        let (meta, range, attributes) = (got.meta.clone(), got.range.clone(), got.attributes.clone());
        let read = Arc::clone(&self.read);
        let counted = got
            .into_stream()
            .inspect(move |chunk| {
                if let Ok(bytes) = chunk {
                    read.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                }
            })
            .boxed();
        Ok(GetResult { payload: GetResultPayload::Stream(counted), meta, range, attributes })
    }

    async fn get_ranges(&self, location: &Path, ranges: &[Range<u64>]) -> Result<Vec<bytes::Bytes>> {
        let got = self.inner.get_ranges(location, ranges).await?;
        self.read.fetch_add(got.iter().map(|b| b.len() as u64).sum(), Ordering::Relaxed);
        Ok(got)
    }

    fn delete_stream(&self, locations: BoxStream<'static, Result<Path>>) -> BoxStream<'static, Result<Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

#[cfg(test)]
mod tests {
    use object_store::ObjectStoreExt;

    use super::*;

    #[tokio::test]
    async fn every_read_is_counted() {
        let dir = crate::tests::temp_dir("qe-counting");
        std::fs::write(dir.join("a.csv"), "x\n1\n2\n").unwrap();
        let (files, read) = CountingFiles::new();
        let path = Path::from_filesystem_path(dir.join("a.csv")).unwrap();
        assert_eq!(files.get(&path).await.unwrap().bytes().await.unwrap().len(), 6);
        assert_eq!(read.load(Ordering::Relaxed), 6);
        assert_eq!(files.get_range(&path, 0..2).await.unwrap().as_ref(), b"x\n");
        assert_eq!(files.get_ranges(&path, &[2..4, 4..6]).await.unwrap().len(), 2);
        assert_eq!(read.load(Ordering::Relaxed), 12);
    }
}
