//! Memory queries may use: each its own limit, all of them together the server's (`--max-memory`), including
//! what DataFusion's memory pool does not see.
//!
//! DataFusion accounts for the state of its operators (hash tables, sorts, buffered batches) in a memory pool;
//! a query's pool here is its own limit over a pool shared by every query ([`QueryPool`]). What no pool sees is
//! the arrays scalar functions build: `repeat('x', 1500000000)` allocates 1.5 GB in one call, and a string over
//! 2 GiB in a batch overflows Arrow's 32-bit offsets, which panics. So the functions whose output can be far
//! larger than their input are replaced, in every session, by the same functions behind a check
//! ([`Bounded`]): before each call, an upper bound of the bytes it will write is computed from its arguments and
//! reserved from the query's pool for the length of the call; past the query's limit or the server's, the call
//! fails with `ResourcesExhausted` (400 `query_memory_limit`, or 429 when it is the server's memory that is in
//! use) instead of allocating. `||` on strings is planned as such a function too ([`ConcatPlanner`]).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{DFSchema, Result, ScalarValue};
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::{
    GreedyMemoryPool, MemoryConsumer, MemoryLimit, MemoryPool, MemoryReservation,
};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::{
    ColumnarValue, Documentation, Expr, ExprSchemable, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::BinaryOperator;

/// The start of the message of a refusal for want of the server's memory (not the query's own limit): retried
/// later, it may pass.
pub(crate) const SERVER_MEMORY_IN_USE: &str = "The memory this server gives queries together is in use";

/// The most bytes one array of strings or lists can hold: its offsets are 32-bit.
const MAX_ARRAY_BYTES: usize = i32::MAX as usize;

/// One query's memory: its own limit, within the pool every query of the server shares.
#[derive(Debug)]
pub(crate) struct QueryPool {
    own: GreedyMemoryPool,
    shared: Arc<GreedyMemoryPool>,
}

impl QueryPool {
    pub(crate) fn new(limit: usize, shared: Arc<GreedyMemoryPool>) -> Self {
        Self { own: GreedyMemoryPool::new(limit), shared }
    }
}

impl fmt::Display for QueryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "query {} within server {}", self.own, self.shared)
    }
}

impl MemoryPool for QueryPool {
    fn name(&self) -> &str {
        "query"
    }

    fn grow(&self, reservation: &MemoryReservation, additional: usize) {
        self.own.grow(reservation, additional);
        self.shared.grow(reservation, additional);
    }

    fn shrink(&self, reservation: &MemoryReservation, shrink: usize) {
        self.own.shrink(reservation, shrink);
        self.shared.shrink(reservation, shrink);
    }

    fn try_grow(&self, reservation: &MemoryReservation, additional: usize) -> Result<()> {
        self.own.try_grow(reservation, additional)?;
        if self.shared.try_grow(reservation, additional).is_err() {
            self.own.shrink(reservation, additional);
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{SERVER_MEMORY_IN_USE}: {additional} more bytes for {} do not fit now.",
                reservation.consumer().name()
            )));
        }
        Ok(())
    }

    fn reserved(&self) -> usize {
        self.own.reserved()
    }

    fn memory_limit(&self) -> MemoryLimit {
        self.own.memory_limit()
    }
}

/// How a function's output grows with its arguments, for an upper bound of its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Growth {
    /// `repeat(s, n)`: `s` `n` times.
    Repeat,
    /// `lpad(s, n [, fill])`, `rpad`: `n` characters.
    Pad,
    /// `replace(s, from, to)`: each `from` becomes `to`.
    Replace,
    /// `regexp_replace(s, pattern, replacement [, flags])`: each match (an empty one between any two characters)
    /// becomes the replacement, whose `$n` each copy at most the whole string.
    RegexpReplace,
    /// The sum of the arguments: `concat`, `concat_ws`, `overlay`, `||`, and their list forms.
    Sum,
    /// `array_repeat(x, n)`, `array_resize(list, n [, x])`: `n` elements.
    Elements,
    /// `range(start, stop [, step])`, `generate_series` as a list: `(stop - start) / step` elements.
    Series,
    /// At most this many times the bytes of the arguments: `encode` (hex doubles), `translate` (a character
    /// of one byte becomes one of four), `upper`/`lower` (`ΐ` becomes three characters), `string_to_array`
    /// (each character an element with its offset).
    Times(usize),
    /// `concat_ws(separator, ...)`: the separator between each two of the others.
    Separated,
    /// `array_to_string(list, delimiter [, null])`: each element of the list, nested ones too, written as text
    /// with the delimiter (or the null's text) after it.
    Joined,
}

