//! Tables written from uploads on a real storage: every format, and every way an upload fails leaving the table
//! as it was and nothing staged.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use domain::{
    ColumnType, EngineError, ProjectId, QueryEngine, TableFormat, TableName, TableStore, Upload, UploadError,
    WriteMode,
};
use futures_util::stream;
use serde_json::{json, Value};

use crate::tests::temp_dir;
use crate::{DataFusionEngine, Storage};

fn project() -> ProjectId {
    ProjectId::new(1).unwrap()
}

fn sales() -> TableName {
    TableName::parse("sales").unwrap()
}

/// An upload of `body` in chunks of 7 bytes, so rows cross chunk boundaries.
pub(crate) fn upload(format: TableFormat, mode: WriteMode, body: &[u8]) -> Upload {
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        body.chunks(7).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    Upload {
        format,
        mode,
        body: Box::pin(stream::iter(chunks)),
        limit_bytes: 1 << 20,
        tag: None,
        quarantine: false,
    }
}

fn csv(body: &str) -> Upload {
    upload(TableFormat::Csv, WriteMode::Replace, body.as_bytes())
}

fn append_csv(body: &str) -> Upload {
    upload(TableFormat::Csv, WriteMode::Append, body.as_bytes())
}

async fn rows(engine: &DataFusionEngine, sql: &str) -> Value {
    let query = domain::Query::try_from(&json!({"kind": "SQLQuery", "query": sql})).unwrap();
    let result = engine.execute(project(), &query, &BTreeMap::new(), 1000, 0).await.unwrap();
    serde_json::from_str(&result.rows_json).unwrap()
}

/// No file is left in the staging area of the project.
fn nothing_staged(dir: &std::path::Path) {
    fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
        let entries = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_else(|_| Vec::new());
        entries
            .into_iter()
            .flat_map(|p: std::path::PathBuf| if p.is_dir() { files(&p) } else { vec![p] })
            .collect()
    }
    let left = files(&dir.join("projects/1/staging"));
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn invalid(result: Result<domain::Written, UploadError>) -> String {
    match result {
        Err(UploadError::Invalid(reason)) => reason,
        other => panic!("expected an invalid upload, got {other:?}"),
    }
}

async fn engine() -> (DataFusionEngine, crate::tests::TempDir) {
    let dir = temp_dir("qe-uploads");
    (DataFusionEngine::new(Storage::local(&dir).unwrap()), dir)
}

#[tokio::test]
async fn a_csv_replace_creates_the_table_and_a_second_replaces_it() {
    let (engine, dir) = engine().await;
    let written = engine.write(project(), &sales(), csv("country,amount\nUS,1.5\nFR,2\n")).await.unwrap();
    assert_eq!((written.rows, written.created), (2, true));
    let info = TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap();
    let columns: Vec<_> = info.columns.iter().map(|c| (c.name.as_str(), c.column_type)).collect();
    assert_eq!(columns, [("country", ColumnType::String), ("amount", ColumnType::Float)]);
    assert_eq!((info.row_count, info.source.format()), (Some(2), "parquet"));
    assert!(info.bytes > Some(0) && info.created_at <= info.updated_at);

    let again = engine.write(project(), &sales(), csv("country,amount\nDE,3\n")).await.unwrap();
    assert_eq!((again.rows, again.created), (1, false));
    assert_eq!(rows(&engine, "SELECT country FROM sales").await, json!([{"country": "DE"}]));
    let replaced = TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap();
    assert_eq!(replaced.created_at, info.created_at, "a replace keeps when the table was created");
    nothing_staged(&dir);
}

