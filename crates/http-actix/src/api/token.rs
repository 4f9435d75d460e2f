//! The answer of `POST run_tokens`: the token, once.

use domain::IssuedRunToken;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

/// A run token just signed. It is not kept by the service: keep it, or issue another.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunToken {
    /// An HS256 JWT, sent as `Authorization: Bearer <token>`.
    pub token: String,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

impl From<IssuedRunToken> for RunToken {
    fn from(issued: IssuedRunToken) -> Self {
        Self { token: issued.token, expires_at: issued.expires_at }
    }
}
