//! An OpenAPI 3.0.3 document for one endpoint version, so that a generator can produce a typed client:
//! variables become typed request fields, columns become typed row fields.
//!
//! The shapes are the service's own (`api`, `error`): the run request, the run answer and the error body are
//! the schemas `/api/schema` publishes, with this endpoint's variables and columns typed in. Those schemas are
//! written for OpenAPI 3.1, whose JSON Schema marks a nullable value with a `null` type; [`openapi_3_0`] turns
//! them into 3.0's `nullable`, which generators of 3.0 clients read.

use std::collections::BTreeMap;

use domain::{
    Column, ColumnType, Endpoint, EndpointVersion, ResultFormat, RunRequest, Variable, VariableType,
};
use indexmap::IndexMap;
use openapiv3::{
    Components, Info, MediaType, OpenAPI, Operation, Parameter, ParameterData, ParameterSchemaOrContent,
    PathItem, Paths, QueryStyle, ReferenceOr, RequestBody, Response, Responses, Schema, SecurityRequirement,
    SecurityScheme, Server, StatusCode,
};
use serde_json::{json, Map, Value};
use utoipa::openapi::schema::{ArrayBuilder, KnownFormat, ObjectBuilder, SchemaFormat, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::PartialSchema;

use crate::api::requests::{run_body, BodyOf};
use crate::api::{names, RunAnswer};
use crate::error::ErrorBody;

const JSON: &str = "application/json";
const BEARER: &str = "bearer";

/// An OpenAPI 3.1 schema as OpenAPI 3.0 writes it: a `null` among the types becomes `nullable: true`, a
/// `oneOf` with a `null` branch becomes its other branch made nullable, and keywords 3.0 does not know go.
fn downgrade(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(downgrade),
        Value::Object(object) => {
            if let Some(Value::Array(types)) = object.get("type") {
                let nullable = types.iter().any(|t| t == "null");
                let others: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if let [only] = others.as_slice() {
                    object.insert("type".into(), only.clone());
                } else {
                    object.remove("type");
                }
                if nullable {
                    object.insert("nullable".into(), Value::Bool(true));
                }
            }
            if let Some(Value::Array(branches)) = object.get("oneOf") {
                let is_null = |b: &Value| b.get("type").is_some_and(|t| t == "null");
                if branches.iter().any(is_null) {
                    let others: Vec<Value> = branches.iter().filter(|b| !is_null(b)).cloned().collect();
                    object.remove("oneOf");
                    match others.as_slice() {
                        [Value::Object(other)] if other.contains_key("$ref") => {
                            object.insert("allOf".into(), Value::Array(others));
                        }
                        [Value::Object(other)] => {
                            for (key, value) in other {
                                object.entry(key.clone()).or_insert_with(|| value.clone());
                            }
                        }
                        _ => {
                            object.insert("oneOf".into(), Value::Array(others));
                        }
                    }
                    object.insert("nullable".into(), Value::Bool(true));
                }
            }
            object.remove("propertyNames");
            object.remove("$schema");
            object.values_mut().for_each(downgrade);
        }
        _ => {}
    }
}

/// A request body's schema says its defaults in words rather than with `default`: client generators read a
/// property with a `default` as one the server always fills in, and with their default settings make it
/// required in the request (openapi-typescript 7) or in the generated type, so a caller could not leave it out.
/// What is left out is what the server defaults, which the description says.
pub(crate) fn described_defaults(value: &mut Value) {
    match value {
        Value::Object(object) => {
            if let Some(default) = object.remove("default") {
                let said = format!("Default: {default}.");
                let description = match object.get("description").and_then(Value::as_str).map(str::trim_end) {
                    Some(text) if text.ends_with(['.', '!', '?']) => format!("{text} {said}"),
                    Some(text) if !text.is_empty() => format!("{text}. {said}"),
                    _ => said,
                };
                object.insert("description".into(), Value::String(description));
            }
            object.values_mut().for_each(described_defaults);
        }
        Value::Array(items) => items.iter_mut().for_each(described_defaults),
        _ => {}
    }
}