impl Growth {
    /// Whether the output grows with a count or a pattern in the arguments rather than with their bytes: such
    /// a call on constants is not folded into the plan when it is planned (a folded `repeat('x', 300000000)`
    /// would be a literal of 300 MB in the plan, which every rewrite of the plan copies again).
    fn by_count(self) -> bool {
        !matches!(self, Self::Sum | Self::Times(_) | Self::Separated | Self::Joined)
    }
}

/// The functions that can write far more than they read, by name, with their growth.
const BOUNDED: [(&str, Growth); 24] = [
    ("repeat", Growth::Repeat),
    ("lpad", Growth::Pad),
    ("rpad", Growth::Pad),
    ("replace", Growth::Replace),
    ("regexp_replace", Growth::RegexpReplace),
    ("concat", Growth::Sum),
    ("concat_ws", Growth::Separated),
    ("overlay", Growth::Sum),
    ("array_concat", Growth::Sum),
    ("array_append", Growth::Sum),
    ("array_prepend", Growth::Sum),
    ("make_array", Growth::Sum),
    ("array_repeat", Growth::Elements),
    ("array_resize", Growth::Elements),
    ("range", Growth::Series),
    ("generate_series", Growth::Series),
    ("encode", Growth::Times(2)),
    ("translate", Growth::Times(4)),
    ("upper", Growth::Times(3)),
    ("lower", Growth::Times(3)),
    ("initcap", Growth::Times(3)),
    ("string_to_array", Growth::Times(5)),
    ("array_to_string", Growth::Joined),
    ("to_hex", Growth::Times(2)),
];

/// `udf` behind a check of its output's size against the memory pool of a session's `runtime` and its limit
/// (the engine's default when the pool has none) when it is one of the functions that can write far more than
/// they read, else `udf` itself. Every scalar function a session takes passes through here (`crate::session`).
pub(crate) fn bounded(runtime: &RuntimeEnv, udf: Arc<ScalarUDF>) -> Arc<ScalarUDF> {
    let Some((_, growth)) = BOUNDED.iter().find(|(name, _)| *name == udf.name()) else { return udf };
    let (limit, pool) = limit_of(runtime);
    Arc::new(ScalarUDF::new_from_impl(Bounded::new(Arc::clone(udf.inner()), *growth, limit, pool)))
}

/// Plans `||` on strings in `ctx` as a function behind the same check ([`ConcatPlanner`]).
pub(crate) fn plan_concat(ctx: &SessionContext) {
    let (limit, pool) = limit_of(&ctx.runtime_env());
    let concat = Arc::new(ScalarUDF::new_from_impl(Bounded::new(
        Arc::new(StringConcat::new()),
        Growth::Sum,
        limit,
        pool,
    )));
    // Registration only fails for a registry that takes no planners, which a session context is not.
    let planned = ctx.state_ref().write().register_expr_planner(Arc::new(ConcatPlanner(concat)));
    debug_assert!(planned.is_ok(), "a session takes expression planners");
}

/// The limit a function's output is checked against in a session's `runtime`, and the pool it is reserved from.
fn limit_of(runtime: &RuntimeEnv) -> (usize, Arc<dyn MemoryPool>) {
    let pool = Arc::clone(&runtime.memory_pool);
    let limit = match pool.memory_limit() {
        MemoryLimit::Finite(own) => own,
        _ => crate::EngineLimits::default().memory_limit,
    };
    (limit, pool)
}

