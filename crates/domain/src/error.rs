//! The errors services return. Port errors live beside their ports and convert into [`Error`].

use crate::ports::{EngineError, StoreError};

/// An opaque underlying cause, kept for logs and never shown to a client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A rejected input: which field, a stable machine code and a sentence for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Dotted path of the offending field (`query.variables.country`), or `None` for the request as a whole.
    pub attr: Option<String>,
    /// Stable snake_case code: `invalid`, `required`, `unique`, `unknown_variable`, ...
    pub code: &'static str,
    pub detail: String,
}

impl Invalid {
    pub fn new(attr: impl Into<String>, code: &'static str, detail: impl Into<String>) -> Self {
        Self { attr: Some(attr.into()), code, detail: detail.into() }
    }

    /// An `invalid` error on `attr`.
    pub fn field(attr: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(attr, "invalid", detail)
    }

    /// A `required` error on `attr`.
    pub fn required(attr: impl Into<String>) -> Self {
        let attr = attr.into();
        let detail = format!("The field '{attr}' is required.");
        Self::new(attr, "required", detail)
    }

    /// Prefixes the attribute path with `parent.` (or sets it to `parent` when it had none).
    #[must_use]
    pub fn within(mut self, parent: &str) -> Self {
        self.attr = Some(match self.attr.take() {
            Some(attr) => format!("{parent}.{attr}"),
            None => parent.to_owned(),
        });
        self
    }
}

/// What a service operation can fail with. Each variant maps to one HTTP status in the adapter.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 400: the request is well-formed but its content breaks a rule.
    #[error("{}", .0.detail)]
    Invalid(Invalid),
    /// 401: no usable credential.
    #[error("{0}")]
    NotAuthenticated(String),
    /// 403: the credential may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// 404: the addressed thing does not exist (or is not visible).
    #[error("{0}")]
    NotFound(String),
    /// 409: the name is already used by another endpoint of the project.
    #[error("An endpoint named '{0}' already exists in this project.")]
    NameTaken(String),
    /// 400 `query_timeout`: the query ran past its time limit.
    #[error("The query did not finish within {0:?} and was cancelled.")]
    QueryTimeout(std::time::Duration),
    /// 400 `query_memory_limit`: the query needed more memory than allowed.
    #[error("{0}")]
    QueryMemoryLimit(String),
    /// 400 `result_too_large`: the page of rows is larger than a response may carry.
    #[error(
        "The page of results is larger than the {} MiB a response may carry; ask for fewer rows with limit and \
         page through them with offset.",
        .limit_bytes / (1024 * 1024)
    )]
    ResultTooLarge { limit_bytes: usize },
    /// 429: too many live queries for the project.
    #[error("Too many queries of this project are running; retry after {retry_after:?}.")]
    Throttled { retry_after: std::time::Duration },
    /// 503: a dependency (database, engine) is down.
    #[error("a dependency is unavailable")]
    Unavailable(#[source] BoxError),
    /// 500: anything else. The source is logged, never shown.
    #[error("internal error")]
    Internal(#[source] BoxError),
}

impl From<Invalid> for Error {
    fn from(invalid: Invalid) -> Self {
        Error::Invalid(invalid)
    }
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::NotFound => Error::NotFound("Not found.".into()),
            StoreError::VersionNotFound(v) => Error::NotFound(format!("Version {v} does not exist.")),
            StoreError::NameTaken(name) => Error::NameTaken(name),
            StoreError::Unavailable(source) => Error::Unavailable(source),
            StoreError::Internal(source) => Error::Internal(source),
        }
    }
}

impl From<EngineError> for Error {
    fn from(err: EngineError) -> Self {
        match err {
            EngineError::InvalidQuery(reason) => Error::Invalid(Invalid::field("query", reason)),
            EngineError::Timeout(limit) => Error::QueryTimeout(limit),
            EngineError::MemoryLimit(reason) => Error::QueryMemoryLimit(reason),
            EngineError::ResultTooLarge { limit_bytes } => Error::ResultTooLarge { limit_bytes },
            EngineError::Busy { retry_after } => Error::Throttled { retry_after },
            EngineError::Unavailable(source) => Error::Unavailable(source),
            EngineError::Internal(source) => Error::Internal(source),
        }
    }
}
