//! `ApiKeyStore` on diesel. Only the SHA-256 of a secret is ever written.

use async_trait::async_trait;
use diesel::prelude::*;
use domain::{ApiKey, ApiKeyStore, Change, ProjectId, Scope, StoreError, Timestamp};
use tracing::instrument;
use uuid::Uuid;

use crate::changes::announce;
use crate::error::DbError;
use crate::rows::{instant, micros, uuid};
use crate::schema::api_keys;
use crate::DieselStore;

#[derive(Queryable, Selectable, Insertable)]
#[diesel(table_name = api_keys)]
struct KeyRow {
    id: String,
    project_id: i64,
    label: String,
    /// Space-separated scope names.
    scopes: String,
    secret_hash: String,
    prefix: String,
    created_at: i64,
    expires_at: Option<i64>,
    revoked_at: Option<i64>,
    last_used_at: Option<i64>,
}

impl KeyRow {
    fn from_domain(key: &ApiKey) -> Self {
        Self {
            id: key.id.to_string(),
            project_id: key.project_id.get(),
            label: key.label.clone(),
            scopes: key.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(" "),
            secret_hash: key.secret_hash.clone(),
            prefix: key.prefix.clone(),
            created_at: micros(key.created_at),
            expires_at: key.expires_at.map(micros),
            revoked_at: key.revoked_at.map(micros),
            last_used_at: key.last_used_at.map(micros),
        }
    }

    fn into_domain(self) -> Result<ApiKey, DbError> {
        Ok(ApiKey {
            id: uuid(&self.id)?,
            project_id: ProjectId::new(self.project_id).map_err(|e| DbError::Corrupt(e.detail))?,
            label: self.label,
            scopes: self
                .scopes
                .split_whitespace()
                .map(Scope::parse)
                .collect::<Result<_, _>>()
                .map_err(|e| DbError::Corrupt(e.detail))?,
            secret_hash: self.secret_hash,
            prefix: self.prefix,
            created_at: instant(self.created_at)?,
            expires_at: self.expires_at.map(instant).transpose()?,
            revoked_at: self.revoked_at.map(instant).transpose()?,
            last_used_at: self.last_used_at.map(instant).transpose()?,
        })
    }
}

#[async_trait]
impl ApiKeyStore for DieselStore {
    #[instrument(skip_all, fields(project = %key.project_id))]
    async fn insert(&self, key: ApiKey) -> Result<ApiKey, StoreError> {
        let row = KeyRow::from_domain(&key);
        self.db.run(move |conn| Ok(diesel::insert_into(api_keys::table).values(&row).execute(conn)?)).await?;
        Ok(key)
    }

    #[instrument(skip_all)]
    async fn find_by_hash(&self, secret_hash: &str) -> Result<Option<ApiKey>, StoreError> {
        let hash = secret_hash.to_owned();
        Ok(self
            .db
            .run(move |conn| {
                api_keys::table
                    .filter(api_keys::secret_hash.eq(&hash))
                    .select(KeyRow::as_select())
                    .first(conn)
                    .optional()?
                    .map(KeyRow::into_domain)
                    .transpose()
            })
            .await?)
    }

    #[instrument(skip(self))]
    async fn list(&self, project: Option<ProjectId>) -> Result<Vec<ApiKey>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let mut query = api_keys::table.select(KeyRow::as_select()).into_boxed();
                if let Some(project) = project {
                    query = query.filter(api_keys::project_id.eq(project.get()));
                }
                let rows: Vec<KeyRow> =
                    query.order((api_keys::created_at.asc(), api_keys::id.asc())).load(conn)?;
                rows.into_iter().map(KeyRow::into_domain).collect()
            })
            .await?)
    }

    #[instrument(skip(self))]
    async fn revoke(&self, id: Uuid, at: Timestamp) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let id = id.to_string();
                conn.transaction(|conn| {
                    let exists =
                        api_keys::table.find(&id).select(api_keys::id).first::<String>(conn).optional()?;
                    if exists.is_none() {
                        return Err(DbError::NotFound);
                    }
                    diesel::update(api_keys::table.find(&id).filter(api_keys::revoked_at.is_null()))
                        .set(api_keys::revoked_at.eq(micros(at)))
                        .execute(conn)?;
                    announce(conn, &Change::Keys)
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(keys = used.len()))]
    async fn record_usage(&self, used: Vec<(Uuid, Timestamp)>) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    for (id, at) in &used {
                        let at = micros(*at);
                        // Never back: another process may have written a later use.
                        diesel::update(
                            api_keys::table
                                .find(id.to_string())
                                .filter(api_keys::last_used_at.is_null().or(api_keys::last_used_at.lt(at))),
                        )
                        .set(api_keys::last_used_at.eq(at))
                        .execute(conn)?;
                    }
                    Ok(())
                })
            })
            .await?)
    }
}
