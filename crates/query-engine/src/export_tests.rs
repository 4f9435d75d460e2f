//! Pages written as CSV, NDJSON, Parquet and Arrow, read back with real readers.

use std::collections::BTreeMap;

use bytes::Bytes;
use datafusion::arrow::array::{Int64Array, StringArray};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use domain::{Export, QueryEngine, ResultFormat};
use futures_util::StreamExt;
use serde_json::json;

use crate::tests::{engine_with_events, query};

async fn body(export: Export) -> Vec<u8> {
    let chunks: Vec<Bytes> = export.body.map(|c| c.unwrap()).collect().await;
    chunks.concat()
}

async fn export(limit: u32, format: ResultFormat) -> (Export, Vec<u8>) {
    let (engine, _dir) = engine_with_events().await;
    let q = query("SELECT country, revenue FROM events ORDER BY revenue", json!({}));
    let mut export = engine
        .export(domain::ProjectId::new(1).unwrap(), &q, &BTreeMap::new(), limit, 0, format)
        .await
        .unwrap();
    let chunks: Vec<Bytes> = std::mem::replace(&mut export.body, Box::pin(futures_util::stream::empty()))
        .map(|c| c.unwrap())
        .collect()
        .await;
    (export, chunks.concat())
}

#[tokio::test]
async fn csv_and_ndjson_pages_hold_the_rows_and_say_whether_more_follow() {
    let (all, csv) = export(10, ResultFormat::Csv).await;
    assert_eq!(String::from_utf8(csv.clone()).unwrap(), "country,revenue\nUS,10\nFR,20\n");
    assert_eq!((all.rows, all.has_more, all.bytes), (2, false, csv.len() as u64));
    assert_eq!(all.columns.len(), 2);
    let (first, csv) = export(1, ResultFormat::Csv).await;
    assert_eq!(
        (String::from_utf8(csv).unwrap().as_str(), first.rows, first.has_more),
        ("country,revenue\nUS,10\n", 1, true)
    );
    let (_, ndjson) = export(10, ResultFormat::NdJson).await;
    let lines: Vec<serde_json::Value> =
        String::from_utf8(ndjson).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines, [json!({"country": "US", "revenue": 10}), json!({"country": "FR", "revenue": 20})]);
}

#[tokio::test]
async fn parquet_and_arrow_pages_read_back_as_the_same_rows() {
    let (_, parquet) = export(10, ResultFormat::Parquet).await;
    let reader = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(parquet)).unwrap().build().unwrap();
    let batches: Vec<_> = reader.map(|b| b.unwrap()).collect();
    let countries = batches[0].column(0).as_any().downcast_ref::<StringArray>().unwrap();
    let revenue = batches[0].column(1).as_any().downcast_ref::<Int64Array>().unwrap();
    assert_eq!((countries.value(0), revenue.value(1), batches[0].num_rows()), ("US", 20, 2));

    let (_, arrow) = export(10, ResultFormat::Arrow).await;
    let reader = StreamReader::try_new(std::io::Cursor::new(arrow), None).unwrap();
    let rows: usize = reader.map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(rows, 2);
}

#[tokio::test]
async fn the_same_page_has_the_same_digest() {
    let (a, _) = export(10, ResultFormat::Csv).await;
    let (b, _) = export(10, ResultFormat::Csv).await;
    let (c, _) = export(1, ResultFormat::Csv).await;
    assert_eq!(a.digest.len(), 32);
    assert_eq!(a.digest, b.digest);
    assert_ne!(a.digest, c.digest);
}

#[tokio::test]
async fn an_empty_page_still_says_its_columns() {
    let (engine, _dir) = engine_with_events().await;
    let q = query("SELECT country, revenue FROM events WHERE revenue > 1000", json!({}));
    let export = engine
        .export(domain::ProjectId::new(1).unwrap(), &q, &BTreeMap::new(), 10, 0, ResultFormat::Csv)
        .await
        .unwrap();
    assert_eq!((export.rows, export.has_more), (0, false));
    assert_eq!(String::from_utf8(body(export).await).unwrap(), "country,revenue\n");
}

