//! The service's own OpenAPI document (`GET /api/schema`) and its interactive page (`/api/docs`).
//!
//! The schemas below describe the JSON bodies that `render` writes and the domain reads; a test compares real
//! responses with them field by field, so the document cannot drift from the service.

#![allow(dead_code)] // The structs exist for their schemas; they are never built.

use std::collections::BTreeMap;

use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi, ToSchema};

/// Every error answer.
#[derive(ToSchema)]
pub(crate) struct Error {
    /// `validation_error`, `authentication_error`, `permission_denied`, `not_found`, `conflict`, `throttled`,
    /// `query_error` or `server_error`.
    #[schema(rename = "type")]
    kind: String,
    /// A stable machine code such as `invalid`, `required`, `unique`, `query_timeout`.
    code: String,
    detail: String,
    /// The offending field as a dotted path, or null.
    attr: Option<String>,
}

/// An endpoint's name, as the contract defines it (the body schemas repeat it: utoipa takes only literals).
const NAME_PATTERN: &str = "^[A-Za-z][A-Za-z0-9_-]{0,127}$";

/// A declared variable.
#[derive(ToSchema)]
pub(crate) struct Variable {
    /// `String`, `Number`, `Integer`, `Boolean`, `Date`, `DateTime` or `List`.
    #[schema(rename = "type", pattern = "^(String|Number|Integer|Boolean|Date|DateTime|List)$")]
    kind: String,
    default: Option<Value>,
    required: Option<bool>,
    description: Option<String>,
}

/// The saved query.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Query {
    /// `SQLQuery` (or its alias `HogQLQuery`).
    #[schema(pattern = "^(SQLQuery|HogQLQuery)$")]
    kind: String,
    /// One read-only SQL statement with `{variables.NAME}` placeholders.
    query: String,
    variables: Option<BTreeMap<String, Variable>>,
}

/// An output column.
#[derive(ToSchema)]
pub(crate) struct Column {
    name: String,
    /// `integer`, `float`, `decimal`, `string`, `boolean`, `date`, `datetime`, `array`, `json` or `unknown`.
    #[schema(rename = "type")]
    kind: String,
}

/// The body of a create: `name` and `query` are required, every other field is optional.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointCreate {
    #[schema(pattern = "^[A-Za-z][A-Za-z0-9_-]{0,127}$")]
    name: String,
    query: Query,
    description: Option<String>,
    derived_from_insight: Option<String>,
    is_active: Option<bool>,
    is_materialized: Option<bool>,
    /// 0..=86400; null for the server default (300).
    #[schema(minimum = 0, maximum = 86400)]
    cache_age_seconds: Option<i64>,
    /// `5min`, `30min`, `1hour`, `6hour`, `12hour`, `24hour`, `7day` or `30day`; only with `is_materialized`.
    #[schema(pattern = "^(5min|30min|1hour|6hour|12hour|24hour|7day|30day)$")]
    sync_frequency: Option<String>,
}

/// The body of an update: any subset of the fields, an empty body changing nothing. `name`, when given, must be
/// the endpoint's own (names are URLs; they are not renamed). A new `query` makes a new version when it differs
/// from the current one; `sync_frequency` needs the endpoint materialized.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct EndpointUpdate {
    #[schema(pattern = "^[A-Za-z][A-Za-z0-9_-]{0,127}$")]
    name: Option<String>,
    query: Option<Query>,
    description: Option<String>,
    derived_from_insight: Option<String>,
    is_active: Option<bool>,
    is_materialized: Option<bool>,
    /// 0..=86400; null for the server default (300).
    #[schema(minimum = 0, maximum = 86400)]
    cache_age_seconds: Option<i64>,
    /// `5min`, `30min`, `1hour`, `6hour`, `12hour`, `24hour`, `7day` or `30day`; only when materialized.
    #[schema(pattern = "^(5min|30min|1hour|6hour|12hour|24hour|7day|30day)$")]
    sync_frequency: Option<String>,
}

/// The materialization status of an endpoint's current version (contract section 7).
#[derive(ToSchema)]
pub(crate) struct Materialization {
    name: String,
    version: i64,
    is_materialized: bool,
    /// `Disabled`, `Pending`, `Running`, `Completed` or `Failed`.
    status: String,
    sync_frequency: Option<String>,
    /// When the stored result of this version was computed.
    last_materialized_at: Option<String>,
    /// When the next refresh is due.
    next_run_at: Option<String>,
    row_count: Option<i64>,
    /// Why the last refresh failed.
    error: Option<String>,
    /// Whether the query and the endpoint allow materialization.
    can_materialize: bool,
    /// Why not, when `can_materialize` is false.
    reason: Option<String>,
}