/// A schema of the service's (OpenAPI 3.1) for this document (OpenAPI 3.0).
fn openapi_3_0(schema: impl Into<RefOr<utoipa::openapi::Schema>>) -> Schema {
    let value = serde_json::to_value(schema.into()).unwrap_or(Value::Object(Map::new()));
    openapi_3_0_value(value)
}

/// [`openapi_3_0`] of a schema already written as JSON.
fn openapi_3_0_value(mut value: Value) -> Schema {
    downgrade(&mut value);
    // Every schema the service builds is one OpenAPI 3.0 can say once downgraded; an empty schema (any value)
    // is the safe reading of one that could not be.
    serde_json::from_value(value).unwrap_or_else(|_| Schema {
        schema_data: openapiv3::SchemaData::default(),
        schema_kind: openapiv3::SchemaKind::Any(openapiv3::AnySchema::default()),
    })
}

/// The schema of a variable's value in a body, with its default and description.
fn variable_schema(variable: &Variable) -> RefOr<utoipa::openapi::Schema> {
    let (default, description) = (variable.default.clone(), variable.description.clone());
    let scalar = |kind: Type, format: Option<KnownFormat>| {
        ObjectBuilder::new()
            .schema_type(kind)
            .format(format.map(SchemaFormat::KnownFormat))
            .default(default.clone())
            .description(description.clone())
            .into()
    };
    match variable.variable_type {
        VariableType::String => scalar(Type::String, None),
        VariableType::Number => scalar(Type::Number, Some(KnownFormat::Double)),
        VariableType::Integer => scalar(Type::Integer, Some(KnownFormat::Int64)),
        VariableType::Boolean => scalar(Type::Boolean, None),
        VariableType::Date => scalar(Type::String, Some(KnownFormat::Date)),
        VariableType::DateTime => scalar(Type::String, Some(KnownFormat::DateTime)),
        VariableType::List => ArrayBuilder::new()
            .items(ObjectBuilder::new().schema_type(Type::String))
            .default(default)
            .description(description)
            .into(),
    }
}

/// The schema of a result value of a column type; every value may be null.
fn column_schema(column_type: ColumnType) -> RefOr<utoipa::openapi::Schema> {
    let nullable = |kind: Type| SchemaType::from_iter([kind, Type::Null]);
    let typed = |kind: Type, format: Option<KnownFormat>| {
        ObjectBuilder::new().schema_type(nullable(kind)).format(format.map(SchemaFormat::KnownFormat))
    };
    match column_type {
        ColumnType::Integer => typed(Type::Integer, Some(KnownFormat::Int64)).into(),
        ColumnType::Float | ColumnType::Decimal => typed(Type::Number, Some(KnownFormat::Double)).into(),
        ColumnType::String => typed(Type::String, None).into(),
        ColumnType::Boolean => typed(Type::Boolean, None).into(),
        ColumnType::Date => typed(Type::String, Some(KnownFormat::Date)).into(),
        ColumnType::Datetime => {
            typed(Type::String, Some(KnownFormat::DateTime)).description(Some("UTC")).into()
        }
        ColumnType::Array => {
            ArrayBuilder::new().schema_type(nullable(Type::Array)).items(ObjectBuilder::new()).into()
        }
        ColumnType::Json => typed(Type::Object, None).into(),
        ColumnType::Unknown => ObjectBuilder::new().into(),
    }
}

