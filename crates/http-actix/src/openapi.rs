//! Row 7: an OpenAPI 3.0.3 document for one endpoint version, built with a typed OpenAPI 3.0 model so that a
//! generator can produce a typed client: variables become typed request fields, columns become typed row fields.

use domain::endpoint::{ColumnType, Endpoint, EndpointVersion};
use domain::{RunRequest, Variable, VariableType};
use indexmap::IndexMap;
use openapiv3::{
    AdditionalProperties, ArrayType, BooleanType, Components, Info, IntegerFormat, IntegerType, MediaType,
    NumberFormat, NumberType, ObjectType, OpenAPI, Operation, Parameter, ParameterData,
    ParameterSchemaOrContent, PathItem, Paths, QueryStyle, ReferenceOr, RequestBody, Response, Responses,
    Schema, SchemaData, SchemaKind, SecurityRequirement, SecurityScheme, Server, StatusCode, StringFormat,
    StringType, Type, VariantOrUnknownOrEmpty,
};
use serde_json::{json, Value};

const JSON: &str = "application/json";
const BEARER: &str = "bearer";

fn schema(kind: Type) -> Schema {
    Schema { schema_data: SchemaData::default(), schema_kind: SchemaKind::Type(kind) }
}

fn described(mut schema: Schema, description: impl Into<String>) -> Schema {
    schema.schema_data.description = Some(description.into());
    schema
}

fn nullable(mut schema: Schema) -> Schema {
    schema.schema_data.nullable = true;
    schema
}

fn string() -> Schema {
    schema(Type::String(StringType::default()))
}

fn formatted(format: StringFormat) -> Schema {
    schema(Type::String(StringType {
        format: VariantOrUnknownOrEmpty::Item(format),
        ..StringType::default()
    }))
}

/// `format: uuid`, a free-form format OpenAPI 3.0 allows.
fn uuid() -> Schema {
    schema(Type::String(StringType {
        format: VariantOrUnknownOrEmpty::Unknown("uuid".into()),
        ..StringType::default()
    }))
}

fn integer() -> Schema {
    schema(Type::Integer(IntegerType {
        format: VariantOrUnknownOrEmpty::Item(IntegerFormat::Int64),
        ..IntegerType::default()
    }))
}

fn bounded_integer(minimum: i64, maximum: Option<i64>) -> Schema {
    schema(Type::Integer(IntegerType {
        format: VariantOrUnknownOrEmpty::Item(IntegerFormat::Int64),
        minimum: Some(minimum),
        maximum,
        ..IntegerType::default()
    }))
}

fn number() -> Schema {
    schema(Type::Number(NumberType {
        format: VariantOrUnknownOrEmpty::Item(NumberFormat::Double),
        ..NumberType::default()
    }))
}

fn boolean() -> Schema {
    schema(Type::Boolean(BooleanType::default()))
}

fn array(items: Schema) -> Schema {
    schema(Type::Array(ArrayType {
        items: Some(ReferenceOr::boxed_item(items)),
        min_items: None,
        max_items: None,
        unique_items: false,
    }))
}

fn any() -> Schema {
    Schema {
        schema_data: SchemaData::default(),
        schema_kind: SchemaKind::Any(openapiv3::AnySchema::default()),
    }
}

/// An object with the given properties; `closed` forbids any other property.
fn object(properties: Vec<(String, Schema)>, required: Vec<String>, closed: bool) -> Schema {
    schema(Type::Object(ObjectType {
        properties: properties.into_iter().map(|(name, s)| (name, ReferenceOr::boxed_item(s))).collect(),
        required,
        additional_properties: closed.then_some(AdditionalProperties::Any(false)),
        ..ObjectType::default()
    }))
}

fn enumeration(values: &[&str]) -> Schema {
    schema(Type::String(StringType {
        enumeration: values.iter().map(|v| Some((*v).to_owned())).collect(),
        ..StringType::default()
    }))
}

