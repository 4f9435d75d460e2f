//! `/mcp`: every active endpoint a credential may run, as a Model Context Protocol tool,
//! over the streamable HTTP transport of the official Rust SDK (`rmcp`), which speaks the protocol; this module
//! only says what the tools are and runs them.
//!
//! - The caller is authenticated here, with the same bearer keys and run tokens as the REST API (401 before the
//!   SDK sees anything), and handed to the SDK's handler in the request's extensions.
//! - `tools/list`: `run_<name>` per active endpoint of the credential's project (a run token: only its
//!   endpoints), its `inputSchema` the variables' schemas of the endpoint's OpenAPI document (a token's fixed
//!   variables left out), its `outputSchema` the page of rows typed per column.
//! - `tools/call`: the run path of `POST run` (cache, materialization, limits), with the caller's request rate
//!   taken per call; the page comes back as `structuredContent` and as JSON text. Every failure a run can have
//!   is a tool error result carrying the REST API's error body (`type`, `code`, `detail`, `attr`).
//!
//! The transport is served statelessly (no session, a JSON answer per request): any process of a deployment
//! answers any request, and nothing is kept per client. So there is no stream to push
//! `notifications/tools/list_changed` on; a client lists the tools again to see changed endpoints.

use std::sync::Arc;

use actix_web::http::StatusCode;
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse};
use domain::{
    ApiKeyService, Endpoint, EndpointFilter, EndpointName, EndpointService, Invalid, PageRequest, Principal,
    ProjectRef, RunRequest, RunService, Scope, Transport,
};
use http_body_util::{BodyExt, Full};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation, ListToolsResult,
    PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

use crate::asking::Asking;
use crate::error::ApiError;
use crate::extract::{authenticate, is_json, read_body};
use crate::rate_limit::RateLimits;
use crate::{openapi, AppState};

/// The prefix of every tool's name: `run_<endpoint name>`.
const TOOL_PREFIX: &str = "run_";
/// Endpoints listed per `tools/list` page (the next page's cursor is its offset).
const TOOLS_PER_PAGE: u32 = 1000;

/// The MCP server of one process.
pub(crate) struct Mcp {
    transport: StreamableHttpService<EndpointTools, NeverSessionManager>,
}

impl Mcp {
    /// The server of a worker of the application, over the application's services.
    pub(crate) fn new(state: &AppState) -> Self {
        let tools = EndpointTools {
            endpoints: Arc::clone(&state.endpoints),
            runs: Arc::clone(&state.runs),
            keys: Arc::clone(&state.keys),
            rate_limits: Arc::clone(&state.rate_limits),
        };
        // Every request carries its bearer credential and is checked before the SDK sees it, so the SDK's
        // defence against DNS rebinding (for unauthenticated local servers: loopback hosts only) is not needed,
        // and would refuse every deployment behind a real host name.
        let config = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(false)
            .with_json_response(true)
            .disable_allowed_hosts();
        let transport = StreamableHttpService::new(
            move || Ok(tools.clone()),
            Arc::new(NeverSessionManager::default()),
            config,
        );
        Self { transport }
    }
}

