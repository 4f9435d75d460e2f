//! A table version as DataFusion reads it on this node: exactly the files its Delta log names, with the sizes
//! and times the log gives, so that a scan neither lists the storage nor asks it about each file (a `HEAD` per
//! file per run on S3). Each file's statistics come from its footer once per process (DataFusion's shared
//! statistics cache), as for any table of files. A run of a table's newest version reads the files kept decoded
//! in memory from there, and decodes the others in the background ([`crate::hot_tables`]).

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::stats::Precision;
use datafusion::common::Statistics;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::file_format::FileFormat;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder};
use datafusion::datasource::TableType;
use datafusion::execution::cache::cache_manager::CachedFileMetadata;
use datafusion::execution::cache::{SchemaFingerprint, TableScopedPath};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::ExecutionPlan;
use datafusion_datasource::compute_all_files_statistics;
use futures_util::{StreamExt, TryStreamExt};
use object_store::ObjectMeta;

use crate::hot_tables::{self, HotTable, HotTables};

/// The columns a scan must read beyond those its filters name for its files to be filtered while decoded: the
/// gate of apache/datafusion#23420, whose ClickBench run had pushdown everywhere 20 queries slower and 6 faster,
/// and 4 (within noise) and 5 with it.
const LATE_COLUMNS: usize = 3;

/// The decoded files a scan reads, and its table there.
pub(crate) type HotRead = (Arc<HotTables>, HotTable);

/// The files of one table version, read as one table of `schema`.
#[derive(Debug)]
pub(crate) struct SnapshotScan {
    schema: SchemaRef,
    fingerprint: Arc<SchemaFingerprint>,
    store: ObjectStoreUrl,
    files: Vec<ObjectMeta>,
    /// Its rows in all, when the log says for every file.
    rows: Option<u64>,
    format: Arc<dyn FileFormat>,
    /// Where its files are kept decoded, when they are (a read of the table's newest version), and that version.
    hot: Option<(HotRead, u64)>,
}

impl SnapshotScan {
    /// `files` are paths in the object store `store` names, with the sizes and modification times of the log,
    /// holding `rows` in all when the log says; `format` reads them with the session's options.
    pub(crate) fn new(
        schema: SchemaRef,
        store: ObjectStoreUrl,
        (files, rows): (Vec<ObjectMeta>, Option<u64>),
        format: Arc<dyn FileFormat>,
    ) -> Self {
        let fingerprint = Arc::new(SchemaFingerprint::from_schema(&schema));
        Self { schema, fingerprint, store, files, rows, format, hot: None }
    }

    /// The same scan, reading the files `hot` keeps decoded from memory, and having the others decoded: a read
    /// of the table's newest version, `version`.
    pub(crate) fn reading_decoded(mut self, hot: Option<HotRead>, version: u64) -> Self {
        self.hot = hot.map(|hot| (hot, version));
        self
    }

    /// `file` with its statistics: kept from an earlier scan of the same file and columns, else read from its
    /// footer (itself cached) and kept.
    async fn with_statistics(
        &self,
        state: &dyn Session,
        store: &Arc<dyn object_store::ObjectStore>,
        file: &ObjectMeta,
    ) -> datafusion::common::Result<PartitionedFile> {
        let cache = state.runtime_env().cache_manager.get_file_statistic_cache();
        let key = TableScopedPath { table: None, path: file.location.clone() };
        let kept = cache.as_ref().and_then(|cache| cache.get(&key));
        let (statistics, ordering) = match kept.filter(|kept| kept.is_valid_for(file, &self.fingerprint)) {
            Some(kept) => (kept.statistics, kept.ordering),
            None => {
                let read = self
                    .format
                    .infer_stats_and_ordering(state, store, Arc::clone(&self.schema), file)
                    .await?;
                let statistics = Arc::new(read.statistics);
                if let Some(cache) = &cache {
                    let entry = CachedFileMetadata::new(
                        file.clone(),
                        Arc::clone(&self.fingerprint),
                        Arc::clone(&statistics),
                        read.ordering.clone(),
                    );
                    cache.put(&key, entry);
                }
                (statistics, read.ordering)
            }
        };
        Ok(PartitionedFile::new_from_meta(file.clone()).with_statistics(statistics).with_ordering(ordering))
    }
}

#[async_trait]
impl TableProvider for SnapshotScan {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    /// Its rows, as the log says: what plan rewrites weigh (the files' own statistics are the scan's).
    fn statistics(&self) -> Option<Statistics> {
        let rows = self.rows?;
        let mut statistics = Statistics::new_unknown(&self.schema);
        statistics.num_rows = Precision::Exact(usize::try_from(rows).ok()?);
        Some(statistics)
    }

