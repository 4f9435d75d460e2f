//! The schemas of request bodies. The domain reads a body field by field, so that an error names the field and
//! says what was wrong with it; these schemas describe what it accepts, built from its own field lists, names,
//! patterns and bounds.

use std::borrow::Cow;

use domain::{
    CacheAge, Freshness, Hibernation, RunRequest, RunTokenRequest, CONFIRM_BREAKING, ENDPOINT_FIELDS,
    MAX_NAMES,
};
use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use super::names;

fn nullable(kind: Type) -> SchemaType {
    SchemaType::from_iter([kind, Type::Null])
}

fn closed(object: ObjectBuilder) -> ObjectBuilder {
    object.additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
}

/// A variable's declaration as a client writes it.
fn variable_declaration() -> ObjectBuilder {
    closed(
        ObjectBuilder::new()
            .property("type", names::variable_type())
            .required("type")
            .property(
                "default",
                ObjectBuilder::new()
                    .schema_type(SchemaType::AnyValue)
                    .description(Some("A value of the type; none makes the variable required.")),
            )
            .property("required", ObjectBuilder::new().schema_type(nullable(Type::Boolean)))
            .property("description", ObjectBuilder::new().schema_type(nullable(Type::String))),
    )
}

/// The query of a create or an update.
pub(crate) struct QueryInput;

impl PartialSchema for QueryInput {
    fn schema() -> RefOr<Schema> {
        let variables = ObjectBuilder::new()
            .schema_type(nullable(Type::Object))
            .additional_properties(Some(variable_declaration()))
            .description(Some("Declarations keyed by variable name."));
        closed(
            ObjectBuilder::new()
                .property("kind", names::query_kind())
                .required("kind")
                .property(
                    "query",
                    ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)).description(Some(
                        "One read-only SQL statement with `{variables.NAME}` placeholders.",
                    )),
                )
                .required("query")
                .property("variables", variables),
        )
        .into()
    }
}

impl ToSchema for QueryInput {}

/// The fields of a create or an update, all of them known to the domain.
fn endpoint_fields() -> ObjectBuilder {
    let mut object = closed(ObjectBuilder::new());
    for field in ENDPOINT_FIELDS {
        let schema: RefOr<Schema> = match field {
            "name" => names::endpoint_name().into(),
            "query" => Ref::from_schema_name(QueryInput::name()).into(),
            "cache_age_seconds" => ObjectBuilder::new()
                .schema_type(nullable(Type::Integer))
                .minimum(Some(0))
                .maximum(Some(CacheAge::MAX_SECONDS))
                .description(Some(format!(
                    "Seconds a run's result is served from the cache; null for the server default ({}).",
                    CacheAge::DEFAULT_SECONDS
                )))
                .into(),
            "sync_frequency" => names::nullable_sync_frequency().into(),
            "freshness_seconds" => ObjectBuilder::new()
                .schema_type(nullable(Type::Integer))
                .minimum(Some(Freshness::MIN_SECONDS))
                .maximum(Some(Freshness::MAX_SECONDS))
                .description(Some(format!(
                    "Seconds within which rows appended to a table the query reads reach the stored result of \
                     a materialized endpoint; null for the default ({}).",
                    Freshness::DEFAULT_SECONDS
                )))
                .into(),
            "hibernate_after_days" => ObjectBuilder::new()
                .schema_type(nullable(Type::Integer))
                .minimum(Some(Hibernation::MIN_DAYS))
                .maximum(Some(Hibernation::MAX_DAYS))
                .description(Some(format!(
                    "Days a materialized endpoint nobody runs (or changes) keeps refreshing; then it hibernates \
                     until its next run. {} unless set; null never hibernates.",
                    Hibernation::DEFAULT_DAYS
                )))
                .into(),
            "is_active" | "is_materialized" => {
                ObjectBuilder::new().schema_type(nullable(Type::Boolean)).into()
            }
            _ => ObjectBuilder::new().schema_type(nullable(Type::String)).into(),
        };
        object = object.property(field, schema);
    }
    object
}

