//! A page of rows written as CSV, NDJSON, Parquet or Arrow IPC.
//!
//! The page is written batch by batch, as the engine produces it, to a temporary file through a writer that
//! counts and digests the bytes: memory holds a batch (and Parquet's current row group), not the page. Once the
//! page is whole its size, its digest (the answer's `ETag`) and whether rows follow it are known, so they can
//! go in the response's headers; the file is then read from its start as the body is sent. The file has no
//! name (`tempfile`: `O_TMPFILE`, or unlinked at once where that is missing, mode 0600): no other process can
//! open it, and it is gone when the body is, however the answer ends.

use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::csv;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::ipc::writer::StreamWriter;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use datafusion::prelude::SessionContext;
use domain::{BoundValue, EngineError, Export, ProjectId, Query, ResultFormat};
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::compile;
use crate::tables::imports::plain;
use crate::types::cast_to;
use crate::{execute, types, DataFusionEngine};

/// Rows per Parquet row group: what the writer holds in memory before it writes them out.
const PARQUET_ROW_GROUP: usize = 64 * 1024;

/// Bytes read from the file per chunk of the body.
const CHUNK: usize = 64 * 1024;

/// Counts and digests what goes through it, and refuses to go past `limit` bytes (noting that in `over`, since
/// the writers in front of it report its error as their own).
struct Digesting<W> {
    inner: W,
    digest: Sha256,
    bytes: u64,
    limit: u64,
    over: Arc<AtomicBool>,
}

impl<W: Write> Write for Digesting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes + buf.len() as u64 > self.limit {
            self.over.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("the page is over the export limit"));
        }
        let written = self.inner.write(buf)?;
        self.digest.update(&buf[..written]);
        self.bytes += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

type Sink = Digesting<BufWriter<std::fs::File>>;

/// A writer of one format.
enum Rows {
    Csv(csv::Writer<Sink>),
    NdJson(arrow_json::LineDelimitedWriter<Sink>),
    Parquet(ArrowWriter<Sink>),
    Arrow(StreamWriter<Sink>),
}

fn internal(err: impl std::error::Error + Send + Sync + 'static) -> EngineError {
    EngineError::Internal(Box::new(err))
}

impl Rows {
    fn create(format: ResultFormat, sink: Sink, schema: &SchemaRef) -> Result<Self, EngineError> {
        Ok(match format {
            ResultFormat::Csv => Self::Csv(csv::WriterBuilder::new().with_header(true).build(sink)),
            ResultFormat::NdJson => Self::NdJson(arrow_json::LineDelimitedWriter::new(sink)),
            ResultFormat::Parquet => {
                let props =
                    WriterProperties::builder().set_max_row_group_row_count(Some(PARQUET_ROW_GROUP)).build();
                Self::Parquet(ArrowWriter::try_new(sink, Arc::clone(schema), Some(props)).map_err(internal)?)
            }
            ResultFormat::Arrow | ResultFormat::Json => {
                Self::Arrow(StreamWriter::try_new(sink, schema).map_err(internal)?)
            }
        })
    }

    fn write(&mut self, batch: &RecordBatch) -> Result<(), EngineError> {
        match self {
            Self::Csv(writer) => writer.write(batch).map_err(internal),
            Self::NdJson(writer) => writer.write(batch).map_err(internal),
            Self::Parquet(writer) => writer.write(batch).map_err(internal),
            Self::Arrow(writer) => writer.write(batch).map_err(internal),
        }
    }

    fn finish(self) -> Result<Sink, EngineError> {
        let mut sink = match self {
            Self::Csv(writer) => writer.into_inner(),
            Self::NdJson(mut writer) => {
                writer.finish().map_err(internal)?;
                writer.into_inner()
            }
            Self::Parquet(writer) => writer.into_inner().map_err(internal)?,
            Self::Arrow(mut writer) => {
                writer.finish().map_err(internal)?;
                writer.into_inner().map_err(internal)?
            }
        };
        sink.flush().map_err(internal)?;
        Ok(sink)
    }
}

/// `export` with its body holding `room` of the spool until it is sent (or the reader goes).
fn holding(mut export: Export, room: impl Send + Sync + 'static) -> Export {
    export.body = Box::pin(export.body.map(move |chunk| {
        let _held = &room;
        chunk
    }));
    export
}

impl DataFusionEngine {
    /// A written page, its query's `slot` given back (the rows are computed) and its file's size taken from the
    /// spool until its body is sent or dropped: a slow client holds disk, never the project's queries.
    ///
    /// # Errors
    /// [`EngineError::Busy`] when the pages being sent leave too little room now (the file is dropped).
    pub(crate) fn spooled(
        &self,
        project: ProjectId,
        export: Export,
        slot: crate::admission::Slot,
    ) -> Result<Export, EngineError> {
        let room = self.admission.spool(project, export.bytes, slot)?;
        Ok(holding(export, room))
    }
}