/// A function whose output is bounded before it is written.
struct Bounded {
    inner: Arc<dyn ScalarUDFImpl>,
    /// The function's, but for those whose output grows with a count: volatile, so that the planner never
    /// evaluates them on constants ([`Growth::by_count`]).
    signature: Signature,
    growth: Growth,
    limit: usize,
    pool: Arc<dyn MemoryPool>,
}

/// The volatility a function declares, under the bound this module may wrap it in: a bound makes a function
/// whose output grows with a count volatile only to keep the planner from evaluating it on constants, not
/// because its answer changes from one call to the next.
pub(crate) fn declared_volatility(function: &datafusion::logical_expr::ScalarUDF) -> Volatility {
    let inner: &dyn std::any::Any = function.inner().as_ref();
    match inner.downcast_ref::<Bounded>() {
        Some(bounded) => bounded.inner.signature().volatility,
        None => function.signature().volatility,
    }
}

impl Bounded {
    fn new(inner: Arc<dyn ScalarUDFImpl>, growth: Growth, limit: usize, pool: Arc<dyn MemoryPool>) -> Self {
        let mut signature = inner.signature().clone();
        if growth.by_count() {
            signature.volatility = Volatility::Volatile;
        }
        Self { inner, signature, growth, limit, pool }
    }
}

impl fmt::Debug for Bounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bounded").field("function", &self.inner.name()).field("limit", &self.limit).finish()
    }
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner.name() == other.inner.name() && self.growth == other.growth && self.limit == other.limit
    }
}

impl Eq for Bounded {}

impl Hash for Bounded {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.inner.name().hash(state);
        self.growth.hash(state);
        self.limit.hash(state);
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.schema_name(args)
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn is_nullable(&self, args: &[Expr], schema: &dyn datafusion::common::ExprSchema) -> bool {
        #[allow(deprecated)]
        self.inner.is_nullable(args, schema)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }

    // `simplify` is not passed on: a function's simplification may rewrite it into calls of the unbounded one.

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = upper_bound(self.growth, &args.args, args.number_rows);
        // While it writes, the call holds its arguments too: in a chain (`encode(encode(repeat(...)))`) each
        // call's input is the output of the one before, alive until this one returns.
        let holds = bytes.saturating_add(args.args.iter().map(held_bytes).fold(0, usize::saturating_add));
        let refused = |why: String| {
            Err(DataFusionError::ResourcesExhausted(format!(
                "{}() would write up to {bytes} bytes, {why}.",
                self.inner.name()
            )))
        };
        if holds > self.limit {
            return refused(format!(
                "which with its arguments is over the query's memory limit of {} bytes",
                self.limit
            ));
        }
        if bytes > MAX_ARRAY_BYTES {
            return refused("more than one column of a batch can hold".to_owned());
        }
        // Held while the function writes: its output is the query's until it flows on.
        let reservation = MemoryConsumer::new(format!("{}()", self.inner.name())).register(&self.pool);
        reservation.try_grow(holds)?;
        self.inner.invoke_with_args(args)
    }
}

/// The string at `row` of a string argument (`None` for a null, or an argument that is no string).
fn str_at(value: &ColumnarValue, row: usize) -> Option<&str> {
    match value {
        ColumnarValue::Scalar(
            ScalarValue::Utf8(Some(s)) | ScalarValue::LargeUtf8(Some(s)) | ScalarValue::Utf8View(Some(s)),
        ) => Some(s),
        ColumnarValue::Scalar(_) => None,
        ColumnarValue::Array(array) => {
            if array.is_null(row) {
                return None;
            }
            match array.data_type() {
                DataType::Utf8 => Some(array.as_string::<i32>().value(row)),
                DataType::LargeUtf8 => Some(array.as_string::<i64>().value(row)),
                DataType::Utf8View => Some(array.as_string_view().value(row)),
                _ => None,
            }
        }
    }
}

/// The value at `row` of an argument, as a scalar (only for the small ones: counts, bounds, steps).
fn scalar_at(value: &ColumnarValue, row: usize) -> Option<ScalarValue> {
    match value {
        ColumnarValue::Scalar(scalar) => Some(scalar.clone()),
        ColumnarValue::Array(array) => ScalarValue::try_from_array(array, row).ok(),
    }
}