/// An endpoint.
#[derive(ToSchema)]
pub(crate) struct Endpoint {
    #[schema(format = Uuid)]
    id: String,
    name: String,
    description: String,
    query: Query,
    derived_from_insight: Option<String>,
    is_active: bool,
    is_materialized: bool,
    cache_age_seconds: Option<i64>,
    sync_frequency: Option<String>,
    current_version: i64,
    versions_count: i64,
    columns: Vec<Column>,
    endpoint_path: String,
    #[schema(format = DateTime)]
    created_at: String,
    #[schema(format = DateTime)]
    updated_at: String,
    last_executed_at: Option<String>,
    materialization: Materialization,
}

/// A page of endpoints.
#[derive(ToSchema)]
pub(crate) struct EndpointPage {
    count: i64,
    next: Option<String>,
    previous: Option<String>,
    results: Vec<Endpoint>,
}

/// One version of an endpoint.
#[derive(ToSchema)]
pub(crate) struct Version {
    version: i64,
    query: Query,
    description: String,
    columns: Vec<Column>,
    cache_age_seconds: Option<i64>,
    #[schema(format = DateTime)]
    created_at: String,
    is_current: bool,
}

/// A page of versions, newest first.
#[derive(ToSchema)]
pub(crate) struct VersionPage {
    count: i64,
    next: Option<String>,
    previous: Option<String>,
    results: Vec<Version>,
}

/// The body of a POST run.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunRequest {
    /// At most 100.
    variables: Option<BTreeMap<String, Value>>,
    #[schema(minimum = 1, maximum = 4294967295_i64)]
    version: Option<i64>,
    /// 1..=10000, default 100.
    #[schema(minimum = 1, maximum = 10000)]
    limit: Option<i64>,
    #[schema(minimum = 0)]
    offset: Option<i64>,
    /// `blocking` (default), `force_blocking`, `force_cache` or `direct`.
    #[schema(pattern = "^(blocking|force_blocking|force_cache|direct)$")]
    refresh: Option<String>,
    client_query_id: Option<String>,
    /// Accepted for compatibility: null or `{}` only (the saved query is the contract).
    #[schema(schema_with = empty_object)]
    query_override: Option<Value>,
    /// Accepted for compatibility: null or `{}` only.
    #[schema(schema_with = empty_object)]
    filters_override: Option<Value>,
}

/// An object with no properties, or null.
fn empty_object() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(0))
        .build()
}

/// Time spent answering.
#[derive(ToSchema)]
pub(crate) struct Timings {
    total_ms: f64,
    query_ms: f64,
}

/// A run's answer. Each endpoint's own document (`{name}/openapi.json`) types `results` per column.
#[derive(ToSchema)]
pub(crate) struct RunResult {
    name: String,
    endpoint_version: Option<i64>,
    endpoint_version_created_at: Option<String>,
    columns: Vec<String>,
    types: Vec<Vec<String>>,
    results: Option<Vec<BTreeMap<String, Value>>>,
    #[schema(rename = "hasMore")]
    has_more: bool,
    limit: i64,
    offset: i64,
    is_cached: bool,
    last_refresh: Option<String>,
    cache_expires_at: Option<String>,
    endpoint_materialized: bool,
    endpoint_materialized_at: Option<String>,
    #[schema(format = Uuid)]
    execution_id: String,
    client_query_id: Option<String>,
    timings: Timings,
}

/// The names to look up.
#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct Names {
    /// 1..=1000 endpoint names.
    #[schema(min_items = 1, max_items = 1000, pattern = "^[A-Za-z][A-Za-z0-9_-]{0,127}$")]
    names: Vec<String>,
}

/// Counts of a lookup.
#[derive(ToSchema)]
pub(crate) struct QueryProgress {
    active_cpu_time: i64,
    bytes_read: i64,
    estimated_rows_total: i64,
    rows_read: i64,
    time_elapsed: f64,
}

/// The status of a last-execution-times lookup.
#[derive(ToSchema)]
pub(crate) struct QueryStatus {
    complete: bool,
    error: bool,
    error_message: Option<String>,
    id: String,
    query_async: bool,
    team_id: i64,
    dashboard_id: Option<i64>,
    insight_id: Option<i64>,
    labels: Option<Vec<String>>,
    start_time: Option<String>,
    end_time: Option<String>,
    pickup_time: Option<String>,
    expiration_time: Option<String>,
    task_id: Option<String>,
    /// `[name, last_executed_at]` pairs.
    results: Option<Vec<Vec<String>>>,
    query_progress: QueryProgress,
}