#[tokio::test]
async fn appends_add_rows_read_as_the_tables_types() {
    let (engine, dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,1.5\n")).await.unwrap();
    // `2` would infer as an integer on its own; it is read as the table's float.
    let added = engine.write(project(), &sales(), append_csv("country,amount\nFR,2\n")).await.unwrap();
    assert_eq!((added.rows, added.created), (1, false));
    let ndjson = upload(TableFormat::NdJson, WriteMode::Append, b"{\"country\": \"DE\", \"amount\": 4.25}\n");
    engine.write(project(), &sales(), ndjson).await.unwrap();
    assert_eq!(
        rows(&engine, "SELECT country, amount FROM sales ORDER BY country").await,
        json!([{"country": "DE", "amount": 4.25}, {"country": "FR", "amount": 2.0}, {"country": "US", "amount": 1.5}])
    );
    assert_eq!(TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap().row_count, Some(3));
    nothing_staged(&dir);
}

#[tokio::test]
async fn a_parquet_upload_keeps_its_types() {
    let (engine, _dir) = engine().await;
    let schema = Arc::new(Schema::new(vec![
        Field::new("country", DataType::Utf8, false),
        Field::new("amount", DataType::Float64, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            Arc::new(StringArray::from(vec!["US", "FR"])),
            Arc::new(Float64Array::from(vec![Some(1.0), None])),
        ],
    )
    .unwrap();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    engine
        .write(project(), &sales(), upload(TableFormat::Parquet, WriteMode::Replace, &bytes))
        .await
        .unwrap();
    let info = TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap();
    let nullable: Vec<_> = info.columns.iter().map(|c| c.nullable).collect();
    assert_eq!(nullable, [false, true]);
    let appended = upload(TableFormat::Parquet, WriteMode::Append, &bytes);
    assert_eq!(engine.write(project(), &sales(), appended).await.unwrap().rows, 2);
}

#[tokio::test]
async fn a_parquet_upload_with_columns_a_delta_table_cannot_have_is_refused_saying_which() {
    let (engine, dir) = engine().await;
    let schema = Arc::new(Schema::new(vec![Field::new("amount", DataType::Decimal256(40, 2), true)]));
    let amounts =
        datafusion::arrow::array::Decimal256Array::from(vec![None::<datafusion::arrow::datatypes::i256>])
            .with_precision_and_scale(40, 2)
            .unwrap();
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(amounts)]).unwrap();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    let refused =
        engine.write(project(), &sales(), upload(TableFormat::Parquet, WriteMode::Replace, &bytes)).await;
    let reason = invalid(refused);
    assert!(reason.contains("Decimal256(40, 2)") && !reason.contains("projects/"), "{reason}");
    assert!(TableStore::get(&engine, project(), &sales()).await.unwrap().is_none());
    nothing_staged(&dir);
}

#[tokio::test]
async fn a_failed_upload_leaves_the_table_as_it_was_and_nothing_staged() {
    let (engine, dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,1.5\n")).await.unwrap();
    let before = rows(&engine, "SELECT * FROM sales").await;

    let mismatch = invalid(engine.write(project(), &sales(), append_csv("country,price\nFR,2\n")).await);
    assert!(
        mismatch.contains("[country, amount]") && mismatch.contains("the body has 'price'"),
        "{mismatch}"
    );
    let bad_value =
        invalid(engine.write(project(), &sales(), append_csv("country,amount\nFR,2\nDE,lots\n")).await);
    assert!(bad_value.contains("lots") && !bad_value.contains("staging"), "{bad_value}");
    let ragged = invalid(engine.write(project(), &sales(), csv("country,amount\nUS,1,extra\n")).await);
    assert!(ragged.to_lowercase().contains("line") || ragged.contains("field"), "{ragged}");
    assert!(invalid(engine.write(project(), &sales(), csv("")).await).contains("empty"));

    let cut = Upload {
        format: TableFormat::Csv,
        mode: WriteMode::Replace,
        body: Box::pin(stream::iter(vec![
            Ok(Bytes::from_static(b"country,amount\nDE,")),
            Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "the client went away")),
        ])),
        limit_bytes: 1 << 20,
        tag: None,
        quarantine: false,
    };
    assert!(matches!(engine.write(project(), &sales(), cut).await, Err(UploadError::CutOff(_))));

    let mut big = csv(&format!("country,amount\n{}", "US,1\n".repeat(100)));
    big.limit_bytes = 64;
    assert!(matches!(
        engine.write(project(), &sales(), big).await,
        Err(UploadError::TooLarge { limit_bytes: 64 })
    ));

    let other = TableName::parse("missing").unwrap();
    assert!(matches!(
        engine.write(project(), &other, append_csv("a\n1\n")).await,
        Err(UploadError::NoSuchTable)
    ));
    assert!(TableStore::get(&engine, project(), &other).await.unwrap().is_none());

    assert_eq!(rows(&engine, "SELECT * FROM sales").await, before);
    nothing_staged(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_all_land() {
    let (engine, _dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,0\n")).await.unwrap();
    let appends: Vec<_> = (1..=12)
        .map(|i| {
            let engine = engine.clone();
            tokio::spawn(async move {
                engine.write(project(), &sales(), append_csv(&format!("country,amount\nUS,{i}\n"))).await
            })
        })
        .collect();
    for append in appends {
        append.await.unwrap().unwrap();
    }
    assert_eq!(
        rows(&engine, "SELECT count(*) AS n, sum(amount) AS total FROM sales").await,
        json!([{"n": 13, "total": 78}])
    );
}

#[tokio::test]
async fn tables_are_listed_by_name_and_deleted() {
    let (engine, _dir) = engine().await;
    for name in ["zeta", "alpha"] {
        engine.write(project(), &TableName::parse(name).unwrap(), csv("n\n1\n")).await.unwrap();
    }
    let listed: Vec<String> =
        TableStore::list(&engine, project()).await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    assert_eq!(listed, ["alpha", "zeta"]);
    let zeta = TableName::parse("zeta").unwrap();
    assert!(TableStore::delete(&engine, project(), &zeta).await.unwrap());
    assert!(!TableStore::delete(&engine, project(), &zeta).await.unwrap());
    assert_eq!(TableStore::list(&engine, project()).await.unwrap().len(), 1);
    let gone = domain::Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT * FROM zeta"})).unwrap();
    assert!(matches!(
        engine.execute(project(), &gone, &BTreeMap::new(), 10, 0).await,
        Err(EngineError::InvalidQuery(_))
    ));
}

/// An engine on a local storage that allows `file://{lake}/` as a source.
async fn engine_allowing(lake: &std::path::Path) -> (DataFusionEngine, crate::tests::TempDir) {
    engine_refreshing(lake, std::time::Duration::ZERO)
}

/// [`engine_allowing`], checking external Delta tables for new versions at most once per `refresh`.
fn engine_refreshing(
    lake: &std::path::Path,
    refresh: std::time::Duration,
) -> (DataFusionEngine, crate::tests::TempDir) {
    let dir = temp_dir("qe-sources");
    let allowed = format!("file://{}/", lake.display());
    let storage = Storage::local(&dir).unwrap().allowing_sources(&[allowed], refresh).unwrap();
    (DataFusionEngine::new(storage), dir)
}

fn files_source(url: String, format: TableFormat) -> domain::ExternalSource {
    domain::ExternalSource::Files { url, format }
}

fn rejected(result: Result<bool, UploadError>) -> String {
    match result {
        Err(UploadError::Rejected(invalid)) => {
            assert_eq!(invalid.attr.as_deref(), Some("source"), "{invalid:?}");
            invalid.detail
        }
        other => panic!("expected a refused source, got {other:?}"),
    }
}

#[tokio::test]
async fn a_table_reads_files_where_they_are_and_follows_them() {
    let lake = temp_dir("qe-lake");
    let orders = lake.join("orders");
    std::fs::create_dir_all(&orders).unwrap();
    std::fs::write(orders.join("2026-01.csv"), "country,amount\nUS,1.5\nFR,2\n").unwrap();
    std::fs::write(orders.join("notes.txt"), "not a table\n").unwrap();
    let (engine, _dir) = engine_allowing(&lake).await;
    let prefix = format!("file://{}/", orders.display());
    let created = engine.register(project(), &sales(), files_source(prefix.clone(), TableFormat::Csv)).await;
    assert!(created.unwrap(), "a new table");
    let info = TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap();
    assert_eq!((info.source.format(), info.row_count), ("csv", None), "CSV rows are not counted: {info:?}");
    assert_eq!(info.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["country", "amount"]);
    assert!(info.bytes > Some(0));
    let total = "SELECT count(*) AS n, sum(amount) AS total FROM sales";
    assert_eq!(rows(&engine, total).await, json!([{"n": 2, "total": 3.5}]));

    // A file added where the source is is read by the next query, without telling the table. (Its values
    // must read as the same types: each file's are inferred, and types that differ do not merge.)
    std::fs::write(orders.join("2026-02.csv"), "country,amount\nDE,4.5\n").unwrap();
    assert_eq!(rows(&engine, total).await, json!([{"n": 3, "total": 8.0}]));
    assert_eq!(engine.metrics().plans().0, 0, "a query of an external source is planned each time");

    // Its rows are the source's: an append is refused, and the table is unchanged.
    let append = engine.write(project(), &sales(), append_csv("country,amount\nIT,1\n")).await;
    assert!(
        matches!(append, Err(UploadError::Rejected(ref i)) if i.attr.as_deref() == Some("table")),
        "{append:?}"
    );
    assert_eq!(rows(&engine, total).await, json!([{"n": 3, "total": 8.0}]));

    // Replaced by an upload, it reads its own rows again; registered again, the source's. Deleting it leaves
    // the source's files where they are.
    assert!(!engine.write(project(), &sales(), csv("country,amount\nJP,9.5\n")).await.unwrap().created);
    assert_eq!(rows(&engine, total).await, json!([{"n": 1, "total": 9.5}]));
    assert!(!engine.register(project(), &sales(), files_source(prefix, TableFormat::Csv)).await.unwrap());
    assert_eq!(rows(&engine, total).await, json!([{"n": 3, "total": 8.0}]));
    assert!(TableStore::delete(&engine, project(), &sales()).await.unwrap());
    assert_eq!(TableStore::get(&engine, project(), &sales()).await.unwrap(), None);
    assert!(orders.join("2026-01.csv").exists() && orders.join("2026-02.csv").exists());
}

#[tokio::test]
async fn a_delta_table_is_a_source_read_at_its_newest_version_within_the_refresh_interval() {
    // The lake's table is a Delta table another writer keeps: here, another service's storage.
    let lake = temp_dir("qe-lake");
    let writer = DataFusionEngine::new(Storage::local(&lake).unwrap());
    writer.write(project(), &sales(), csv("country,amount\nUS,1.5\nFR,2\n")).await.unwrap();
    let table = format!("file://{}/projects/{}/tables/sales", lake.display(), project());
    let delta = || domain::ExternalSource::Delta { url: table.clone() };
    let total = "SELECT count(*) AS n, sum(amount) AS total FROM sales";

    let (following, _dir) = engine_allowing(&lake).await;
    assert!(following.register(project(), &sales(), delta()).await.unwrap());
    let info = TableStore::get(&following, project(), &sales()).await.unwrap().unwrap();
    assert_eq!((info.source.format(), info.row_count, info.files), ("delta", Some(2), Some(1)), "{info:?}");
    assert_eq!(info.columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["country", "amount"]);
    assert_eq!(rows(&following, total).await, json!([{"n": 2, "total": 3.5}]));

    // Checked at most once an hour, the table is read at the version it was first read at.
    let (hourly, _other) = engine_refreshing(&lake, std::time::Duration::from_secs(3600));
    hourly.register(project(), &sales(), delta()).await.unwrap();
    assert_eq!(rows(&hourly, total).await, json!([{"n": 2, "total": 3.5}]));

    writer.write(project(), &sales(), append_csv("country,amount\nDE,4.5\n")).await.unwrap();
    assert_eq!(rows(&following, total).await, json!([{"n": 3, "total": 8.0}]), "the new version is read");
    assert_eq!(rows(&hourly, total).await, json!([{"n": 2, "total": 3.5}]), "not checked again yet");

    // Its rows are the lake's: an append is refused, and nothing is written there.
    let append = following.write(project(), &sales(), append_csv("country,amount\nIT,1\n")).await;
    assert!(matches!(append, Err(UploadError::Rejected(_))), "{append:?}");
    assert_eq!(rows(&writer, total).await, json!([{"n": 3, "total": 8.0}]));

    // A folder that is not a Delta table, and one outside the allowed prefix, are refused when registered.
    std::fs::create_dir_all(lake.join("plain")).unwrap();
    let plain = domain::ExternalSource::Delta { url: format!("file://{}/plain/", lake.display()) };
    let err = rejected(following.register(project(), &TableName::parse("plain").unwrap(), plain).await);
    assert!(err.contains("no Delta table is there"), "{err}");
    let outside = domain::ExternalSource::Delta { url: "file:///etc/".into() };
    let err = rejected(following.register(project(), &TableName::parse("etc").unwrap(), outside).await);
    assert!(err.contains("not under a source this server allows"), "{err}");
}

#[tokio::test]
async fn a_parquet_source_counts_its_rows_and_one_file_can_be_a_source() {
    let lake = temp_dir("qe-lake");
    let schema = Arc::new(Schema::new(vec![Field::new("country", DataType::Utf8, false)]));
    let batch =
        RecordBatch::try_new(schema.clone(), vec![Arc::new(StringArray::from(vec!["US", "FR"]))]).unwrap();
    let file = std::fs::File::create(lake.join("countries.parquet")).unwrap();
    let mut writer = ArrowWriter::try_new(file, schema, None).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    std::fs::write(lake.join("events.ndjson"), "{\"event\": \"click\"}\n{\"event\": \"view\"}\n").unwrap();
    let (engine, _dir) = engine_allowing(&lake).await;
    let parquet = files_source(format!("file://{}/", lake.display()), TableFormat::Parquet);
    engine.register(project(), &sales(), parquet).await.unwrap();
    let info = TableStore::get(&engine, project(), &sales()).await.unwrap().unwrap();
    assert_eq!((info.source.format(), info.row_count), ("parquet", Some(2)), "{info:?}");
    let events = TableName::parse("Events").unwrap();
    let one_file = files_source(format!("file://{}/events.ndjson", lake.display()), TableFormat::NdJson);
    engine.register(project(), &events, one_file).await.unwrap();
    let sql = "SELECT count(*) AS n FROM \"Events\" CROSS JOIN sales";
    assert_eq!(rows(&engine, sql).await, json!([{"n": 4}]));
}

#[tokio::test]
async fn a_source_outside_the_allowed_ones_or_without_files_is_refused_and_changes_nothing() {
    let lake = temp_dir("qe-lake");
    let (engine, dir) = engine_allowing(&lake).await;
    engine.write(project(), &sales(), csv("country,amount\nUS,1\n")).await.unwrap();
    let outside = temp_dir("qe-outside");
    std::fs::write(outside.join("x.csv"), "a\n1\n").unwrap();
    for (url, why) in [
        (format!("file://{}/", outside.display()), "not under a source this server allows"),
        (format!("file://{}/projects/1/tables/sales/", dir.display()), "projects/"),
        (format!("file://{}/", lake.display()), "No files found"),
        (format!("file://{}/missing.csv", lake.display()), "does not exist"),
        ("s3://bucket/x/".to_owned(), "not under a source"),
    ] {
        let err =
            rejected(engine.register(project(), &sales(), files_source(url.clone(), TableFormat::Csv)).await);
        assert!(err.contains(why), "{url}: {err}");
    }
    // The storage's own projects/ area is never a source, even when an allowed prefix covers it.
    let (wide, wide_dir) = engine_allowing(std::path::Path::new("/")).await;
    let own = format!("file://{}/projects/", wide_dir.display());
    let err = rejected(wide.register(project(), &sales(), files_source(own, TableFormat::Parquet)).await);
    assert!(err.contains("projects/"), "{err}");
    assert_eq!(rows(&engine, "SELECT * FROM sales").await, json!([{"country": "US", "amount": 1}]));
}

/// A link placed in an allowed folder after the table was registered, to another project's table: the next
/// query reads none of its rows, and says the source leads outside what is allowed.
#[tokio::test]
async fn a_source_never_follows_a_link_out_of_the_allowed_folders() {
    let lake = temp_dir("qe-lake");
    let (engine, dir) = engine_allowing(&lake).await;
    let other = ProjectId::new(2).unwrap();
    engine.write(other, &sales(), csv("secret,amount\nother-projects-row,1\n")).await.unwrap();
    let folder = lake.join("mine");
    std::fs::create_dir_all(&folder).unwrap();
    engine.write(project(), &sales(), csv("secret,amount\nmine,2\n")).await.unwrap();
    let own_files = dir.join("projects/1/tables/sales");
    // The project's own data copied into the lake as its source: one Parquet file.
    let copied = std::fs::read_dir(&own_files)
        .unwrap()
        .flatten()
        .find(|file| file.path().extension().is_some_and(|e| e == "parquet"))
        .unwrap();
    std::fs::copy(copied.path(), folder.join("mine.parquet")).unwrap();
    let events = TableName::parse("lake").unwrap();
    let source = files_source(format!("file://{}/", folder.display()), TableFormat::Parquet);
    engine.register(project(), &events, source).await.unwrap();
    let sql = "SELECT secret FROM lake ORDER BY secret";
    assert_eq!(rows(&engine, sql).await, json!([{"secret": "mine"}]));

    std::os::unix::fs::symlink(dir.join("projects/2/tables/sales"), folder.join("linked")).unwrap();
    let query = domain::Query::try_from(&json!({"kind": "SQLQuery", "query": sql})).unwrap();
    let read = engine.execute(project(), &query, &BTreeMap::new(), 1000, 0).await;
    let err = read.expect_err("a link to another project's table is not read");
    let text = err.to_string();
    // Named by the link, never by the files behind it, and as any place outside the allowed folders is.
    assert!(text.contains("mine/linked is not under") && !text.contains("other-projects-row"), "{text}");
    assert!(!text.contains(".parquet") && !text.contains("data directory"), "{text}");
    // Registering the folder again is refused for the same reason.
    let again = files_source(format!("file://{}/", folder.display()), TableFormat::Parquet);
    let refused = rejected(engine.register(project(), &events, again).await);
    assert!(refused.contains("linked is not under"), "{refused}");
    // A link to a file outside every allowed folder is refused the same way.
    std::fs::remove_file(folder.join("linked")).unwrap();
    let outside = temp_dir("qe-outside");
    std::fs::copy(folder.join("mine.parquet"), outside.join("x.parquet")).unwrap();
    std::os::unix::fs::symlink(outside.join("x.parquet"), folder.join("x.parquet")).unwrap();
    let err = engine.execute(project(), &query, &BTreeMap::new(), 1000, 0).await.unwrap_err();
    assert!(err.to_string().contains("not under a source"), "{err}");
}

/// Malformed bodies, a corrupt Parquet file among them (which panicked the reader), are the client's: an
/// `Invalid` naming what is wrong, never where the server keeps the body.
#[tokio::test]
async fn a_malformed_body_is_refused_without_naming_where_the_server_keeps_it() {
    let dir = temp_dir("qe-malformed");
    let engine = DataFusionEngine::new(Storage::local(&dir).unwrap());
    let mut parquet_with_bad_footer = b"PAR1".to_vec();
    parquet_with_bad_footer.extend_from_slice(&[0xff; 64]);
    parquet_with_bad_footer.extend_from_slice(&u32::MAX.to_le_bytes());
    parquet_with_bad_footer.extend_from_slice(b"PAR1");
    for (format, body) in [
        (TableFormat::Parquet, b"PAR1garbagePAR1".to_vec()),
        (TableFormat::Parquet, parquet_with_bad_footer),
        (TableFormat::Parquet, b"not parquet at all".to_vec()),
        (TableFormat::Csv, b"a,b\n1,2,3\n".to_vec()),
        (TableFormat::NdJson, b"{\"a\": 1}\n{\"a\": \n".to_vec()),
    ] {
        let result = engine.write(project(), &sales(), upload(format, WriteMode::Replace, &body)).await;
        let Err(UploadError::Invalid(reason)) = result else { panic!("{format:?}: {result:?}") };
        let root = std::fs::canonicalize(&*dir).unwrap();
        for leak in [root.display().to_string(), "staging".to_owned(), "file://".to_owned()] {
            assert!(!reason.contains(&leak), "{format:?} names {leak}: {reason}");
        }
    }
    // A huge value is refused as it arrives, before anything reads it.
    let mut huge = b"id,blob\n1,\"".to_vec();
    huge.resize(huge.len() + 65 * 1024 * 1024, b'x');
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        huge.chunks(1 << 20).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let body = Box::pin(stream::iter(chunks));
    let huge = Upload {
        format: TableFormat::Csv,
        mode: WriteMode::Replace,
        body,
        limit_bytes: 1 << 30,
        tag: None,
        quarantine: false,
    };
    let result = engine.write(project(), &sales(), huge).await;
    let Err(UploadError::Invalid(reason)) = result else { panic!("{result:?}") };
    assert!(reason.contains("Row 2") && reason.contains("MiB"), "{reason}");
    nothing_staged(&dir);
}

/// The Parquet files the table has (no write here is replaced or compacted: every file is the table's).
fn table_files(dir: &std::path::Path) -> usize {
    let tables = dir.join("projects/1/tables/sales");
    std::fs::read_dir(&tables)
        .unwrap()
        .flatten()
        .filter(|f| f.path().extension().is_some_and(|ext| ext == "parquet"))
        .count()
}

#[tokio::test]
async fn concurrent_appends_share_writes_and_every_row_is_added_once() {
    let (engine, dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,0\n")).await.unwrap();
    let engine = Arc::new(engine);
    // The table's lock is held while the appends arrive, so all but the first queue behind the first write.
    let lock = engine.table_locks.of(project(), "sales");
    let held = lock.lock().await;
    let appends: Vec<_> = (1..=16)
        .map(|i| {
            let engine = Arc::clone(&engine);
            tokio::spawn(async move {
                let body = format!("country,amount\nC{i},{i}\nD{i},{i}\n");
                engine.write(project(), &sales(), append_csv(&body)).await
            })
        })
        .collect();
    // A body that does not fit is refused alone, whatever it shares a write with.
    let bad = {
        let engine = Arc::clone(&engine);
        tokio::spawn(async move {
            engine.write(project(), &sales(), append_csv("country,amount\nX,oops\n")).await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    drop(held);
    for append in appends {
        let written = append.await.unwrap().unwrap();
        assert_eq!((written.rows, written.created), (2, false));
    }
    assert!(invalid(bad.await.unwrap()).contains("oops"), "the bad body is named");
    let counted =
        rows(&engine, "SELECT count(*) AS n, count(DISTINCT country) AS c, sum(amount) AS s FROM sales")
            .await;
    assert_eq!(counted, json!([{"n": 33, "c": 33, "s": 272}]), "each row once");
    let files = table_files(&dir);
    assert!(files <= 3, "16 appends written in {files} files besides the first");
    nothing_staged(&dir);
}

#[tokio::test]
async fn one_clients_appends_are_each_written_at_once() {
    let (engine, dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,0\n")).await.unwrap();
    for i in 1..=3 {
        engine.write(project(), &sales(), append_csv(&format!("country,amount\nC{i},{i}\n"))).await.unwrap();
        let counted = rows(&engine, "SELECT count(*) AS n FROM sales").await;
        assert_eq!(counted, json!([{"n": i + 1}]), "visible once answered");
    }
    assert_eq!(table_files(&dir), 4);
    let missing = engine.write(project(), &TableName::parse("nope").unwrap(), append_csv("a\n1\n")).await;
    assert!(matches!(missing, Err(UploadError::NoSuchTable)), "{missing:?}");
}

#[tokio::test]
async fn appends_past_the_bodies_held_in_memory_are_staged_and_land() {
    let (engine, dir) = engine().await;
    engine.write(project(), &sales(), csv("country,amount\nUS,0\n")).await.unwrap();
    let places: Vec<_> = std::iter::from_fn(|| engine.appends.try_hold()).collect();
    assert!(!places.is_empty());
    for i in 1..=2 {
        engine.write(project(), &sales(), append_csv(&format!("country,amount\nC{i},{i}\n"))).await.unwrap();
    }
    assert_eq!(rows(&engine, "SELECT count(*) AS n FROM sales").await, json!([{"n": 3}]));
    drop(places);
    assert!(engine.appends.try_hold().is_some(), "the places come back");
    nothing_staged(&dir);
}

/// A body past a megabyte is on disk as it arrives, not held until it ends: a client that sends most of a
/// body and stalls holds about a megabyte of the server's memory, however large the body. On an object
/// storage it goes through a temporary file, and reads back whole.
#[tokio::test]
async fn a_large_body_is_written_to_disk_as_it_arrives() {
    let (engine, dir) = engine().await;
    let (send, receive) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    let upload = Upload {
        format: TableFormat::Csv,
        mode: WriteMode::Replace,
        body: Box::pin(stream::unfold(receive, |mut receive| async move {
            receive.recv().await.map(|chunk| (chunk, receive))
        })),
        limit_bytes: 1 << 30,
        tag: None,
        quarantine: false,
    };
    let writing = tokio::spawn({
        let engine = engine.clone();
        async move { engine.write(project(), &sales(), upload).await }
    });
    send.send(Ok(Bytes::from_static(b"country,amount\n"))).await.unwrap();
    let row = "US,1\n".repeat(13_000);
    for _ in 0..50 {
        send.send(Ok(Bytes::from(row.clone()))).await.unwrap();
    }
    // 3.25 MB sent, and the client stalls: all but the last part is in the staging file.
    let staged = || -> u64 {
        let staging = dir.join("projects/1/staging");
        let entries =
            std::fs::read_dir(&staging).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
        entries
            .iter()
            .flat_map(|upload| std::fs::read_dir(upload.path()).into_iter().flatten().flatten())
            .map(|file| file.metadata().map_or(0, |m| m.len()))
            .sum()
    };
    let waited = std::time::Instant::now();
    while staged() < 2 << 20 {
        assert!(waited.elapsed() < std::time::Duration::from_secs(60), "staged {} bytes", staged());
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    send.send(Err(std::io::Error::new(std::io::ErrorKind::ConnectionReset, "gone"))).await.unwrap();
    assert!(matches!(writing.await.unwrap(), Err(UploadError::CutOff(_))));
    nothing_staged(&dir);

    let store = Arc::new(object_store::memory::InMemory::new());
    let remote = DataFusionEngine::new(Storage::from_store(store, "memory:///"));
    let body = format!("country,amount\n{}", "US,1\n".repeat(700_000));
    let chunks: Vec<Result<Bytes, std::io::Error>> =
        body.as_bytes().chunks(64 << 10).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let upload = Upload { body: Box::pin(stream::iter(chunks)), limit_bytes: 1 << 30, ..csv("") };
    assert_eq!(remote.write(project(), &sales(), upload).await.unwrap().rows, 700_000);
    assert_eq!(rows(&remote, "SELECT count(*) AS n FROM sales").await, json!([{"n": 700_000}]));
}
