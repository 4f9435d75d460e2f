//! The order compaction writes a table's rows in when its layout names several columns.
//!
//! Sorting by the columns one after another orders the second only within runs of equal values of the first: a
//! first column with as many values as rows (a user id, a timestamp) leaves the second in arrival order, and a
//! filter on it skips nothing. So the columns are split by how many values they have, measured on a sample of
//! the rows being written:
//!
//! - a column whose values each fill at least [`PRUNED_ROWS`] rows on average (an event name, a country) is
//!   *coarse*: sorted by first, in the layout's order, each of its values is a run of its own that a filter on it
//!   finds whole, and the columns after it stay ordered within each run;
//! - the others are *fine*: two or more of them are ordered together along a Z-order curve, the bits of their
//!   ranks interleaved (the first column's highest bit first), so that each fine column's filter skips about as
//!   much as the others'. A value's rank is its bucket among quantiles of the sample (the way Databricks'
//!   Z-ordering ranks values), not its bytes: a column whose values share a long prefix (`user_0...`, this
//!   year's timestamps) would otherwise leave its high bits equal and hand the order to the other column.
//!
//! The key is a `u64` computed by [`ZOrderKey`], a scalar function the compaction's sort evaluates (and spills
//! beside the rows, like any sort key). Nulls sort last, as the coarse columns' nulls do.

use std::sync::Arc;

use datafusion::arrow::array::{new_empty_array, Array, ArrayRef, UInt32Array, UInt64Array};
use datafusion::arrow::compute::{concat, take, SortOptions};
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::{DataFusionError, Result};
use datafusion::dataframe::DataFrame;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, SortExpr, Volatility,
};
use datafusion::prelude::ident;
use futures_util::StreamExt;

/// The finest run of rows a filter skips: a hot table's slice (DataFusion's default batch size) and about a
/// Parquet page of a table's files. A column with at most one value per this many rows is coarse.
pub(crate) const PRUNED_ROWS: usize = 8192;

/// Rows of the sample a Z-order's quantiles are taken from, at least (at most twice as many are kept).
const SAMPLE_ROWS: usize = 1 << 16;

/// Bits of each fine column's rank in the key, at most: 65,536 buckets, the sample's size.
const RANK_BITS: u32 = 16;

/// How compaction sorts rows by `columns` (the table's layout, in its order): the coarse columns first, then the
/// fine ones, one by one if there is one, along a Z-order if there are more. Reads the columns of `frame` once
/// to measure them when there are several; fewer rows than four runs a filter skips are sorted in the layout's
/// order.
pub(crate) async fn sort_keys(frame: &DataFrame, columns: &[String]) -> Result<Vec<SortExpr>> {
    let ascending = |c: &String| ident(c).sort(true, false);
    if columns.len() < 2 {
        return Ok(columns.iter().map(ascending).collect());
    }
    let names: Vec<&str> = columns.iter().map(String::as_str).collect();
    let (rows, sample) = sample(frame.clone().select_columns(&names)?).await?;
    if rows < 4 * PRUNED_ROWS {
        // Fewer rows than a two-by-two grid of runs a filter skips: there is nothing to lay out.
        return Ok(columns.iter().map(ascending).collect());
    }
    let mut coarse = Vec::new();
    let mut fine = Vec::new();
    for (column, values) in columns.iter().zip(sample) {
        let ranked = Ranked::new(values)?;
        if ranked.distinct * PRUNED_ROWS <= rows {
            coarse.push(column);
        } else {
            fine.push((column, ranked));
        }
    }
    let mut keys: Vec<SortExpr> = coarse.into_iter().map(ascending).collect();
    if fine.len() < 2 {
        keys.extend(fine.iter().map(|(column, _)| ascending(column)));
        return Ok(keys);
    }
    let args = fine.iter().map(|(column, _)| ident(*column)).collect();
    let key = ZOrderKey::new(fine.into_iter().map(|(_, ranked)| ranked.bounds).collect());
    keys.push(ScalarUDF::new_from_impl(key).call(args).sort(true, false));
    Ok(keys)
}