/// Row 12's answer.
#[derive(ToSchema)]
pub(crate) struct LastExecutionTimes {
    query_status: QueryStatus,
}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints", operation_id = "list_endpoints",
    params(("project_id" = String, Path, description = "Project id or @current"),
           ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query), ("is_active" = Option<bool>, Query),
           ("is_materialized" = Option<bool>, Query), ("search" = Option<String>, Query)),
    responses((status = 200, body = EndpointPage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
fn list() {}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints", operation_id = "create_endpoint",
    params(("project_id" = String, Path)), request_body = EndpointCreate,
    responses((status = 201, body = Endpoint, headers(("Location" = String, description = "The new endpoint's URL"))), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 409, body = Error), (status = 413, body = Error), (status = 415, body = Error)))]
fn create() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "get_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = Endpoint), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn retrieve() {}

#[utoipa::path(patch, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "update_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path)), request_body = EndpointUpdate,
    responses((status = 200, body = Endpoint), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn update() {}

#[utoipa::path(delete, path = "/api/projects/{project_id}/endpoints/{name}", operation_id = "delete_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn delete() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint_get",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query), ("limit" = Option<i64>, Query),
           ("offset" = Option<i64>, Query), ("refresh" = Option<String>, Query), ("client_query_id" = Option<String>, Query),
           ("variables" = Option<String>, Query, description = "A JSON object of variables; or one `variables.NAME=value` parameter each")),
    responses((status = 200, body = RunResult), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
fn run_get() {}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/{name}/run", operation_id = "run_endpoint",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)), request_body = RunRequest,
    responses((status = 200, body = RunResult), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error),
              (status = 404, body = Error), (status = 429, body = Error)))]
fn run_post() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/openapi.json", operation_id = "endpoint_openapi",
    params(("project_id" = String, Path), ("name" = String, Path), ("version" = Option<i64>, Query)),
    responses((status = 200, description = "An OpenAPI 3.0.3 document of the endpoint's run operation", body = Object),
              (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn openapi() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/materialization_status", operation_id = "materialization_status",
    params(("project_id" = String, Path), ("name" = String, Path)),
    responses((status = 200, body = Materialization), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn materialization_status() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/versions", operation_id = "list_versions",
    params(("project_id" = String, Path), ("name" = String, Path), ("limit" = Option<i64>, Query), ("offset" = Option<i64>, Query)),
    responses((status = 200, body = VersionPage), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn versions() {}

#[utoipa::path(get, path = "/api/projects/{project_id}/endpoints/{name}/versions/{version_number}", operation_id = "get_version",
    params(("project_id" = String, Path), ("name" = String, Path), ("version_number" = String, Path)),
    responses((status = 200, body = Version), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error), (status = 404, body = Error)))]
fn version() {}

#[utoipa::path(post, path = "/api/projects/{project_id}/endpoints/last_execution_times", operation_id = "last_execution_times",
    params(("project_id" = String, Path)), request_body = Names,
    responses((status = 200, body = LastExecutionTimes), (status = 400, body = Error), (status = 401, body = Error), (status = 403, body = Error)))]
fn last_execution_times() {}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        openapi.security =
            Some(vec![utoipa::openapi::security::SecurityRequirement::new("bearer", Vec::<String>::new())]);
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "Saved query endpoints", description = "Named, saved SQL query endpoints inside projects, run over HTTP."),
    paths(list, create, retrieve, update, delete, run_get, run_post, openapi, materialization_status, versions, version, last_execution_times),
    components(schemas(Error, Endpoint, EndpointCreate, EndpointUpdate, EndpointPage, Version, VersionPage, RunRequest, RunResult, Names, LastExecutionTimes)),
    modifiers(&BearerAuth)
)]
struct ApiDoc;

/// The service's document, with every path under both families (`projects` and `environments`).
pub(crate) fn document() -> Document {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    let projects: Vec<(String, utoipa::openapi::PathItem)> =
        doc.paths.paths.iter().map(|(path, item)| (path.clone(), item.clone())).collect();
    for (path, item) in projects {
        let mut item = item;
        for operation in operations(&mut item) {
            operation.operation_id = operation.operation_id.take().map(|id| format!("environments_{id}"));
            operation.tags = Some(vec!["environments".into()]);
        }
        doc.paths.paths.insert(path.replacen("/api/projects/", "/api/environments/", 1), item);
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        if path.starts_with("/api/projects/") {
            for operation in operations(item) {
                operation.tags = Some(vec!["projects".into()]);
            }
        }
        for operation in operations(item) {
            optional_body(operation);
            add_shared_responses(operation);
            describe_parameters(path, operation);
        }
    }
    doc
}