/// A run's variables as an object: each typed, required where the query requires it, closed to any other;
/// `omit` leaves out the ones a caller may not send (a run token's fixed variables). The one source of the
/// variables' schema of an endpoint's OpenAPI document and of its MCP tool's input.
fn variables_object(variables: &BTreeMap<String, Variable>, omit: impl Fn(&str) -> bool) -> ObjectBuilder {
    let mut object = ObjectBuilder::new().schema_type(Type::Object).additional_properties(Some(
        utoipa::openapi::schema::AdditionalProperties::<utoipa::openapi::Schema>::FreeForm(false),
    ));
    for (name, variable) in variables.iter().filter(|(name, _)| !omit(name)) {
        object = object.property(name, variable_schema(variable));
        if variable.required {
            object = object.required(name);
        }
    }
    object
}

/// [`variables_object`] as JSON Schema (an MCP tool's `inputSchema`).
pub(crate) fn variables_schema(
    variables: &BTreeMap<String, Variable>,
    omit: impl Fn(&str) -> bool,
) -> Map<String, Value> {
    match serde_json::to_value(variables_object(variables, omit).build()) {
        Ok(Value::Object(schema)) => schema,
        _ => Map::new(),
    }
}

/// A row of results: one property per column, typed, every one present.
fn row_object(columns: &[Column]) -> ObjectBuilder {
    let mut row = ObjectBuilder::new().schema_type(Type::Object);
    for column in columns {
        row = row.property(&column.name, column_schema(column.column_type)).required(&column.name);
    }
    row
}

/// [`row_object`] as JSON Schema (the rows of an MCP tool's `outputSchema`).
pub(crate) fn row_schema(columns: &[Column]) -> Value {
    serde_json::to_value(row_object(columns).build()).unwrap_or_else(|_| Value::Object(Map::new()))
}

/// The run (or export) request with this version's variables typed, closed to any other, required when one is.
fn run_request_schema(version: &EndpointVersion, of: BodyOf) -> Schema {
    let object = variables_object(&version.query.variables, |_| false);
    let mut body = run_body(object.into(), of);
    if any_required(version) {
        body = body.required("variables");
    }
    let mut value = serde_json::to_value(body.build()).unwrap_or(Value::Object(Map::new()));
    described_defaults(&mut value);
    openapi_3_0_value(value)
}

fn any_required(version: &EndpointVersion) -> bool {
    version.query.variables.values().any(|v| v.required)
}

/// The run answer with `results` typed per column of this version.
fn run_response_schema(version: &EndpointVersion) -> Schema {
    openapi_3_0(RunAnswer::schema_with_rows(row_object(&version.columns).into()))
}

fn json_content(schema: ReferenceOr<Schema>) -> IndexMap<String, MediaType> {
    IndexMap::from([(JSON.to_owned(), MediaType { schema: Some(schema), ..MediaType::default() })])
}

fn component(name: &str) -> ReferenceOr<Schema> {
    ReferenceOr::Reference { reference: format!("#/components/schemas/{name}") }
}

/// A page written in another format than JSON: text, or binary.
fn page_content(binary: bool) -> MediaType {
    let schema = if binary {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
    } else {
        ObjectBuilder::new().schema_type(Type::String)
    };
    MediaType { schema: Some(ReferenceOr::Item(openapi_3_0(schema))), ..MediaType::default() }
}

