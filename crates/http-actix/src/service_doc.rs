//! The service's own OpenAPI document (`GET /api/schema`) and its interactive page (`/api/docs`).
//!
//! Each operation is described on its handler (`#[utoipa::path]`); every schema is the one of the type a
//! handler answers with (`api`, `error`), or of a request body as the domain reads it (`api::requests`).
//! This module gathers them, adds the bearer scheme, and writes every path under both families.

use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::OpenApi as Document;
use utoipa::{Modify, OpenApi};

use crate::api::requests::{EndpointCreate, EndpointUpdate, ExportBody, Names, RunBody, RunTokenBody};
use crate::api::{
    names, Endpoint, EndpointPage, LastExecutionTimes, LogList, Project, RunAnswer, RunToken, Usage, Version,
    VersionPage,
};
use crate::error::ErrorBody as Error;
use crate::handlers;

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
    paths(
        handlers::endpoints::list, handlers::endpoints::create, handlers::endpoints::retrieve,
        handlers::endpoints::update, handlers::endpoints::delete,
        handlers::runs::run_get, handlers::runs::run_post, handlers::runs::export_get, handlers::runs::export_post,
        handlers::versions::openapi,
        handlers::materialization::status, handlers::logs::list, handlers::logs::usage, handlers::versions::list, handlers::versions::retrieve,
        handlers::runs::last_execution_times,
        handlers::tables::list, handlers::tables::retrieve, handlers::tables::put, handlers::tables::update_layout,
        handlers::tables::append,
        handlers::tables::delete, handlers::tables::preview, handlers::tables::versions, handlers::tokens::issue,
        handlers::projects::retrieve,
    ),
    components(schemas(
        Error, Endpoint, EndpointCreate, EndpointUpdate, EndpointPage, Version, VersionPage, RunBody, ExportBody, RunAnswer,
        Names, LastExecutionTimes, RunTokenBody, RunToken, LogList, Usage, Project,
    )),
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
/// one the service accepts: `project_id` a positive integer or `@current`, `name` an endpoint's name, `table` a
/// table's,
/// versions positive 32-bit numbers, `limit` 1..=1000 on lists and on runs up to the export limit (JSON pages
/// 10000), `offset` non-negative.
fn describe_parameters(path: &str, operation: &mut utoipa::openapi::path::Operation) {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    let integer = |min: i64, max: i64| {
        ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(min)).maximum(Some(max))
    };
    let (max_limit, default_limit) = if path.ends_with("/run") {
        // JSON pages hold at most RunRequest::MAX_LIMIT rows; pages in other formats up to the export limit.
        (domain::RunRequest::DEFAULT_EXPORT_LIMIT, domain::RunRequest::DEFAULT_LIMIT)
    } else {
        (domain::PageRequest::MAX_LIMIT, domain::PageRequest::DEFAULT_LIMIT)
    };
    for parameter in operation.parameters.iter_mut().flatten() {
        let schema = match parameter.name.as_str() {
            "project_id" => ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^([1-9][0-9]{0,17}|@current)$"))
                .description(Some("The project's id, or @current for the key's own project")),
            "name" => names::endpoint_name(),
            "table" => names::table_name(),
            "version" | "version_number" => integer(1, u32::MAX.into()),
            "limit" => integer(1, max_limit.into()).default(Some(default_limit.into())),
            "offset" => integer(0, i64::MAX).default(Some(0.into())),
            "refresh" => {
                parameter.schema = Some(names::refresh().into());
                continue;
            }
            "format" => {
                parameter.schema = Some(names::result_format().into());
                continue;
            }
            "since" | "until" => ObjectBuilder::new().schema_type(Type::String).format(Some(
                utoipa::openapi::schema::SchemaFormat::KnownFormat(
                    utoipa::openapi::schema::KnownFormat::DateTime,
                ),
            )),
            "kind" => words(&domain::LogKind::ALL.map(domain::LogKind::as_str)),
            "interval" => words(&domain::Interval::ALL.map(domain::Interval::as_str)),
            "status" => {
                ObjectBuilder::new().schema_type(Type::String).pattern(Some("^(ok|error|[1-5][0-9]{2})$"))
            }
            // A page's `next`: microseconds since 1970 (within three centuries of it) and an id.
            "cursor" => {
                ObjectBuilder::new().schema_type(Type::String).pattern(Some(r"^-?[0-9]{1,16}\.[0-9a-f]{32}$"))
            }
            _ => continue,
        };
        parameter.schema = Some(schema.into());
    }
}

