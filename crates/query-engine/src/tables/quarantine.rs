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

use crate::tables::imports::{csv_header, plain, sent_columns};
use domain::TableFormat;

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

/// The most records of one body set aside: a body with more that do not fit is refused whole, as the client's
/// mistake (sending another format, another table's rows) rather than a few bad records.
pub(crate) const MAX_BAD_ROWS: usize = 10_000;

/// The most characters of a reason a bad row keeps.
const MAX_REASON_CHARS: usize = 1_024;

/// Records checked together: a run of them that all read as the columns costs one decoder, and one that does
/// not is halved until each bad record stands alone.
const CHUNK_RECORDS: usize = 4_096;

/// Sorts a body's records by whether they read as `schema`'s columns.
///
/// # Errors
/// Why the body as a whole cannot be sorted, for the client: a CSV header that is not the table's columns, or
/// more than [`MAX_BAD_ROWS`] records that do not fit.
pub(crate) fn sort(body: &[u8], format: TableFormat, schema: &SchemaRef) -> Result<Sorted, String> {
    let schema = plain(schema);
    match format {
        TableFormat::Csv => sort_csv(body, &schema),
        TableFormat::NdJson => sort_ndjson(body, &schema),
        TableFormat::Parquet => Err("A Parquet body has no records to set aside.".into()),
    }
}

/// One record of a body: its first line, and its bytes (a CSV record's line end included).
struct Record<'a> {
    line: u64,
    raw: &'a [u8],
}

