//! Access: projects, API keys and their scopes. Who may call what, on which project.

mod model;
mod ports;
mod service;

pub use model::{
    hash_secret, ApiKey, NewApiKey, Principal, Project, ProjectId, Scope, CURRENT_PROJECT, KEY_PREFIX,
};
pub use ports::{ApiKeyStore, ProjectStore};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockApiKeyStore, MockProjectStore};
pub use service::ApiKeyService;
