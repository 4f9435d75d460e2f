//! Projects, API keys and scopes: who may call what, and how a key's secret is shaped and stored.

use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::token::{RunGrant, TokenSecret};
use crate::clock::Timestamp;
use crate::error::{Error, Invalid};

/// A project's id: a positive integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProjectId(i64);

impl ProjectId {
    /// # Errors
    /// [`Invalid`] (attr `project_id`) when the id is not positive.
    pub fn new(id: i64) -> Result<Self, Invalid> {
        if id > 0 {
            Ok(Self(id))
        } else {
            Err(Invalid::field("project_id", "project_id must be a positive integer."))
        }
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for ProjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Project {
    pub id: ProjectId,
    pub name: String,
    pub created_at: Timestamp,
    /// Web origins (`https://app.example.com`) whose pages may call the project's runs from a browser (CORS).
    pub allowed_origins: Vec<String>,
}

/// What checking a run token or a browser's origin needs of a project: read from the store, kept briefly.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProjectAccess {
    pub allowed_origins: Vec<String>,
    /// `None` until the project's first run token is issued.
    pub token_secret: Option<TokenSecret>,
}

/// Checks an origin as `--allow-origin` takes it, and writes it as a browser sends it in `Origin`: a scheme
/// (`https` or `http`), a host and a port unless it is the scheme's own (`https://app.example.com`). A trailing
/// `/` is dropped; a path, a query or credentials are refused.
///
/// # Errors
/// [`Invalid`] (attr `allowed_origins`) saying what is wrong.
pub fn parse_origin(raw: &str) -> Result<String, Invalid> {
    let bad = |why: &str| Invalid::field("allowed_origins", format!("'{raw}' is not an origin: {why}"));
    let url = url::Url::parse(raw.trim()).map_err(|e| bad(&format!("{e}.")))?;
    if !matches!(url.scheme(), "https" | "http") {
        return Err(bad("it must start with https:// or http://."));
    }
    if url.path() != "/"
        || url.query().is_some()
        || url.fragment().is_some()
        || url.has_authority() && !url.username().is_empty()
        || url.password().is_some()
    {
        return Err(bad(
            "write a scheme, a host and an optional port, nothing else (https://app.example.com).",
        ));
    }
    Ok(url.origin().ascii_serialization())
}

/// A permission carried by a key. A write scope implies the read scope of its kind; `endpoint:write` does not
/// imply `table:write` (changing a project's data is its own permission).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    EndpointRead,
    EndpointWrite,
    TableRead,
    TableWrite,
}

impl Scope {
    pub const ALL: [Scope; 4] =
        [Scope::EndpointRead, Scope::EndpointWrite, Scope::TableRead, Scope::TableWrite];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::EndpointRead => "endpoint:read",
            Scope::EndpointWrite => "endpoint:write",
            Scope::TableRead => "table:read",
            Scope::TableWrite => "table:write",
        }
    }

    /// # Errors
    /// [`Invalid`] (attr `scope`) for an unknown scope name.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw).ok_or_else(|| {
            let known = Self::ALL.map(Self::as_str).join(", ");
            Invalid::field("scope", format!("Unknown scope '{raw}'; known scopes: {known}."))
        })
    }

    /// Whether holding `self` allows an operation that needs `needed`.
    pub fn grants(self, needed: Scope) -> bool {
        self == needed
            || matches!(
                (self, needed),
                (Scope::EndpointWrite, Scope::EndpointRead) | (Scope::TableWrite, Scope::TableRead)
            )
    }
}

impl std::str::FromStr for Scope {
    type Err = Invalid;

    fn from_str(raw: &str) -> Result<Self, Invalid> {
        Self::parse(raw)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored API key. The secret itself is never stored, only its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKey {
    pub id: Uuid,
    pub project_id: ProjectId,
    pub label: String,
    pub scopes: Vec<Scope>,
    /// Lowercase hex SHA-256 of the full secret.
    pub secret_hash: String,
    /// The first characters of the secret, so an operator can tell keys apart.
    pub prefix: String,
    pub created_at: Timestamp,
    pub expires_at: Option<Timestamp>,
    pub revoked_at: Option<Timestamp>,
    /// When the key, or a run token it issued, last authenticated a request (flushed from memory in batches).
    pub last_used_at: Option<Timestamp>,
}

impl ApiKey {
    pub fn is_usable_at(&self, now: Timestamp) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|exp| now < exp)
    }
}

