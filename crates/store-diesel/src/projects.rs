//! `ProjectStore` on diesel.

use async_trait::async_trait;
use diesel::prelude::*;
use domain::{Change, Project, ProjectAccess, ProjectId, ProjectStore, StoreError, Timestamp, TokenSecret};
use tracing::instrument;

use crate::changes::announce;
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
    allowed_origins: String,
}

/// Origins are kept space-separated: an origin has no space.
fn origins(stored: &str) -> Vec<String> {
    stored.split_whitespace().map(str::to_owned).collect()
}

impl ProjectRow {
    fn into_domain(self) -> Result<Project, DbError> {
        Ok(Project {
            id: ProjectId::new(self.id).map_err(|e| DbError::Corrupt(e.detail))?,
            name: self.name,
            created_at: instant(self.created_at)?,
            allowed_origins: origins(&self.allowed_origins),
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

    #[instrument(skip(self))]
    async fn access(&self, id: ProjectId) -> Result<Option<ProjectAccess>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let row: Option<(Option<String>, String)> = projects::table
                    .find(id.get())
                    .select((projects::token_secret, projects::allowed_origins))
                    .first(conn)
                    .optional()?;
                Ok(row.map(|(secret, allowed)| ProjectAccess {
                    allowed_origins: origins(&allowed),
                    token_secret: secret.map(TokenSecret::from_stored),
                }))
            })
            .await?)
    }

    #[instrument(skip(self, secret))]
    async fn set_token_secret(
        &self,
        id: ProjectId,
        secret: TokenSecret,
        replace: bool,
    ) -> Result<TokenSecret, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let target = projects::table.find(id.get());
                    let written = if replace {
                        diesel::update(target)
                            .set(projects::token_secret.eq(secret.expose()))
                            .execute(conn)?
                    } else {
                        diesel::update(target.filter(projects::token_secret.is_null()))
                            .set(projects::token_secret.eq(secret.expose()))
                            .execute(conn)?
                    };
                    // The secret in force: this one, or the one another process wrote first.
                    let stored: Option<Option<String>> =
                        target.select(projects::token_secret).first(conn).optional()?;
                    let stored = stored.ok_or(DbError::NotFound)?.ok_or(DbError::NotFound)?;
                    if written > 0 && replace {
                        announce(conn, &Change::Project { project: id })?;
                    }
                    Ok(TokenSecret::from_stored(stored))
                })
            })
            .await?)
    }

    #[instrument(skip(self))]
    async fn set_allowed_origins(&self, id: ProjectId, origins: Vec<String>) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let written = diesel::update(projects::table.find(id.get()))
                        .set(projects::allowed_origins.eq(origins.join(" ")))
                        .execute(conn)?;
                    if written == 0 {
                        return Err(DbError::NotFound);
                    }
                    announce(conn, &Change::Project { project: id })
                })
            })
            .await?)
    }
}
