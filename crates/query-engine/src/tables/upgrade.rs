//! `migrate`'s part for tables: every table an earlier release wrote becomes a Delta table in place, its rows
//! neither lost nor doubled.
//!
//! Earlier releases kept a table as Parquet files and a `_current` object naming where its rows were: a version's
//! directory (`v-{uuid}/`, one line, then the table's creation time on a second, then the full files of `full/`
//! that compactions wrote, one per line), or an external source (`external`, the time, the source as JSON). The
//! first release kept the Parquet files directly under the table's prefix, without `_current`. A table is
//! converted by one commit of a new Delta log that adds exactly the files `_current` names (in the folders where
//! they are: nothing is copied), with the creation time it kept; then `_current` and the versions nothing names
//! are removed. A table that has a Delta log is left as it is, so `migrate` may run again, or be cut off and run
//! again, at any point.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::Schema;
use datafusion::datasource::physical_plan::parquet::metadata::DFParquetMetadata;
use domain::{EngineError, ExternalSource, ProjectId};
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectMeta, ObjectStoreExt};
use tables_delta::NewFile;

use crate::storage::{unavailable, Storage};
use crate::tables::catalog::{is_table_name, table_error, tables_prefix, SourceRecord};

/// The object naming an earlier release's table version.
const CURRENT: &str = "_current";

/// Where an earlier release's `_current` said a table's rows were.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Pointed {
    /// A version's directory and the full files (names in `full/`).
    Version {
        version: String,
        full: Vec<String>,
    },
    Source(ExternalSource),
}

/// An earlier release's pointer: what it names and the table's creation time (milliseconds), if it kept one.
fn parse_pointer(text: &str) -> Option<(Pointed, Option<i64>)> {
    let mut lines = text.lines().map(str::trim);
    let first = lines.next()?;
    let created = lines
        .next()
        .and_then(|line| domain::Timestamp::parse(line, &time::format_description::well_known::Rfc3339).ok())
        .and_then(|at| i64::try_from(at.unix_timestamp_nanos() / 1_000_000).ok());
    if first == "external" {
        let record: SourceRecord = serde_json::from_str(lines.next()?).ok()?;
        return Some((Pointed::Source(record.source()?), created));
    }
    let id = first.strip_prefix("v-")?;
    uuid::Uuid::parse_str(id).ok()?;
    let mut full = Vec::new();
    for name in lines.filter(|line| !line.is_empty()) {
        if !name.ends_with(".parquet") || name.contains('/') || name.starts_with('.') {
            return None;
        }
        full.push(name.to_owned());
    }
    Some((Pointed::Version { version: first.to_owned(), full }, created))
}

/// What `migrate` did to the tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TablesUpgraded {
    /// Tables of an earlier layout now Delta tables.
    pub converted: Vec<String>,
}

/// Converts every table of every project that is not a Delta table yet.
///
/// # Errors
/// `Unavailable` when the storage cannot be read or written; `Internal` for a `_current` that names nothing.
pub(crate) async fn upgrade(storage: &Storage) -> Result<TablesUpgraded, EngineError> {
    let mut done = TablesUpgraded::default();
    let projects = storage.children(&ObjectPath::from("projects")).await.map_err(unavailable)?;
    for project in projects {
        let Some(project) = project.parse::<i64>().ok().and_then(|id| ProjectId::new(id).ok()) else {
            continue;
        };
        for name in storage.children(&tables_prefix(project)).await.map_err(unavailable)? {
            if !is_table_name(&name) {
                continue;
            }
            let prefix = tables_prefix(project).join(name.as_str());
            if convert(storage, &prefix).await? {
                tracing::info!(%project, table = name, "converted a table into a Delta table");
                done.converted.push(format!("{project}/{name}"));
            }
        }
    }
    Ok(done)
}

