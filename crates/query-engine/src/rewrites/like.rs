//! `LIKE` patterns of literal text and `_`, with at most a trailing `%` (`'user_012%'`, `'__-__-2026'`),
//! matched by comparing text instead of by a regular expression.
//!
//! arrow's `LIKE` kernel has fast paths only for patterns without `_` (equality, prefix, suffix, contains);
//! any `_` makes it compile the pattern to a regular expression, again for every batch, and run it on every
//! row. Such a pattern is a fixed sequence of text and single characters, so [`FixedPattern::matches`] walks
//! it once per value with no allocation. The rewritten filter keeps the pattern's literal prefix as a plain
//! `LIKE 'prefix%'` conjunct after the match: DataFusion prunes files, row groups and pages by it (as it did
//! by the original pattern, whose prefix ends at the first `_`), and evaluates it only on the rows the match
//! let through when those are few.
//!
//! A plan with a table that evaluates filters itself (a PostgreSQL source: they become its SQL) is left as it is.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayAccessor, ArrayRef, AsArray, BooleanArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::logical_expr::expr::{Like, ScalarFunction};
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    TableProviderFilterPushDown, Volatility,
};
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

/// Rewrites `x [NOT] LIKE 'fixed pattern'` (see the module's documentation) everywhere in a plan.
#[derive(Debug, Default)]
pub(crate) struct FixedLike;

impl OptimizerRule for FixedLike {
    fn name(&self) -> &'static str {
        "fixed_like"
    }

    /// The whole plan at once (no apply order): whether it may be rewritten depends on all its tables.
    fn rewrite(&self, plan: LogicalPlan, _config: &dyn OptimizerConfig) -> Result<Transformed<LogicalPlan>> {
        if !evaluated_here(&plan) {
            return Ok(Transformed::no(plan));
        }
        plan.transform_up_with_subqueries(|node| {
            // A scan's filters are its source's (and evaluated again above it when the source may let more rows
            // through); the filter above is rewritten.
            if matches!(node, LogicalPlan::TableScan(_)) {
                return Ok(Transformed::no(node));
            }
            super::rewrite_expressions(node, rewrite)
        })
    }
}

/// Whether DataFusion itself evaluates the filters of `plan`: no table in it takes a filter as exact, as a
/// PostgreSQL source does (its filters are sent to the database as SQL, where `fixed_like` is no function).
/// Each source is asked about a `LIKE` on its first column; one that cannot say is taken as exact.
pub(super) fn evaluated_here(plan: &LogicalPlan) -> bool {
    let mut here = true;
    let walked = plan.apply_with_subqueries(|node| {
        let LogicalPlan::TableScan(scan) = node else { return Ok(TreeNodeRecursion::Continue) };
        let Some(field) = scan.source.schema().fields().first().cloned() else {
            return Ok(TreeNodeRecursion::Continue);
        };
        let probe = Expr::Column(Column::from_name(field.name())).like(Expr::Literal("_".into(), None));
        let exact = scan
            .source
            .supports_filters_pushdown(&[&probe])
            .map_or(true, |answers| answers.contains(&TableProviderFilterPushDown::Exact));
        here &= !exact;
        Ok(if exact { TreeNodeRecursion::Stop } else { TreeNodeRecursion::Continue })
    });
    here && walked.is_ok()
}

/// `expr` with a `LIKE` of a fixed pattern replaced by the match and its prefix, else unchanged.
fn rewrite(expr: Expr) -> Transformed<Expr> {
    let Expr::Like(like) = &expr else { return Transformed::no(expr) };
    let Some((pattern, written)) = fixed_pattern(like) else { return Transformed::no(expr) };
    // In the written pattern's type (the column's string type, as planning coerced it).
    let prefix = pattern.prefix().and_then(|prefix| {
        let pattern = ScalarValue::try_from_string(format!("{prefix}%"), &written.data_type()).ok()?;
        Some(Expr::Like(Like::new(
            false,
            like.expr.clone(),
            Box::new(Expr::Literal(pattern, None)),
            None,
            false,
        )))
    });
    let matched = Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(ScalarUDF::new_from_impl(pattern)),
        vec![like.expr.as_ref().clone(), like.pattern.as_ref().clone()],
    ));
    Transformed::yes(match (like.negated, prefix) {
        // The prefix is implied by the match: a value that does not match may still have it.
        (true, _) => Expr::Not(Box::new(matched)),
        (false, Some(prefix)) => matched.and(prefix),
        (false, None) => matched,
    })
}