/// A key just created, with its secret: shown once, then gone.
#[derive(Debug, Clone)]
pub struct NewApiKey {
    pub key: ApiKey,
    pub secret: String,
}

/// The authenticated caller of a request: a key, or a run token (with the key that issued it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key, or the key that issued the run token.
    pub key_id: Uuid,
    pub project_id: ProjectId,
    pub scopes: Vec<Scope>,
    /// A run token's grant: what it may run, and with which variables fixed.
    pub grant: Option<Arc<RunGrant>>,
    /// How a log record names the caller: the key's label (its prefix when it has none), or the run token's
    /// id. Shared, so that recording a run copies no text.
    pub label: Arc<str>,
}

impl Principal {
    /// The credential itself, for its rate-limit bucket: the key, or the run token.
    pub fn credential_id(&self) -> Uuid {
        self.grant.as_ref().map_or(self.key_id, |grant| grant.token_id)
    }

    /// Checks that it may use scope `needed` in its own project. `runs` names the endpoint when the operation
    /// runs it (or serves what a caller needs to run it): a run token may do only that, for the endpoints it
    /// names; a key needs the scope.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] naming what is missing.
    pub fn permits(&self, needed: Scope, runs: Option<&str>) -> Result<(), Error> {
        match (&self.grant, runs) {
            (Some(_), None) => Err(Error::PermissionDenied(
                "A run token may only run the endpoints it names and read their OpenAPI documents.".into(),
            )),
            (Some(grant), Some(name)) if !grant.allows(name) => Err(Error::PermissionDenied(format!(
                "This run token does not give access to the endpoint '{name}'."
            ))),
            (Some(_), Some(_)) => Ok(()),
            (None, _) if self.scopes.iter().any(|s| s.grants(needed)) => Ok(()),
            (None, _) => Err(Error::PermissionDenied(format!("This action needs the scope '{needed}'."))),
        }
    }

    /// Whether it may run the endpoint `name` of its project (see [`Principal::permits`]).
    pub fn may_run(&self, name: &str) -> bool {
        self.permits(Scope::EndpointRead, Some(name)).is_ok()
    }
}

/// The project a path names: a project id, or the caller's own (`@current`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProjectRef {
    Current,
    Id(ProjectId),
}

impl ProjectRef {
    /// The project it names for `caller`: `@current` is the caller's own.
    pub fn resolve(self, caller: &Principal) -> ProjectId {
        match self {
            Self::Current => caller.project_id,
            Self::Id(id) => id,
        }
    }
}

impl std::str::FromStr for ProjectRef {
    type Err = Invalid;

    fn from_str(raw: &str) -> Result<Self, Invalid> {
        if raw == CURRENT_PROJECT {
            return Ok(Self::Current);
        }
        raw.parse::<i64>()
            .ok()
            .and_then(|id| ProjectId::new(id).ok())
            .map(Self::Id)
            .ok_or_else(|| Invalid::field("project_id", "project_id must be a positive integer or @current."))
    }
}

/// Every key starts with this, so secret scanners can spot leaked keys.
pub const KEY_PREFIX: &str = "phx_";
/// Bytes of randomness in a key.
pub(crate) const SECRET_BYTES: usize = 32;
/// The alias of the key's own project in paths.
pub const CURRENT_PROJECT: &str = "@current";

/// How a key's secret is stored: its SHA-256 as 64 lowercase hex digits.
pub fn hash_secret(secret: &str) -> String {
    SecretHash::of(secret).as_str().to_owned()
}

/// A secret's SHA-256 as 64 lowercase hex digits, on the stack: authenticating a request allocates nothing
/// for it.
pub(crate) struct SecretHash([u8; 64]);

impl SecretHash {
    pub(crate) fn of(secret: &str) -> Self {
        let mut text = [0_u8; 64];
        hex::encode_to_slice(Sha256::digest(secret.as_bytes()), &mut text)
            .expect("32 bytes fill 64 hex digits exactly");
        Self(text)
    }

    pub(crate) fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("hex digits are ASCII")
    }
}

/// Whether a bearer token has the shape of a key: the prefix and 64 lowercase hex digits.
pub(crate) fn looks_like_key(token: &str) -> bool {
    token.strip_prefix(KEY_PREFIX).is_some_and(|rest| {
        rest.len() == SECRET_BYTES * 2
            && rest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}
