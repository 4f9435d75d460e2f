//! The route table: every row of the interface under both path families.

use std::sync::Arc;

use actix_web::dev::HttpServiceFactory;
use actix_web::http::header;
use actix_web::middleware::{from_fn, DefaultHeaders};
use actix_web::{guard, web, HttpResponse, Resource};
use domain::ApiKeyService;

use crate::error::ApiError;
use crate::handlers::{endpoints, materialization, runs, tables, tokens, versions};
use crate::{console, cors, operations};

/// Each family's static prefix is matched by a string comparison before its dynamic part is tried.
pub(crate) const FAMILY_PREFIXES: [&str; 2] = ["/api/environments", "/api/projects"];
const FAMILY_REST: &str = "/{project_id}/endpoints";
const TABLES_REST: &str = "/{project_id}/tables";
const TOKENS_REST: &str = "/{project_id}/run_tokens";

/// Every resource's name, the `route` label of the request metrics. Both families share names: the family is
/// not a different operation.
pub(crate) const ROUTE_NAMES: [&str; 19] = [
    "run",
    "endpoints",
    "last_execution_times",
    "endpoint",
    "materialization_status",
    "endpoint_openapi",
    "versions",
    "version",
    "tables",
    "table",
    "table_rows",
    "table_preview",
    "run_tokens",
    "mcp",
    "healthz",
    "readyz",
    "metrics",
    "home",
    "console",
];

/// A resource's fallback for methods it does not serve: 405 with `Allow`.
fn not_allowed(
    allow: &'static str,
) -> impl Fn() -> std::future::Ready<Result<HttpResponse, ApiError>> + Clone {
    move || std::future::ready(Err(ApiError::MethodNotAllowed { allow }))
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
    web::resource(format!("{prefix}{FAMILY_REST}/{{name}}/run"))
        .name("run")
        .route(web::get().to(runs::run_get))
        .route(web::post().to(runs::run_post))
        .default_service(web::to(not_allowed("GET, POST")))
}

/// An endpoint's OpenAPI document, in its family's scope.
fn endpoint_openapi() -> Resource {
    web::resource("/{name}/openapi.json")
        .name("endpoint_openapi")
        .route(web::get().to(versions::openapi))
        .default_service(web::to(not_allowed("GET")))
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
        cfg.service(
            web::scope(prefix)
                .service(
                    web::scope(FAMILY_REST)
                        .service(
                            web::resource("")
                                .name("endpoints")
                                .route(web::get().to(endpoints::list))
                                .route(web::post().to(endpoints::create))
                                .default_service(web::to(not_allowed("GET, POST"))),
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
                            web::resource("/{name}")
                                .name("endpoint")
                                .route(web::get().to(endpoints::retrieve))
                                .route(web::patch().to(endpoints::update))
                                .route(web::delete().to(endpoints::delete))
                                .default_service(web::to(not_allowed("GET, PATCH, DELETE"))),
                        )
                        .service(
                            web::resource("/{name}/materialization_status")
                                .name("materialization_status")
                                .route(web::get().to(materialization::status))
                                .default_service(web::to(not_allowed("GET"))),
                        )
                        .service(not_from_pages(endpoint_openapi()))
                        .service(from_pages(endpoint_openapi(), keys))
                        .service(
                            web::resource("/{name}/versions")
                                .name("versions")
                                .route(web::get().to(versions::list))
                                .default_service(web::to(not_allowed("GET"))),
                        )
                        .service(
                            web::resource("/{name}/versions/{version_number}")
                                .name("version")
                                .route(web::get().to(versions::retrieve))
                                .default_service(web::to(not_allowed("GET"))),
                        ),
                )
                .service(
                    web::resource(TOKENS_REST)
                        .name("run_tokens")
                        .route(web::post().to(tokens::issue))
                        .default_service(web::to(not_allowed("POST"))),
                )
                // Each family is one scope: actix-web tries no second scope of the same prefix.
                .service(
                    web::scope(TABLES_REST)
                        .service(
                            web::resource("")
                                .name("tables")
                                .route(web::get().to(tables::list))
                                .default_service(web::to(not_allowed("GET"))),
                        )
                        .service(
                            web::resource("/{table}")
                                .name("table")
                                .route(web::get().to(tables::retrieve))
                                .route(web::put().to(tables::put))
                                .route(web::delete().to(tables::delete))
                                .default_service(web::to(not_allowed("GET, PUT, DELETE"))),
                        )
                        .service(
                            web::resource("/{table}/rows")
                                .name("table_rows")
                                .route(web::post().to(tables::append))
                                .default_service(web::to(not_allowed("POST"))),
                        )
                        .service(
                            web::resource("/{table}/preview")
                                .name("table_preview")
                                .route(web::post().to(tables::preview))
                                .default_service(web::to(not_allowed("POST"))),
                        ),
                ),
        );
    }
    // The endpoints as MCP tools, for agents (the SDK answers the transport's methods and refuses the others).
    cfg.service(
        web::resource("/mcp")
            .name("mcp")
            .route(web::post().to(crate::mcp::serve))
            .default_service(web::to(not_allowed("POST"))),
    );
    // Operations: no key, so orchestrators and scrapers can reach them.
    cfg.service(
        web::resource("/healthz")
            .name("healthz")
            .route(web::get().to(operations::healthz))
            .default_service(web::to(not_allowed("GET"))),
    );
    cfg.service(
        web::resource("/readyz")
            .name("readyz")
            .route(web::get().to(operations::readyz))
            .default_service(web::to(not_allowed("GET"))),
    );
    cfg.service(
        web::resource("/metrics")
            .name("metrics")
            .route(web::get().to(operations::metrics))
            .default_service(web::to(not_allowed("GET"))),
    );
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
    let read = || guard::Any(guard::Get()).or(guard::Head());
    cfg.service(
        web::resource("/")
            .name("home")
            .route(web::route().guard(read()).to(console::home))
            .default_service(web::to(not_allowed("GET, HEAD"))),
    );
    cfg.service(
        web::resource(["/console", "/console/{path:.*}"])
            .name("console")
            .route(web::route().guard(read()).to(console::serve))
            .default_service(web::to(not_allowed("GET, HEAD"))),
    );
    cfg.default_service(web::to(|| async { Err::<HttpResponse, _>(ApiError::RouteNotFound) }));
}