/// The body of a create: `name` and `query` are required.
pub(crate) struct EndpointCreate;

impl PartialSchema for EndpointCreate {
    fn schema() -> RefOr<Schema> {
        endpoint_fields().required("name").required("query").into()
    }
}

impl ToSchema for EndpointCreate {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((QueryInput::name().into_owned(), QueryInput::schema()));
    }
}

/// The body of an update: any subset of the fields, an empty body changing nothing. `name`, when given, must be
/// the endpoint's own (names are URLs; they are not renamed). A new `query` makes a new version when it differs
/// from the current one; `sync_frequency` needs the endpoint materialized.
pub(crate) struct EndpointUpdate;

impl PartialSchema for EndpointUpdate {
    fn schema() -> RefOr<Schema> {
        let confirm = ObjectBuilder::new().schema_type(nullable(Type::Boolean)).description(Some(
            "true saves a new `query` whose version removes or retypes output columns of the current one \
             although the endpoint ran within the last 7 days (409 `breaking_change` otherwise).",
        ));
        endpoint_fields().property(CONFIRM_BREAKING, confirm).into()
    }
}

impl ToSchema for EndpointUpdate {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((QueryInput::name().into_owned(), QueryInput::schema()));
    }
}

/// Which operation a run's body is for: a run, whose answer is JSON (its `format` documented as `json` only,
/// so that a generated client's answer is the JSON body), or an export, whose format is in its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyOf {
    Run,
    Export,
}

/// `format` of a run as documented: JSON. The other formats are the export operations'; a run still takes them
/// (`format`, `Accept`) for clients that are not generated.
pub(crate) fn json_format() -> ObjectBuilder {
    ObjectBuilder::from(names::nullable_json_format()).description(Some(
        "json, the default. The other formats are the export operation's (`.../run/{format}`); this field and \
         Accept still take them, for clients that are not generated.",
    ))
}

/// The body of a run, every field the domain reads, with `variables` as given: free-form for the service,
/// typed in an endpoint's document. An export's has no `format` (its path names it), nor `as_of` and `cursor`
/// (a page in another format reads the newest data and pages by `offset`).
pub(crate) fn run_body(variables: RefOr<Schema>, of: BodyOf) -> ObjectBuilder {
    let bounded = |min: i64, max: i64| {
        ObjectBuilder::new().schema_type(nullable(Type::Integer)).minimum(Some(min)).maximum(Some(max))
    };
    // Accepted for compatibility: null or `{}` only (the saved query is what runs; callers pass variables).
    let empty = || {
        ObjectBuilder::new()
            .schema_type(nullable(Type::Object))
            .max_properties(Some(0))
            .description(Some("Accepted for compatibility: null or {} only."))
    };
    let fields: [(&str, RefOr<Schema>); 12] = [
        ("client_query_id", ObjectBuilder::new().schema_type(nullable(Type::String)).into()),
        ("format", json_format().into()),
        ("filters_override", empty().into()),
        ("query_override", empty().into()),
        ("refresh", names::nullable_refresh().into()),
        ("variables", variables),
        (
            "version",
            bounded(1, u32::MAX.into())
                .description(Some("The version to run; the current one by default."))
                .into(),
        ),
        // Defaults are said in words in request bodies (see `crate::openapi::described_defaults`).
        (
            "limit",
            bounded(1, RunRequest::MAX_LIMIT.into())
                .description(Some(format!("Rows per page. Default: {}.", RunRequest::DEFAULT_LIMIT)))
                .into(),
        ),
        ("offset", bounded(0, i64::MAX).description(Some("Rows skipped. Default: 0.")).into()),
        (
            "max_staleness_seconds",
            bounded(0, RunRequest::MAX_STALENESS_SECONDS)
                .description(Some(
                    "The oldest data taken, in seconds: a cached or stored answer whose `data_as_of` is older \
                     is not served (the run computes live instead; `force_cache` answers no rows).",
                ))
                .into(),
        ),
        (
            "as_of",
            ObjectBuilder::new()
                .schema_type(nullable(Type::String))
                .format(Some(utoipa::openapi::schema::SchemaFormat::KnownFormat(
                    utoipa::openapi::schema::KnownFormat::DateTime,
                )))
                .description(Some(
                    "Read every table as it was at this RFC 3339 time: its newest version committed at or before \
                     it, within the table retention (7 days by default). The answer's `data_as_of` is this time.",
                ))
                .into(),
        ),
        (
            "cursor",
            ObjectBuilder::new()
                .schema_type(nullable(Type::String))
                .description(Some(
                    "The `next` of an earlier answer: the page after it, of the same snapshot of the tables. Send \
                     the same variables (and version, if it named one) without `offset` or `as_of`.",
                ))
                .into(),
        ),
    ];
    fields
        .into_iter()
        .filter(|(field, _)| of == BodyOf::Run || !["format", "as_of", "cursor"].contains(field))
        .fold(closed(ObjectBuilder::new()), |object, (field, schema)| object.property(field, schema))
}