/// `/mcp` (POST): authenticates the caller and checks the request as the REST API checks its own (a JSON error
/// body for each refusal), then lets the SDK answer it, with the caller in the request's extensions.
pub(crate) async fn serve(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
    mcp: web::Data<Mcp>,
) -> Result<HttpResponse, ApiError> {
    let caller = authenticate(&req, &state).await?;
    // The REST API's body limits and timeout.
    let body = read_body(&req, payload.into_inner(), &state).await?;
    if !is_json(&req) {
        return Err(ApiError::UnsupportedMediaType);
    }
    let message =
        serde_json::from_slice::<Value>(&body).map_err(|e| ApiError::MalformedJson(e.to_string()))?;
    let method = message.get("method").and_then(Value::as_str);
    // Every message spends the caller's request rate, as a REST call does. Listing and calling tools take it in
    // their handlers, so that a client over its rate gets the protocol's error (a tool error for a call) with
    // the REST API's body; anything else (`initialize`, `ping`, notifications) is refused here with 429.
    if !method.is_some_and(|method| ["tools/list", "tools/call"].contains(&method)) {
        match state.rate_limits.take(&caller) {
            Ok(budget) => {
                if let Some(budget) = budget {
                    req.extensions_mut().insert(budget);
                }
            }
            Err(exceeded) => {
                req.extensions_mut().insert(exceeded.budget);
                return Err(ApiError::RateLimited {
                    scope: exceeded.scope,
                    retry_after: exceeded.retry_after,
                });
            }
        }
    }
    if !accepts_both(&req) {
        return Err(ApiError::McpNotAcceptable);
    }
    let mut request = http::Request::builder().method(http::Method::POST).uri(req.uri().to_string());
    for (name, value) in req.headers() {
        request = request.header(name.as_str(), value.as_bytes());
    }
    let mut request = request.body(Full::new(body)).map_err(internal)?;
    request.extensions_mut().insert(caller);
    let (parts, body) = mcp.transport.handle(request).await.into_parts();
    // Served without sessions, an answer is one JSON document that ends with the request: it is read whole,
    // and actix-web frames it.
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(never) => match never {},
    };
    let status = StatusCode::from_u16(parts.status.as_u16()).map_err(internal)?;
    if status.is_client_error() && !is_json_answer(&parts.headers) {
        // The transport's own refusals (a JSON document that is no JSON-RPC message, say) are plain text.
        let detail = String::from_utf8_lossy(&body);
        return Err(Invalid::whole(format!("The body is not an MCP request: {detail}.")).into());
    }
    if status.is_server_error() {
        return Err(internal(String::from_utf8_lossy(&body).into_owned()));
    }
    let mut response = HttpResponse::build(status);
    for (name, value) in &parts.headers {
        if name != http::header::CONTENT_LENGTH && name != http::header::TRANSFER_ENCODING {
            response.append_header((name.as_str(), value.as_bytes()));
        }
    }
    Ok(response.body(body))
}

/// Whether the client accepts both of the transport's answers, as an MCP client says it does.
fn accepts_both(req: &HttpRequest) -> bool {
    let accepted: Vec<String> = req
        .headers()
        .get_all(actix_web::http::header::ACCEPT)
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|item| item.split(';').next())
        .map(|mime| mime.trim().to_ascii_lowercase())
        .collect();
    let accepts = |mime: &str| accepted.iter().any(|item| item == mime || item == "*/*");
    accepts("application/json") && accepts("text/event-stream")
}

