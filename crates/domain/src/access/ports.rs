//! What the key service needs from a store: projects and keys.

use async_trait::async_trait;
use uuid::Uuid;

use super::model::{ApiKey, Project, ProjectAccess, ProjectId};
use super::token::TokenSecret;
use crate::clock::Timestamp;
use crate::error::StoreError;

/// Projects, managed by the operator.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ProjectStore: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn create(&self, name: String, at: Timestamp) -> Result<Project, StoreError>;

    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn get(&self, id: ProjectId) -> Result<Option<Project>, StoreError>;

    /// All projects by id.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn list(&self) -> Result<Vec<Project>, StoreError>;

    /// What checking run tokens and browsers' origins needs of a project; `None` for no such project.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn access(&self, id: ProjectId) -> Result<Option<ProjectAccess>, StoreError>;

    /// Sets the project's token secret and returns the one in force: `secret` when `replace` is true or the
    /// project had none, else the one it had (so that processes issuing a project's first tokens at once agree
    /// on one). A replacement is announced to every process: tokens signed with the old secret stop working.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn set_token_secret(
        &self,
        id: ProjectId,
        secret: TokenSecret,
        replace: bool,
    ) -> Result<TokenSecret, StoreError>;

    /// Replaces the project's allowed origins, and announces it to every process.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn set_allowed_origins(&self, id: ProjectId, origins: Vec<String>) -> Result<(), StoreError>;
}

/// API keys, looked up by the hash of their secret.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait ApiKeyStore: Send + Sync {
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn insert(&self, key: ApiKey) -> Result<ApiKey, StoreError>;

    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn find_by_hash(&self, secret_hash: &str) -> Result<Option<ApiKey>, StoreError>;

    /// Keys of one project, or of all, oldest first.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn list(&self, project: Option<ProjectId>) -> Result<Vec<ApiKey>, StoreError>;

    /// Marks a key revoked from `at` on. Revoking a revoked key keeps its first revocation time.
    ///
    /// # Errors
    /// [`StoreError::NotFound`]; `Unavailable`, `Internal`.
    async fn revoke(&self, id: Uuid, at: Timestamp) -> Result<(), StoreError>;

    /// Records when keys were last used, in one batch; a time never moves a stored one back.
    ///
    /// # Errors
    /// `Unavailable`, `Internal`.
    async fn record_usage(&self, used: Vec<(Uuid, Timestamp)>) -> Result<(), StoreError>;
}
