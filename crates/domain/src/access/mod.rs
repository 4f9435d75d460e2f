//! Access: projects, API keys and their scopes. Who may call what, on which project.

mod model;
mod ports;
mod service;
mod token;

pub use model::{
    hash_secret, parse_origin, ApiKey, NewApiKey, Principal, Project, ProjectAccess, ProjectId, ProjectRef,
    Scope, CURRENT_PROJECT, KEY_PREFIX,
};
pub use ports::{ApiKeyStore, ProjectStore};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockApiKeyStore, MockProjectStore};
pub use service::ApiKeyService;
pub use token::{IssuedRunToken, RunGrant, RunTokenRequest, TokenSecret};