/// The schema of a variable's value, with its default and description.
fn variable_schema(variable: &Variable) -> Schema {
    let mut schema = match variable.variable_type {
        VariableType::String => string(),
        VariableType::Number => number(),
        VariableType::Integer => integer(),
        VariableType::Boolean => boolean(),
        VariableType::Date => formatted(StringFormat::Date),
        VariableType::DateTime => formatted(StringFormat::DateTime),
        VariableType::List => array(string()),
    };
    schema.schema_data.default = variable.default.clone();
    schema.schema_data.description = variable.description.clone();
    schema
}

/// The schema of a result value of a column type; every value may be null.
fn column_schema(column_type: ColumnType) -> Schema {
    nullable(match column_type {
        ColumnType::Integer => integer(),
        ColumnType::Float | ColumnType::Decimal => number(),
        ColumnType::String => string(),
        ColumnType::Boolean => boolean(),
        ColumnType::Date => formatted(StringFormat::Date),
        ColumnType::Datetime => described(formatted(StringFormat::DateTime), "UTC"),
        ColumnType::Array => array(any()),
        ColumnType::Json => object(vec![], vec![], false),
        ColumnType::Unknown => any(),
    })
}

fn variables_schema(version: &EndpointVersion) -> (Schema, bool) {
    let variables = &version.query.variables;
    let properties = variables.iter().map(|(name, v)| (name.clone(), variable_schema(v))).collect();
    let required: Vec<String> =
        variables.iter().filter(|(_, v)| v.required).map(|(name, _)| name.clone()).collect();
    let any_required = !required.is_empty();
    (object(properties, required, true), any_required)
}

const REFRESH: [&str; 4] = ["blocking", "force_blocking", "force_cache", "direct"];

fn run_request_schema(version: &EndpointVersion) -> Schema {
    let (variables, variables_required) = variables_schema(version);
    let properties = vec![
        ("variables".to_owned(), variables),
        ("version".to_owned(), bounded_integer(1, None)),
        ("limit".to_owned(), bounded_integer(1, Some(i64::from(RunRequest::MAX_LIMIT)))),
        ("offset".to_owned(), bounded_integer(0, None)),
        ("refresh".to_owned(), enumeration(&REFRESH)),
        ("client_query_id".to_owned(), nullable(string())),
    ];
    let required = if variables_required { vec!["variables".to_owned()] } else { vec![] };
    object(properties, required, true)
}

fn row_schema(version: &EndpointVersion) -> Schema {
    let properties = version.columns.iter().map(|c| (c.name.clone(), column_schema(c.column_type))).collect();
    let required = version.columns.iter().map(|c| c.name.clone()).collect();
    object(properties, required, false)
}

fn run_response_schema(version: &EndpointVersion) -> Schema {
    let timings = object(vec![("total_ms".into(), number()), ("query_ms".into(), number())], vec![], false);
    let properties = vec![
        ("name".to_owned(), string()),
        ("endpoint_version".to_owned(), nullable(integer())),
        ("endpoint_version_created_at".to_owned(), nullable(formatted(StringFormat::DateTime))),
        ("columns".to_owned(), array(string())),
        ("types".to_owned(), array(array(string()))),
        ("results".to_owned(), nullable(array(row_schema(version)))),
        ("hasMore".to_owned(), boolean()),
        ("limit".to_owned(), integer()),
        ("offset".to_owned(), integer()),
        ("is_cached".to_owned(), boolean()),
        ("last_refresh".to_owned(), nullable(formatted(StringFormat::DateTime))),
        ("cache_expires_at".to_owned(), nullable(formatted(StringFormat::DateTime))),
        ("endpoint_materialized".to_owned(), boolean()),
        ("endpoint_materialized_at".to_owned(), nullable(formatted(StringFormat::DateTime))),
        ("execution_id".to_owned(), uuid()),
        ("client_query_id".to_owned(), nullable(string())),
        ("timings".to_owned(), timings),
    ];
    let required =
        ["name", "columns", "types", "results", "hasMore", "limit", "offset", "is_cached", "execution_id"]
            .map(str::to_owned)
            .to_vec();
    object(properties, required, false)
}