/// The answers of a run: its JSON (`format` `None`), or its page written in `format` (an export). A run's 200
/// is JSON only, so that a generated client types its answer as the endpoint's rows.
fn responses(format: Option<ResultFormat>) -> Responses {
    let mut responses = IndexMap::new();
    let (content, description) = match format {
        None => (
            json_content(component("RunResult")),
            "The page of rows, with the run's version, X-Has-More, X-Is-Cached and X-Execution-Id in headers too.",
        ),
        Some(format) => (
            IndexMap::from([(format.media_type().to_owned(), page_content(format.is_binary()))]),
            "The page of rows written in the format (streamed), with the run's version, X-Has-More and \
             X-Execution-Id in headers. A refresh=force_cache run with no fresh stored result is a page of no \
             rows (the columns only) with X-Endpoint-Materialized: false.",
        ),
    };
    responses.insert(
        StatusCode::Code(200),
        ReferenceOr::Item(Response { description: description.into(), content, ..Response::default() }),
    );
    responses.insert(
        StatusCode::Code(304),
        ReferenceOr::Item(Response {
            description: "If-None-Match holds the answer's ETag.".into(),
            ..Response::default()
        }),
    );
    for (code, description) in [
        (400, "Invalid variables or parameters, or the query failed (query_timeout, query_memory_limit)."),
        (401, "Missing, unknown, revoked or expired API key."),
        (403, "The key lacks endpoint:read or belongs to another project."),
        (404, "No such active endpoint or version."),
        (429, "Too many live queries for this project; see Retry-After."),
    ] {
        responses.insert(
            StatusCode::Code(code),
            ReferenceOr::Item(Response {
                description: description.into(),
                content: json_content(component("Error")),
                ..Response::default()
            }),
        );
    }
    Responses { responses, ..Responses::default() }
}

fn query_parameter(
    name: &str,
    schema: impl Into<RefOr<utoipa::openapi::Schema>>,
    required: bool,
    description: Option<String>,
) -> ReferenceOr<Parameter> {
    ReferenceOr::Item(Parameter::Query {
        parameter_data: ParameterData {
            name: name.to_owned(),
            description,
            required,
            deprecated: None,
            format: ParameterSchemaOrContent::Schema(ReferenceOr::Item(openapi_3_0(schema))),
            example: None,
            examples: IndexMap::new(),
            explode: None,
            extensions: IndexMap::new(),
        },
        allow_reserved: false,
        style: QueryStyle::Form,
        allow_empty_value: None,
    })
}

/// The identifier a generator turns into a function name: `run_<name>` with hyphens as underscores.
pub(crate) fn operation_id(name: &str) -> String {
    format!("run_{}", name.replace('-', "_"))
}

/// The parameters of a GET run: each variable (a list as comma-separated text), then the page and refresh.
fn query_parameters(version: &EndpointVersion) -> Vec<ReferenceOr<Parameter>> {
    let mut parameters: Vec<ReferenceOr<Parameter>> = version
        .query
        .variables
        .iter()
        .map(|(var, v)| {
            let schema: RefOr<utoipa::openapi::Schema> = if v.variable_type == VariableType::List {
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .description(Some("Comma-separated values"))
                    .into()
            } else {
                variable_schema(v)
            };
            query_parameter(&format!("variables.{var}"), schema, v.required, v.description.clone())
        })
        .collect();
    let bounded = |min: i64, max: Option<i64>| {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(min))
            .maximum(max)
    };
    let limit = format!(
        "At most {} rows of JSON; for another format, up to the server's export limit.",
        RunRequest::MAX_LIMIT
    );
    parameters.push(query_parameter(
        "limit",
        bounded(1, Some(RunRequest::DEFAULT_EXPORT_LIMIT.into())),
        false,
        Some(limit),
    ));
    parameters.push(query_parameter("offset", bounded(0, None), false, None));
    parameters.push(query_parameter("refresh", names::refresh(), false, None));
    parameters.push(query_parameter("format", names::result_format(), false, None));
    parameters
}

/// The endpoint's description, followed by what this version breaks of the version before it.
fn info_description(description: Option<String>, version: &EndpointVersion) -> Option<String> {
    if version.breaking_changes.is_empty() {
        return description;
    }
    let changes: Vec<String> =
        version.breaking_changes.iter().map(domain::BreakingChange::describe).collect();
    let breaking = format!(
        "Breaking changes in version {} against version {}: {}.",
        version.version,
        version.version.saturating_sub(1),
        changes.join("; ")
    );
    Some(match description {
        Some(description) => format!("{description}\n\n{breaking}"),
        None => breaking,
    })
}

