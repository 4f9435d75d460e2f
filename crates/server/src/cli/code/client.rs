//! The one client of a server's public API that `pull`, `diff`, `push` and `test` share: the endpoint list, a
//! create and an update (each also as a dry run), a delete and a run, with the key as a bearer token.

use std::time::Duration;

use http_actix::api::{BreakingChange, Endpoint, EndpointPage};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use url::Url;

/// How long one request may take before the command gives up on the server.
const TIMEOUT: Duration = Duration::from_secs(120);

/// The most one answer may hold: a page of endpoints or a run's rows are far smaller.
const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

/// The most endpoints a listing reads before it takes the server for one whose pages never end.
const MAX_ENDPOINTS: usize = 100_000;

/// How much of an error answer that is not the API's JSON is shown.
const SHOWN_ERROR_CHARS: usize = 200;

/// A server's endpoints of one project, through its API.
#[derive(Debug)]
pub struct Api {
    http: reqwest::Client,
    /// `{url}/api/projects/{project}/endpoints/`
    endpoints: Url,
    key: String,
}

/// What went wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("could not reach the server at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The server's error answer, as its JSON body says it.
    #[error("{status} {code}: {detail}")]
    Api { status: u16, code: String, detail: String, breaking_changes: Vec<BreakingChange> },
    #[error("the server answered what this command does not understand ({}); is it an endpoints server?", printable(.0))]
    Unexpected(String),
    /// A file the API's own rules refuse, found before anything is sent (what the server would answer with 400).
    #[error("400 validation_error: {0}")]
    Invalid(String),
}

impl ClientError {
    pub(crate) fn invalid(invalid: &domain::Invalid) -> Self {
        Self::Invalid(match &invalid.attr {
            Some(attr) => format!("{attr}: {}", invalid.detail),
            None => invalid.detail.clone(),
        })
    }

    /// The server's error code (`breaking_change`, `not_found`, ...), for an error answer.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }
}

/// A run's answer: its columns in order and its rows, one object per row (the members of the API's run answer
/// a test compares; the others are not read).
#[derive(Debug, Clone, Deserialize)]
pub struct RunAnswer {
    pub columns: Vec<String>,
    pub results: Vec<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    code: String,
    detail: String,
    #[serde(default)]
    breaking_changes: Vec<BreakingChange>,
}

