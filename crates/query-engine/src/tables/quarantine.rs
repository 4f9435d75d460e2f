//! Appends that set aside the rows that do not fit (`on_error=quarantine`).
//!
//! The body (CSV or NDJSON, held in memory) is read one record at a time with the table's columns, by the same
//! Arrow readers an import uses: CSV records found with the `csv` crate (so a quoted field may span lines),
//! NDJSON by its lines. The records that read make the body that is appended; each one that does not becomes a
//! row of the quarantine table: when it arrived, its line, its text as sent and why it did not fit.

use std::sync::Arc;

use bytes::Bytes;
use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::parquet::arrow::ArrowWriter;

use crate::tables::imports::{plain, FileFormat};

/// The largest body an append that quarantines takes: it is held in memory while its records are sorted.
pub(crate) const QUARANTINE_BODY_BYTES: u64 = 16 * 1024 * 1024;

/// A record that does not fit the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BadRow {
    /// Its first line in the body, from 1 (the CSV header is line 1).
    pub(crate) line: u64,
    pub(crate) raw: String,
    pub(crate) error: String,
}

/// A body sorted: the records that fit, as a body of the same format, and the others.
#[derive(Debug)]
pub(crate) struct Sorted {
    pub(crate) good: Bytes,
    pub(crate) good_rows: u64,
    pub(crate) bad: Vec<BadRow>,
}

/// Sorts a body's records by whether they read as `schema`'s columns.
///
/// # Errors
/// Why the body as a whole cannot be sorted, for the client: a CSV header that is not the table's columns.
pub(crate) fn sort(body: &[u8], format: FileFormat, schema: &SchemaRef) -> Result<Sorted, String> {
    let schema = plain(schema);
    match format {
        FileFormat::Csv => sort_csv(body, &schema),
        FileFormat::NdJson => Ok(sort_ndjson(body, &schema)),
        FileFormat::Parquet => Err("A Parquet body has no records to set aside.".into()),
    }
}

fn sort_ndjson(body: &[u8], schema: &SchemaRef) -> Sorted {
    let mut sorted = Sorted { good: Bytes::new(), good_rows: 0, bad: Vec::new() };
    let mut good = Vec::with_capacity(body.len());
    for (index, line) in body.split(|b| *b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match read_json(line, schema) {
            Ok(()) => {
                good.extend_from_slice(line);
                good.push(b'\n');
                sorted.good_rows += 1;
            }
            Err(error) => sorted.bad.push(BadRow {
                line: index as u64 + 1,
                raw: String::from_utf8_lossy(line).into_owned(),
                error,
            }),
        }
    }
    sorted.good = good.into();
    sorted
}

/// Whether one NDJSON line reads as the columns (no other field, every value of its column's type).
fn read_json(line: &[u8], schema: &SchemaRef) -> Result<(), String> {
    let mut decoder = arrow_json::ReaderBuilder::new(Arc::clone(schema))
        .with_strict_mode(true)
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.decode(line).map_err(|e| e.to_string())?;
    decoder.flush().map(|_| ()).map_err(|e| e.to_string())
}

fn sort_csv(body: &[u8], schema: &SchemaRef) -> Result<Sorted, String> {
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(body);
    let mut record = csv::ByteRecord::new();
    let header_read = reader.read_byte_record(&mut record).map_err(|e| format!("The body's header: {e}"))?;
    let names: Vec<String> = record.iter().map(|f| String::from_utf8_lossy(f).trim().to_owned()).collect();
    let want: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
    if !header_read || names != want {
        return Err(format!(
            "The columns do not match the table's: the table has [{}], the body has [{}].",
            want.join(", "),
            names.join(", ")
        ));
    }
    let header_end = usize::try_from(reader.position().byte()).unwrap_or(body.len());
    let mut good = body[..header_end].to_vec();
    if !good.ends_with(b"\n") {
        good.push(b'\n');
    }
    let mut sorted = Sorted { good: Bytes::new(), good_rows: 0, bad: Vec::new() };
    // Each record's bytes run from where it starts to where the next one does.
    let mut start = (header_end, reader.position().line());
    loop {
        let more = match reader.read_byte_record(&mut record) {
            Ok(more) => more,
            Err(err) => {
                // The rest of the body is not CSV the reader can follow: it is set aside whole.
                let raw = String::from_utf8_lossy(&body[start.0..]).into_owned();
                sorted.bad.push(BadRow { line: start.1, raw, error: err.to_string() });
                break;
            }
        };
        let end =
            if more { usize::try_from(reader.position().byte()).unwrap_or(body.len()) } else { body.len() };
        let raw = &body[start.0..end.min(body.len())];
        if !raw.iter().all(u8::is_ascii_whitespace) {
            match read_csv(raw, schema) {
                Ok(()) => {
                    good.extend_from_slice(raw);
                    if !raw.ends_with(b"\n") {
                        good.push(b'\n');
                    }
                    sorted.good_rows += 1;
                }
                Err(error) => {
                    let text = String::from_utf8_lossy(raw).trim_end_matches(['\r', '\n']).to_owned();
                    sorted.bad.push(BadRow { line: start.1, raw: text, error });
                }
            }
        }
        if !more {
            break;
        }
        start = (end, reader.position().line());
    }
    sorted.good = good.into();
    Ok(sorted)
}

