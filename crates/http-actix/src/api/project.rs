//! A project, as any key of it reads it.

use domain::Project as DomainProject;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

/// A project: what its keys, endpoints and tables belong to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Project {
    /// The id paths name (`/api/projects/{id}/...`).
    pub id: i64,
    /// The name it was created with (`endpoints project create NAME`).
    pub name: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
}

impl From<DomainProject> for Project {
    fn from(project: DomainProject) -> Self {
        Self { id: project.id.get(), name: project.name, created_at: project.created_at }
    }
}