/// An integer argument at `row`: a count (`n`), never below zero; a null counts as zero.
fn count_at(value: &ColumnarValue, row: usize) -> usize {
    let n = match scalar_at(value, row) {
        Some(ScalarValue::Int64(Some(n))) => i128::from(n),
        Some(ScalarValue::Int32(Some(n))) => i128::from(n),
        Some(ScalarValue::UInt64(Some(n))) => i128::from(n),
        Some(other) if !other.is_null() => {
            other.cast_to(&DataType::Int64).ok().and_then(|v| i64::try_from(v).ok()).map_or(0, i128::from)
        }
        _ => 0,
    };
    usize::try_from(n.max(0)).unwrap_or(usize::MAX)
}

/// The bytes an argument holds at `row`, for one that is copied into the output.
fn bytes_at(value: &ColumnarValue, row: usize, rows: usize) -> usize {
    if let Some(s) = str_at(value, row) {
        return s.len();
    }
    match value {
        // A whole array's memory split over its rows: lists and other nested values.
        ColumnarValue::Array(array) => array.get_array_memory_size() / rows.max(1) + 16,
        ColumnarValue::Scalar(scalar) => scalar.size(),
    }
}

/// The bytes of an argument's values, all its rows (a scalar's once per row), without spare capacity.
fn slice_bytes(value: &ColumnarValue, rows: usize) -> usize {
    match value {
        ColumnarValue::Array(array) => {
            array.to_data().get_slice_memory_size().unwrap_or_else(|_| array.get_array_memory_size())
        }
        ColumnarValue::Scalar(_) => {
            let each = str_at(value, 0).map_or_else(|| bytes_at(value, 0, rows), str::len);
            each.saturating_mul(rows)
        }
    }
}

/// The bytes of an argument's values a call holds: an array's rows only (a slice of a larger array, as a
/// `LIMIT` makes, would otherwise count the whole array's buffers and refuse a call over a few rows), a scalar
/// once.
fn held_bytes(value: &ColumnarValue) -> usize {
    match value {
        ColumnarValue::Array(_) => slice_bytes(value, 1),
        ColumnarValue::Scalar(scalar) => scalar.size(),
    }
}

/// The values of a list at `row`, those of its nested lists counted one by one (one for a value that is not a
/// list).
fn leaves_at(value: &ColumnarValue, row: usize) -> usize {
    fn leaves(array: &dyn Array) -> usize {
        match array.data_type() {
            DataType::List(_) => {
                let list = array.as_list::<i32>();
                let offsets = list.value_offsets();
                let (first, last) = (offsets[0].max(0), offsets[offsets.len() - 1].max(0));
                let (first, last) = (first.unsigned_abs() as usize, last.unsigned_abs() as usize);
                leaves(&list.values().slice(first, last.saturating_sub(first)))
            }
            DataType::LargeList(_) => {
                let list = array.as_list::<i64>();
                let offsets = list.value_offsets();
                let first = usize::try_from(offsets[0]).unwrap_or(0);
                let last = usize::try_from(offsets[offsets.len() - 1]).unwrap_or(0);
                leaves(&list.values().slice(first, last.saturating_sub(first)))
            }
            // The whole child: more than the row's, never fewer.
            DataType::FixedSizeList(..) => leaves(array.as_fixed_size_list().values()),
            _ => array.len(),
        }
    }
    match value {
        ColumnarValue::Array(array) if row < array.len() => leaves(&array.slice(row, 1)),
        ColumnarValue::Array(_) => 0,
        ColumnarValue::Scalar(scalar) => scalar.to_array().map_or(1, |array| leaves(&array)),
    }
}