/// The rows `frame` has, and an evenly spaced sample of each of its columns: every row until there are twice
/// [`SAMPLE_ROWS`], then every second of those and of the rows after, and so on.
async fn sample(frame: DataFrame) -> Result<(usize, Vec<ArrayRef>)> {
    let schema = frame.schema().as_arrow().clone();
    let columns = schema.fields().len();
    let mut stream = frame.execute_stream().await?;
    let (mut rows, mut stride) = (0usize, 1usize);
    let mut kept: Vec<Vec<ArrayRef>> = vec![Vec::new(); columns];
    let mut kept_rows = 0;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        // The batch's rows whose position in the whole is a multiple of the stride.
        let first = (stride - rows % stride) % stride;
        let picked = UInt32Array::from_iter_values(
            (first..batch.num_rows())
                .step_by(stride)
                .map(|i| u32::try_from(i).expect("a batch's rows fit u32")),
        );
        rows += batch.num_rows();
        kept_rows += picked.len();
        for (column, kept) in batch.columns().iter().zip(&mut kept) {
            kept.push(take(column, &picked, None)?);
        }
        if kept_rows >= 2 * SAMPLE_ROWS {
            let every_other = UInt32Array::from_iter_values(
                (0..kept_rows).step_by(2).map(|i| u32::try_from(i).expect("the sample fits u32")),
            );
            for kept in &mut kept {
                let all = concat(&kept.iter().map(AsRef::as_ref).collect::<Vec<_>>())?;
                *kept = vec![take(&all, &every_other, None)?];
            }
            kept_rows = every_other.len();
            stride *= 2;
        }
    }
    let mut sample = Vec::with_capacity(columns);
    for (parts, field) in kept.into_iter().zip(schema.fields()) {
        sample.push(match parts.as_slice() {
            [] => new_empty_array(field.data_type()),
            parts => concat(&parts.iter().map(AsRef::as_ref).collect::<Vec<_>>())?,
        });
    }
    Ok((rows, sample))
}

/// A column's sample measured: how many values it has, and the bounds of its rank buckets.
struct Ranked {
    distinct: usize,
    bounds: Bounds,
}

impl Ranked {
    fn new(values: ArrayRef) -> Result<Self> {
        let data_type = values.data_type().clone();
        let rows = RowConverter::new(vec![sort_field(&data_type)])?.convert_columns(&[values])?;
        let mut sorted: Vec<&[u8]> = rows.iter().map(|row| row.data()).collect();
        sorted.sort_unstable();
        let buckets = sorted.len().clamp(1, 1 << RANK_BITS);
        // A value's bucket is how many of these it is not below: the sample's quantiles, 0 to buckets - 1.
        let upper = (1..buckets).map(|i| sorted[i * sorted.len() / buckets].to_vec()).collect();
        sorted.dedup();
        Ok(Self { distinct: sorted.len(), bounds: Bounds { data_type, upper } })
    }
}

/// How values of a column are ranked: their row-format bytes (which compare as the values do) against the
/// upper bounds of the buckets below the last.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Bounds {
    data_type: DataType,
    upper: Vec<Vec<u8>>,
}

impl Bounds {
    /// The rank of each of `values`, a number of `bits` bits.
    fn ranks(&self, values: &ArrayRef, bits: u32) -> Result<Vec<u64>> {
        let converter = RowConverter::new(vec![sort_field(&self.data_type)])?;
        let rows: Rows = converter.convert_columns(&[Arc::clone(values)])?;
        // The ranks spread over `bits` bits, so that a column of few buckets still has its high bits set.
        let buckets = self.upper.len() as u64 + 1;
        let shift = bits - (u64::BITS - (buckets - 1).leading_zeros()).min(bits);
        Ok(rows
            .iter()
            .map(|row| (self.upper.partition_point(|bound| bound.as_slice() <= row.data()) as u64) << shift)
            .collect())
    }
}

/// Values sort ascending with nulls last, as the coarse columns sort.
fn sort_field(data_type: &DataType) -> SortField {
    SortField::new_with_options(data_type.clone(), SortOptions { descending: false, nulls_first: false })
}