/// The bounds the service enforces on path and query parameters, so that every value the document allows is
/// one the service accepts: `project_id` a positive integer or `@current`, `name` the contract's pattern,
/// versions positive 32-bit numbers, `limit` 1..=1000 on lists and 1..=10000 on runs, `offset` non-negative.
fn describe_parameters(path: &str, operation: &mut utoipa::openapi::path::Operation) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let integer = |min: i64, max: i64| {
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(min)).maximum(Some(max))
    };
    let (max_limit, default_limit) = if path.ends_with("/run") {
        (domain::RunRequest::MAX_LIMIT, domain::RunRequest::DEFAULT_LIMIT)
    } else {
        (domain::PageRequest::MAX_LIMIT, domain::PageRequest::DEFAULT_LIMIT)
    };
    for parameter in operation.parameters.iter_mut().flatten() {
        let schema = match parameter.name.as_str() {
            "project_id" => ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^([1-9][0-9]{0,17}|@current)$"))
                .description(Some("The project's id, or @current for the key's own project")),
            "name" => ObjectBuilder::new().schema_type(Type::String).pattern(Some(NAME_PATTERN)),
            "version" | "version_number" => integer(1, u32::MAX.into()),
            "limit" => integer(1, max_limit.into()).default(Some(default_limit.into())),
            "offset" => integer(0, i64::MAX).default(Some(0.into())),
            "refresh" => ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^(blocking|force_blocking|force_cache|direct)$")),
            _ => continue,
        };
        parameter.schema = Some(schema.into());
    }
}

/// An update and a POST run take an empty body as `{}`: the body is optional.
fn optional_body(operation: &mut utoipa::openapi::path::Operation) {
    let id = operation.operation_id.as_deref().unwrap_or_default();
    if id.ends_with("update_endpoint") || id.ends_with("run_endpoint") {
        if let Some(body) = operation.request_body.as_mut() {
            body.required = Some(utoipa::openapi::Required::False);
        }
    }
}

/// The answers any operation may give besides its own: a malformed `project_id` (400), a caller over its
/// request rate (429), the database away (503); and for those that read a body, a body too slow (408), too
/// large (413) or not JSON (415).
fn add_shared_responses(operation: &mut utoipa::openapi::path::Operation) {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let mut shared = vec![
        ("400", "Invalid input, for example a project_id that is not a positive integer or @current"),
        ("429", "Over the key's or project's request rate (rate_limited), or the project runs its maximum of live queries (throttled); see Retry-After"),
        ("503", "The database cannot be reached"),
    ];
    if operation.request_body.is_some() {
        shared.extend([
            ("408", "The request body did not arrive in time"),
            ("413", "The body is over 1 MiB"),
            ("415", "The body is not JSON"),
        ]);
    }
    for (status, description) in shared {
        operation.responses.responses.entry(status.to_owned()).or_insert_with(|| {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new().schema(Some(Ref::from_schema_name("Error"))).build(),
                )
                .build()
                .into()
        });
    }
}

fn operations(item: &mut utoipa::openapi::PathItem) -> Vec<&mut utoipa::openapi::path::Operation> {
    [&mut item.get, &mut item.post, &mut item.patch, &mut item.delete, &mut item.put]
        .into_iter()
        .filter_map(Option::as_mut)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{document, NAME_PATTERN};

    /// utoipa takes only literals in its attributes, so the body schemas spell the name pattern out; they must
    /// not drift from the one the parameters use.
    #[test]
    fn every_name_in_the_document_has_the_same_pattern() {
        let doc = serde_json::to_value(document()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let patterns = [
            &schemas["EndpointCreate"]["properties"]["name"]["pattern"],
            &schemas["EndpointUpdate"]["properties"]["name"]["pattern"],
            &schemas["Names"]["properties"]["names"]["items"]["pattern"],
            &doc["paths"]["/api/projects/{project_id}/endpoints/{name}"]["get"]["parameters"][1]["schema"]
                ["pattern"],
        ];
        for pattern in patterns {
            assert_eq!(pattern, NAME_PATTERN);
        }
    }
}
