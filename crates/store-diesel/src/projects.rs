//! `ProjectStore` on diesel.

use async_trait::async_trait;
use diesel::prelude::*;
use domain::{Project, ProjectId, ProjectStore, StoreError, Timestamp};
use tracing::instrument;

use crate::error::DbError;
use crate::rows::{instant, micros};
use crate::schema::projects;
use crate::DieselStore;

#[derive(Queryable, Selectable)]
#[diesel(table_name = projects)]
struct ProjectRow {
    id: i64,
    name: String,
    created_at: i64,
}

impl ProjectRow {
    fn into_domain(self) -> Result<Project, DbError> {
        Ok(Project {
            id: ProjectId::new(self.id).map_err(|e| DbError::Corrupt(e.detail))?,
            name: self.name,
            created_at: instant(self.created_at)?,
        })
    }
}

#[async_trait]
impl ProjectStore for DieselStore {
    #[instrument(skip(self))]
    async fn create(&self, name: String, at: Timestamp) -> Result<Project, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let created_at = micros(at);
                conn.transaction(|conn| {
                    diesel::insert_into(projects::table)
                        .values((projects::name.eq(&name), projects::created_at.eq(created_at)))
                        .execute(conn)?;
                    // RETURNING is not available through the two-backend connection; name and creation instant
                    // identify the row just written (the newest one if an operator made twins in one microsecond).
                    let row: ProjectRow = projects::table
                        .filter(projects::name.eq(&name))
                        .filter(projects::created_at.eq(created_at))
                        .order(projects::id.desc())
                        .select(ProjectRow::as_select())
                        .first(conn)?;
                    row.into_domain()
                })
            })
            .await?)
    }

    #[instrument(skip(self))]
    async fn get(&self, id: ProjectId) -> Result<Option<Project>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                projects::table
                    .find(id.get())
                    .select(ProjectRow::as_select())
                    .first(conn)
                    .optional()?
                    .map(ProjectRow::into_domain)
                    .transpose()
            })
            .await?)
    }

    #[instrument(skip(self))]
    async fn list(&self) -> Result<Vec<Project>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let rows: Vec<ProjectRow> =
                    projects::table.order(projects::id.asc()).select(ProjectRow::as_select()).load(conn)?;
                rows.into_iter().map(ProjectRow::into_domain).collect()
            })
            .await?)
    }
}