/// `zorder_key(a, b, ...)`: the rows' Z-order over the fine columns, each ranked by its [`Bounds`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ZOrderKey {
    signature: Signature,
    columns: Vec<Bounds>,
}

impl ZOrderKey {
    fn new(columns: Vec<Bounds>) -> Self {
        Self { signature: Signature::any(columns.len(), Volatility::Immutable), columns }
    }
}

impl ScalarUDFImpl for ZOrderKey {
    fn name(&self) -> &'static str {
        "zorder_key"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::UInt64)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if args.args.len() != self.columns.len() {
            return datafusion::common::internal_err!("zorder_key takes {} columns", self.columns.len());
        }
        let width = u32::try_from(self.columns.len()).map_err(|e| DataFusionError::External(Box::new(e)))?;
        let bits = (u64::BITS / width).min(RANK_BITS);
        let mut ranks = Vec::with_capacity(self.columns.len());
        for (value, bounds) in args.args.iter().zip(&self.columns) {
            ranks.push(bounds.ranks(&value.to_array(args.number_rows)?, bits)?);
        }
        let keys = (0..args.number_rows).map(|row| interleave(ranks.iter().map(|r| r[row]), bits));
        Ok(ColumnarValue::Array(Arc::new(UInt64Array::from_iter_values(keys))))
    }
}