/// Sorts `records` into the good body (after `good`'s start) and the bad rows, checking them `CHUNK_RECORDS` at a
/// time with `check` (which reads the records it is given, joined, and answers whether each of them read).
fn sort_records<'a>(
    records: &[Record<'a>],
    mut good: Vec<u8>,
    check: &dyn Fn(&[Record<'a>]) -> Result<(), String>,
) -> Result<Sorted, String> {
    let mut sorted = Sorted { good: Bytes::new(), good_rows: 0, bad: Vec::new() };
    let mut pending: Vec<&[Record<'a>]> = records.chunks(CHUNK_RECORDS).rev().collect();
    while let Some(run) = pending.pop() {
        match check(run) {
            Ok(()) => {
                for record in run {
                    good.extend_from_slice(record.raw);
                    if !record.raw.ends_with(b"\n") {
                        good.push(b'\n');
                    }
                }
                sorted.good_rows += run.len() as u64;
            }
            Err(error) if run.len() == 1 => {
                if sorted.bad.len() == MAX_BAD_ROWS {
                    let first = &sorted.bad[0];
                    return Err(format!(
                        "More than {MAX_BAD_ROWS} records of the body do not fit the table's columns (the first, at \
                         line {}: {}); nothing was appended.",
                        first.line, first.error
                    ));
                }
                let raw = String::from_utf8_lossy(run[0].raw).trim_end_matches(['\r', '\n']).to_owned();
                let error = match error.char_indices().nth(MAX_REASON_CHARS) {
                    Some((cut, _)) => format!("{}...", &error[..cut]),
                    None => error,
                };
                sorted.bad.push(BadRow { line: run[0].line, raw, error });
            }
            // Halves, the first checked first.
            Err(_) => {
                let (first, second) = run.split_at(run.len() / 2);
                pending.push(second);
                pending.push(first);
            }
        }
    }
    sorted.good = good.into();
    Ok(sorted)
}

fn sort_ndjson(body: &[u8], schema: &SchemaRef) -> Result<Sorted, String> {
    let records: Vec<Record<'_>> = body
        .split(|b| *b == b'\n')
        .enumerate()
        .map(|(index, line)| Record { line: index as u64 + 1, raw: line.strip_suffix(b"\r").unwrap_or(line) })
        .filter(|record| !record.raw.iter().all(u8::is_ascii_whitespace))
        .collect();
    sort_records(&records, Vec::with_capacity(body.len()), &|run| read_json(run, schema))
}

/// Whether NDJSON lines read as the columns (no other field, every value of its column's type), each one JSON
/// value of its own: lines that only read joined (an object split over two) do not.
fn read_json(run: &[Record<'_>], schema: &SchemaRef) -> Result<(), String> {
    for record in run {
        serde_json::from_slice::<serde::de::IgnoredAny>(record.raw).map_err(|e| e.to_string())?;
    }
    let mut decoder = arrow_json::ReaderBuilder::new(Arc::clone(schema))
        .with_batch_size(run.len().max(1))
        .with_strict_mode(true)
        .build_decoder()
        .map_err(|e| e.to_string())?;
    let mut rows = 0;
    for record in run {
        let read = decoder.decode(record.raw).map_err(|e| e.to_string())?;
        if read < record.raw.len() {
            return Err("more records than lines".into());
        }
        decoder.decode(b"\n").map_err(|e| e.to_string())?;
    }
    if let Some(batch) = decoder.flush().map_err(|e| e.to_string())? {
        rows = batch.num_rows();
    }
    if rows == run.len() {
        Ok(())
    } else {
        Err(format!("{rows} records read from {} lines", run.len()))
    }
}

fn sort_csv(body: &[u8], schema: &SchemaRef) -> Result<Sorted, String> {
    // Records are read as the columns their header names, in its order; the good ones keep that header.
    let names = csv_header(body)?;
    let schema = &Arc::new(sent_columns(schema, names.iter().map(String::as_str))?);
    let mut reader = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(body);
    let mut record = csv::ByteRecord::new();
    // The header, read above.
    reader.read_byte_record(&mut record).map_err(|e| format!("The body's header: {e}"))?;
    let header_end = usize::try_from(reader.position().byte()).unwrap_or(body.len());
    let mut good = Vec::with_capacity(body.len());
    good.extend_from_slice(&body[..header_end]);
    if !good.ends_with(b"\n") {
        good.push(b'\n');
    }
    let mut records = Vec::new();
    // Each record's bytes run from where it starts to where the next one does.
    let mut start = (header_end, reader.position().line());
    let mut unreadable = None;
    loop {
        let more = match reader.read_byte_record(&mut record) {
            Ok(more) => more,
            Err(err) => {
                // The rest of the body is not CSV the reader can follow: it is set aside whole.
                let raw = String::from_utf8_lossy(&body[start.0..]).into_owned();
                unreadable = Some(BadRow { line: start.1, raw, error: err.to_string() });
                break;
            }
        };
        let end =
            if more { usize::try_from(reader.position().byte()).unwrap_or(body.len()) } else { body.len() };
        let raw = &body[start.0..end.min(body.len())];
        if !raw.iter().all(u8::is_ascii_whitespace) {
            records.push(Record { line: start.1, raw });
        }
        if !more {
            break;
        }
        start = (end, reader.position().line());
    }
    let mut sorted = sort_records(&records, good, &|run| read_csv(run, schema))?;
    sorted.bad.extend(unreadable);
    Ok(sorted)
}

/// Whether CSV records read as the columns, one row each.
fn read_csv(run: &[Record<'_>], schema: &SchemaRef) -> Result<(), String> {
    let mut decoder = datafusion::arrow::csv::ReaderBuilder::new(Arc::clone(schema))
        .with_header(false)
        .with_batch_size(run.len().max(1))
        .build_decoder();
    for record in run {
        let mut raw = record.raw;
        while !raw.is_empty() {
            let read = decoder.decode(raw).map_err(|e| e.to_string())?;
            if read == 0 {
                return Err("more records than lines".into());
            }
            raw = &raw[read..];
        }
        if !record.raw.ends_with(b"\n") {
            decoder.decode(b"\n").map_err(|e| e.to_string())?;
        }
    }
    decoder.decode(&[]).map_err(|e| e.to_string())?;
    let rows = decoder.flush().map_err(|e| e.to_string())?.map_or(0, |batch| batch.num_rows());
    if rows == run.len() {
        Ok(())
    } else {
        Err(format!("{rows} rows read from {} records", run.len()))
    }
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
        let sorted = sort(body, TableFormat::NdJson, &schema()).unwrap();
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
        let sorted = sort(body, TableFormat::Csv, &schema()).unwrap();
        assert_eq!(sorted.good_rows, 3);
        assert_eq!(
            sorted.good,
            Bytes::from_static(b"id,country,amount\n1,US,2.5\n3,\"Saint\nMartin\",1\n5,IT,7\n")
        );
        let lines: Vec<(u64, &str)> = sorted.bad.iter().map(|b| (b.line, b.raw.as_str())).collect();
        assert_eq!(lines, [(3, "2,FR,lots"), (6, "4,DE")]);
        let wrong = sort(b"id,colour\n1,2\n", TableFormat::Csv, &schema()).unwrap_err();
        assert!(wrong.contains("the body has 'colour'"), "{wrong}");
        // A header names the table's columns in any order, leaving out nullable ones.
        let reordered = sort(b"amount,id\n2.5,1\nlots,2\n", TableFormat::Csv, &schema()).unwrap();
        assert_eq!((reordered.good_rows, reordered.bad.len()), (1, 1));
        assert_eq!(reordered.good, Bytes::from_static(b"amount,id\n2.5,1\n"));
    }

    /// Bad records among many good ones are found wherever they are, each alone with its own line and reason;
    /// lines that read only when joined (an object split over two) are bad; a body of more bad records than
    /// the bound is refused whole.
    #[test]
    fn records_are_checked_in_runs_and_a_body_of_mostly_bad_records_is_refused() {
        let bad_at = [1_usize, 4_097, 9_000, 19_999];
        let mut body = String::new();
        for i in 0..20_000 {
            if bad_at.contains(&i) {
                body.push_str("{\"id\": \"x\"}\n");
            } else {
                body.push_str(&format!("{{\"id\": {i}, \"country\": \"US\"}}\n"));
            }
        }
        body.push_str("{\"id\": 1,\n\"country\": \"US\"}\n");
        let sorted = sort(body.as_bytes(), TableFormat::NdJson, &schema()).unwrap();
        assert_eq!(sorted.good_rows, 20_000 - 4);
        let lines: Vec<u64> = sorted.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [2, 4_098, 9_001, 20_000, 20_001, 20_002]);
        assert!(sorted.bad[0].error.contains("x"), "{}", sorted.bad[0].error);
        let mut csv = String::from("id,country,amount\n");
        for i in 0..10_000 {
            csv.push_str(if i == 7_777 { "1,FR,lots\n" } else { "2,US,1.5\n" });
        }
        let sorted = sort(csv.as_bytes(), TableFormat::Csv, &schema()).unwrap();
        assert_eq!((sorted.good_rows, sorted.bad.len(), sorted.bad[0].line), (9_999, 1, 7_779));
        let garbage = "x\n".repeat(MAX_BAD_ROWS + 1);
        let refused = sort(garbage.as_bytes(), TableFormat::NdJson, &schema()).unwrap_err();
        assert!(refused.contains("More than 10000 records") && refused.contains("line 1"), "{refused}");
        let within = "x\n".repeat(MAX_BAD_ROWS);
        assert_eq!(sort(within.as_bytes(), TableFormat::NdJson, &schema()).unwrap().bad.len(), MAX_BAD_ROWS);
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
