//! A body larger than what is held in memory, written to disk as it arrives: however slowly clients send
//! their bodies, and however many do at once, the server holds about a megabyte of each.
//!
//! On a local storage the body goes straight to its staging object, a part of [`PART_BYTES`] at a time (the
//! local store writes each part into the object's file as it comes). An object storage takes parts of 5 MiB at
//! least, which a slow client would hold in memory for as long as it takes to send them: there the body goes to
//! a temporary file of this machine first (`tempfile`: unlinked at once, mode 0600), and is sent to the staging
//! object once it has all arrived.

use std::io::SeekFrom;
use std::sync::Arc;

use bytes::Bytes;
use object_store::buffered::BufWriter;
use object_store::path::Path as ObjectPath;
use object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};

use crate::storage::Storage;

/// The bytes of a body held in memory at most while it is written to disk.
const PART_BYTES: usize = 1 << 20;

/// The bytes read from a temporary file at a time when it is sent to an object storage.
const SEND_BYTES: usize = 8 << 20;

/// Where a body is written as it arrives.
pub(crate) enum Spool {
    /// The staging object itself, on a local storage.
    Direct(BufWriter),
    /// A temporary file, sent to the staging object at `path` once whole.
    File { file: tokio::fs::File, store: Arc<dyn ObjectStore>, path: ObjectPath },
}

impl Spool {
    /// A spool for the staging object at `path`.
    ///
    /// # Errors
    /// A temporary file that cannot be made.
    pub(crate) fn new(storage: &Storage, path: ObjectPath) -> Result<Self, object_store::Error> {
        let store = Arc::clone(storage.store());
        if storage.is_local() {
            return Ok(Self::Direct(BufWriter::with_capacity(store, path, PART_BYTES)));
        }
        let file = tempfile::tempfile().map_err(io)?;
        Ok(Self::File { file: tokio::fs::File::from_std(file), store, path })
    }

    /// Writes the next chunk of the body.
    ///
    /// # Errors
    /// The storage's, or the disk's.
    pub(crate) async fn put(&mut self, chunk: Bytes) -> Result<(), object_store::Error> {
        match self {
            Self::Direct(writer) => writer.put(chunk).await,
            Self::File { file, .. } => file.write_all(&chunk).await.map_err(io),
        }
    }

    /// Makes the staging object whole.
    ///
    /// # Errors
    /// The storage's, or the disk's.
    pub(crate) async fn finish(self) -> Result<(), object_store::Error> {
        match self {
            Self::Direct(mut writer) => writer.shutdown().await.map_err(io),
            Self::File { mut file, store, path } => {
                file.flush().await.map_err(io)?;
                file.seek(SeekFrom::Start(0)).await.map_err(io)?;
                let mut writer = BufWriter::new(store, path);
                let mut buffer = vec![0; SEND_BYTES];
                loop {
                    let read = file.read(&mut buffer).await.map_err(io)?;
                    if read == 0 {
                        break;
                    }
                    if let Err(err) = writer.put(Bytes::copy_from_slice(&buffer[..read])).await {
                        // An object storage keeps no object of an upload that is not completed.
                        let _ = writer.abort().await;
                        return Err(err);
                    }
                }
                writer.shutdown().await.map_err(io)
            }
        }
    }

    /// Leaves nothing of the body behind.
    ///
    /// # Errors
    /// The storage's.
    pub(crate) async fn abort(self) -> Result<(), object_store::Error> {
        match self {
            Self::Direct(mut writer) => writer.abort().await,
            // The file was never linked: closing it frees it.
            Self::File { .. } => Ok(()),
        }
    }
}

fn io(err: std::io::Error) -> object_store::Error {
    object_store::Error::Generic { store: "spool", source: Box::new(err) }
}
