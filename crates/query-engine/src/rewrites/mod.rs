//! Rewrites of saved queries' plans that keep every answer and make it cheaper to compute: DataFusion
//! optimizer rules added to each session this engine plans in (not to a Ballista cluster's, whose executors
//! would not know the functions they plan).

mod date_of;
mod eager_aggregate;
mod like;

use std::sync::Arc;

use datafusion::prelude::SessionContext;

/// Adds every rewrite to `ctx`'s optimizer, after DataFusion's own rules (so literals are folded first).
pub(crate) fn register(ctx: &SessionContext) {
    ctx.add_optimizer_rule(Arc::new(like::FixedLike));
    ctx.add_optimizer_rule(Arc::new(date_of::DayOfTimestamp));
    ctx.add_optimizer_rule(Arc::new(eager_aggregate::EagerAggregate));
}

#[cfg(test)]
mod date_of_tests;
#[cfg(test)]
mod eager_aggregate_tests;
#[cfg(test)]
mod tests;
