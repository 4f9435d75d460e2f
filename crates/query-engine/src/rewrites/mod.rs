//! Rewrites of saved queries' plans that keep every answer and make it cheaper to compute: DataFusion
//! optimizer rules added to each session this engine plans in (not to a Ballista cluster's, whose executors
//! would not know the functions they plan).

mod date_of;
mod eager_aggregate;
mod like;

use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::Result;
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::prelude::SessionContext;

/// Adds every rewrite to `ctx`'s optimizer, after DataFusion's own rules (so literals are folded first).
pub(crate) fn register(ctx: &SessionContext) {
    ctx.add_optimizer_rule(Arc::new(like::FixedLike));
    ctx.add_optimizer_rule(Arc::new(date_of::DayOfTimestamp));
    ctx.add_optimizer_rule(Arc::new(eager_aggregate::EagerAggregate));
}

/// `node` with each of its expressions rewritten bottom up by `rewrite`; an expression that names an output
/// column keeps its name (a projection's `x LIKE 'a_%'`, a `GROUP BY CAST(ts AS DATE)`).
fn rewrite_expressions(
    node: LogicalPlan,
    rewrite: impl Fn(Expr) -> Transformed<Expr>,
) -> Result<Transformed<LogicalPlan>> {
    let names = NamePreserver::new(&node);
    node.map_expressions(|expr| {
        let name = names.save(&expr);
        let rewritten = expr.transform_up(|expr| Ok(rewrite(expr)))?;
        Ok(if rewritten.transformed { rewritten.update_data(|expr| name.restore(expr)) } else { rewritten })
    })
}

#[cfg(test)]
mod date_of_tests;
#[cfg(test)]
mod eager_aggregate_tests;
#[cfg(test)]
mod tests;