fn error_schema() -> Schema {
    let kinds = [
        "validation_error",
        "authentication_error",
        "permission_denied",
        "not_found",
        "conflict",
        "throttled",
        "query_error",
        "server_error",
    ];
    object(
        vec![
            ("type".into(), enumeration(&kinds)),
            ("code".into(), string()),
            ("detail".into(), string()),
            ("attr".into(), nullable(string())),
        ],
        ["type", "code", "detail", "attr"].map(str::to_owned).to_vec(),
        false,
    )
}

fn json_content(schema: ReferenceOr<Schema>) -> IndexMap<String, MediaType> {
    IndexMap::from([(JSON.to_owned(), MediaType { schema: Some(schema), ..MediaType::default() })])
}

fn responses(success: &str) -> Responses {
    let error = || ReferenceOr::Reference { reference: "#/components/schemas/Error".into() };
    let mut responses = IndexMap::new();
    responses.insert(
        StatusCode::Code(200),
        ReferenceOr::Item(Response {
            description: "The page of rows.".into(),
            content: json_content(ReferenceOr::Reference {
                reference: format!("#/components/schemas/{success}"),
            }),
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
                content: json_content(error()),
                ..Response::default()
            }),
        );
    }
    Responses { responses, ..Responses::default() }
}

fn query_parameter(
    name: &str,
    schema: Schema,
    required: bool,
    description: Option<String>,
) -> ReferenceOr<Parameter> {
    ReferenceOr::Item(Parameter::Query {
        parameter_data: ParameterData {
            name: name.to_owned(),
            description,
            required,
            deprecated: None,
            format: ParameterSchemaOrContent::Schema(ReferenceOr::Item(schema)),
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

/// The document for `version` of `endpoint`, served at `base_url`.
pub(crate) fn document(endpoint: &Endpoint, version: &EndpointVersion, base_url: &str) -> Value {
    let name = endpoint.name.as_str();
    let success = "RunResult";
    let security = vec![SecurityRequirement::from([(BEARER.to_owned(), vec![])])];

    let mut parameters: Vec<ReferenceOr<Parameter>> = version
        .query
        .variables
        .iter()
        .map(|(var, v)| {
            // Lists travel as comma-separated text in a query string.
            let schema = if v.variable_type == VariableType::List {
                described(string(), "Comma-separated values")
            } else {
                variable_schema(v)
            };
            query_parameter(&format!("variables.{var}"), schema, v.required, v.description.clone())
        })
        .collect();
    parameters.push(query_parameter(
        "limit",
        bounded_integer(1, Some(i64::from(RunRequest::MAX_LIMIT))),
        false,
        None,
    ));
    parameters.push(query_parameter("offset", bounded_integer(0, None), false, None));
    parameters.push(query_parameter("refresh", enumeration(&REFRESH), false, None));

    let get = Operation {
        operation_id: Some(format!("{}_get", operation_id(name))),
        summary: Some(format!("Run {name} (variables in the query string)")),
        parameters,
        responses: responses(success),
        security: Some(security.clone()),
        ..Operation::default()
    };
    let post = Operation {
        operation_id: Some(operation_id(name)),
        summary: Some(format!("Run {name}")),
        description: (!endpoint.description.is_empty()).then(|| endpoint.description.clone()),
        request_body: Some(ReferenceOr::Item(RequestBody {
            content: json_content(ReferenceOr::Reference {
                reference: "#/components/schemas/RunRequest".into(),
            }),
            required: true,
            ..RequestBody::default()
        })),
        responses: responses(success),
        security: Some(security.clone()),
        ..Operation::default()
    };
    let path = format!("/api/projects/{}/endpoints/{name}/run", endpoint.project_id);
    let mut paths = Paths::default();
    paths.paths.insert(
        path,
        ReferenceOr::Item(PathItem { get: Some(get), post: Some(post), ..PathItem::default() }),
    );

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
    components.schemas.insert("RunRequest".into(), ReferenceOr::Item(run_request_schema(version)));
    components.schemas.insert(success.into(), ReferenceOr::Item(run_response_schema(version)));
    components.schemas.insert("Error".into(), ReferenceOr::Item(error_schema()));

    let doc = OpenAPI {
        openapi: "3.0.3".into(),
        info: Info {
            title: name.to_owned(),
            description: (!endpoint.description.is_empty()).then(|| endpoint.description.clone()),
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