fn any_variables() -> RefOr<Schema> {
    ObjectBuilder::new()
        .schema_type(nullable(Type::Object))
        .max_properties(Some(RunRequest::MAX_VARIABLES))
        .description(Some("Values by variable name."))
        .into()
}

/// The body of a POST run.
pub(crate) struct RunBody;

impl PartialSchema for RunBody {
    fn schema() -> RefOr<Schema> {
        run_body(any_variables(), BodyOf::Run).into()
    }
}

impl ToSchema for RunBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RunRequest")
    }
}

/// The body of a POST export.
pub(crate) struct ExportBody;

impl PartialSchema for ExportBody {
    fn schema() -> RefOr<Schema> {
        run_body(any_variables(), BodyOf::Export).into()
    }
}

impl ToSchema for ExportBody {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ExportRequest")
    }
}

/// `format` of a GET run, as a query parameter: JSON (see [`json_format`]).
pub(crate) struct JsonFormat;

impl PartialSchema for JsonFormat {
    fn schema() -> RefOr<Schema> {
        json_format().into()
    }
}

impl ToSchema for JsonFormat {}

/// `{format}` of an export's path.
pub(crate) struct ExportFormat;

impl PartialSchema for ExportFormat {
    fn schema() -> RefOr<Schema> {
        names::export_format().into()
    }
}

impl ToSchema for ExportFormat {}

/// The names whose last execution times are asked for.
pub(crate) struct Names;

impl PartialSchema for Names {
    fn schema() -> RefOr<Schema> {
        let names =
            ArrayBuilder::new().items(names::endpoint_name()).min_items(Some(1)).max_items(Some(MAX_NAMES));
        closed(ObjectBuilder::new().property("names", names).required("names")).into()
    }
}

impl ToSchema for Names {}

/// The optional body of a preview: how many rows (1..=1000, default 20).
pub(crate) struct PreviewBody;

impl PartialSchema for PreviewBody {
    fn schema() -> RefOr<Schema> {
        let limit = ObjectBuilder::new()
            .schema_type(nullable(Type::Integer))
            .minimum(Some(1))
            .maximum(Some(domain::PageRequest::MAX_LIMIT))
            .description(Some(format!("Rows to show. Default: {}.", domain::PREVIEW_ROWS)));
        closed(ObjectBuilder::new().property("limit", limit)).into()
    }
}

impl ToSchema for PreviewBody {}

/// The body that makes a table read an external source where it is: files (`url` and `format`) or a
/// PostgreSQL table (`url` and `table`).
pub(crate) struct TableSourceBody;

