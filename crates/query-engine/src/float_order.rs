//! `min` and `max` of floating point numbers in one order, IEEE 754's total order (`f64::total_cmp`: a NaN
//! with its sign bit set < -inf < ... < -0.0 < 0.0 < ... < inf < NaN), whether the rows are grouped or not.
//!
//! DataFusion 55's grouped `min`/`max` of floats compare with `partial_cmp` and take any value a comparison
//! with NaN leaves undecided, so a NaN in a group makes the answer depend on the order the rows arrive in
//! (the `max` of {2.5, NaN, -3.0} is -3.0); and they start each group at the type's finite extreme, so a
//! group holding only `inf` has a `min` of `f64::MAX`. Its ungrouped aggregation follows the total order
//! (arrow's kernels). A stored rollup aggregates its partial values again, grouped, so its answer can only
//! equal the live query's when both follow one order: every session has these two functions in place of
//! DataFusion's, and a rollup recombines its partials with the function its query called. Other types, and
//! window frames, are DataFusion's own.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::compute::{max, min};
use datafusion::arrow::datatypes::{DataType, FieldRef, Float32Type, Float64Type};
use datafusion::common::{internal_err, Result, ScalarValue};
use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
use datafusion::logical_expr::function::{AccumulatorArgs, AggregateFunctionSimplification, StateFieldsArgs};
use datafusion::logical_expr::utils::AggregateOrderSensitivity;
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Documentation, GroupsAccumulator, ReversedUDAF,
    SetMonotonicity, Signature, StatisticsArgs,
};
use datafusion::prelude::SessionContext;
use datafusion_functions_aggregate_common::aggregate::groups_accumulator::prim_op::PrimitiveGroupsAccumulator;

/// Which end of the order an aggregate keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Extreme {
    Min,
    Max,
}

impl Extreme {
    /// Whether `new` takes the place of `kept`.
    fn replaces(self, kept: Ordering) -> bool {
        match self {
            Self::Min => kept == Ordering::Greater,
            Self::Max => kept == Ordering::Less,
        }
    }

    /// The value every other value replaces: the other end of the total order.
    fn start(self) -> f64 {
        match self {
            Self::Min => f64::from_bits(0x7fff_ffff_ffff_ffff),
            Self::Max => f64::from_bits(u64::MAX),
        }
    }

    fn start_f32(self) -> f32 {
        match self {
            Self::Min => f32::from_bits(0x7fff_ffff),
            Self::Max => f32::from_bits(u32::MAX),
        }
    }
}

/// A grouped accumulator of `$arrow` values that keeps a new value when it compares to the kept one (in the
/// total order) as `$keep` (`$wins` as numbers, and not `$loses`), starting each group at `$start`, which
/// every value replaces.
///
/// Two numbers that differ compare as in the total order, so the hardware's comparison decides them. Only
/// equal numbers of other bits (0.0 and -0.0) and NaN take the total order's comparison: values equal to the
/// kept one, frequent in real columns, cost one integer comparison more.
macro_rules! extreme_of {
    ($data_type:expr, $arrow:ty, $keep:path, $wins:tt, $loses:tt, $start:expr) => {
        Box::new(
            PrimitiveGroupsAccumulator::<$arrow, _>::new($data_type, |kept, new| {
                if new $wins *kept {
                    *kept = new;
                } else if !(new $loses *kept)
                    && new.to_bits() != kept.to_bits()
                    && new.total_cmp(kept) == $keep
                {
                    *kept = new;
                }
            })
            .with_starting_value($start),
        ) as Box<dyn GroupsAccumulator>
    };
}

/// DataFusion's `min` or `max`, with accumulators of its own for `Float32` and `Float64`.
#[derive(Debug)]
struct TotalOrder {
    inner: Arc<dyn AggregateUDFImpl>,
    extreme: Extreme,
}

impl PartialEq for TotalOrder {
    fn eq(&self, other: &Self) -> bool {
        self.extreme == other.extreme
    }
}

impl Eq for TotalOrder {}

impl Hash for TotalOrder {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.extreme.hash(state);
    }
}

fn is_float(data_type: &DataType) -> bool {
    matches!(data_type, DataType::Float32 | DataType::Float64)
}

/// `min` and `max` in the total order, made once.
fn functions() -> &'static [Arc<AggregateUDF>; 2] {
    static FUNCTIONS: std::sync::OnceLock<[Arc<AggregateUDF>; 2]> = std::sync::OnceLock::new();
    FUNCTIONS.get_or_init(|| {
        let wrap = |inner: Arc<AggregateUDF>, extreme| {
            let inner = Arc::clone(inner.inner());
            Arc::new(AggregateUDF::new_from_impl(TotalOrder { inner, extreme }))
        };
        [wrap(min_udaf(), Extreme::Min), wrap(max_udaf(), Extreme::Max)]
    })
}