/// The number of elements `range`/`generate_series` would list at `row`, from its bounds and step as numbers
/// of the same unit (integers, days, timestamps' units); a step of an interval counts as at least a second.
fn series_at(args: &[ColumnarValue], row: usize) -> usize {
    let as_i128 = |value: Option<ScalarValue>| -> Option<i128> {
        match value? {
            ScalarValue::Int64(v) => v.map(i128::from),
            ScalarValue::Date32(v) => v.map(|days| i128::from(days) * 86_400_000_000_000),
            ScalarValue::Date64(v) => v.map(|ms| i128::from(ms) * 1_000_000),
            ScalarValue::TimestampNanosecond(v, _) => v.map(i128::from),
            ScalarValue::TimestampMicrosecond(v, _) => v.map(|v| i128::from(v) * 1_000),
            ScalarValue::TimestampMillisecond(v, _) => v.map(|v| i128::from(v) * 1_000_000),
            ScalarValue::TimestampSecond(v, _) => v.map(|v| i128::from(v) * 1_000_000_000),
            ScalarValue::IntervalMonthDayNano(v) => v.map(|v| {
                (i128::from(v.months) * 28 * 86_400 + i128::from(v.days) * 86_400) * 1_000_000_000
                    + i128::from(v.nanoseconds)
            }),
            ScalarValue::IntervalDayTime(v) => {
                v.map(|v| i128::from(v.days) * 86_400_000_000_000 + i128::from(v.milliseconds) * 1_000_000)
            }
            ScalarValue::IntervalYearMonth(v) => v.map(|months| i128::from(months) * 28 * 86_400_000_000_000),
            other => other.cast_to(&DataType::Int64).ok().and_then(|v| i64::try_from(v).ok()).map(i128::from),
        }
    };
    let (start, stop, step) = match args {
        [stop] => (Some(0), as_i128(scalar_at(stop, row)), Some(1)),
        [start, stop] => (as_i128(scalar_at(start, row)), as_i128(scalar_at(stop, row)), Some(1)),
        [start, stop, step, ..] => {
            (as_i128(scalar_at(start, row)), as_i128(scalar_at(stop, row)), as_i128(scalar_at(step, row)))
        }
        [] => (None, None, None),
    };
    let (Some(start), Some(stop), Some(step)) = (start, stop, step) else { return 0 };
    let temporal = !matches!(scalar_at(&args[0], row), Some(ScalarValue::Int64(_)) | None);
    let step = if temporal { step.abs().max(1_000_000_000) } else { step.abs().max(1) };
    usize::try_from((stop - start).abs() / step + 1).unwrap_or(usize::MAX)
}

