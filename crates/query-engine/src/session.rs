//! The DataFusion sessions requests plan and run in: one per request, which takes only the functions its
//! statement names.
//!
//! A session made the usual way (`SessionContext::new_with_config_rt`) registers each of DataFusion's several
//! hundred functions and their aliases, and each copy of its state (one per `DataFrame`, one per task context)
//! copies those maps again: a live `SELECT 1` spent a seventh of its time so (docs/flows.md). Here
//! the functions, the planners and the optimizer's rules are made once per process ([`Registry`]); a session
//! starts with the rules and no functions, and before a statement is planned ([`plan`]) it takes the functions
//! the statement names, as it takes the tables it names (`catalog::register_named`). A statement that does not
//! plan so is planned again with every function, so that neither an answer nor an error depends on what was
//! taken.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::{Arc, LazyLock};

use datafusion::catalog::TableFunction;
use datafusion::execution::context::{SessionConfig, SessionContext};
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::execution::FunctionRegistry;
use datafusion::logical_expr::planner::ExprPlanner;
use datafusion::logical_expr::{AggregateUDF, HigherOrderUDF, LogicalPlan, ScalarUDF, WindowUDF};
use datafusion::optimizer::{Analyzer, Optimizer};
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr, ObjectName, Visit, Visitor};

/// Aggregates DataFusion's optimizer looks up by name rather than finding them in the plan: `first_value`
/// plans `DISTINCT ON`. Every session has them, plans kept from an earlier session too.
const LOOKED_UP: [&str; 1] = ["first_value"];

/// Every function a session can take, and the rules and planners every session has, made once.
struct Registry {
    scalar: HashMap<String, Arc<ScalarUDF>>,
    higher_order: HashMap<String, Arc<HigherOrderUDF>>,
    aggregate: HashMap<String, Arc<AggregateUDF>>,
    window: HashMap<String, Arc<WindowUDF>>,
    table: HashMap<String, Arc<TableFunction>>,
    planners: Vec<Arc<dyn ExprPlanner>>,
    analyzer: Analyzer,
    optimizer: Optimizer,
    physical: PhysicalOptimizer,
}

/// DataFusion's defaults with this engine's own: `min` and `max` in total order (`float_order`) and the
/// rewrites of saved queries (`rewrites`). Functions that can write far more than they read are bound to each
/// session's memory pool when a session takes them (`memory::bounded`).
static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let state = with_every_function().state();
    Registry {
        scalar: state.scalar_functions().clone(),
        higher_order: state.higher_order_functions().clone(),
        aggregate: state.aggregate_functions().clone(),
        window: state.window_functions().clone(),
        table: state.table_functions().clone(),
        planners: state.expr_planners().to_vec(),
        analyzer: state.analyzer().clone(),
        optimizer: state.optimizer().clone(),
        physical: PhysicalOptimizer::with_rules(state.physical_optimizers().to_vec()),
    }
});

/// A session made as DataFusion makes one, with every function, and this engine's own aggregates and rules:
/// what [`REGISTRY`] holds, and what tests compare a session that takes functions with.
fn with_every_function() -> SessionContext {
    let ctx = SessionContext::new();
    crate::float_order::register(&ctx);
    crate::rewrites::register(&ctx);
    ctx
}

/// A session with `config` and `runtime` that has DataFusion's planners and rules and this engine's, and of
/// the functions only those the optimizer looks up by name ([`LOOKED_UP`]).
pub(crate) fn new(config: SessionConfig, runtime: Arc<RuntimeEnv>) -> SessionContext {
    let registry = &*REGISTRY;
    let mut builder = SessionStateBuilder::new()
        .with_config(config)
        .with_runtime_env(runtime)
        .with_expr_planners(registry.planners.clone());
    *builder.analyzer() = Some(registry.analyzer.clone());
    *builder.optimizer() = Some(registry.optimizer.clone());
    *builder.physical_optimizers() = Some(registry.physical.clone());
    let ctx = SessionContext::new_with_state(builder.build());
    crate::memory::plan_concat(&ctx);
    take(&ctx, LOOKED_UP.iter().copied());
    ctx
}

