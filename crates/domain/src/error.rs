//! The errors services return, and the errors of the ports they call: a store or an engine reports a
//! [`StoreError`] or an [`EngineError`], and services turn both into one [`Error`].

/// An opaque underlying cause, kept for logs and never shown to a client.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why an input was refused, as a stable machine code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// The value breaks the field's rule.
    Invalid,
    /// A value the request must carry is missing.
    Required,
    /// A variable the query does not declare.
    UnknownVariable,
    /// A variable the caller's run token fixes, which the caller may not send.
    FixedVariable,
}

/// A rejected input: which field, why, and a sentence for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// Dotted path of the offending field (`query.variables.country`), or `None` for the request as a whole.
    pub attr: Option<String>,
    pub code: Violation,
    pub detail: String,
}

impl Invalid {
    pub fn new(attr: impl Into<String>, code: Violation, detail: impl Into<String>) -> Self {
        Self { attr: Some(attr.into()), code, detail: detail.into() }
    }

    /// An `invalid` error on `attr`.
    pub fn field(attr: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(attr, Violation::Invalid, detail)
    }

    /// An `invalid` error on the request as a whole (no one field is to blame).
    pub fn whole(detail: impl Into<String>) -> Self {
        Self { attr: None, code: Violation::Invalid, detail: detail.into() }
    }

    /// A `required` error on `attr`.
    pub fn required(attr: impl Into<String>) -> Self {
        let attr = attr.into();
        let detail = format!("The field '{attr}' is required.");
        Self::new(attr, Violation::Required, detail)
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

/// The detail alone, so that parsers built on [`std::str::FromStr`] (command-line flags) say what was wrong.
impl std::fmt::Display for Invalid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.detail)
    }
}

impl std::error::Error for Invalid {}