impl PartialSchema for TableSourceBody {
    fn schema() -> RefOr<Schema> {
        let [url, format, table] = domain::ExternalSource::FIELDS;
        let source = closed(
            ObjectBuilder::new()
                .description(Some(
                    "Files: s3://bucket/prefix/ (every file of the format under it) or one file's URL, with \
                     format. A Delta Lake table: its folder's URL with format delta. A PostgreSQL table: \
                     postgres://host/database with table ('name' or 'schema.name').",
                ))
                .property(url, ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)))
                .required(url)
                .property(format, names::file_format())
                .property(table, ObjectBuilder::new().schema_type(Type::String).min_length(Some(1))),
        );
        closed(ObjectBuilder::new().property("source", source).required("source")).into()
    }
}

impl ToSchema for TableSourceBody {}

/// The body that sets the columns a table's files are sorted by.
pub(crate) struct TableLayoutBody;

impl PartialSchema for TableLayoutBody {
    fn schema() -> RefOr<Schema> {
        let columns = ArrayBuilder::new()
            .schema_type(nullable(Type::Array))
            .items(ObjectBuilder::new().schema_type(Type::String).min_length(Some(1)))
            .max_items(Some(domain::MAX_CLUSTER_COLUMNS))
            .description(Some(format!(
                "The columns compaction sorts the table's files by, first to last (at most {}), in place of those \
                 its endpoints filter on; [] for files not sorted; null for its endpoints' filters to choose again.",
                domain::MAX_CLUSTER_COLUMNS
            )));
        closed(ObjectBuilder::new().property("cluster_by", columns).required("cluster_by")).into()
    }
}

impl ToSchema for TableLayoutBody {}

/// A run token's grant, as `POST run_tokens` takes it.
pub(crate) struct RunTokenBody;

impl PartialSchema for RunTokenBody {
    fn schema() -> RefOr<Schema> {
        let max_endpoints = RunTokenRequest::MAX_ENDPOINTS;
        let endpoints = ArrayBuilder::new()
            .items(names::endpoint_name())
            .min_items(Some(1))
            .max_items(Some(max_endpoints))
            .description(Some("The endpoints the token may run (and read the OpenAPI documents of)."));
        let fixed = ObjectBuilder::new()
            .schema_type(nullable(Type::Object))
            .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(true)))
            .max_properties(Some(RunTokenRequest::MAX_FIXED_VARIABLES))
            .description(Some(
                "Variables set by the token, which its holder may not send: each must be declared by every \
                 endpoint named, with a value of its type.",
            ));
        let expires = ObjectBuilder::new()
            .schema_type(nullable(Type::Integer))
            .minimum(Some(1.0))
            .maximum(Some(RunTokenRequest::MAX_EXPIRES_IN_SECONDS as f64))
            .description(Some("Seconds until the token expires: 3600 unless given, at most 30 days."));
        let rate = ObjectBuilder::new()
            .schema_type(nullable(Type::Integer))
            .minimum(Some(1.0))
            .maximum(Some(1_000_000.0))
            .description(Some("Requests per second the token may make (bursts of twice that), on top of the project's limit."));
        let numbers = ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1.0)))
            .max_items(Some(RunTokenRequest::MAX_VERSIONS));
        let versions = ObjectBuilder::new()
            .schema_type(nullable(Type::Object))
            .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(numbers.into()))))
            .description(Some(
                "Versions the token may run by number (?version=), by endpoint name. Without them its holder runs \
                 the current version only, so fixing a query binds the tokens already issued.",
            ));
        closed(
            ObjectBuilder::new()
                .property("endpoints", endpoints)
                .required("endpoints")
                .property("fixed_variables", fixed)
                .property("expires_in_seconds", expires)
                .property("rate_limit_per_sec", rate)
                .property("versions", versions),
        )
        .into()
    }
}

impl ToSchema for RunTokenBody {}