fn is_json_answer(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

fn internal(err: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> ApiError {
    ApiError::from(domain::Error::Internal(err.into()))
}

/// The tools: the endpoints, run through the services.
#[derive(Clone)]
struct EndpointTools {
    endpoints: Arc<EndpointService>,
    runs: Arc<RunService>,
    keys: Arc<ApiKeyService>,
    rate_limits: Arc<RateLimits>,
}

/// The authenticated caller of this request, put there by [`serve`].
fn caller(context: &RequestContext<RoleServer>) -> Result<Principal, McpError> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
        .ok_or_else(|| McpError::internal_error("the request's caller is missing", None))
}

/// A tool error result with the REST API's error body, as JSON text and as structured content.
fn failed(err: ApiError) -> CallToolResult {
    err.log_server_error();
    let body = err.body();
    let mut result = CallToolResult::error(vec![ContentBlock::text(body.to_string())]);
    result.structured_content = Some(body);
    result
}

/// The tool of an endpoint: its variables as input (less the ones `fixed`), its page of rows as output.
fn tool(endpoint: &Endpoint, fixed: &Map<String, Value>) -> Tool {
    let mut input = openapi::variables_schema(&endpoint.query.variables, |name| fixed.contains_key(name));
    input.insert("type".into(), json!("object"));
    let rows = json!({"type": "array", "items": openapi::row_schema(&endpoint.columns)});
    let output = json!({
        "type": "object",
        "properties": {
            "rows": rows,
            "has_more": {"type": "boolean", "description": "More rows follow this page (of 100)."},
        },
        "required": ["rows", "has_more"],
    });
    let description = if endpoint.description.trim().is_empty() {
        format!("Runs the saved query '{}' and returns its rows.", endpoint.name)
    } else {
        endpoint.description.clone()
    };
    let mut tool = Tool::new(format!("{TOOL_PREFIX}{}", endpoint.name), description, Arc::new(input))
        .with_annotations(ToolAnnotations::new().read_only(true).idempotent(true).open_world(false));
    if let Value::Object(output) = output {
        tool = tool.with_raw_output_schema(Arc::new(output));
    }
    tool
}

impl EndpointTools {
    /// The endpoints of a page of `tools/list`, with the offset of the next page if there is one.
    async fn list(&self, caller: &Principal, offset: u64) -> Result<(Vec<Tool>, Option<String>), ApiError> {
        self.take_request(caller)?;
        let active = EndpointFilter { is_active: Some(true), ..EndpointFilter::default() };
        let page = PageRequest { limit: TOOLS_PER_PAGE, offset };
        let page = self.endpoints.list(caller.project_id, &active, page).await?;
        let no_fixed = Map::new();
        let fixed = caller.grant.as_ref().map_or(&no_fixed, |grant| &grant.fixed_variables);
        let tools = page
            .items
            .iter()
            .filter(|endpoint| caller.may_run(endpoint.name.as_str()))
            .map(|endpoint| tool(endpoint, fixed))
            .collect();
        let next = page.has_next().then(|| (offset + u64::from(TOOLS_PER_PAGE)).to_string());
        Ok((tools, next))
    }

    /// Takes one request from the caller's rate limits, as every REST request does: listing reads the store,
    /// and a call may run a query.
    fn take_request(&self, caller: &Principal) -> Result<(), ApiError> {
        self.rate_limits.take(caller).map(|_| ()).map_err(|exceeded| ApiError::RateLimited {
            scope: exceeded.scope,
            retry_after: exceeded.retry_after,
        })
    }

    /// Runs the endpoint a tool names, as `POST run` with `arguments` as its variables would. The run service
    /// records the run; a call refused here, before it is asked, is told to it.
    async fn call(
        &self,
        caller: &Principal,
        name: &str,
        arguments: Map<String, Value>,
    ) -> Result<Value, ApiError> {
        let asking = Asking::current();
        let admitted = self.take_request(caller).and_then(|()| {
            let project =
                self.keys.authorize(caller, ProjectRef::Current, Scope::EndpointRead, Some(name))?;
            Ok((project, EndpointName::from_path(name)?))
        });
        let (project, endpoint) = match admitted {
            Ok(admitted) => admitted,
            Err(err) => {
                asking.refused(&self.runs, caller, Transport::Mcp, caller.project_id, name, &err);
                return Err(err);
            }
        };
        let request = RunRequest { variables: arguments, ..RunRequest::default() };
        let outcome = self.runs.run(asking.by(caller, Transport::Mcp), project, endpoint, request).await?;
        let (rows, has_more) = match outcome.run.as_deref() {
            Some(run) => {
                (serde_json::from_str(&run.result.rows_json).map_err(internal)?, run.result.has_more)
            }
            None => (Value::Array(Vec::new()), false),
        };
        Ok(json!({"rows": rows, "has_more": has_more}))
    }
}

impl ServerHandler for EndpointTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("endpoints", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Each tool runs one saved SQL query endpoint of the project with its variables as arguments and \
                 returns its first page of rows.",
            )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let caller = caller(&context)?;
        let offset = match request.and_then(|r| r.cursor) {
            Some(cursor) => {
                cursor.parse::<u64>().map_err(|_| McpError::invalid_params("unknown cursor", None))?
            }
            None => 0,
        };
        let (tools, next) = self.list(&caller, offset).await.map_err(|err| {
            err.log_server_error();
            McpError::internal_error(err.detail().into_owned(), Some(err.body()))
        })?;
        let mut page = ListToolsResult::with_all_items(tools);
        page.next_cursor = next;
        Ok(page)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let caller = caller(&context)?;
        let Some(name) = request.name.strip_prefix(TOOL_PREFIX) else {
            return Err(McpError::invalid_params(format!("Unknown tool '{}'.", request.name), None));
        };
        // A tool called without arguments runs with no variables.
        let arguments = request.arguments.unwrap_or_else(Map::new);
        let called = self.call(&caller, name, arguments).await;
        Ok(match called {
            Ok(page) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(page.to_string())]);
                result.structured_content = Some(page);
                result
            }
            Err(err) => failed(err),
        }
        .into())
    }
}
