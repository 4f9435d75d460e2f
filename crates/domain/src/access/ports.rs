//! What the key service needs from a store: projects and keys.

use async_trait::async_trait;
use uuid::Uuid;

use super::model::{ApiKey, Project, ProjectId};
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
}