    /// Filters reach the Parquet reader (row groups, pages and rows) through the physical plan; the rows they
    /// let through are filtered again above the scan.
    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> datafusion::common::Result<Vec<TableProviderFilterPushDown>> {
        Ok(vec![TableProviderFilterPushDown::Inexact; filters.len()])
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        if self.files.is_empty() {
            let schema = datafusion::common::project_schema(&self.schema, projection)?;
            return Ok(Arc::new(EmptyExec::new(schema)));
        }
        let format = self.format_for(projection, filters);
        let Some(((hot, table), version)) = &self.hot else {
            return self.scan_files(state, &self.files, &format, projection, limit).await;
        };
        let columns = projection.map(Vec::as_slice);
        let (decoded, stored) = hot.split(table, (&self.files, *version), columns);
        let mut scans = Vec::with_capacity(2);
        if !decoded.is_empty() {
            scans.push(hot_tables::scan(&decoded, &self.schema, state, (projection, filters, limit))?);
        }
        if !stored.is_empty() {
            scans.push(self.scan_files(state, &stored, &format, projection, limit).await?);
            for file in stored {
                let Some(columns) = hot.claim(table, (&file, *version), (&self.schema, columns)) else {
                    continue;
                };
                // The columns runs of the table read (this one's and earlier ones') that the file's kept ones
                // lack. Failing to plan it fails no run: the file is read from storage, as now.
                let one = std::slice::from_ref(&file);
                match self.scan_files(state, one, &self.format, Some(&columns), None).await {
                    Ok(plan) => hot.decode(
                        (table.project, file),
                        (Arc::clone(&self.schema), columns),
                        plan,
                        state.task_ctx(),
                    ),
                    Err(err) => hot.refuse(&file, &err),
                }
            }
        }
        UnionExec::try_new(scans)
    }
}

impl SnapshotScan {
    /// The format a scan of `projection` under `filters` reads its files with: the table's, filtering rows
    /// while decoding them (a Parquet row filter) when the scan reads at least [`LATE_COLUMNS`] columns its
    /// filters do not name. Those are then decoded only for the rows that pass; with fewer, evaluating the
    /// filter a second time inside the reader costs more than it saves, so they are decoded whole and
    /// filtered above the scan (the session's own setting, off).
    fn format_for(&self, projection: Option<&Vec<usize>>, filters: &[Expr]) -> Arc<dyn FileFormat> {
        let any: &dyn std::any::Any = self.format.as_ref();
        let late = match any.downcast_ref::<ParquetFormat>() {
            Some(parquet) if !filters.is_empty() && !parquet.options().global.pushdown_filters => parquet,
            _ => return Arc::clone(&self.format),
        };
        let filtered: HashSet<usize> = filters
            .iter()
            .flat_map(Expr::column_refs)
            .filter_map(|column| self.schema.index_of(&column.name).ok())
            .collect();
        let read = |at: &usize| !filtered.contains(at);
        let others = match projection {
            Some(projection) => projection.iter().filter(|at| read(at)).count(),
            None => (0..self.schema.fields().len()).filter(read).count(),
        };
        if others < LATE_COLUMNS {
            return Arc::clone(&self.format);
        }
        let mut options = late.options().clone();
        options.global.pushdown_filters = true;
        Arc::new(ParquetFormat::default().with_options(options))
    }

    /// A scan of `files` from storage, read by `format`.
    async fn scan_files(
        &self,
        state: &dyn Session,
        files: &[ObjectMeta],
        format: &Arc<dyn FileFormat>,
        projection: Option<&Vec<usize>>,
        limit: Option<usize>,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let options = state.config_options();
        let collect = options.execution.collect_statistics;
        let files = if collect {
            let store = state.runtime_env().object_store(&self.store)?;
            futures_util::stream::iter(0..files.len())
                .map(|at| self.with_statistics(state, &store, &files[at]))
                .buffered(options.execution.meta_fetch_concurrency.get())
                .try_collect::<Vec<_>>()
                .await?
        } else {
            let unknown = Arc::new(Statistics::new_unknown(&self.schema));
            let file = |meta: &ObjectMeta| {
                PartitionedFile::new_from_meta(meta.clone()).with_statistics(Arc::clone(&unknown))
            };
            files.iter().map(file).collect()
        };
        let ordering = common_ordering(&files);
        let groups = FileGroup::new(files).split_files(state.config().target_partitions());
        let (groups, statistics) = compute_all_files_statistics(groups, self.schema(), collect, false)?;
        let source = format.file_source(self.schema().into());
        let config = FileScanConfigBuilder::new(self.store.clone(), source)
            .with_file_groups(groups)
            .with_statistics(statistics)
            .with_projection_indices(projection.cloned())?
            .with_limit(limit)
            .with_output_ordering(ordering.into_iter().collect())
            .build();
        format.create_physical_plan(state, config).await
    }
}

/// The order every file says its rows are in, when they all say the same one.
fn common_ordering(files: &[PartitionedFile]) -> Option<datafusion::physical_expr::LexOrdering> {
    let first = files.first()?.ordering.clone()?;
    files.iter().all(|file| file.ordering.as_ref() == Some(&first)).then_some(first)
}