/// Whether one CSV record reads as the columns.
fn read_csv(record: &[u8], schema: &SchemaRef) -> Result<(), String> {
    let mut decoder =
        datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(schema)).with_header(false).build_decoder();
    decoder.decode(record).map_err(|e| e.to_string())?;
    decoder.decode(&[]).map_err(|e| e.to_string())?;
    decoder.flush().map(|_| ()).map_err(|e| e.to_string())
}

/// The columns of a quarantine table.
pub(crate) fn quarantine_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("received_at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
        Field::new("line", DataType::Int64, false),
        Field::new("raw", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
    ]))
}

/// The bad rows as a Parquet body of the quarantine table's columns, received at `received_at` (microseconds
/// since the epoch).
pub(crate) fn quarantine_body(bad: &[BadRow], received_at: i64) -> Result<Bytes, String> {
    let schema = quarantine_schema();
    let columns: Vec<ArrayRef> = vec![
        Arc::new(TimestampMicrosecondArray::from(vec![received_at; bad.len()]).with_timezone("UTC")),
        Arc::new(Int64Array::from_iter_values(bad.iter().map(|b| i64::try_from(b.line).unwrap_or(i64::MAX)))),
        Arc::new(StringArray::from_iter_values(bad.iter().map(|b| b.raw.as_str()))),
        Arc::new(StringArray::from_iter_values(bad.iter().map(|b| b.error.as_str()))),
    ];
    let batch = RecordBatch::try_new(Arc::clone(&schema), columns).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, schema, None).map_err(|e| e.to_string())?;
    writer.write(&batch).map_err(|e| e.to_string())?;
    writer.close().map_err(|e| e.to_string())?;
    Ok(bytes.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("country", DataType::Utf8, true),
            Field::new("amount", DataType::Float64, true),
        ]))
    }

    #[test]
    fn ndjson_lines_that_do_not_fit_are_set_aside_with_their_line_and_why() {
        let body = b"{\"id\": 1, \"country\": \"US\", \"amount\": 2.5}\n\
                     {\"id\": \"two\", \"country\": \"FR\"}\n\
                     \n\
                     {\"id\": 3, \"colour\": \"red\"}\r\n\
                     not json\n\
                     {\"id\": 4}";
        let sorted = sort(body, FileFormat::NdJson, &schema()).unwrap();
        assert_eq!(sorted.good_rows, 2);
        assert_eq!(
            sorted.good,
            Bytes::from_static(b"{\"id\": 1, \"country\": \"US\", \"amount\": 2.5}\n{\"id\": 4}\n")
        );
        let lines: Vec<(u64, &str)> = sorted.bad.iter().map(|b| (b.line, b.raw.as_str())).collect();
        assert_eq!(
            lines,
            [
                (2, "{\"id\": \"two\", \"country\": \"FR\"}"),
                (4, "{\"id\": 3, \"colour\": \"red\"}"),
                (5, "not json")
            ]
        );
        assert!(sorted.bad.iter().all(|b| !b.error.is_empty()));
        assert!(sorted.bad[1].error.contains("colour"), "{}", sorted.bad[1].error);
    }

    #[test]
    fn csv_records_that_do_not_fit_are_set_aside_and_a_quoted_field_may_span_lines() {
        let body = b"id,country,amount\n1,US,2.5\n2,FR,lots\n3,\"Saint\nMartin\",1\n4,DE\n5,IT,7\n";
        let sorted = sort(body, FileFormat::Csv, &schema()).unwrap();
        assert_eq!(sorted.good_rows, 3);
        assert_eq!(
            sorted.good,
            Bytes::from_static(b"id,country,amount\n1,US,2.5\n3,\"Saint\nMartin\",1\n5,IT,7\n")
        );
        let lines: Vec<(u64, &str)> = sorted.bad.iter().map(|b| (b.line, b.raw.as_str())).collect();
        assert_eq!(lines, [(3, "2,FR,lots"), (6, "4,DE")]);
        let wrong = sort(b"id,amount\n1,2\n", FileFormat::Csv, &schema()).unwrap_err();
        assert!(wrong.contains("the body has [id, amount]"), "{wrong}");
    }

    #[test]
    fn bad_rows_become_a_parquet_body_of_the_quarantine_columns() {
        let bad = vec![BadRow { line: 3, raw: "2,FR,lots".into(), error: "not a number".into() }];
        let bytes = quarantine_body(&bad, 1_764_115_200_000_000).unwrap();
        let reader =
            datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReader::try_new(bytes, 1024).unwrap();
        let batches: Vec<RecordBatch> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(batches[0].schema(), quarantine_schema());
        assert_eq!(batches[0].num_rows(), 1);
    }
}