/// Converts one table; `false` when it is a Delta table already, or no table (nothing of it to convert).
async fn convert(storage: &Storage, prefix: &ObjectPath) -> Result<bool, EngineError> {
    let tables = storage.tables();
    if tables.exists(prefix).await.map_err(table_error)? {
        return Ok(false);
    }
    let pointer_path = prefix.clone().join(CURRENT);
    let pointed = match storage.store().get(&pointer_path).await {
        Ok(found) => {
            let bytes = found.bytes().await.map_err(unavailable)?;
            let text = String::from_utf8_lossy(&bytes);
            let parsed = parse_pointer(&text).ok_or_else(|| {
                EngineError::Internal(format!("{pointer_path} names no table version or source").into())
            })?;
            Some(parsed)
        }
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => return Err(unavailable(e)),
    };
    let (files, properties, created_ms) = match pointed {
        Some((Pointed::Source(source), created)) => (Vec::new(), SourceRecord::properties(&source), created),
        Some((Pointed::Version { version, full }, created)) => {
            let mut files = parquet_under(storage, &prefix.clone().join(version.as_str())).await?;
            let full_dir = prefix.clone().join("full");
            for name in full {
                let meta =
                    storage.store().head(&full_dir.clone().join(name.as_str())).await.map_err(unavailable)?;
                files.push(meta);
            }
            (files, HashMap::new(), created)
        }
        // The first layout: the Parquet files directly under the prefix (none: no table at all).
        None => {
            let loose = parquet_under(storage, prefix).await?;
            if loose.is_empty() {
                return Ok(false);
            }
            let created = loose.iter().map(|m| m.last_modified.timestamp_millis()).min();
            (loose, HashMap::new(), created)
        }
    };
    let mut schema = Schema::empty();
    let mut added = Vec::with_capacity(files.len());
    for (i, meta) in files.iter().enumerate() {
        let footer = DFParquetMetadata::new(storage.store().as_ref(), meta);
        let metadata = footer.fetch_metadata().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
        if i == 0 {
            let read = footer.fetch_schema().await.map_err(|e| EngineError::Internal(Box::new(e)))?;
            schema = crate::tables::imports::plain(&Arc::new(read)).as_ref().clone();
        }
        let rows = u64::try_from(metadata.file_metadata().num_rows()).unwrap_or(0);
        let modified_ms = meta.last_modified.timestamp_millis();
        added.push(NewFile { location: meta.location.clone(), size: meta.size, rows, modified_ms });
    }
    let created_ms = created_ms.or_else(|| Some(storage.now_ms()));
    // Created only if no other process (a node starting at the same time) converted it meanwhile.
    if tables.create(prefix, &schema, &added, &properties, created_ms).await.map_err(table_error)?.is_none() {
        return Ok(false);
    }
    // The table is a Delta table now; what the earlier layout kept beside its files goes.
    let named: Vec<&ObjectPath> = added.iter().map(|f| &f.location).collect();
    remove_leftovers(storage, prefix, &named).await;
    Ok(true)
}

/// The Parquet files directly in `dir`, in name order.
async fn parquet_under(storage: &Storage, dir: &ObjectPath) -> Result<Vec<ObjectMeta>, EngineError> {
    let mut files: Vec<ObjectMeta> = storage
        .objects(dir)
        .await
        .map_err(unavailable)?
        .into_iter()
        .filter(|o| o.location.extension() == Some("parquet"))
        .collect();
    files.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(files)
}

/// Removes `_current`, the versions and full files the converted table does not read, and the marks the earlier
/// compactions kept; a failure leaves them, unread, for a later look.
async fn remove_leftovers(storage: &Storage, prefix: &ObjectPath, named: &[&ObjectPath]) {
    let mut leftovers = vec![prefix.clone().join(CURRENT)];
    let listed: Result<Vec<ObjectMeta>, _> = storage.store().list(Some(prefix)).try_collect().await;
    match listed {
        Ok(all) => leftovers.extend(all.into_iter().map(|o| o.location).filter(|location| {
            let in_log =
                location.parts().nth(prefix.parts().count()).is_some_and(|p| p.as_ref() == "_delta_log");
            let top_level = location.parts().count() == prefix.parts().count() + 1;
            !in_log && !top_level && !named.contains(&location)
        })),
        Err(err) => {
            tracing::warn!(table = %prefix, error = %err, "cannot list a converted table's old files")
        }
    }
    if let Err(err) = storage.delete(leftovers).await {
        tracing::warn!(table = %prefix, error = %err, "cannot remove a converted table's old files");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pointer_shape_of_earlier_releases_reads() {
        let id = "v-6f1c3d5e-8b5a-4a2e-9a53-5b2d1f7e9c01";
        let version = |full: &[&str]| Pointed::Version {
            version: id.into(),
            full: full.iter().map(|name| (*name).to_owned()).collect(),
        };
        assert_eq!(parse_pointer(id), Some((version(&[]), None)));
        let created = Some(1_764_151_200_000);
        assert_eq!(parse_pointer(&format!("{id}\n2025-11-26T10:00:00Z\n")), Some((version(&[]), created)));
        let listed = format!("{id}\n2025-11-26T10:00:00Z\nf-1.parquet\nf-2.parquet\n");
        assert_eq!(parse_pointer(&listed), Some((version(&["f-1.parquet", "f-2.parquet"]), created)));
        let untimed = format!("{id}\n\nf-1.parquet\n");
        assert_eq!(parse_pointer(&untimed), Some((version(&["f-1.parquet"]), None)));
        let source = "external\n2025-11-26T10:00:00Z\n{\"url\":\"s3://b/p/\",\"format\":\"csv\"}\n";
        let expected = ExternalSource::Files { url: "s3://b/p/".into(), format: domain::TableFormat::Csv };
        assert_eq!(parse_pointer(source), Some((Pointed::Source(expected), created)));
        for bad in ["v-nope", "other", &format!("{id}\n\n../x.parquet\n"), "external\n\n{}\n"] {
            assert_eq!(parse_pointer(bad), None, "{bad:?}");
        }
    }
}
