//! Run tokens: signed credentials that a customer-facing page may hold. A token may only
//! run the endpoints it names and read their OpenAPI documents, with some variables fixed to the tenant's
//! values, until it expires. It is a JWT signed with HS256 by its project's secret (the `jsonwebtoken` crate
//! does the encoding, the signature and its checks); its header's `kid` names the project, so that the secret
//! to check it with is found before anything in it is trusted.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use uuid::Uuid;

use super::model::ProjectId;
use crate::clock::Timestamp;
use crate::error::{Error, Invalid};
use crate::fields::{integer, Fields};
use crate::version::VersionNumber;

/// Bytes of randomness in a project's token secret.
const SECRET_BYTES: usize = 32;
/// The longest token accepted: far more than any token this service signs (100 names and their variables).
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A project's token secret: 32 random bytes as 64 hex digits. Never shown, never logged.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenSecret(String);

impl TokenSecret {
    /// A new random secret.
    pub fn generate() -> Self {
        let mut bytes = [0_u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        Self(hex::encode(bytes))
    }

    /// A secret as the store keeps it.
    pub fn from_stored(secret: String) -> Self {
        Self(secret)
    }

    /// The stored form.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TokenSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenSecret(..)")
    }
}

/// What a run token grants, as its claims: signed, so none of it can be changed by whoever holds it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Claims {
    /// The key that issued the token (its uses count as the key's).
    sub: Uuid,
    /// The token's own id: its rate-limit bucket.
    jti: Uuid,
    /// The project, also in the header's `kid`.
    pid: i64,
    iat: i64,
    exp: i64,
    endpoints: Vec<String>,
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    fixed_variables: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    rate_limit_per_sec: Option<NonZeroU32>,
    /// Versions the token may run besides the current one, by endpoint. Absent from tokens issued before it
    /// existed, which therefore run the current version only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    versions: BTreeMap<String, Vec<u32>>,
}

/// What a verified run token lets its holder do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunGrant {
    pub token_id: Uuid,
    /// The endpoints it may run, by name.
    pub endpoints: Vec<String>,
    /// Variables set by the token, which a caller may not send.
    pub fixed_variables: Map<String, Value>,
    /// The token's own request rate, on top of the project's.
    pub rate_limit_per_sec: Option<NonZeroU32>,
    /// The versions it may name, by endpoint; every other run is of the endpoint's current version, so that a
    /// fixed query binds the tokens already issued.
    pub versions: BTreeMap<String, Vec<u32>>,
    pub expires_at: Timestamp,
}

impl RunGrant {
    pub fn allows(&self, endpoint: &str) -> bool {
        self.endpoints.iter().any(|name| name == endpoint)
    }

    /// Whether the token was issued to run `version` of `endpoint` by number.
    pub fn allows_version(&self, endpoint: &str, version: u32) -> bool {
        self.versions.get(endpoint).is_some_and(|versions| versions.contains(&version))
    }

    /// Refuses a version named by the holder (`?version=`) that the token was not issued for: its holder runs,
    /// and reads the document of, the current version only.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] naming the version.
    pub fn admit_version(&self, endpoint: &str, version: Option<u32>) -> Result<(), Error> {
        match version.filter(|version| !self.allows_version(endpoint, *version)) {
            None => Ok(()),
            Some(version) => Err(Error::PermissionDenied(format!(
                "This run token is for the current version of '{endpoint}', not version {version}: send no \
                 version, or use a token issued for it (\"versions\": {{\"{endpoint}\": [{version}]}})."
            ))),
        }
    }
}

/// A request for a run token, as its body says.
#[derive(Debug, Clone, PartialEq)]
pub struct RunTokenRequest {
    pub endpoints: Vec<String>,
    pub fixed_variables: Map<String, Value>,
    pub expires_in: Duration,
    pub rate_limit_per_sec: Option<NonZeroU32>,
    /// Versions the token may run by number (`?version=`), by endpoint; none unless named.
    pub versions: BTreeMap<String, Vec<u32>>,
}