/// The file's bytes in chunks, from where it stands, read off the async threads.
fn read_body(file: std::fs::File) -> BoxStream<'static, Result<Bytes, std::io::Error>> {
    Box::pin(futures_util::stream::unfold(Some(file), |file| async move {
        let mut file = file?;
        let read = tokio::task::spawn_blocking(move || {
            let mut chunk = vec![0; CHUNK];
            let n = file.read(&mut chunk)?;
            chunk.truncate(n);
            Ok::<_, std::io::Error>((chunk, file))
        })
        .await;
        match read {
            Ok(Ok((chunk, _))) if chunk.is_empty() => None,
            Ok(Ok((chunk, file))) => Some((Ok(Bytes::from(chunk)), Some(file))),
            Ok(Err(err)) => Some((Err(err), None)),
            Err(err) => Some((Err(std::io::Error::other(err)), None)),
        }
    }))
}

impl DataFusionEngine {
    pub(crate) async fn export_here(
        &self,
        project: ProjectId,
        query: &Query,
        variables: &BTreeMap<String, BoundValue>,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError> {
        let compiled = compile::compile(query);
        let values = execute::parameter_values(&compiled, variables)?;
        let (ctx, unbound) = self.live_plan(project, &compiled).await?;
        let plan = crate::bind(unbound, values)?;
        self.partition_for(&ctx, &plan);
        self.write_plan(project, &ctx, plan, limit, offset, format).await
    }

    /// The page `offset..offset+limit` of a planned query's rows, written in `format` to a temporary file.
    pub(crate) async fn write_plan(
        &self,
        project: ProjectId,
        ctx: &SessionContext,
        plan: datafusion::logical_expr::LogicalPlan,
        limit: u32,
        offset: u64,
        format: ResultFormat,
    ) -> Result<Export, EngineError> {
        let columns = types::columns(plan.schema().as_arrow());
        // A page of no rows is written from the plan's schema: nothing runs.
        let planned: SchemaRef = Arc::new(plan.schema().as_arrow().clone());
        let mut running = match limit {
            0 => None,
            _ => {
                let plan = execute::window(plan, limit, offset)?;
                let frame = ctx.execute_logical_plan(plan).await.map_err(execute::execution_error)?;
                Some(self.execute_fairly(project, frame).await?)
            }
        };
        let schema = plain(&running.as_ref().map_or(planned, |(stream, _held)| stream.schema()));

        let file = tempfile::tempfile().map_err(internal)?;
        let over = Arc::new(AtomicBool::new(false));
        let cap = self.limits.export_bytes;
        let too_large = |err: EngineError| match over.load(Ordering::Relaxed) {
            true => EngineError::ResultTooLarge { limit_bytes: usize::try_from(cap).unwrap_or(usize::MAX) },
            false => err,
        };
        let sink = Digesting {
            inner: BufWriter::new(file),
            digest: Sha256::new(),
            bytes: 0,
            limit: cap,
            over: Arc::clone(&over),
        };
        let mut rows = Rows::create(format, sink, &schema).map_err(too_large)?;
        // A CSV page has its header row, and every format its schema, with no rows as well.
        rows.write(&RecordBatch::new_empty(Arc::clone(&schema))).map_err(too_large)?;
        let (mut written, mut has_more) = (0_u64, false);
        while let Some(batch) = match running.as_mut() {
            Some((stream, _held)) => stream.next().await,
            None => None,
        } {
            let batch = batch.map_err(execute::execution_error)?;
            // The window fetched one row past the page, to tell whether more follow: it is not written.
            let room = usize::try_from(u64::from(limit) - written).unwrap_or(usize::MAX);
            let batch = if batch.num_rows() > room {
                has_more = true;
                batch.slice(0, room)
            } else {
                batch
            };
            if batch.num_rows() > 0 {
                rows.write(&cast_to(&batch, &schema).map_err(internal)?).map_err(too_large)?;
                written += batch.num_rows() as u64;
            }
            if has_more {
                break;
            }
        }
        let sink = rows.finish().map_err(too_large)?;
        let (bytes, digest) = (sink.bytes, hex::encode(&sink.digest.finalize()[..16]));
        let mut file = sink.inner.into_inner().map_err(|e| internal(e.into_error()))?;
        file.seek(SeekFrom::Start(0)).map_err(internal)?;
        Ok(Export { columns, rows: written, has_more, bytes, digest, body: read_body(file) })
    }
}
