//! Rollups (see `domain::Rollup`): an aggregating query stored grouped by its keys plus the columns its variables
//! filter, with each aggregate's partial values, and answered by filtering those rows and aggregating again.
//!
//! Both plans are built from the query's unoptimized plan (see `outline`), so the stored rows and the answer
//! follow the query as DataFusion planned it: the stored plan is the query's sources and WHERE (its variable
//! predicates removed) under a new aggregation; the answer is that aggregation recombined, renamed to the
//! query's own aggregation's output, under the rest of the query's outermost SELECT (HAVING, the select list,
//! DISTINCT, ORDER BY) as it was.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::Column as PlanColumn;
use datafusion::error::{DataFusionError, Result};
use datafusion::functions::expr_fn::{coalesce, date_trunc};
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::functions_aggregate::expr_fn::sum;
use datafusion::functions_aggregate::sum::sum_udaf;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{
    cast, col, lit, Aggregate, BinaryExpr, Expr, LogicalPlan, LogicalPlanBuilder, Operator,
};
use datafusion::scalar::ScalarValue;
use domain::{AggregateKind, CompareOp, MaterializedFilter, Rollup, StoredColumn};

use crate::compile::Compiled;
use crate::stored::outline::{aggregate_kind, aggregation, simple, spine, unaliased, without_simple};

/// The stored column of the query's `i`th group key.
fn key_column(i: usize) -> String {
    format!("k{i}")
}

/// The stored column of the rollup's `j`th filtered column.
fn filter_column(j: usize) -> String {
    format!("f{j}")
}

/// The stored column a filter compares; `None` for an output column of the query, which a rollup does not
/// store as such.
fn stored_column(column: &StoredColumn) -> Option<String> {
    match column {
        StoredColumn::Key(i) => Some(key_column(*i)),
        StoredColumn::Filtered(j) => Some(filter_column(*j)),
        StoredColumn::Output(_) => None,
    }
}

/// The stored column a filter compares, in a rollup's rows or in rows stored as the query answered them.
pub(crate) fn stored_name(column: &StoredColumn) -> Option<String> {
    match column {
        StoredColumn::Output(name) => Some(name.clone()),
        other => stored_column(other),
    }
}

/// What the stored rows are grouped by, for messages: the query's keys, then the filtered columns (a timestamp
/// stored by day says so), then the arguments of DISTINCT aggregates.
pub(crate) fn grouping(rollup: &Rollup) -> Vec<String> {
    let filtered = rollup.columns.iter().map(|c| match c.day {
        true => format!("{} (by day)", c.column),
        false => c.column.clone(),
    });
    rollup.keys.iter().cloned().chain(filtered).chain(rollup.distinct.iter().cloned()).collect()
}

/// The stored column of the `j`th argument of DISTINCT aggregates.
fn distinct_column(j: usize) -> String {
    format!("d{j}")
}

/// For each aggregate, the DISTINCT argument whose values the rollup stores for it (see
/// the domain's `distinct_values`), as the index `j` of its column `d{j}`: one per argument, in the order of the
/// aggregates, whatever calls share it.
fn distinct_arguments(aggregate: &Aggregate) -> Result<(Vec<&Expr>, Vec<Option<usize>>)> {
    let mut arguments: Vec<&Expr> = Vec::new();
    let mut of = Vec::with_capacity(aggregate.aggr_expr.len());
    for expr in &aggregate.aggr_expr {
        let call = function(expr)?;
        let counted = matches!(
            aggregate_kind(call.func.name()),
            AggregateKind::Count | AggregateKind::Sum | AggregateKind::Avg
        );
        if !(call.params.distinct && counted) {
            of.push(None);
            continue;
        }
        let [argument] = call.params.args.as_slice() else {
            return Err(internal("stores DISTINCT values of one argument only"));
        };
        if call.params.filter.is_some() {
            return Err(internal("stores DISTINCT values without a FILTER only"));
        }
        let j = match arguments.iter().position(|a| *a == argument) {
            Some(j) => j,
            None => {
                arguments.push(argument);
                arguments.len() - 1
            }
        };
        of.push(Some(j));
    }
    Ok((arguments, of))
}

/// The stored column of the count that goes with the `m`th aggregate, an average, whose sum is `a{m}`.
fn count_column(m: usize) -> String {
    format!("c{m}")
}

/// The stored column of the `m`th aggregate's partial value.
fn aggregate_column(m: usize) -> String {
    format!("a{m}")
}

fn internal(what: &str) -> DataFusionError {
    DataFusionError::Internal(format!("a rollup's plan {what}"))
}

/// The query's outermost aggregation and the spine nodes above it, top first.
fn split(plan: &LogicalPlan) -> Result<(Vec<&LogicalPlan>, &Aggregate)> {
    let (nodes, _) = spine(plan);
    let aggregate = aggregation(&nodes).ok_or_else(|| internal("has no aggregation"))?;
    let above = nodes.iter().take_while(|n| !matches!(n, LogicalPlan::Aggregate(_))).copied().collect();
    Ok((above, aggregate))
}