/// The pattern of a case-sensitive `LIKE` whose pattern is a literal this rewrite matches: text and at least
/// one `_`, `%` only at its end, no escapes (patterns with a backslash, or another escape character, which the
/// engine refuses, are left as they are).
fn fixed_pattern(like: &Like) -> Option<(FixedPattern, &ScalarValue)> {
    if like.case_insensitive || like.escape_char.is_some_and(|escape| escape != '\\') {
        return None;
    }
    let Expr::Literal(written, _) = like.pattern.as_ref() else { return None };
    Some((FixedPattern::parse(written.try_as_str()??)?, written))
}

/// One step of a [`FixedPattern`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Part {
    /// This text, exactly.
    Text(String),
    /// This many characters, whichever.
    Any(usize),
}

/// A `LIKE` pattern made of text and `_`, optionally ending in `%`, as the scalar function that matches it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct FixedPattern {
    parts: Vec<Part>,
    /// Whether the pattern ends in `%` (anything may follow the parts).
    open: bool,
    signature: Signature,
}

impl FixedPattern {
    /// `pattern` as a fixed pattern; `None` when arrow's own kernel is as fast (no `_`) or the pattern is not
    /// fixed (a `%` before its end, an escape).
    pub(crate) fn parse(pattern: &str) -> Option<Self> {
        let body = pattern.trim_end_matches('%');
        if !body.contains('_') || body.contains(['%', '\\']) {
            return None;
        }
        let mut parts = Vec::new();
        for (at, text) in body.split('_').enumerate() {
            if at > 0 {
                match parts.last_mut() {
                    Some(Part::Any(count)) => *count += 1,
                    _ => parts.push(Part::Any(1)),
                }
            }
            if !text.is_empty() {
                parts.push(Part::Text(text.to_owned()));
            }
        }
        Some(Self {
            parts,
            open: body.len() < pattern.len(),
            signature: Signature::any(2, Volatility::Immutable),
        })
    }

    /// The text every matching value starts with, when there is any.
    fn prefix(&self) -> Option<&str> {
        match self.parts.first() {
            Some(Part::Text(text)) => Some(text),
            _ => None,
        }
    }

    /// Whether `value` matches, as `value LIKE pattern` decides: `_` is one character (not one byte).
    pub(crate) fn matches(&self, value: &str) -> bool {
        let mut rest = value;
        for part in &self.parts {
            match part {
                Part::Text(text) => match rest.strip_prefix(text.as_str()) {
                    Some(after) => rest = after,
                    None => return false,
                },
                Part::Any(count) => {
                    let mut chars = rest.chars();
                    for _ in 0..*count {
                        if chars.next().is_none() {
                            return false;
                        }
                    }
                    rest = chars.as_str();
                }
            }
        }
        self.open || rest.is_empty()
    }

    fn match_all<'a>(&self, values: impl ArrayAccessor<Item = &'a str>) -> BooleanArray {
        BooleanArray::from_unary(values, |value| self.matches(value))
    }
}

impl ScalarUDFImpl for FixedPattern {
    fn name(&self) -> &'static str {
        "fixed_like"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // The second argument is the pattern as written, for plans' text: this function was made from it.
        let [values, _] = args.args.as_slice() else {
            return datafusion::common::internal_err!("fixed_like takes a value and its pattern");
        };
        let values = values.to_array(args.number_rows)?;
        let matched = match values.data_type() {
            DataType::Utf8View => self.match_all(values.as_string_view()),
            DataType::Utf8 => self.match_all(values.as_string::<i32>()),
            DataType::LargeUtf8 => self.match_all(values.as_string::<i64>()),
            // Dictionaries of text, and anything else `LIKE` was planned over, as the text they are.
            _ => {
                let text: ArrayRef = cast(&values, &DataType::Utf8View)?;
                self.match_all(text.as_string_view())
            }
        };
        Ok(ColumnarValue::Array(Arc::new(matched)))
    }
}