/// An upper bound of the bytes a call writes for `rows` rows of `args`.
fn upper_bound(growth: Growth, args: &[ColumnarValue], rows: usize) -> usize {
    if let Growth::Times(k) = growth {
        // A bound of the whole call at once, without a pass over its rows: these functions run on hot paths
        // (`lower(country) = 'us'`), and their bound is their arguments' bytes, whichever rows hold them.
        let bytes = args.iter().map(|a| slice_bytes(a, rows)).fold(0, usize::saturating_add);
        return bytes.saturating_mul(k).saturating_add(rows.saturating_mul(64));
    }
    let arg = |i: usize| args.get(i);
    let len = |i: usize, row: usize| arg(i).and_then(|a| str_at(a, row)).map_or(0, str::len);
    let per_row = |row: usize| -> usize {
        match growth {
            Growth::Repeat => len(0, row).saturating_mul(arg(1).map_or(0, |n| count_at(n, row))),
            Growth::Pad => {
                let ascii =
                    [0, 2].iter().all(|i| arg(*i).and_then(|a| str_at(a, row)).is_none_or(str::is_ascii));
                let width = if ascii { 1 } else { 4 };
                arg(1).map_or(0, |n| count_at(n, row)).saturating_mul(width)
            }
            Growth::Replace => {
                let (s, from, to) = (len(0, row), len(1, row), len(2, row));
                // An empty `from` matches between every two characters.
                let matches = s.checked_div(from).unwrap_or(s + 1);
                s.saturating_add(matches.saturating_mul(to))
            }
            Growth::RegexpReplace => {
                let s = len(0, row);
                let replacement = arg(2).and_then(|a| str_at(a, row)).unwrap_or("");
                let copies = replacement.matches('$').count() + 1;
                s.saturating_mul(copies).saturating_add((s + 1).saturating_mul(replacement.len()))
            }
            Growth::Sum => args.iter().map(|a| bytes_at(a, row, rows)).fold(0, usize::saturating_add),
            Growth::Elements => {
                let element = arg(2).or(arg(0)).map_or(16, |a| bytes_at(a, row, rows).max(16));
                arg(1).map_or(0, |n| count_at(n, row)).saturating_mul(element)
            }
            Growth::Series => series_at(args, row).saturating_mul(16),
            // Bounded for the whole call at once, above.
            Growth::Times(_) => 0,
            Growth::Separated => {
                let others =
                    args.iter().skip(1).map(|a| bytes_at(a, row, rows)).fold(0, usize::saturating_add);
                len(0, row).saturating_mul(args.len().saturating_sub(2)).saturating_add(others)
            }
            Growth::Joined => {
                // A number's text is at most 24 bytes; a string's is its bytes, which the list's holds. The
                // delimiter and the null's text may be values of any type, cast to text.
                let text = |i: usize| match arg(i) {
                    Some(a) if str_at(a, row).is_some() => len(i, row),
                    Some(a) => bytes_at(a, row, rows).saturating_mul(4).saturating_add(24),
                    None => 0,
                };
                let each = text(1).saturating_add(text(2)).saturating_add(24);
                let leaves = arg(0).map_or(0, |list| leaves_at(list, row));
                leaves.saturating_mul(each).saturating_add(arg(0).map_or(0, |list| bytes_at(list, row, rows)))
            }
        }
        // Offsets and validity of the row.
        .saturating_add(64)
    };
    let varies = args.iter().any(|a| matches!(a, ColumnarValue::Array(_)));
    if varies {
        (0..rows).map(per_row).fold(0, usize::saturating_add)
    } else {
        per_row(0).saturating_mul(rows.max(1))
    }
}

/// `a || b` on strings: their concatenation, null when either is (unlike `concat`, which skips nulls).
#[derive(Debug, PartialEq, Eq, Hash)]
struct StringConcat {
    signature: Signature,
}