/// The function an aggregate expression calls, with its parameters.
fn function(expr: &Expr) -> Result<&AggregateFunction> {
    match unaliased(expr) {
        Expr::AggregateFunction(call) => Ok(call),
        other => Err(internal(&format!("cannot recombine `{other}`"))),
    }
}

/// The rows a rollup stores: the query's sources and WHERE (if it has one) without its variable predicates,
/// grouped by the query's keys (`k0, ...`), the rollup's columns (`f0, ...`) and the arguments of its DISTINCT
/// counts, sums and averages (`d0, ...`), with the partial value of each other aggregate (`a{m}`; an average as
/// its sum `a{m}` and count `c{m}`).
pub(crate) fn stored_plan(plan: &LogicalPlan, compiled: &Compiled, rollup: &Rollup) -> Result<LogicalPlan> {
    let (nodes, filter) = spine(plan);
    let aggregate = aggregation(&nodes).ok_or_else(|| internal("has no aggregation"))?;
    // Without a WHERE no variable filters a column: the rollup is of the keys alone.
    let compared: HashMap<String, PlanColumn> = filter
        .into_iter()
        .flat_map(|filter| split_conjunction(&filter.predicate))
        .filter_map(|c| simple(c, compiled))
        .map(|s| (s.column.flat_name(), s.column))
        .collect();
    let mut groups: Vec<Expr> =
        aggregate.group_expr.iter().enumerate().map(|(i, e)| e.clone().alias(key_column(i))).collect();
    for (j, column) in rollup.columns.iter().enumerate() {
        let found = compared.get(&column.column).ok_or_else(|| internal("lost a filtered column"))?;
        let expr = Expr::Column(found.clone());
        // A comparison with a date casts both sides to this type: truncating it keeps the comparison exact.
        let expr = if column.day {
            date_trunc(lit("day"), cast(expr, DataType::Timestamp(TimeUnit::Nanosecond, None)))
        } else {
            expr
        };
        groups.push(expr.alias(filter_column(j)));
    }
    let (arguments, distinct) = distinct_arguments(aggregate)?;
    for (j, argument) in arguments.into_iter().enumerate() {
        groups.push(argument.clone().alias(distinct_column(j)));
    }
    let mut partials = Vec::with_capacity(aggregate.aggr_expr.len());
    for (m, expr) in aggregate.aggr_expr.iter().enumerate() {
        let call = function(expr)?;
        if distinct[m].is_some() {
            continue;
        }
        if aggregate_kind(call.func.name()) == AggregateKind::Avg {
            let params = &call.params;
            let with = |func| {
                Expr::AggregateFunction(AggregateFunction::new_udf(
                    func,
                    params.args.clone(),
                    false,
                    params.filter.clone(),
                    params.order_by.clone(),
                    params.null_treatment,
                ))
            };
            partials.push(with(sum_udaf()).alias(aggregate_column(m)));
            partials.push(with(count_udaf()).alias(count_column(m)));
        } else {
            partials.push(Expr::AggregateFunction(call.clone()).alias(aggregate_column(m)));
        }
    }
    let source = match filter {
        Some(filter) => without_simple(filter, compiled)?,
        None => aggregate.input.as_ref().clone(),
    };
    LogicalPlanBuilder::from(source).aggregate(groups, partials)?.build()
}

/// The partial rows of a rollup's parts (`parts`, a scan of them) merged into one row per group of the rollup
/// `stored` (its stored plan) writes: counts and sums summed, minimums and maximums taken again (by the same
/// functions), each column cast back to the type the stored plan writes (a file's strings read back as views)
/// so that the merged part and the parts folded after it have one schema. DISTINCT values are groups of their
/// own, merged as any group.
pub(crate) fn merged(parts: LogicalPlan, stored: &LogicalPlan) -> Result<LogicalPlan> {
    let LogicalPlan::Aggregate(aggregate) = stored else {
        return Err(internal("has no aggregation at its top"));
    };
    let keys = aggregate.group_expr.len();
    let fields = aggregate.schema.fields();
    let groups: Vec<Expr> = fields
        .iter()
        .take(keys)
        .map(|f| cast(col(f.name()), f.data_type().clone()).alias(f.name()))
        .collect();
    let mut partials = Vec::with_capacity(aggregate.aggr_expr.len());
    for (expr, field) in aggregate.aggr_expr.iter().zip(fields.iter().skip(keys)) {
        let call = function(expr)?;
        let partial = col(field.name());
        let again = match aggregate_kind(call.func.name()) {
            AggregateKind::Count | AggregateKind::Sum => sum(partial),
            AggregateKind::Min | AggregateKind::Max => Expr::AggregateFunction(AggregateFunction::new_udf(
                Arc::clone(&call.func),
                vec![partial],
                false,
                None,
                vec![],
                None,
            )),
            AggregateKind::Avg | AggregateKind::Other => {
                return Err(internal(&format!("cannot merge `{}`", call.func.name())))
            }
        };
        partials.push(cast(again, field.data_type().clone()).alias(field.name()));
    }
    LogicalPlanBuilder::from(parts).aggregate(groups, partials)?.build()
}