/// `statement` planned in `ctx`, which takes the functions `statement` names first; when it does not plan so,
/// planned again with every function.
///
/// # Errors
/// Why the statement does not plan, with every function at hand.
pub(crate) async fn plan(
    ctx: &SessionContext,
    statement: DfStatement,
) -> datafusion::error::Result<LogicalPlan> {
    take(ctx, named(&statement).iter().map(String::as_str));
    match ctx.state().statement_to_plan(statement.clone()).await {
        Ok(plan) => Ok(plan),
        Err(_) => {
            take(ctx, all());
            ctx.state().statement_to_plan(statement).await
        }
    }
}

/// Every function's name, aliases too.
fn all() -> impl Iterator<Item = &'static str> {
    let registry = &*REGISTRY;
    registry
        .scalar
        .keys()
        .chain(registry.higher_order.keys())
        .chain(registry.aggregate.keys())
        .chain(registry.window.keys())
        .chain(registry.table.keys())
        .map(String::as_str)
}

/// Registers in `ctx` each function of the registry called one of `names` that `ctx` does not have yet (a
/// cluster's session has them all): scalar, higher-order, aggregate, window and table functions alike.
fn take<'a>(ctx: &SessionContext, names: impl Iterator<Item = &'a str>) {
    let registry = &*REGISTRY;
    let runtime = ctx.runtime_env();
    let state = ctx.state_ref();
    let mut state = state.write();
    for name in names {
        if let Some(udf) = registry.scalar.get(name) {
            if !state.scalar_functions().contains_key(name) {
                let bounded = crate::memory::bounded(&runtime, Arc::clone(udf));
                // A session's registry takes any function.
                let _ = state.register_udf(bounded);
            }
        }
        if let Some(function) = registry.higher_order.get(name) {
            if !state.higher_order_functions().contains_key(name) {
                let _ = state.register_higher_order_function(Arc::clone(function));
            }
        }
        if let Some(udaf) = registry.aggregate.get(name) {
            if !state.aggregate_functions().contains_key(name) {
                let _ = state.register_udaf(Arc::clone(udaf));
            }
        }
        if let Some(udwf) = registry.window.get(name) {
            if !state.window_functions().contains_key(name) {
                let _ = state.register_udwf(Arc::clone(udwf));
            }
        }
        if let Some(udtf) = registry.table.get(name) {
            if !state.table_functions().contains_key(name) {
                state.register_udtf(name, Arc::clone(udtf.function()));
            }
        }
    }
}

/// The names of the functions `statement` calls, as DataFusion's planner looks them up: each function's name
/// (lower case unless quoted), each table's (a table function is called in `FROM`), and those the planner
/// looks up for syntax of their own (`TRIM`, `CEIL`, `FLOOR`, `^`).
fn named(statement: &DfStatement) -> Vec<String> {
    struct Names(Vec<String>);

    impl Names {
        fn object(&mut self, name: &ObjectName) {
            match name.0.as_slice() {
                [part] => {
                    if let Some(ident) = part.as_ident() {
                        let value = match ident.quote_style {
                            Some(_) => ident.value.clone(),
                            None => ident.value.to_ascii_lowercase(),
                        };
                        self.0.push(value);
                    }
                }
                _ => self.0.push(name.to_string()),
            }
        }

        fn known(&mut self, names: &[&str]) {
            self.0.extend(names.iter().map(|name| (*name).to_owned()));
        }
    }

    impl Visitor for Names {
        type Break = ();

        fn pre_visit_expr(&mut self, expr: &Expr) -> ControlFlow<()> {
            match expr {
                Expr::Function(function) => self.object(&function.name),
                Expr::Trim { .. } => self.known(&["trim", "btrim", "ltrim", "rtrim"]),
                Expr::Ceil { .. } => self.known(&["ceil"]),
                Expr::Floor { .. } => self.known(&["floor"]),
                Expr::BinaryOp { op: BinaryOperator::PGExp, .. } => self.known(&["power"]),
                _ => {}
            }
            ControlFlow::Continue(())
        }

        fn pre_visit_relation(&mut self, relation: &ObjectName) -> ControlFlow<()> {
            self.object(relation);
            ControlFlow::Continue(())
        }
    }

    let mut names = Names(Vec::new());
    if let DfStatement::Statement(inner) = statement {
        let _ = inner.visit(&mut names);
    }
    names.0.sort_unstable();
    names.0.dedup();
    names.0
}

#[cfg(test)]
#[path = "session_tests.rs"]
mod tests;
