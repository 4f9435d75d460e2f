//! The longest record of an upload, found while it is staged.
//!
//! An import reads a batch of rows at a time, and a row whole: a CSV row (or NDJSON line) of 400 MB is read
//! into memory in one piece, several times over as it is parsed and converted, and a batch of many large rows
//! multiplies that. So while the body streams to its staging object, its records are measured (CSV with
//! `csv-core`, which knows quoted fields that span lines; NDJSON by its lines). A record over
//! [`MAX_RECORD_BYTES`] refuses the upload (400 on `body`, naming the row); otherwise the import reads batches
//! of [`batch_rows`] rows, so that a batch holds about [`BATCH_BYTES`] whatever the rows' size.

use csv_core::{ReadFieldResult, Reader};
use domain::TableFormat;

/// The longest row (CSV) or line (NDJSON) an upload may have.
pub(crate) const MAX_RECORD_BYTES: usize = 64 * 1024 * 1024;
/// About what one batch of an import holds, its rows as text.
pub(crate) const BATCH_BYTES: usize = 64 * 1024 * 1024;
/// The rows of a batch when rows are small: DataFusion's default.
const MAX_BATCH_ROWS: usize = 8192;

/// Measures the records of a body fed to it in chunks.
pub(crate) struct RecordSizes {
    csv: Option<Reader>,
    /// Bytes of the record under way, and records that ended before it.
    current: usize,
    records: u64,
    longest: usize,
}

impl RecordSizes {
    /// A measure of a body in `format`; Parquet has no text records to measure.
    pub(crate) fn of(format: TableFormat) -> Option<Self> {
        let csv = match format {
            TableFormat::Csv => Some(Reader::new()),
            TableFormat::NdJson => None,
            TableFormat::Parquet => return None,
        };
        Some(Self { csv, current: 0, records: 0, longest: 0 })
    }

    /// Takes the next bytes of the body.
    ///
    /// # Errors
    /// Why the body is refused: a record past [`MAX_RECORD_BYTES`], in words for the client.
    pub(crate) fn feed(&mut self, mut input: &[u8]) -> Result<(), String> {
        match self.csv.take() {
            Some(mut reader) => {
                // The fields' text is not needed, only where records end.
                let mut scratch = [0_u8; 4096];
                let measured = loop {
                    // An empty input tells the reader the body has ended: only `finish` says that.
                    if input.is_empty() {
                        break Ok(());
                    }
                    let (result, read, _) = reader.read_field(input, &mut scratch);
                    input = &input[read..];
                    self.current += read;
                    match result {
                        ReadFieldResult::Field { record_end: true } => self.end_record(),
                        ReadFieldResult::InputEmpty | ReadFieldResult::End => break Ok(()),
                        ReadFieldResult::Field { record_end: false } | ReadFieldResult::OutputFull => {}
                    }
                    if let Err(refused) = self.check_csv(true) {
                        break Err(refused);
                    }
                };
                self.csv = Some(reader);
                measured?;
            }
            None => {
                while let Some(end) = input.iter().position(|b| *b == b'\n') {
                    self.current += end + 1;
                    self.check()?;
                    self.end_record();
                    input = &input[end + 1..];
                }
                self.current += input.len();
            }
        }
        self.check()
    }

    /// The body has ended: its last record too.
    ///
    /// # Errors
    /// As [`RecordSizes::feed`].
    pub(crate) fn finish(&mut self) -> Result<(), String> {
        if let Some(reader) = &mut self.csv {
            let mut scratch = [0_u8; 64];
            while let (ReadFieldResult::Field { .. } | ReadFieldResult::OutputFull, _, _) =
                reader.read_field(&[], &mut scratch)
            {}
        }
        self.check()?;
        if self.current > 0 {
            self.end_record();
        }
        Ok(())
    }

    fn end_record(&mut self) {
        self.longest = self.longest.max(self.current);
        self.current = 0;
        self.records += 1;
    }

    fn check(&self) -> Result<(), String> {
        self.check_csv(self.csv.is_some())
    }

    fn check_csv(&self, csv: bool) -> Result<(), String> {
        if self.current <= MAX_RECORD_BYTES {
            return Ok(());
        }
        let what = if csv { "Row" } else { "Line" };
        Err(format!(
            "{what} {} is over {} MiB: a record (and so each of its values) must be smaller.",
            self.records + 1,
            MAX_RECORD_BYTES / (1024 * 1024)
        ))
    }

    /// The rows an import reads at a time: about [`BATCH_BYTES`] of them, at most DataFusion's default.
    pub(crate) fn batch_rows(&self) -> usize {
        (BATCH_BYTES / self.longest.max(1)).clamp(1, MAX_BATCH_ROWS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn measured(format: TableFormat, body: &[u8], chunk: usize) -> Result<RecordSizes, String> {
        let mut sizes = RecordSizes::of(format).unwrap();
        for piece in body.chunks(chunk) {
            sizes.feed(piece)?;
        }
        sizes.finish()?;
        Ok(sizes)
    }

    #[test]
    fn records_are_measured_across_chunks_and_quoted_newlines() {
        let csv = b"a,b\n1,\"x\ny\"\n22,333";
        for chunk in [1, 2, 5, 100] {
            let sizes = measured(TableFormat::Csv, csv, chunk).unwrap();
            assert_eq!((sizes.records, sizes.longest), (3, 8), "chunks of {chunk}");
        }
        let lines = b"{\"a\":1}\n{\"a\":12345}\n{\"a\":2}";
        let sizes = measured(TableFormat::NdJson, lines, 3).unwrap();
        assert_eq!((sizes.records, sizes.longest), (3, 12));
        assert_eq!(sizes.batch_rows(), MAX_BATCH_ROWS);
        assert!(RecordSizes::of(TableFormat::Parquet).is_none());
    }

    #[test]
    fn a_record_past_the_limit_is_refused_as_it_arrives() {
        let mut sizes = RecordSizes::of(TableFormat::Csv).unwrap();
        sizes.feed(b"id,blob\n1,\"").unwrap();
        let chunk = vec![b'x'; 1024 * 1024];
        let refused = (0..100).find_map(|_| sizes.feed(&chunk).err()).expect("refused");
        assert!(refused.contains("Row 2") && refused.contains("64 MiB"), "{refused}");
        let mut lines = RecordSizes::of(TableFormat::NdJson).unwrap();
        let refused = (0..100).find_map(|_| lines.feed(&chunk).err()).expect("refused");
        assert!(refused.starts_with("Line 1"), "{refused}");
        // Large rows make small batches.
        let mut big = RecordSizes::of(TableFormat::NdJson).unwrap();
        big.feed(&vec![b'x'; 8 * 1024 * 1024]).unwrap();
        big.feed(b"\n").unwrap();
        big.finish().unwrap();
        assert_eq!(big.batch_rows(), 7);
    }
}
