//! Stored results (materializations): a query's rows kept in the storage and refreshed (`materialized`), folded
//! forward by appended rows instead of refreshed in full where the query allows it (`fold`, with `rollup` for
//! aggregates and `outline` for the query's shape).

pub(crate) mod bound;
pub(crate) mod fold;
pub(crate) mod materialized;
pub(crate) mod outline;
pub(crate) mod rollup;