impl RunTokenRequest {
    /// The most endpoints one token may name.
    pub const MAX_ENDPOINTS: usize = 100;
    /// The most variables one token may fix.
    pub const MAX_FIXED_VARIABLES: usize = 100;
    /// The longest life of a token: 30 days.
    pub const MAX_EXPIRES_IN_SECONDS: i64 = 30 * 24 * 3600;
    /// The life of a token whose request does not say: one hour.
    pub const DEFAULT_EXPIRES_IN_SECONDS: i64 = 3600;
    /// The most versions one token may name for one endpoint.
    pub const MAX_VERSIONS: usize = 100;
    const FIELDS: [&'static str; 5] =
        ["endpoints", "fixed_variables", "expires_in_seconds", "rate_limit_per_sec", "versions"];
}

/// A request as its body says.
impl TryFrom<&Value> for RunTokenRequest {
    type Error = Invalid;

    /// # Errors
    /// [`Invalid`] naming the field at fault. Whether the endpoints exist and declare the fixed variables is
    /// checked by the run service, which knows them.
    fn try_from(body: &Value) -> Result<Self, Invalid> {
        let fields = Fields::new(body, &RunTokenRequest::FIELDS)?;
        let endpoints = match fields.get("endpoints") {
            None | Some(Value::Null) => return Err(Invalid::required("endpoints")),
            Some(Value::Array(names)) => names
                .iter()
                .map(|name| name.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
                .filter(|names| (1..=RunTokenRequest::MAX_ENDPOINTS).contains(&names.len()))
                .ok_or_else(|| {
                    Invalid::field(
                        "endpoints",
                        format!(
                            "endpoints must be a list of 1 to {} endpoint names.",
                            RunTokenRequest::MAX_ENDPOINTS
                        ),
                    )
                })?,
            Some(_) => {
                return Err(Invalid::field("endpoints", "endpoints must be a list of endpoint names."))
            }
        };
        let mut endpoints = endpoints;
        endpoints.sort();
        endpoints.dedup();
        let fixed_variables = match fields.get("fixed_variables") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(map)) if map.len() <= RunTokenRequest::MAX_FIXED_VARIABLES => map.clone(),
            Some(_) => {
                return Err(Invalid::field(
                    "fixed_variables",
                    format!(
                        "fixed_variables must be an object of at most {} NAME: value pairs.",
                        RunTokenRequest::MAX_FIXED_VARIABLES
                    ),
                ))
            }
        };
        let seconds = match fields.get("expires_in_seconds") {
            None | Some(Value::Null) => RunTokenRequest::DEFAULT_EXPIRES_IN_SECONDS,
            Some(value) => integer(value)
                .filter(|n| (1..=RunTokenRequest::MAX_EXPIRES_IN_SECONDS).contains(n))
                .ok_or_else(|| {
                    Invalid::field(
                        "expires_in_seconds",
                        format!(
                            "expires_in_seconds must be an integer between 1 and {} (30 days).",
                            RunTokenRequest::MAX_EXPIRES_IN_SECONDS
                        ),
                    )
                })?,
        };
        let rate_limit_per_sec = match fields.get("rate_limit_per_sec") {
            None | Some(Value::Null) => None,
            Some(value) => Some(
                integer(value)
                    .and_then(|n| u32::try_from(n).ok())
                    .and_then(NonZeroU32::new)
                    .filter(|n| n.get() <= 1_000_000)
                    .ok_or_else(|| {
                        Invalid::field(
                            "rate_limit_per_sec",
                            "rate_limit_per_sec must be an integer between 1 and 1000000.",
                        )
                    })?,
            ),
        };
        let versions = match fields.get("versions") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(map)) => versions(map, &endpoints)?,
            Some(_) => return Err(Invalid::field("versions", VERSIONS_SHAPE)),
        };
        Ok(Self {
            endpoints,
            fixed_variables,
            expires_in: Duration::from_secs(seconds.unsigned_abs()),
            rate_limit_per_sec,
            versions,
        })
    }
}

const VERSIONS_SHAPE: &str = "versions must be an object of NAME: [version numbers] pairs.";