/// A page waiting for a slow reader holds its size of the spool (at most half of it per project), not its
/// project's query slot, and no page is written past the export limit: slow readers of large exports can neither
/// fill the disk nor stop a project's queries, nor keep another project's pages out.
#[tokio::test]
async fn an_export_gives_its_slot_back_once_written_and_holds_its_bytes_of_the_spool_until_sent() {
    let (_, dir) = engine_with_events().await;
    let limits = crate::EngineLimits {
        max_concurrent_per_project: 1,
        export_bytes: 64 * 1024,
        export_spool_bytes: 128 * 1024,
        ..crate::EngineLimits::default()
    };
    let engine = crate::DataFusionEngine::new(crate::Storage::local(&dir).unwrap()).with_limits(limits);
    let project = domain::ProjectId::new(1).unwrap();
    let none = BTreeMap::new();
    let small = query("SELECT country, revenue FROM events ORDER BY revenue", json!({}));
    let held = engine.export(project, &small, &none, 10, 0, ResultFormat::Csv).await.unwrap();
    // Its rows are computed: the project's one slot is free while the page waits for its reader.
    engine.execute(project, &small, &none, 10, 0).await.unwrap();
    // A page of about 34 KiB fits in the project's half of the spool beside it; a second one does not until the
    // first is sent, while another project's page still fits: one project's slow readers never take it all.
    let half = query("SELECT v, repeat('x', 30) AS pad FROM generate_series(1, 1000) AS t(v)", json!({}));
    let first = engine.export(project, &half, &none, 1000, 0, ResultFormat::Csv).await.unwrap();
    assert!(first.bytes > 32 * 1024, "{} bytes", first.bytes);
    let refused = engine.export(project, &half, &none, 1000, 0, ResultFormat::Csv).await.unwrap_err();
    assert!(matches!(refused, domain::EngineError::Busy { .. }), "{refused:?}");
    let another = domain::ProjectId::new(2).unwrap();
    let theirs = engine.export(another, &half, &none, 1000, 0, ResultFormat::Csv).await;
    assert!(theirs.is_ok(), "{:?}", theirs.err());
    drop(theirs);
    engine.execute(project, &small, &none, 10, 0).await.unwrap();
    let size = first.bytes;
    assert_eq!(body(first).await.len() as u64, size, "the whole page is sent");
    let second = engine.export(project, &half, &none, 1000, 0, ResultFormat::Csv).await.unwrap();
    drop(second);
    assert!(!body(held).await.is_empty());
    let large = query("SELECT v, repeat('x', 100) AS pad FROM generate_series(1, 100000) AS t(v)", json!({}));
    for format in [ResultFormat::Csv, ResultFormat::NdJson, ResultFormat::Parquet, ResultFormat::Arrow] {
        let err = engine.export(project, &large, &none, 100_000, 0, format).await.unwrap_err();
        assert!(
            matches!(err, domain::EngineError::ResultTooLarge { limit_bytes: 65_536 }),
            "{format:?}: {err:?}"
        );
    }
    engine.execute(project, &small, &none, 10, 0).await.unwrap();
}

/// A page of no rows (a `force_cache` export with nothing stored) is planned, not run: each format has the
/// query's columns, and a query that fails on its rows does not fail.
#[tokio::test]
async fn a_page_of_no_rows_has_the_columns_and_runs_nothing() {
    let (engine, _dir) = engine_with_events().await;
    let project = domain::ProjectId::new(1).unwrap();
    let failing = query("SELECT country, revenue / (revenue - 10) AS r FROM events", json!({}));
    let ran = engine.export(project, &failing, &BTreeMap::new(), 10, 0, ResultFormat::Csv).await;
    assert!(ran.is_err(), "the query divides by zero on its first row");
    let none = BTreeMap::new();
    let page = |format| engine.export(project, &failing, &none, 0, 0, format);

    let csv = page(ResultFormat::Csv).await.unwrap();
    assert_eq!((csv.rows, csv.has_more), (0, false));
    assert_eq!(String::from_utf8(body(csv).await).unwrap(), "country,r\n");
    assert_eq!(body(page(ResultFormat::NdJson).await.unwrap()).await, b"");
    let parquet = ParquetRecordBatchReaderBuilder::try_new(Bytes::from(
        body(page(ResultFormat::Parquet).await.unwrap()).await,
    ))
    .unwrap();
    let names: Vec<_> = parquet.schema().fields().iter().map(|f| f.name().clone()).collect();
    assert_eq!(
        (names, parquet.metadata().file_metadata().num_rows()),
        (vec!["country".to_owned(), "r".into()], 0)
    );
    let arrow = StreamReader::try_new(
        std::io::Cursor::new(body(page(ResultFormat::Arrow).await.unwrap()).await),
        None,
    )
    .unwrap();
    assert_eq!(arrow.schema().fields().len(), 2);
    assert_eq!(arrow.map(|b| b.unwrap().num_rows()).sum::<usize>(), 0);
}