/// What a service operation can fail with: which rule the request broke, or what failed beneath it. How each
/// is answered (an HTTP status, a protocol error) is the adapter's choice.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value of the request breaks a rule; [`Invalid`] names the field.
    #[error("{}", .0.detail)]
    Invalid(Invalid),
    /// No usable credential came with the request.
    #[error("{0}")]
    NotAuthenticated(String),
    /// The credential is valid but may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// The addressed thing does not exist, or is not visible to the caller.
    #[error("{0}")]
    NotFound(String),
    /// The name is already used by another endpoint of the project.
    #[error("An endpoint named '{0}' already exists in this project.")]
    NameTaken(String),
    /// The thing is still needed (a table that endpoints read); the detail names by what.
    #[error("{0}")]
    InUse(String),
    /// An append's `Idempotency-Key` was used with another body, or its first append is still being written.
    #[error("{0}")]
    IdempotencyConflict(String),
    /// A new version would break the callers of an endpoint that ran recently, and the
    /// change was not confirmed; nothing was changed. `changes` lists what breaks, as the version record would.
    #[error("{detail}")]
    BreakingChange { detail: String, changes: serde_json::Value },
    /// A body is larger than allowed.
    #[error("The body is larger than the limit of {limit_bytes} bytes; nothing was written.")]
    PayloadTooLarge { limit_bytes: u64 },
    /// The saved query no longer plans (a table it reads changed); the detail says why.
    #[error("{0}")]
    QueryInvalid(String),
    /// The query ran past its time limit and was cancelled.
    #[error("The query did not finish within {0:?} and was cancelled.")]
    QueryTimeout(std::time::Duration),
    /// The query needed more memory than its limit allows.
    #[error("{0}")]
    QueryMemoryLimit(String),
    /// The page of rows is larger than a response may carry.
    #[error(
        "The page of results is larger than the {} MiB a response may carry; ask for fewer rows with limit and \
         page through them with offset.",
        .limit_bytes / (1024 * 1024)
    )]
    ResultTooLarge { limit_bytes: usize },
    /// The project runs as many queries as it may, the server is out of memory for another, or an exported page
    /// does not fit beside the pages waiting for their readers; the request may be retried after `retry_after`.
    #[error("The server is at its limit of queries for this project (or of memory or exported pages for all); retry after {retry_after:?}.")]
    Throttled { retry_after: std::time::Duration },
    /// A run's `cursor` pinned versions of tables that are no longer kept, or is older than the cursors live.
    #[error("{0}")]
    CursorExpired(String),
    /// A dependency (database, engine) is down.
    #[error("a dependency is unavailable")]
    Unavailable(#[source] BoxError),
    /// Anything else. The source is logged, never shown.
    #[error("internal error")]
    Internal(#[source] BoxError),
}

impl Error {
    /// The stable code and HTTP status the error is answered with (the HTTP adapter answers the same; a test
    /// there holds them together), for records kept of failures that no request answered (a refresh's).
    pub fn code_and_status(&self) -> (&'static str, u16) {
        match self {
            Self::Invalid(invalid) => match invalid.code {
                Violation::Invalid => ("invalid", 400),
                Violation::Required => ("required", 400),
                Violation::UnknownVariable => ("unknown_variable", 400),
                Violation::FixedVariable => ("fixed_variable", 400),
            },
            Self::NotAuthenticated(_) => ("not_authenticated", 401),
            Self::PermissionDenied(_) => ("permission_denied", 403),
            Self::NotFound(_) => ("not_found", 404),
            Self::NameTaken(_) => ("unique", 409),
            Self::InUse(_) => ("in_use", 409),
            Self::IdempotencyConflict(_) => ("idempotency_conflict", 409),
            Self::BreakingChange { .. } => ("breaking_change", 409),
            Self::PayloadTooLarge { .. } => ("payload_too_large", 413),
            Self::QueryInvalid(_) => ("query_invalid", 400),
            Self::QueryTimeout(_) => ("query_timeout", 400),
            Self::QueryMemoryLimit(_) => ("query_memory_limit", 400),
            Self::ResultTooLarge { .. } => ("result_too_large", 400),
            Self::Throttled { .. } => ("throttled", 429),
            Self::CursorExpired(_) => ("cursor_expired", 410),
            Self::Unavailable(_) => ("unavailable", 503),
            Self::Internal(_) => ("error", 500),
        }
    }

    /// No endpoint of that name in the caller's project.
    pub fn endpoint_not_found(name: &str) -> Self {
        Self::NotFound(format!("No endpoint named '{name}' in this project."))
    }

    /// No table of that name in the caller's project.
    pub fn table_not_found(name: &str) -> Self {
        Self::NotFound(format!("No table named '{name}' in this project."))
    }
}

/// What a store adapter can fail with.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("not found")]
    NotFound,
    #[error("version {0} not found")]
    VersionNotFound(u32),
    #[error("name '{0}' already taken")]
    NameTaken(String),
    /// A new version was decided against a version that is no longer the endpoint's current one (another
    /// change saved one first); nothing was written.
    #[error("the endpoint moved on to version {current}")]
    Superseded { current: u32 },
    #[error("store unavailable")]
    Unavailable(#[source] BoxError),
    #[error("store failure")]
    Internal(#[source] BoxError),
}

/// What the query engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The SQL is not a single read-only statement over the project's tables, or does not plan.
    #[error("{0}")]
    InvalidQuery(String),
    /// The query ran past its time limit and was cancelled.
    #[error("query timed out after {0:?}")]
    Timeout(std::time::Duration),
    /// The query needed more memory than its limit allows.
    #[error("{0}")]
    MemoryLimit(String),
    /// The page of rows would be larger than a response may carry (`limit_bytes`).
    #[error("the result is over {limit_bytes} bytes")]
    ResultTooLarge { limit_bytes: usize },
    /// Too many queries of the project are running; try again after the given time.
    #[error("too many concurrent queries")]
    Busy { retry_after: std::time::Duration },
    /// A table has no version at the time asked for, or the version asked for is no longer kept.
    #[error("{0}")]
    NoSuchVersion(String),
    #[error("engine unavailable")]
    Unavailable(#[source] BoxError),
    #[error("engine failure")]
    Internal(#[source] BoxError),
}

/// What writing an upload into a table can fail with. Whatever it fails with, the table is as it was.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// The body does not read as its format, or its rows do not fit the table; the text says what and where
    /// (a line or row number).
    #[error("{0}")]
    Invalid(String),
    #[error("the body is over {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    /// Rows were to be added to a table that does not exist.
    #[error("no such table")]
    NoSuchTable,
    /// The request names something the table cannot be or do: a source outside the allowed ones or that
    /// cannot be read, rows appended to a table whose rows live elsewhere.
    #[error("{0}")]
    Rejected(Invalid),
    /// The body stopped before its end: the client went away or its connection broke.
    #[error("the body was cut off")]
    CutOff(#[source] BoxError),
    /// Another append under the same `Idempotency-Key` (a retry that took the key over) landed first: nothing
    /// was written.
    #[error("another append with the same Idempotency-Key landed first")]
    TakenOver,
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<UploadError> for Error {
    fn from(err: UploadError) -> Self {
        match err {
            UploadError::Invalid(reason) => Error::Invalid(Invalid::field("body", reason)),
            UploadError::TooLarge { limit_bytes } => Error::PayloadTooLarge { limit_bytes },
            UploadError::Rejected(invalid) => Error::Invalid(invalid),
            UploadError::NoSuchTable => {
                Error::NotFound("No such table in this project; create it with PUT first.".into())
            }
            UploadError::CutOff(_) => Error::Invalid(Invalid::field(
                "body",
                "The body stopped before its end; nothing was written.",
            )),
            UploadError::TakenOver => Error::IdempotencyConflict(
                "Another append with this Idempotency-Key (a retry) wrote its rows first; nothing was written. \
                 Retry to get its answer."
                    .into(),
            ),
            UploadError::Engine(err) => err.into(),
        }
    }
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
            StoreError::Superseded { current } => {
                Error::Internal(format!("the endpoint moved on to version {current} during a change").into())
            }
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
            EngineError::NoSuchVersion(reason) => Error::Invalid(Invalid::field("as_of", reason)),
            EngineError::Unavailable(source) => Error::Unavailable(source),
            EngineError::Internal(source) => Error::Internal(source),
        }
    }
}