/// The bits of `ranks` (each `bits` wide) interleaved, highest first, the first rank's bit before the others'.
fn interleave(ranks: impl Iterator<Item = u64> + Clone, bits: u32) -> u64 {
    let mut key = 0;
    for bit in (0..bits).rev() {
        for rank in ranks.clone() {
            key = (key << 1) | ((rank >> bit) & 1);
        }
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};
    use datafusion::prelude::SessionContext;

    #[test]
    fn interleaving_follows_the_z_curve_with_the_first_column_highest() {
        // Two columns of 2-bit ranks: the 4x4 grid in Z order, (0,0) (0,1) (1,0) (1,1) then the next quadrant.
        let key = |a: u64, b: u64| interleave([a, b].into_iter(), 2);
        let mut cells: Vec<(u64, u64)> = (0..4).flat_map(|a| (0..4).map(move |b| (a, b))).collect();
        cells.sort_by_key(|&(a, b)| key(a, b));
        let z = [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)];
        assert_eq!(cells[..8], z);
        assert_eq!(cells[8..12], [(2, 0), (2, 1), (3, 0), (3, 1)]);
        assert_eq!(key(3, 3), 0b1111);
    }

    /// A table of `n` rows: `user` and `at` each with `n` values (a prefix shared by all, and big numbers in a
    /// narrow range: what would leave raw bytes' high bits equal), `kind` with three, `null_at` with nulls.
    fn table(n: usize) -> (SessionContext, DataFrame) {
        let ctx = SessionContext::new();
        let ids: Vec<usize> = (0..n).collect();
        let schema = Arc::new(Schema::new(vec![
            Field::new("user", DataType::Utf8, false),
            Field::new("at", DataType::Int64, false),
            Field::new("kind", DataType::Utf8, false),
        ]));
        let user = StringArray::from_iter_values(ids.iter().map(|i| format!("user_{:07}", (i * 7919) % n)));
        let at = Int64Array::from_iter_values(ids.iter().map(|&i| 1_780_000_000_000_000 + i as i64));
        let kind = StringArray::from_iter_values(ids.iter().map(|i| format!("k{}", i % 3)));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(user), Arc::new(at), Arc::new(kind)]).unwrap();
        let frame = ctx.read_batch(batch).unwrap();
        (ctx, frame)
    }

    /// The rows of `frame` sorted by [`sort_keys`] of `columns`, as (user, at, kind).
    async fn sorted(frame: DataFrame, columns: &[&str]) -> Vec<(String, i64, String)> {
        let columns: Vec<String> = columns.iter().map(|c| (*c).to_owned()).collect();
        let keys = sort_keys(&frame, &columns).await.unwrap();
        let batches = frame.sort(keys).unwrap().collect().await.unwrap();
        let mut rows = Vec::new();
        for batch in batches {
            let user = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
            let at = batch.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
            let kind = batch.column(2).as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..batch.num_rows() {
                rows.push((user.value(i).to_owned(), at.value(i), kind.value(i).to_owned()));
            }
        }
        rows
    }

    /// The mean, over `chunks` runs of consecutive rows, of the share of all values a run's values span.
    fn mean_span<T: Ord + Clone>(values: &[T], chunks: usize) -> f64 {
        let mut all = values.to_vec();
        all.sort();
        let rank = |v: &T| all.partition_point(|x| x < v) as f64 / all.len() as f64;
        let size = values.len() / chunks;
        let spans = values.chunks(size).map(|chunk| {
            let (lo, hi) = (chunk.iter().min().unwrap(), chunk.iter().max().unwrap());
            rank(hi) - rank(lo)
        });
        spans.sum::<f64>() / (values.len() / size) as f64
    }

    #[tokio::test]
    async fn two_fine_columns_are_both_narrow_in_every_run_of_rows() {
        let (_ctx, frame) = table(200_000);
        let rows = sorted(frame, &["user", "at"]).await;
        assert_eq!(rows.len(), 200_000);
        let users: Vec<&String> = rows.iter().map(|r| &r.0).collect();
        let ats: Vec<i64> = rows.iter().map(|r| r.1).collect();
        // In 64 runs (8 x 8 cells of the curve), each column spans about an eighth; sorted one after the other,
        // the second would span nearly everything in every run.
        let (user_span, at_span) = (mean_span(&users, 64), mean_span(&ats, 64));
        assert!(user_span < 0.2 && at_span < 0.2, "user {user_span:.3}, at {at_span:.3}");
        let mut distinct: Vec<(String, i64)> = rows.iter().map(|r| (r.0.clone(), r.1)).collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 200_000, "the same rows");
    }

    #[tokio::test]
    async fn a_coarse_column_comes_first_and_the_others_follow_within_its_runs() {
        let (_ctx, frame) = table(200_000);
        // `kind` (three values) named last still sorts first; `user` is then sorted within each kind.
        let rows = sorted(frame, &["user", "kind"]).await;
        let keys: Vec<(&String, &String)> = rows.iter().map(|r| (&r.2, &r.0)).collect();
        assert!(keys.is_sorted(), "sorted by kind, then user");
        // One column alone is sorted by itself, whatever its values.
        let (_ctx, frame) = table(1_000);
        let rows = sorted(frame, &["at"]).await;
        assert!(rows.iter().map(|r| r.1).is_sorted());
    }

    #[tokio::test]
    async fn the_sample_is_evenly_spaced_and_bounded() {
        let (_ctx, frame) = table(300_000);
        let (rows, sample) = sample(frame.select_columns(&["at"]).unwrap()).await.unwrap();
        assert_eq!(rows, 300_000);
        let at = sample[0].as_any().downcast_ref::<Int64Array>().unwrap();
        assert!(at.len() >= SAMPLE_ROWS && at.len() < 2 * SAMPLE_ROWS, "{}", at.len());
        let steps: Vec<i64> = at.values().windows(2).map(|w| w[1] - w[0]).collect();
        assert!(steps.iter().all(|&s| s == steps[0]), "one stride throughout");
    }

    #[test]
    fn ranks_are_quantiles_and_nulls_rank_last() {
        let values: ArrayRef = Arc::new(Int64Array::from_iter_values(0..1000));
        let ranked = Ranked::new(Arc::clone(&values)).unwrap();
        assert_eq!(ranked.distinct, 1000);
        let probe: ArrayRef = Arc::new(Int64Array::from(vec![Some(0), Some(500), Some(999), None, Some(-5)]));
        let ranks = ranked.bounds.ranks(&probe, 16).unwrap();
        // 1,000 buckets take 10 bits, spread to the top of 16.
        assert_eq!(ranks, [0, 500 << 6, 999 << 6, 999 << 6, 0]);
    }
}