impl Api {
    /// A client of project `project`'s endpoints on the server at `url` (its root: `https://host[:port]`).
    ///
    /// # Errors
    /// A URL that is not http(s), or a client that cannot be built.
    pub fn new(url: &Url, project: i64, key: &str) -> Result<Self, ClientError> {
        if !matches!(url.scheme(), "http" | "https") || url.cannot_be_a_base() {
            return Err(ClientError::Unreachable {
                url: url.to_string(),
                reason: "the URL must be http:// or https://".into(),
            });
        }
        let mut endpoints = url.clone();
        endpoints.path_segments_mut().expect("an http(s) URL is a base").pop_if_empty().extend([
            "api",
            "projects",
            &project.to_string(),
            "endpoints",
            "",
        ]);
        let http = reqwest::Client::builder()
            .timeout(TIMEOUT)
            .user_agent(concat!("endpoints-cli/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| ClientError::Unreachable { url: url.to_string(), reason: err.to_string() })?;
        Ok(Self { http, endpoints, key: key.to_owned() })
    }

    /// Every endpoint of the project, page after page, by name. Pages are asked for by offset on the URL the
    /// command was given (never by the page's `next` link: the key goes only where it was meant to, and a proxy
    /// that rewrites hosts or schemes changes nothing).
    pub async fn list(&self) -> Result<Vec<Endpoint>, ClientError> {
        const PAGE: usize = 100;
        let mut all = Vec::new();
        loop {
            let mut url = self.endpoints.clone();
            url.query_pairs_mut()
                .append_pair("limit", &PAGE.to_string())
                .append_pair("offset", &all.len().to_string());
            let page: EndpointPage = self.send(Method::GET, url, None).await?;
            let last = page.next.is_none() || page.results.is_empty();
            all.extend(page.results);
            if last {
                break;
            }
            if all.len() > MAX_ENDPOINTS {
                return Err(ClientError::Unexpected(format!(
                    "more than {MAX_ENDPOINTS} endpoints listed, page after page"
                )));
            }
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Creates an endpoint from `body`, or with `dry_run` answers the endpoint it would make.
    pub async fn create(&self, body: &Value, dry_run: bool) -> Result<Endpoint, ClientError> {
        let mut url = self.endpoints.clone();
        url.path_segments_mut().expect("a base").pop_if_empty();
        if dry_run {
            url.query_pairs_mut().append_pair("dry_run", "true");
        }
        self.send(Method::POST, url, Some(body)).await
    }

    /// Updates endpoint `name` to `body`, or with `dry_run` answers the endpoint as it would be.
    pub async fn update(&self, name: &str, body: &Value, dry_run: bool) -> Result<Endpoint, ClientError> {
        let mut url = self.endpoint(name);
        if dry_run {
            url.query_pairs_mut().append_pair("dry_run", "true");
        }
        self.send(Method::PATCH, url, Some(body)).await
    }

    pub async fn delete(&self, name: &str) -> Result<(), ClientError> {
        let response = self.request(Method::DELETE, self.endpoint(name), None).await?;
        Self::check(response).await.map(drop)
    }

    /// Runs endpoint `name` with `variables`, computed now (`refresh=direct`), never from a cache.
    pub async fn run(&self, name: &str, variables: &Value) -> Result<RunAnswer, ClientError> {
        let mut url = self.endpoint(name);
        url.path_segments_mut().expect("a base").push("run");
        let body = json!({"variables": variables, "refresh": "direct"});
        self.send(Method::POST, url, Some(&body)).await
    }

    fn endpoint(&self, name: &str) -> Url {
        let mut url = self.endpoints.clone();
        url.path_segments_mut().expect("a base").pop_if_empty().push(name);
        url
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<T, ClientError> {
        let response = Self::check(self.request(method, url, body).await?).await?;
        let bytes = read_bounded(response, MAX_ANSWER_BYTES).await?;
        serde_json::from_slice(&bytes).map_err(|err| ClientError::Unexpected(err.to_string()))
    }

    async fn request(
        &self,
        method: Method,
        url: Url,
        body: Option<&Value>,
    ) -> Result<reqwest::Response, ClientError> {
        let shown = url.to_string();
        let mut request = self.http.request(method, url).bearer_auth(&self.key);
        if let Some(body) = body {
            request = request.json(body);
        }
        request.send().await.map_err(|err| ClientError::Unreachable { url: shown, reason: cause(&err) })
    }

    /// The response when it succeeded; its error body as [`ClientError::Api`] otherwise.
    async fn check(response: reqwest::Response) -> Result<reqwest::Response, ClientError> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        // An error answer whose body cannot be read is described by its status alone.
        let bytes = read_bounded(response, MAX_ANSWER_BYTES).await.unwrap_or_else(|_| Vec::new());
        // What the server says is printed on the user's terminal: its control characters are shown escaped.
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) => Err(ClientError::Api {
                status: status.as_u16(),
                code: printable(&body.code),
                detail: printable(&body.detail),
                breaking_changes: body
                    .breaking_changes
                    .into_iter()
                    .map(|change| BreakingChange {
                        column: printable(&change.column),
                        change: printable(&change.change).into(),
                        ..change
                    })
                    .collect(),
            }),
            Err(_) => Err(ClientError::Api {
                status: status.as_u16(),
                code: status.canonical_reason().unwrap_or("error").to_lowercase().replace(' ', "_"),
                detail: if status == StatusCode::NOT_FOUND {
                    "not found: is the URL the server's root?".into()
                } else {
                    let text: String =
                        String::from_utf8_lossy(&bytes).chars().take(SHOWN_ERROR_CHARS).collect();
                    printable(&text)
                },
                breaking_changes: Vec::new(),
            }),
        }
    }
}

/// An answer's body, refused past `limit` bytes as it arrives (a server sending without end is not held).
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ClientError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|err| ClientError::Unexpected(cause(&err)))? {
        if body.len() + chunk.len() > limit {
            return Err(ClientError::Unexpected(format!(
                "an answer larger than {} MiB",
                limit / (1024 * 1024)
            )));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// `text` with its control characters (escape sequences, carriage returns, ...) written as escapes.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

/// A request's failure with its causes (a refused connection says so only in its source).
fn cause(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}
