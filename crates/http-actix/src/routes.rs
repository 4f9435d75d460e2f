//! The route table: every row of the interface under both path families.

use std::sync::Arc;

use actix_web::dev::HttpServiceFactory;
use actix_web::http::{header, Method};
use actix_web::middleware::{from_fn, DefaultHeaders};
use actix_web::{guard, web, HttpResponse, Resource};
use domain::ApiKeyService;

use crate::error::ApiError;
use crate::handlers::{endpoints, logs, materialization, projects, runs, tables, tokens, versions};
use crate::paths::FAMILY_PREFIXES;
use crate::{console, cors, operations};

const FAMILY_REST: &str = "/{project_id}/endpoints";
const TABLES_REST: &str = "/{project_id}/tables";
const TOKENS_REST: &str = "/{project_id}/run_tokens";

/// A resource's fallback for methods it does not serve: 405 with `Allow`.
fn not_allowed(
    allow: &'static str,
) -> impl Fn() -> std::future::Ready<Result<HttpResponse, ApiError>> + Clone {
    move || std::future::ready(Err(ApiError::MethodNotAllowed { allow }))
}

/// A resource at `$path` named `$name` (the metrics' `route` label) serving each `METHOD => handler`; any other
/// method is answered 405 with exactly those methods in `Allow`.
macro_rules! resource {
    ($path:expr, $name:literal, $first:ident => $handler:expr $(, $method:ident => $more:expr)* $(,)?) => {
        web::resource($path)
            .name($name)
            .route(web::method(Method::$first).to($handler))
            $(.route(web::method(Method::$method).to($more)))*
            .default_service(web::to(not_allowed(concat!(stringify!($first) $(, ", ", stringify!($method))*))))
    };
}

/// The resources pages may call are registered twice under one name: requests from a page (with `Origin`) go
/// through the CORS policy ([`from_pages`]); any other is answered without it ([`not_from_pages`]), so API
/// clients neither pay for CORS nor receive its headers, only `Vary: Origin` (the answer differs for pages).
fn from_page() -> impl guard::Guard {
    guard::fn_guard(|ctx| ctx.head().headers().contains_key(header::ORIGIN))
}

fn not_from_pages(resource: Resource) -> impl HttpServiceFactory {
    resource.guard(guard::Not(from_page())).wrap(DefaultHeaders::new().add((header::VARY, "Origin")))
}

fn from_pages(resource: Resource, keys: &Arc<ApiKeyService>) -> impl HttpServiceFactory {
    resource.guard(from_page()).wrap(cors::policy(Arc::clone(keys))).wrap(from_fn(cors::load_origins))
}

/// A run's resource under one family.
fn run(prefix: &str) -> Resource {
    let path = format!("{prefix}{FAMILY_REST}/{{name}}/run");
    resource!(path, "run", GET => runs::run_get, POST => runs::run_post)
}

/// A run written in a format other than JSON (`csv`, `ndjson`, `parquet`, `arrow`): its own operation, so that
/// a generated client's run answers JSON only. Named as a run (metrics, the run log): it is one.
fn export(prefix: &str) -> Resource {
    let path = format!("{prefix}{FAMILY_REST}/{{name}}/run/{{format:csv|ndjson|parquet|arrow}}");
    resource!(path, "run", GET => runs::export_get, POST => runs::export_post)
}

/// An endpoint's OpenAPI document, in its family's scope.
fn endpoint_openapi() -> Resource {
    resource!("/{name}/openapi.json", "endpoint_openapi", GET => versions::openapi)
}