/// The `versions` of a token request: for endpoints it names, lists of positive version numbers.
fn versions(map: &Map<String, Value>, endpoints: &[String]) -> Result<BTreeMap<String, Vec<u32>>, Invalid> {
    let mut versions = BTreeMap::new();
    for (name, numbers) in map {
        let attr = format!("versions.{name}");
        if !endpoints.contains(name) {
            return Err(Invalid::field(
                attr,
                format!("'{name}' is not one of the endpoints the token names."),
            ));
        }
        let listed = numbers
            .as_array()
            .filter(|list| list.len() <= RunTokenRequest::MAX_VERSIONS)
            .and_then(|list| {
                list.iter()
                    .map(|n| integer(n).and_then(|n| VersionNumber::try_from(n).ok()).map(VersionNumber::get))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or_else(|| {
                Invalid::field(
                    attr,
                    format!("A list of at most {} positive version numbers.", RunTokenRequest::MAX_VERSIONS),
                )
            })?;
        let mut listed = listed;
        listed.sort_unstable();
        listed.dedup();
        versions.insert(name.clone(), listed);
    }
    Ok(versions)
}

/// A token just signed.
#[derive(Debug, Clone)]
pub struct IssuedRunToken {
    pub token: String,
    pub expires_at: Timestamp,
    pub grant: RunGrant,
}

/// Why a token was refused, in words for its holder (every refusal is a 401).
pub(crate) type Refusal = &'static str;

pub(crate) const NOT_VALID: Refusal = "The run token is not valid.";
pub(crate) const EXPIRED: Refusal = "The run token has expired.";

/// Whether a bearer credential has the shape of a JWT (three base64url parts), so that it is checked as a run
/// token rather than as a key.
pub(crate) fn looks_like_token(token: &str) -> bool {
    token.len() <= MAX_TOKEN_BYTES
        && token.split('.').count() == 3
        && token.split('.').all(|part| {
            !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The project a token says it belongs to (its header's `kid`), read before anything is trusted: only to pick
/// the secret that checks it.
pub(crate) fn claimed_project(token: &str) -> Result<ProjectId, Refusal> {
    let header = jsonwebtoken::decode_header(token).map_err(|_| NOT_VALID)?;
    if header.alg != Algorithm::HS256 {
        return Err(NOT_VALID);
    }
    header
        .kid
        .as_deref()
        .and_then(|kid| kid.parse::<i64>().ok())
        .and_then(|id| ProjectId::new(id).ok())
        .ok_or(NOT_VALID)
}

/// Signs a token for `project` with its secret.
pub(crate) fn sign(
    secret: &TokenSecret,
    project: ProjectId,
    issuer: Uuid,
    request: RunTokenRequest,
    now: Timestamp,
) -> Result<IssuedRunToken, jsonwebtoken::errors::Error> {
    let expires_at = now + request.expires_in;
    let claims = Claims {
        sub: issuer,
        jti: Uuid::new_v4(),
        pid: project.get(),
        iat: now.unix_timestamp(),
        exp: expires_at.unix_timestamp(),
        endpoints: request.endpoints,
        fixed_variables: request.fixed_variables,
        rate_limit_per_sec: request.rate_limit_per_sec,
        versions: request.versions,
    };
    let header = Header { kid: Some(project.to_string()), ..Header::new(Algorithm::HS256) };
    let token =
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret.expose().as_bytes()))?;
    // The expiry as signed: whole seconds.
    let expires_at = Timestamp::from_unix_timestamp(claims.exp).unwrap_or(expires_at);
    Ok(IssuedRunToken { token, expires_at, grant: grant(claims, expires_at) })
}

fn grant(claims: Claims, expires_at: Timestamp) -> RunGrant {
    RunGrant {
        token_id: claims.jti,
        endpoints: claims.endpoints,
        fixed_variables: claims.fixed_variables,
        rate_limit_per_sec: claims.rate_limit_per_sec,
        versions: claims.versions,
        expires_at,
    }
}

/// A token checked with its project's secret: its signature (HS256 only: `none` and every other algorithm are
/// refused), its project, its shape. Expiry is the caller's to check against its clock: the grant says when.
/// Returns the issuing key and the grant.
pub(crate) fn verify(
    token: &str,
    secret: &TokenSecret,
    project: ProjectId,
) -> Result<(Uuid, RunGrant), Refusal> {
    let mut validation = Validation::new(Algorithm::HS256);
    // Expiry is checked against the service's clock, exactly (no leeway); `exp` must be present all the same.
    validation.validate_exp = false;
    validation.leeway = 0;
    validation.set_required_spec_claims(&["exp", "sub"]);
    let data = jsonwebtoken::decode::<Claims>(
        token,
        &DecodingKey::from_secret(secret.expose().as_bytes()),
        &validation,
    )
    .map_err(|_| NOT_VALID)?;
    let claims = data.claims;
    if claims.pid != project.get() || data.header.kid.as_deref() != Some(project.to_string().as_str()) {
        return Err(NOT_VALID);
    }
    let expires_at = Timestamp::from_unix_timestamp(claims.exp).map_err(|_| NOT_VALID)?;
    if claims.endpoints.is_empty() {
        return Err(NOT_VALID);
    }
    Ok((claims.sub, grant(claims, expires_at)))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::T0;

    fn project(id: i64) -> ProjectId {
        ProjectId::new(id).unwrap()
    }

    fn request(body: Value) -> RunTokenRequest {
        RunTokenRequest::try_from(&body).unwrap()
    }

    fn issued(secret: &TokenSecret) -> IssuedRunToken {
        let body = json!({"endpoints": ["b", "a", "a"], "fixed_variables": {"customer_id": 7}, "rate_limit_per_sec": 5});
        sign(secret, project(3), Uuid::nil(), request(body), T0).unwrap()
    }

    #[test]
    fn a_signed_token_verifies_with_its_secret_and_carries_its_grant() {
        let secret = TokenSecret::generate();
        let issued = issued(&secret);
        assert!(looks_like_token(&issued.token), "{}", issued.token);
        assert_eq!(claimed_project(&issued.token), Ok(project(3)));
        let (issuer, grant) = verify(&issued.token, &secret, project(3)).unwrap();
        assert_eq!(issuer, Uuid::nil());
        assert_eq!(grant, issued.grant);
        assert_eq!(grant.endpoints, ["a", "b"], "sorted, without duplicates");
        assert_eq!(grant.fixed_variables["customer_id"], json!(7));
        assert_eq!(grant.rate_limit_per_sec, NonZeroU32::new(5));
        assert_eq!(grant.expires_at, T0 + Duration::from_secs(3600), "an hour unless asked");
        assert!(grant.allows("a") && !grant.allows("c"));
    }

    #[test]
    fn another_secret_another_project_or_a_changed_claim_is_refused() {
        let secret = TokenSecret::generate();
        let token = issued(&secret).token;
        assert_eq!(verify(&token, &TokenSecret::generate(), project(3)), Err(NOT_VALID), "a rotated secret");
        assert_eq!(verify(&token, &secret, project(4)), Err(NOT_VALID), "another project");

        // The claims changed (a wider customer) with the signature kept: refused.
        let parts: Vec<&str> = token.split('.').collect();
        let mut claims: Value = serde_json::from_slice(&base64_url(parts[1])).unwrap();
        claims["fixed_variables"]["customer_id"] = json!(8);
        let forged = format!("{}.{}.{}", parts[0], encode_url(&claims), parts[2]);
        assert_eq!(verify(&forged, &secret, project(3)), Err(NOT_VALID));

        // `alg: none`, with no signature or with the original one.
        let none = encode_url(&json!({"alg": "none", "typ": "JWT", "kid": "3"}));
        for token in [format!("{none}.{}.", parts[1]), format!("{none}.{}.{}", parts[1], parts[2])] {
            assert!(
                claimed_project(&token).is_err() || verify(&token, &secret, project(3)).is_err(),
                "{token}"
            );
            assert!(verify(&token, &secret, project(3)).is_err());
        }
        // HS512 with the same secret is still another algorithm.
        let header = Header { kid: Some("3".into()), ..Header::new(Algorithm::HS512) };
        let hs512 =
            jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret.expose().as_bytes()))
                .unwrap();
        assert_eq!(claimed_project(&hs512), Err(NOT_VALID));
        assert_eq!(verify(&hs512, &secret, project(3)), Err(NOT_VALID));
    }

    fn base64_url(part: &str) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part).unwrap()
    }

    fn encode_url(value: &Value) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap())
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        let bad = |body: Value, attr: &str| {
            let err = RunTokenRequest::try_from(&body).unwrap_err();
            assert_eq!(err.attr.as_deref(), Some(attr), "{body}: {err:?}");
        };
        bad(json!({}), "endpoints");
        bad(json!({"endpoints": []}), "endpoints");
        bad(json!({"endpoints": "a"}), "endpoints");
        bad(json!({"endpoints": [1]}), "endpoints");
        bad(json!({"endpoints": ["a"], "fixed_variables": [1]}), "fixed_variables");
        bad(json!({"endpoints": ["a"], "expires_in_seconds": 0}), "expires_in_seconds");
        bad(json!({"endpoints": ["a"], "expires_in_seconds": 2_592_001}), "expires_in_seconds");
        bad(json!({"endpoints": ["a"], "expires_in_seconds": "60"}), "expires_in_seconds");
        bad(json!({"endpoints": ["a"], "rate_limit_per_sec": 0}), "rate_limit_per_sec");
        bad(json!({"endpoints": ["a"], "scopes": ["endpoint:write"]}), "scopes");
        let ok = request(json!({"endpoints": ["a"], "expires_in_seconds": 2_592_000.0}));
        assert_eq!(ok.expires_in, Duration::from_secs(2_592_000));
    }

    #[test]
    fn only_three_base64url_parts_look_like_a_token() {
        for bad in ["", "a.b", "a.b.c.d", "a..c", "a.b.c=", "a.b.c d", "phx_00"] {
            assert!(!looks_like_token(bad), "{bad}");
        }
        assert!(!looks_like_token(&format!("a.{}.c", "b".repeat(MAX_TOKEN_BYTES))));
        assert!(looks_like_token("a.b.c"));
    }
}