impl StringConcat {
    fn new() -> Self {
        Self { signature: Signature::user_defined(Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for StringConcat {
    fn name(&self) -> &str {
        "string_concat"
    }

    /// Named as the operator it stands for, so a column computed by `a || b` keeps its name.
    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        match args {
            [left, right] => Ok(format!("{} || {}", left.schema_name(), right.schema_name())),
            _ => Err(DataFusionError::Plan("|| takes two operands".into())),
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        match arg_types {
            [_, _] => Ok(vec![DataType::Utf8, DataType::Utf8]),
            _ => Err(DataFusionError::Plan("|| takes two operands".into())),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let scalars = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays: Vec<ArrayRef> = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<_>>()?;
        let [left, right] = arrays.as_slice() else {
            return Err(DataFusionError::Plan("|| takes two operands".into()));
        };
        let joined = datafusion::arrow::compute::kernels::concat_elements::concat_elements_dyn(left, right)?;
        if scalars {
            return ScalarValue::try_from_array(&joined, 0).map(ColumnarValue::Scalar);
        }
        Ok(ColumnarValue::Array(joined))
    }
}

/// Plans `||` between strings (or a string and a scalar of another type) as [`StringConcat`] behind its bound;
/// lists are left to DataFusion's own planner, which makes them bounded list functions.
#[derive(Debug)]
struct ConcatPlanner(Arc<ScalarUDF>);

fn is_list(data_type: &DataType) -> bool {
    matches!(
        data_type,
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) | DataType::ListView(_)
    )
}

impl ExprPlanner for ConcatPlanner {
    fn plan_binary_op(&self, expr: RawBinaryExpr, schema: &DFSchema) -> Result<PlannerResult<RawBinaryExpr>> {
        if expr.op != BinaryOperator::StringConcat {
            return Ok(PlannerResult::Original(expr));
        }
        let (left, right) = (expr.left.get_type(schema)?, expr.right.get_type(schema)?);
        if is_list(&left) || is_list(&right) {
            return Ok(PlannerResult::Original(expr));
        }
        let call = ScalarFunction::new_udf(Arc::clone(&self.0), vec![expr.left, expr.right]);
        Ok(PlannerResult::Planned(Expr::ScalarFunction(call)))
    }
}

/// The fields a test reads the bound through.
#[cfg(test)]
pub(crate) fn bound_of(name: &str, args: &[ColumnarValue], rows: usize) -> Option<usize> {
    BOUNDED.iter().find(|(bounded, _)| *bounded == name).map(|(_, growth)| upper_bound(*growth, args, rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::Utf8(Some(s.into())))
    }

    fn int(n: i64) -> ColumnarValue {
        ColumnarValue::Scalar(ScalarValue::Int64(Some(n)))
    }

    #[test]
    fn bounds_cover_what_each_function_writes() {
        assert_eq!(bound_of("repeat", &[text("ab"), int(1_000)], 3), Some(6_192));
        assert_eq!(bound_of("repeat", &[text("ab"), int(-5)], 3), Some(192));
        assert_eq!(bound_of("lpad", &[text("x"), int(100)], 1), Some(164));
        assert_eq!(bound_of("lpad", &[text("x"), int(100), text("é")], 1), Some(464));
        assert_eq!(bound_of("replace", &[text("aaaa"), text("a"), text("bbb")], 1), Some(80));
        assert_eq!(bound_of("replace", &[text("aaaa"), text(""), text("b")], 1), Some(73));
        assert!(bound_of("regexp_replace", &[text("abc"), text("(.)"), text("$1$1")], 1).unwrap() >= 6);
        assert_eq!(bound_of("concat", &[text("ab"), text("cde")], 2), Some(138));
        assert_eq!(bound_of("concat_ws", &[text("--"), text("ab"), text("cde")], 1), Some(71));
        assert_eq!(bound_of("encode", &[text("abc"), text("hex")], 1), Some(76));
        assert_eq!(bound_of("range", &[int(0), int(1_000_000_000), int(1)], 1), Some(16_000_000_080));
        assert!(bound_of("array_repeat", &[int(1), int(1_000)], 1).unwrap() >= 16_000);
        let days = ColumnarValue::Scalar(ScalarValue::Date32(Some(0)));
        let far = ColumnarValue::Scalar(ScalarValue::Date32(Some(3_000_000)));
        let second = ColumnarValue::Scalar(ScalarValue::new_interval_mdn(0, 0, 1_000_000_000));
        assert!(bound_of("range", &[days, far, second], 1).unwrap() > 1 << 40);
        let array =
            ColumnarValue::Array(Arc::new(datafusion::arrow::array::StringArray::from(vec!["a", "bb"])));
        assert_eq!(bound_of("repeat", &[array, int(10)], 2), Some(158));
        let list = ColumnarValue::Scalar(ScalarValue::List(Arc::new(
            datafusion::arrow::array::ListArray::from_iter_primitive::<
                datafusion::arrow::datatypes::Int64Type,
                _,
                _,
            >([Some((0..1_000).map(Some))]),
        )));
        let bound = bound_of("array_to_string", &[list, text("-----")], 1).unwrap();
        assert!(bound >= 1_000 * 29, "{bound}");
    }

    /// The bytes an array's values take, without spare capacity.
    fn logical_bytes(array: &dyn Array) -> usize {
        array.to_data().get_slice_memory_size().unwrap_or(0)
    }

    /// Every scalar function of DataFusion, called with each list of arguments it takes from a row of a string
    /// of every width of character, a list, bytes and small numbers: each that writes more than it reads is
    /// one of the bounded, and its bound covers what it wrote. A function a new DataFusion adds that grows its
    /// input fails here until it is bounded.
    #[tokio::test]
    async fn every_function_that_writes_more_than_it_reads_is_bounded() {
        let ctx = SessionContext::new();
        let text = "aȿȺΐß€😀 x,1".repeat(200);
        ctx.sql(&format!(
            "CREATE TABLE t AS SELECT '{text}' AS s, arrow_cast('{text}', 'Utf8View') AS v, \
             range(1, 5000) AS l, [['{text}', 'x'], ['y']] AS ll, arrow_cast('{text}', 'Binary') AS b, \
             CAST(3 AS BIGINT) AS n, 2.5 AS f, DATE '2024-01-02' AS d, TIMESTAMP '2024-01-02 03:04:05' AS ts"
        ))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
        // Lists of arguments, one from another by "; ".
        let arguments = "s; v; b; l; ll; n; f; d; ts; s, s; s, v; s, n; v, n; b, n; l, n; s, 'hex'; s, 'base64'; b, 'hex'; \
                         b, 'base64'; b, 'base64pad'; s, 'a'; s, ''; s, ','; s, 'a', '€😀'; s, 'aȿ', '€😀x'; s, '', 'xyz'; \
                         s, '.', 'xy'; s, n, 'xy'; s, n, n; s, 'a', n; l, ','; l, s; l, ',', s; ll, ','; l, l; l, n, n; \
                         l, s, n; n, s; n, l; s, s, s; d, d; ts, ts; '%Y-%m-%d %H %M %S %A %B', ts; \
                         ts, '%Y-%m-%d %H:%M:%S %A %B %c'; s, 'x', 'g'; s, '(.)', '$1$1$1', 'g'; n, n, n; l, 1, l; l, l, l; \
                         'k', s; s, l; f, n; s, f";
        let mut names: Vec<String> = ctx.state().scalar_functions().keys().cloned().collect();
        names.sort();
        let mut growing = Vec::new();
        for name in names {
            for args in arguments.split("; ") {
                let Ok(frame) = ctx.sql(&format!("SELECT {name}({args}) AS o FROM t")).await else {
                    continue;
                };
                let Ok(out) = frame.collect().await else { continue };
                let Some(out) = out.first().map(|batch| Arc::clone(batch.column(0))) else { continue };
                let aliased: Vec<String> =
                    args.split(", ").enumerate().map(|(i, arg)| format!("{arg} AS a{i}")).collect();
                let inputs = ctx
                    .sql(&format!("SELECT {} FROM t", aliased.join(", ")))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let input_bytes: usize = inputs[0].columns().iter().map(|c| logical_bytes(c.as_ref())).sum();
                let written = logical_bytes(out.as_ref());
                if written <= input_bytes + input_bytes / 20 + 256 {
                    continue;
                }
                let values: Vec<ColumnarValue> =
                    inputs[0].columns().iter().map(|c| ColumnarValue::Array(Arc::clone(c))).collect();
                // Under its own name: `list_to_string` is `array_to_string`.
                let own = ctx.udf(&name).map_or_else(|_| name.clone(), |udf| udf.name().to_owned());
                match bound_of(&own, &values, 1) {
                    Some(bound) if bound >= written => {}
                    bound => {
                        growing.push(format!("{name}({args}): {input_bytes} -> {written}, bound {bound:?}"))
                    }
                }
            }
        }
        assert!(growing.is_empty(), "unbounded growth:\n{}", growing.join("\n"));
    }

    #[test]
    fn the_shared_pool_bounds_every_query_together() {
        let shared = Arc::new(GreedyMemoryPool::new(100));
        let (a, b): (Arc<dyn MemoryPool>, Arc<dyn MemoryPool>) = (
            Arc::new(QueryPool::new(80, Arc::clone(&shared))),
            Arc::new(QueryPool::new(80, Arc::clone(&shared))),
        );
        let first = MemoryConsumer::new("a").register(&a);
        first.try_grow(70).unwrap();
        assert!(first.try_grow(20).is_err(), "past the query's own limit");
        let second = MemoryConsumer::new("b").register(&b);
        let refused = second.try_grow(40).unwrap_err().to_string();
        assert!(refused.contains(SERVER_MEMORY_IN_USE), "{refused}");
        assert_eq!(b.reserved(), 0, "a refused growth is given back");
        second.try_grow(30).unwrap();
        drop(first);
        assert_eq!(shared.reserved(), 30);
    }
}
