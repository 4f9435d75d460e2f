//! The facts materialization needs from a query's plan ([`QueryOutline`]), and the plan with its variable
//! predicates removed.
//!
//! Both read the unoptimized logical plan, whose shape follows the SQL: the outermost SELECT is a spine of
//! single-input nodes (`Limit`, `Sort`, `Distinct`, `Projection`, `Window`, `Filter` for HAVING, `Aggregate`)
//! down to the `Filter` of its WHERE, above the sources (scans, joins, subqueries). Placeholders are still in it,
//! each `CAST($n AS type)` as the compiler wrote it.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::Column as PlanColumn;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::expr::{AggregateFunction, Alias};
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Aggregate, BinaryExpr, Distinct, Expr, Filter, LogicalPlan, Operator};
use domain::{
    AggregateCall, AggregateKind, ColumnType, CompareOp, QueryOutline, VariablePredicate, VariableType,
};

use crate::compile::Compiled;
use crate::types;

/// A WHERE conjunct `column <op> variable`, with the column as the plan names it there.
pub(crate) struct Simple {
    pub(crate) column: PlanColumn,
    pub(crate) op: CompareOp,
    pub(crate) variable: String,
}

fn compare_op(op: Operator) -> Option<CompareOp> {
    Some(match op {
        Operator::Eq => CompareOp::Eq,
        Operator::NotEq => CompareOp::NotEq,
        Operator::Lt => CompareOp::Lt,
        Operator::LtEq => CompareOp::LtEq,
        Operator::Gt => CompareOp::Gt,
        Operator::GtEq => CompareOp::GtEq,
        _ => return None,
    })
}

/// The variable a placeholder expression stands for: `$n` itself or the compiler's `CAST($n AS type)`.
fn variable_of<'a>(expr: &Expr, compiled: &'a Compiled) -> Option<&'a str> {
    let inner = match expr {
        Expr::Cast(cast) => cast.expr.as_ref(),
        other => other,
    };
    let Expr::Placeholder(placeholder) = inner else { return None };
    let index: usize = placeholder.id.strip_prefix('$')?.parse().ok()?;
    compiled.params.get(index.checked_sub(1)?).map(|(name, _)| name.as_str())
}

pub(crate) fn simple(conjunct: &Expr, compiled: &Compiled) -> Option<Simple> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else { return None };
    let op = compare_op(*op)?;
    let (column, op, value) = match (left.as_ref(), right.as_ref()) {
        (Expr::Column(column), other) => (column, op, other),
        (other, Expr::Column(column)) => (column, op.flipped(), other),
        _ => return None,
    };
    let variable = variable_of(value, compiled)?.to_owned();
    Some(Simple { column: column.clone(), op, variable })
}

/// The outermost SELECT's nodes from the top down to (not including) its WHERE filter, and that filter.
pub(crate) fn spine(plan: &LogicalPlan) -> (Vec<&LogicalPlan>, Option<&Filter>) {
    let mut nodes = Vec::new();
    let mut node = plan;
    let mut seen_projection = false;
    loop {
        let next = match node {
            LogicalPlan::Limit(limit) => &limit.input,
            LogicalPlan::Sort(sort) => &sort.input,
            LogicalPlan::Distinct(Distinct::All(input)) => input,
            LogicalPlan::Distinct(Distinct::On(on)) => &on.input,
            LogicalPlan::Projection(projection) => {
                seen_projection = true;
                &projection.input
            }
            LogicalPlan::Window(window) => &window.input,
            LogicalPlan::Aggregate(aggregate) => &aggregate.input,
            // A filter right above the aggregation is its HAVING.
            LogicalPlan::Filter(filter) if matches!(*filter.input, LogicalPlan::Aggregate(_)) => {
                &filter.input
            }
            LogicalPlan::Filter(filter) if seen_projection => return (nodes, Some(filter)),
            _ => return (nodes, None),
        };
        nodes.push(node);
        node = next;
    }
}

/// Follows a column from below the spine node `node` to above it: its new name, or `None` when it does not
/// pass through unchanged.
fn through(node: &LogicalPlan, column: PlanColumn) -> Option<PlanColumn> {
    match node {
        LogicalPlan::Projection(projection) => projection.expr.iter().find_map(|expr| match expr {
            Expr::Column(c) if *c == column => Some(column.clone()),
            Expr::Alias(Alias { expr, relation, name, .. })
                if matches!(expr.as_ref(), Expr::Column(c) if *c == column) =>
            {
                Some(PlanColumn::new(relation.clone(), name))
            }
            _ => None,
        }),
        LogicalPlan::Aggregate(aggregate) => {
            aggregate.group_expr.iter().any(|e| matches!(e, Expr::Column(c) if *c == column)).then_some(column)
        }
        LogicalPlan::Distinct(Distinct::On(_)) => None,
        _ => Some(column),
    }
}

