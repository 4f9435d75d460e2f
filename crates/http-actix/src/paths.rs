//! The API's paths as the parts that route, check origins and label requests know them.

/// Each family's static prefix is matched by a string comparison before its dynamic part is tried.
pub(crate) const FAMILY_PREFIXES: [&str; 2] = ["/api/environments", "/api/projects"];

/// Every resource's name, the `route` label of the request metrics. Both families share names: the family is
/// not a different operation.
pub(crate) const ROUTE_NAMES: [&str; 23] = [
    "run",
    "project",
    "endpoints",
    "last_execution_times",
    "endpoint",
    "materialization_status",
    "endpoint_logs",
    "endpoint_usage",
    "endpoint_openapi",
    "versions",
    "version",
    "tables",
    "table",
    "table_rows",
    "table_versions",
    "table_preview",
    "run_tokens",
    "mcp",
    "healthz",
    "readyz",
    "metrics",
    "home",
    "console",
];