/// Hostile input for the token parser: `make test` runs 256 cases each, `make fuzz` many more.
#[cfg(test)]
mod properties {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::testing::T0;

    fn signed(secret: &TokenSecret) -> String {
        let request =
            RunTokenRequest::try_from(&json!({"endpoints": ["a"], "fixed_variables": {"tenant": 7}}))
                .unwrap();
        sign(secret, ProjectId::new(3).unwrap(), Uuid::nil(), request, T0).unwrap().token
    }

    proptest! {
        #[test]
        fn any_credential_is_checked_without_panicking(raw in ".{0,300}", dotted in "[A-Za-z0-9_-]{0,40}\\.[A-Za-z0-9_-]{0,200}\\.[A-Za-z0-9_-]{0,60}") {
            let secret = TokenSecret::generate();
            for token in [raw.as_str(), dotted.as_str()] {
                let _ = looks_like_token(token);
                let _ = claimed_project(token);
                prop_assert!(verify(token, &secret, ProjectId::new(3).unwrap()).is_err());
            }
        }

        #[test]
        fn a_token_changed_anywhere_no_longer_verifies(at in any::<prop::sample::Index>(), with in "[A-Za-z0-9_.=-]", cut in any::<bool>()) {
            let secret = TokenSecret::generate();
            let token = signed(&secret);
            let at = at.index(token.len());
            let mut changed = token.clone();
            if cut {
                changed.remove(at);
            } else {
                changed.replace_range(at..=at, &with);
            }
            prop_assume!(changed != token);
            prop_assert!(verify(&changed, &secret, ProjectId::new(3).unwrap()).is_err(), "{changed}");
        }

        #[test]
        fn any_signed_claims_are_read_or_refused(claims in crate::properties::any_json(), kid in prop::option::of("[0-9a-z]{0,4}")) {
            // Claims an attacker could only sign with the secret: read as a grant when their shape is right,
            // refused otherwise, never a panic.
            let secret = TokenSecret::generate();
            let header = Header { kid, ..Header::new(Algorithm::HS256) };
            let token = jsonwebtoken::encode(&header, &claims, &EncodingKey::from_secret(secret.expose().as_bytes())).unwrap();
            if let Ok(project) = claimed_project(&token) {
                let _ = verify(&token, &secret, project);
            }
        }
    }
}