/// Counts each variable's placeholders anywhere in the plan, subqueries included.
fn placeholder_uses(plan: &LogicalPlan, compiled: &Compiled) -> Result<HashMap<String, usize>> {
    let mut uses: HashMap<String, usize> = HashMap::new();
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|expr| {
            expr.apply(|e| {
                if let Expr::Placeholder(_) = e {
                    if let Some(name) = variable_of(e, compiled) {
                        *uses.entry(name.to_owned()).or_default() += 1;
                    }
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    Ok(uses)
}

/// The outermost SELECT's aggregation, if it has one.
pub(crate) fn aggregation<'a>(nodes: &[&'a LogicalPlan]) -> Option<&'a Aggregate> {
    nodes.iter().find_map(|n| match n {
        LogicalPlan::Aggregate(aggregate) => Some(aggregate),
        _ => None,
    })
}

/// An aggregate expression without its alias.
pub(crate) fn unaliased(expr: &Expr) -> &Expr {
    match expr {
        Expr::Alias(Alias { expr, .. }) => unaliased(expr),
        other => other,
    }
}

/// How the plan writes a group key or an aggregate call.
fn text(expr: &Expr) -> String {
    unaliased(expr).schema_name().to_string()
}

/// The aggregate DataFusion's function of that name computes.
pub(crate) fn aggregate_kind(name: &str) -> AggregateKind {
    match name.to_ascii_lowercase().as_str() {
        "count" => AggregateKind::Count,
        "sum" => AggregateKind::Sum,
        "min" => AggregateKind::Min,
        "max" => AggregateKind::Max,
        "avg" => AggregateKind::Avg,
        _ => AggregateKind::Other,
    }
}

fn call(expr: &Expr) -> AggregateCall {
    match unaliased(expr) {
        Expr::AggregateFunction(AggregateFunction { func, params }) => AggregateCall {
            text: text(expr),
            function: aggregate_kind(func.name()),
            distinct: params.distinct,
            ordered: !params.order_by.is_empty(),
            distinct_argument: match params.args.as_slice() {
                [argument] if params.distinct && params.filter.is_none() => Some(text(argument)),
                _ => None,
            },
        },
        other => AggregateCall {
            text: text(other),
            function: AggregateKind::Other,
            distinct: false,
            ordered: false,
            distinct_argument: None,
        },
    }
}

/// The facts of the plan's outermost SELECT.
pub(crate) fn outline(plan: &LogicalPlan, compiled: &Compiled) -> Result<QueryOutline> {
    let (nodes, filter) = spine(plan);
    let aggregate = aggregation(&nodes);
    let mut outline = QueryOutline {
        limit_or_offset: nodes.iter().any(|n| matches!(n, LogicalPlan::Limit(_))),
        aggregates: aggregate.is_some(),
        window_functions: nodes.iter().any(|n| matches!(n, LogicalPlan::Window(_))),
        group_keys: aggregate.map_or_else(Vec::new, |a| a.group_expr.iter().map(text).collect()),
        grouping_sets: aggregate
            .is_some_and(|a| a.group_expr.iter().any(|e| matches!(e, Expr::GroupingSet(_)))),
        aggregate_calls: aggregate.map_or_else(Vec::new, |a| a.aggr_expr.iter().map(call).collect()),
        ..QueryOutline::default()
    };
    let mut remaining = placeholder_uses(plan, compiled)?;
    let conjuncts = filter.map_or_else(Vec::new, |f| split_conjunction(&f.predicate));
    for found in conjuncts.into_iter().filter_map(|c| simple(c, compiled)) {
        if let Some(count) = remaining.get_mut(&found.variable) {
            *count -= 1;
        }
        let group_key = aggregate.and_then(|a| {
            a.group_expr.iter().position(|e| matches!(e, Expr::Column(c) if *c == found.column))
        });
        let output = nodes.iter().rev().try_fold(found.column.clone(), |column, node| through(node, column));
        let column_type = filter
            .and_then(|f| f.input.schema().qualified_field_from_column(&found.column).ok())
            .map(|(_, field)| field)
            .map_or(ColumnType::Unknown, |field| types::column_type(field.data_type()));
        let variable_type = compiled
            .params
            .iter()
            .find(|(name, _)| *name == found.variable)
            .map_or(VariableType::String, |(_, ty)| *ty);
        outline.predicates.push(VariablePredicate {
            variable: found.variable,
            variable_type,
            op: found.op,
            column: found.column.flat_name(),
            column_type,
            output_column: output
                .filter(|c| plan.schema().has_column_with_unqualified_name(&c.name))
                .map(|c| c.name),
            group_key,
        });
    }
    let mut other: Vec<String> =
        remaining.into_iter().filter(|(_, n)| *n > 0).map(|(name, _)| name).collect();
    other.sort();
    outline.other_uses = other;
    Ok(outline)
}

/// The plan with the outermost WHERE's variable predicates removed: what a materialization stores.
pub(crate) fn without_variable_predicates(plan: LogicalPlan, compiled: &Compiled) -> Result<LogicalPlan> {
    let depth = match spine(&plan) {
        (nodes, Some(_)) => nodes.len(),
        (_, None) => return Ok(plan),
    };
    strip(plan, depth, compiled)
}

fn strip(plan: LogicalPlan, depth: usize, compiled: &Compiled) -> Result<LogicalPlan> {
    if depth > 0 {
        return plan
            .map_children(|child| strip(child, depth - 1, compiled).map(Transformed::yes))
            .map(|t| t.data);
    }
    let LogicalPlan::Filter(filter) = plan else {
        return Err(DataFusionError::Internal("the outermost WHERE moved while it was being removed".into()));
    };
    without_simple(&filter, compiled)
}

/// The WHERE `filter` without its variable predicates: a filter of the rest, or its input when none remain.
pub(crate) fn without_simple(filter: &Filter, compiled: &Compiled) -> Result<LogicalPlan> {
    let kept: Vec<Expr> = split_conjunction(&filter.predicate)
        .into_iter()
        .filter(|c| simple(c, compiled).is_none())
        .cloned()
        .collect();
    match conjunction(kept) {
        Some(predicate) => Filter::try_new(predicate, Arc::clone(&filter.input)).map(LogicalPlan::Filter),
        None => Ok(filter.input.as_ref().clone()),
    }
}