/// The document for `version` of `endpoint`, served at `base_url`.
pub(crate) fn document(endpoint: &Endpoint, version: &EndpointVersion, base_url: &str) -> Value {
    let name = endpoint.name.as_str();
    let security = vec![SecurityRequirement::from([(BEARER.to_owned(), vec![])])];
    let description = (!endpoint.description.is_empty()).then(|| endpoint.description.clone());
    let get = Operation {
        operation_id: Some(format!("{}_get", operation_id(name))),
        summary: Some(format!("Run {name} (variables in the query string)")),
        parameters: query_parameters(version),
        responses: responses(None),
        security: Some(security.clone()),
        ..Operation::default()
    };
    let post = Operation {
        operation_id: Some(operation_id(name)),
        summary: Some(format!("Run {name}")),
        description: description.clone(),
        request_body: Some(ReferenceOr::Item(RequestBody {
            content: json_content(component("RunRequest")),
            // An empty body runs with every default: a body is needed only to give a required variable.
            required: any_required(version),
            ..RequestBody::default()
        })),
        responses: responses(None),
        security: Some(security.clone()),
        ..Operation::default()
    };
    let path = format!("/api/projects/{}/endpoints/{name}/run", endpoint.project_id);
    // Each export its own operation (`export_<name>_csv`, ...): a generator types each answer as what it is.
    let exports: Vec<(String, Operation)> = ResultFormat::ALL
        .into_iter()
        .filter(|format| *format != ResultFormat::Json)
        .map(|format| {
            let export = Operation {
                operation_id: Some(format!("export_{}_{}", name.replace('-', "_"), format.as_str())),
                summary: Some(format!("Run {name}, the page written as {}", format.as_str())),
                request_body: Some(ReferenceOr::Item(RequestBody {
                    content: json_content(component("ExportRequest")),
                    required: any_required(version),
                    ..RequestBody::default()
                })),
                responses: responses(Some(format)),
                security: Some(security.clone()),
                ..Operation::default()
            };
            (format!("{path}/{}", format.as_str()), export)
        })
        .collect();
    let mut paths = Paths::default();
    paths.paths.insert(
        path,
        ReferenceOr::Item(PathItem { get: Some(get), post: Some(post), ..PathItem::default() }),
    );
    for (path, export) in exports {
        paths.paths.insert(path, ReferenceOr::Item(PathItem { post: Some(export), ..PathItem::default() }));
    }

    let mut components = Components::default();
    components.security_schemes.insert(
        BEARER.to_owned(),
        ReferenceOr::Item(SecurityScheme::HTTP {
            scheme: "bearer".into(),
            bearer_format: Some("API key".into()),
            description: Some(
                "A project API key with endpoint:read, sent as 'Authorization: Bearer phx_...'.".into(),
            ),
            extensions: IndexMap::new(),
        }),
    );
    components
        .schemas
        .insert("RunRequest".into(), ReferenceOr::Item(run_request_schema(version, BodyOf::Run)));
    components
        .schemas
        .insert("ExportRequest".into(), ReferenceOr::Item(run_request_schema(version, BodyOf::Export)));
    components.schemas.insert("RunResult".into(), ReferenceOr::Item(run_response_schema(version)));
    components.schemas.insert("Error".into(), ReferenceOr::Item(openapi_3_0(ErrorBody::schema())));

    let doc = OpenAPI {
        openapi: "3.0.3".into(),
        info: Info {
            title: name.to_owned(),
            description: info_description(description, version),
            version: version.version.to_string(),
            ..Info::default()
        },
        servers: vec![Server { url: base_url.to_owned(), ..Server::default() }],
        paths,
        components: Some(components),
        security: Some(security),
        ..OpenAPI::default()
    };
    serde_json::to_value(&doc).unwrap_or_else(|_| json!({}))
}

#[cfg(test)]
mod tests {
    use domain::testing::{current_version, endpoint, query};
    use serde_json::{json, Value};

    use super::*;