/// Puts `min` and `max` in the total order in place of DataFusion's in `ctx`.
pub(crate) fn register(ctx: &SessionContext) {
    for function in functions() {
        ctx.register_udaf(AggregateUDF::clone(function));
    }
}

impl AggregateUDFImpl for TotalOrder {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field(&self, arg_fields: &[FieldRef]) -> Result<FieldRef> {
        self.inner.return_field(arg_fields)
    }

    fn is_nullable(&self) -> bool {
        self.inner.is_nullable()
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let data_type = args.return_field.data_type().clone();
        if !is_float(&data_type) {
            return self.inner.accumulator(args);
        }
        Ok(Box::new(Extremum { extreme: self.extreme, data_type, value: None }))
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        self.inner.state_fields(args)
    }

    fn groups_accumulator_supported(&self, args: AccumulatorArgs) -> bool {
        is_float(args.return_field.data_type()) || self.inner.groups_accumulator_supported(args)
    }

    // `!(new < kept)` is meant as written: true for equal numbers and for NaN (see `extreme_of!`).
    #[allow(clippy::neg_cmp_op_on_partial_ord)]
    fn create_groups_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn GroupsAccumulator>> {
        let data_type = args.return_field.data_type().clone();
        // One closure per type and end, so that the comparison in the accumulator's loop is a constant's.
        Ok(match (&data_type, self.extreme) {
            (DataType::Float64, Extreme::Min) => {
                extreme_of!(&data_type, Float64Type, Ordering::Less, <, >, Extreme::Min.start())
            }
            (DataType::Float64, Extreme::Max) => {
                extreme_of!(&data_type, Float64Type, Ordering::Greater, >, <, Extreme::Max.start())
            }
            (DataType::Float32, Extreme::Min) => {
                extreme_of!(&data_type, Float32Type, Ordering::Less, <, >, Extreme::Min.start_f32())
            }
            (DataType::Float32, Extreme::Max) => {
                extreme_of!(&data_type, Float32Type, Ordering::Greater, >, <, Extreme::Max.start_f32())
            }
            _ => return self.inner.create_groups_accumulator(args),
        })
    }

    fn create_sliding_accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        self.inner.create_sliding_accumulator(args)
    }

    fn order_sensitivity(&self) -> AggregateOrderSensitivity {
        self.inner.order_sensitivity()
    }

    // `simplify` is not passed on: DataFusion's would put its own function back.
    fn simplify(&self) -> Option<AggregateFunctionSimplification> {
        None
    }

    fn reverse_expr(&self) -> ReversedUDAF {
        ReversedUDAF::Identical
    }

    fn is_descending(&self) -> Option<bool> {
        self.inner.is_descending()
    }

    /// Parquet's statistics of a float column leave NaN out, so they cannot answer in the total order: the
    /// `max` of a whole table holding NaN was answered from them as its largest number (while the same query
    /// with a `WHERE` read the rows and answered NaN). Such an aggregate reads the column.
    fn value_from_stats(&self, args: &StatisticsArgs) -> Option<ScalarValue> {
        match is_float(args.return_type) {
            true => None,
            false => self.inner.value_from_stats(args),
        }
    }

    fn default_value(&self, data_type: &DataType) -> Result<ScalarValue> {
        self.inner.default_value(data_type)
    }

    fn set_monotonicity(&self, data_type: &DataType) -> SetMonotonicity {
        self.inner.set_monotonicity(data_type)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// The ungrouped aggregate of a float column: the extreme seen so far, as an `f64` (an `f32` widens exactly).
#[derive(Debug)]
struct Extremum {
    extreme: Extreme,
    data_type: DataType,
    value: Option<f64>,
}

impl Extremum {
    fn offer(&mut self, new: f64) {
        match self.value {
            Some(kept) if !self.extreme.replaces(kept.total_cmp(&new)) => {}
            _ => self.value = Some(new),
        }
    }
}

impl Accumulator for Extremum {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else { return internal_err!("min/max takes one argument") };
        // Arrow's kernels (vectorised) follow the total order too.
        let extreme = match (values.data_type(), self.extreme) {
            (DataType::Float64, Extreme::Min) => min(values.as_primitive::<Float64Type>()),
            (DataType::Float64, Extreme::Max) => max(values.as_primitive::<Float64Type>()),
            (DataType::Float32, Extreme::Min) => min(values.as_primitive::<Float32Type>()).map(f64::from),
            (DataType::Float32, Extreme::Max) => max(values.as_primitive::<Float32Type>()).map(f64::from),
            (other, _) => return internal_err!("min/max of floats was given {other}"),
        };
        if let Some(value) = extreme {
            self.offer(value);
        }
        Ok(())
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        Ok(match self.data_type {
            // Exact: the value was an `f32` widened.
            #[allow(clippy::cast_possible_truncation)]
            DataType::Float32 => ScalarValue::Float32(self.value.map(|v| v as f32)),
            _ => ScalarValue::Float64(self.value),
        })
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![self.evaluate()?])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        self.update_batch(states)
    }
}