/// A string that is one of `words`.
fn words(words: &[&str]) -> utoipa::openapi::schema::ObjectBuilder {
    utoipa::openapi::schema::ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::String)
        .enum_values(Some(words.iter().copied()))
}

/// An update and a POST run take an empty body as `{}`: the body is optional.
fn optional_body(operation: &mut utoipa::openapi::path::Operation) {
    let id = operation.operation_id.as_deref().expect("every operation is given an id");
    if id.ends_with("update_endpoint") || id.ends_with("run_endpoint") || id.ends_with("preview_table") {
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
            ("413", "The body is over its limit (1 MiB of JSON, or --max-upload-mb of a table's rows)"),
            ("415", "The body is not in a format the route reads"),
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
    use serde_json::json;

    use crate::error::Code;

    #[test]
    fn the_error_schema_lists_the_code_table() {
        let doc = serde_json::to_value(super::document()).unwrap();
        let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(doc["components"]["schemas"]["Error"]["properties"]["code"]["enum"], json!(codes));
        let sync = &doc["components"]["schemas"]["Endpoint"]["properties"]["sync_frequency"]["enum"];
        assert_eq!(sync[0], "5min", "named values come from the domain: {sync}");
    }

    /// No request body of the document carries a `default` (generators would make the property required); the
    /// run body's `limit` says its default in words.
    #[test]
    fn request_bodies_say_their_defaults_in_words() {
        fn no_default(schema: &serde_json::Value, at: &str) {
            match schema {
                serde_json::Value::Object(object) => {
                    assert!(!object.contains_key("default"), "{at}: {schema}");
                    object.iter().for_each(|(key, value)| no_default(value, &format!("{at}/{key}")));
                }
                serde_json::Value::Array(items) => items.iter().for_each(|item| no_default(item, at)),
                _ => {}
            }
        }
        let doc = serde_json::to_value(super::document()).unwrap();
        let mut bodies = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                for media in
                    operation["requestBody"]["content"].as_object().into_iter().flat_map(|c| c.values())
                {
                    let schema = &media["schema"];
                    let schema = match schema["$ref"].as_str() {
                        Some(reference) => doc.pointer(reference.trim_start_matches('#')).unwrap(),
                        None => schema,
                    };
                    no_default(schema, &format!("{method} {path}"));
                    bodies += 1;
                }
            }
        }
        assert!(bodies >= 10, "{bodies}");
        let limit = &doc["components"]["schemas"]["RunRequest"]["properties"]["limit"];
        assert!(limit["description"].as_str().unwrap().ends_with("Default: 100."), "{limit}");
    }

    /// The web console's types are generated from its copy of this document, so that an API change that breaks
    /// the console fails its build. `UPDATE_CONSOLE_SCHEMA=1` writes the copy again after a change.
    #[test]
    fn the_console_is_typed_from_this_document() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../console/src/api/openapi.json");
        let doc = serde_json::to_value(super::document()).unwrap();
        if std::env::var_os("UPDATE_CONSOLE_SCHEMA").is_some() {
            let text = serde_json::to_string_pretty(&doc).unwrap() + "\n";
            std::fs::write(path, text).unwrap();
        }
        let copy: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert!(
            copy == doc,
            "console/src/api/openapi.json differs from /api/schema: run \
             `UPDATE_CONSOLE_SCHEMA=1 cargo test -p http-actix console_is_typed`, then `make console`"
        );
    }
}