pub(crate) fn operator(op: CompareOp) -> Operator {
    match op {
        CompareOp::Eq => Operator::Eq,
        CompareOp::NotEq => Operator::NotEq,
        CompareOp::Lt => Operator::Lt,
        CompareOp::LtEq => Operator::LtEq,
        CompareOp::Gt => Operator::Gt,
        CompareOp::GtEq => Operator::GtEq,
    }
}

/// The query answered from `stored` (a scan of a rollup's rows): its rows that pass every filter, aggregated
/// again by the query's keys, under the rest of the query's outermost SELECT.
pub(crate) fn read_plan(
    plan: &LogicalPlan,
    stored: LogicalPlan,
    filters: Vec<(MaterializedFilter, ScalarValue)>,
) -> Result<LogicalPlan> {
    let (above, aggregate) = split(plan)?;
    let mut conditions = Vec::with_capacity(filters.len());
    for (filter, value) in filters {
        let column = stored_column(&filter.column).ok_or_else(|| internal("filters an output column"))?;
        conditions.push(Expr::BinaryExpr(BinaryExpr::new(
            Box::new(col(column)),
            operator(filter.op),
            Box::new(lit(value)),
        )));
    }
    let mut builder = LogicalPlanBuilder::from(stored);
    if let Some(predicate) = conjunction(conditions) {
        builder = builder.filter(predicate)?;
    }
    let keys = aggregate.group_expr.len();
    let groups: Vec<Expr> = (0..keys).map(|i| col(key_column(i))).collect();
    let (_, distinct) = distinct_arguments(aggregate)?;
    // Each aggregate recombined from its partials: where its value (or an average's sum and count) lands, and
    // how it is finished there (`None`: as it is).
    let mut recombined = Vec::with_capacity(aggregate.aggr_expr.len());
    let mut aggregates = Vec::with_capacity(aggregate.aggr_expr.len());
    for (m, expr) in aggregate.aggr_expr.iter().enumerate() {
        let partial = col(aggregate_column(m));
        let call = function(expr)?;
        let kind = aggregate_kind(call.func.name());
        // The call itself, over the stored DISTINCT values of its argument.
        if let Some(j) = distinct[m] {
            recombined.push((None, keys + aggregates.len()));
            aggregates.push(Expr::AggregateFunction(AggregateFunction::new_udf(
                Arc::clone(&call.func),
                vec![col(distinct_column(j))],
                true,
                None,
                vec![],
                None,
            )));
            continue;
        }
        recombined.push((Some(kind), keys + aggregates.len()));
        match kind {
            AggregateKind::Count | AggregateKind::Sum => aggregates.push(sum(partial)),
            // The function the query called (in this engine's order of floats: `float_order`), on the partials.
            AggregateKind::Min | AggregateKind::Max => aggregates.push(Expr::AggregateFunction(
                AggregateFunction::new_udf(Arc::clone(&call.func), vec![partial], false, None, vec![], None),
            )),
            AggregateKind::Avg => {
                aggregates.push(sum(partial));
                aggregates.push(sum(col(count_column(m))));
            }
            AggregateKind::Other => {
                return Err(internal(&format!("cannot recombine `{}`", call.func.name())))
            }
        }
    }
    let again = builder.aggregate(groups, aggregates)?.build()?;
    let output = again.schema().clone();
    let at = |i: usize| Expr::Column(PlanColumn::from(output.qualified_field(i)));
    // The recombined values under the names and types of the query's own aggregation, so that the nodes above
    // it read them as they read that aggregation.
    let mut renamed = Vec::with_capacity(aggregate.schema.fields().len());
    for (i, (qualifier, field)) in aggregate.schema.iter().enumerate() {
        let value = if i < keys {
            at(i)
        } else {
            let (kind, position) =
                recombined.get(i - keys).ok_or_else(|| internal("has more outputs than aggregates"))?;
            match kind {
                // A COUNT of no rows is 0, where a SUM of none is NULL.
                Some(AggregateKind::Count) => coalesce(vec![at(*position), lit(0_i64)]),
                // A decimal sum is divided as a decimal (then cast to the average's scale); anything else in
                // floating point, as the live average computes it.
                Some(AggregateKind::Avg) => match field.data_type() {
                    DataType::Decimal128(..) | DataType::Decimal256(..) => at(*position) / at(position + 1),
                    _ => cast(at(*position), DataType::Float64) / cast(at(position + 1), DataType::Float64),
                },
                _ => at(*position),
            }
        };
        renamed
            .push(cast(value, field.data_type().clone()).alias_qualified(qualifier.cloned(), field.name()));
    }
    let mut node = LogicalPlanBuilder::from(again).project(renamed)?.build()?;
    for above in above.into_iter().rev() {
        node = above.with_new_exprs(above.expressions(), vec![node])?;
    }
    Ok(node)
}