pub(crate) fn configure(cfg: &mut web::ServiceConfig, keys: &Arc<ApiKeyService>) {
    // Every dynamic pattern is a regular expression tried in order, so runs, the hot path, come first, each
    // family's as one whole pattern: one expression matched per run rather than one per nested scope.
    // Callers other than pages first: they are most runs.
    for prefix in FAMILY_PREFIXES {
        cfg.service(not_from_pages(run(prefix)));
    }
    for prefix in FAMILY_PREFIXES {
        cfg.service(from_pages(run(prefix), keys));
    }
    for prefix in FAMILY_PREFIXES {
        cfg.service(not_from_pages(export(prefix)));
        cfg.service(from_pages(export(prefix), keys));
    }
    for prefix in FAMILY_PREFIXES {
        cfg.service(
            web::scope(prefix)
                // Runs, registered above, refuse unknown parameters as they read them.
                .wrap(from_fn(crate::query_params::known_only))
                .service(
                    web::scope(FAMILY_REST)
                        .service(
                            resource!("", "endpoints", GET => endpoints::list, POST => endpoints::create),
                        )
                        // POST looks up last execution times. `last_execution_times` is also a valid endpoint name,
                        // so GET, PATCH and DELETE of this path reach the endpoint that has it; any other method is
                        // refused with every method the path answers.
                        .service(
                            web::resource("/last_execution_times")
                                .name("last_execution_times")
                                .guard(guard::Not(
                                    guard::Any(guard::Get()).or(guard::Patch()).or(guard::Delete()),
                                ))
                                .route(web::post().to(runs::last_execution_times))
                                .default_service(web::to(not_allowed("GET, POST, PATCH, DELETE"))),
                        )
                        .service(
                            resource!(
                                "/{name}",
                                "endpoint",
                                GET => endpoints::retrieve,
                                PATCH => endpoints::update,
                                DELETE => endpoints::delete
                            ),
                        )
                        .service(
                            resource!(
                                "/{name}/materialization_status",
                                "materialization_status",
                                GET => materialization::status
                            ),
                        )
                        .service(resource!("/{name}/logs", "endpoint_logs", GET => logs::list))
                        .service(resource!("/{name}/usage", "endpoint_usage", GET => logs::usage))
                        .service(not_from_pages(endpoint_openapi()))
                        .service(from_pages(endpoint_openapi(), keys))
                        .service(
                            resource!("/{name}/versions", "versions", GET => versions::list),
                        )
                        .service(
                            resource!("/{name}/versions/{version_number}", "version", GET => versions::retrieve),
                        ),
                )
                .service(
                    resource!(TOKENS_REST, "run_tokens", POST => tokens::issue),
                )
                .service(resource!("/{project_id}", "project", GET => projects::retrieve))
                // Each family is one scope: actix-web tries no second scope of the same prefix.
                .service(
                    web::scope(TABLES_REST)
                        .service(
                            resource!("", "tables", GET => tables::list),
                        )
                        .service(
                            resource!(
                                "/{table}",
                                "table",
                                GET => tables::retrieve,
                                PUT => tables::put,
                                PATCH => tables::update_layout,
                                DELETE => tables::delete
                            ),
                        )
                        .service(
                            resource!("/{table}/rows", "table_rows", POST => tables::append),
                        )
                        .service(
                            resource!("/{table}/versions", "table_versions", GET => tables::versions),
                        )
                        .service(
                            resource!("/{table}/preview", "table_preview", POST => tables::preview),
                        ),
                ),
        );
    }
    // The endpoints as MCP tools, for agents (the SDK answers the transport's methods and refuses the others).
    cfg.service(resource!("/mcp", "mcp", POST => crate::mcp::serve));
    // Operations: no key, so orchestrators and scrapers can reach them.
    cfg.service(resource!("/healthz", "healthz", GET => operations::healthz));
    cfg.service(resource!("/readyz", "readyz", GET => operations::readyz));
    cfg.service(resource!("/metrics", "metrics", GET => operations::metrics));
    // The service's own document and its interactive page (Swagger UI, served from the binary).
    cfg.service(
        utoipa_swagger_ui::SwaggerUi::new("/api/docs/{_:.*}")
            .url("/api/schema", crate::service_doc::document()),
    );
    cfg.route(
        "/api/docs",
        web::get().to(|| async {
            HttpResponse::Found().insert_header(("Location", "/api/docs/index.html")).finish()
        }),
    );
    // The web console: `/` leads to it; every path under /console is its page or one of its files.
    cfg.service(resource!("/", "home", GET => console::home, HEAD => console::home));
    cfg.service(resource!(
        ["/console", "/console/{path:.*}"],
        "console",
        GET => console::serve,
        HEAD => console::serve
    ));
    cfg.default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::RouteNotFound) }));
}