    fn document_of(variables: Value) -> Value {
        let endpoint = domain::Endpoint {
            columns: vec![domain::Column { name: "n".into(), column_type: ColumnType::Integer }],
            ..endpoint(
                "daily-sales",
                query(json!({"kind": "SQLQuery", "query": "SELECT 1 AS n", "variables": variables})),
            )
        };
        document(&endpoint, &current_version(&endpoint), "http://localhost")
    }

    /// A schema is OpenAPI 3.0: one type name (never `null`), no 3.1 keywords, and so is every schema in it.
    fn check_3_0(schema: &Value) {
        let Some(object) = schema.as_object() else { return };
        if let Some(kind) = object.get("type") {
            assert!(kind.is_string() && kind != "null", "a 3.0 type is one name: {schema}");
        }
        assert!(!object.contains_key("propertyNames"), "{schema}");
        for (key, value) in object {
            match key.as_str() {
                "properties" => value.as_object().into_iter().flat_map(|p| p.values()).for_each(check_3_0),
                "items" | "additionalProperties" | "not" => check_3_0(value),
                "allOf" | "oneOf" | "anyOf" => value.as_array().into_iter().flatten().for_each(check_3_0),
                _ => {}
            }
        }
    }

    #[test]
    fn the_body_is_required_only_when_a_variable_is() {
        let defaults = document_of(json!({"n": {"type": "Integer", "default": 1}}));
        let post = &defaults["paths"]["/api/projects/1/endpoints/daily-sales/run"]["post"];
        assert_ne!(post["requestBody"]["required"], json!(true), "{post}");
        assert_eq!(defaults["components"]["schemas"]["RunRequest"]["required"], Value::Null);

        let required = document_of(json!({"n": {"type": "Integer"}}));
        let post = &required["paths"]["/api/projects/1/endpoints/daily-sales/run"]["post"];
        assert_eq!(post["requestBody"]["required"], json!(true));
        assert_eq!(required["components"]["schemas"]["RunRequest"]["required"], json!(["variables"]));
    }

    #[test]
    fn the_service_schemas_are_written_as_openapi_3_0() {
        let doc = document_of(json!({"d": {"type": "Date"}, "l": {"type": "List", "default": ["a"]}}));
        let schemas = &doc["components"]["schemas"];
        schemas.as_object().unwrap().values().for_each(check_3_0);
        for operation in
            doc["paths"]["/api/projects/1/endpoints/daily-sales/run"].as_object().unwrap().values()
        {
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                check_3_0(&parameter["schema"]);
            }
        }
        let run = &schemas["RunResult"]["properties"];
        assert_eq!(run["endpoint_version"]["nullable"], true);
        assert_eq!(run["results"]["items"]["properties"]["n"]["nullable"], true);
        assert_eq!(run["timings"]["properties"]["total_ms"]["type"], "number");
        let error = &schemas["Error"]["properties"];
        assert!(error["code"]["enum"].as_array().unwrap().iter().any(|c| c == "query_timeout"));
        assert_eq!(error["attr"]["nullable"], true);
        let variables = &schemas["RunRequest"]["properties"]["variables"];
        assert_eq!(variables["properties"]["d"]["format"], "date");
        // A request's defaults are said in words: generators make a property with a `default` required.
        assert_eq!(variables["properties"]["l"]["default"], Value::Null);
        assert_eq!(variables["properties"]["l"]["description"], r#"Default: ["a"]."#);
        let limit = &schemas["RunRequest"]["properties"]["limit"];
        assert!(
            limit["default"].is_null() && limit["description"].as_str().unwrap().ends_with("Default: 100.")
        );
        assert_eq!(variables["properties"]["l"]["items"]["type"], "string");
        assert_eq!(variables["additionalProperties"], false);
        let refresh = &schemas["RunRequest"]["properties"]["refresh"];
        assert_eq!(
            (&refresh["enum"][0], &refresh["nullable"]),
            (&json!("blocking"), &json!(true)),
            "{refresh}"
        );
    }
}
