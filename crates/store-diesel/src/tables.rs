//! `TableLeases` on diesel: one row per leased table. A claim takes an expired (or its own) lease by a
//! conditional update, or a free one by an insert that the primary key lets only one claimer make.

use async_trait::async_trait;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use domain::{ProjectId, StoreError, TableLeases, TableName, Timestamp};
use tracing::instrument;
use uuid::Uuid;

use crate::error::DbError;
use crate::rows::micros;
use crate::schema::table_leases;
use crate::DieselStore;

#[async_trait]
impl TableLeases for DieselStore {
    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn claim(
        &self,
        project: ProjectId,
        table: &TableName,
        holder: Uuid,
        now: Timestamp,
        until: Timestamp,
    ) -> Result<bool, StoreError> {
        let (project, table, holder) = (project.get(), table.as_str().to_owned(), holder.to_string());
        let (now, until) = (micros(now), micros(until));
        Ok(self
            .db
            .run(move |conn| {
                let taken = diesel::update(
                    table_leases::table
                        .filter(table_leases::project_id.eq(project))
                        .filter(table_leases::table_name.eq(&table))
                        .filter(table_leases::expires_at.le(now).or(table_leases::holder.eq(&holder))),
                )
                .set((table_leases::holder.eq(&holder), table_leases::expires_at.eq(until)))
                .execute(conn)?;
                if taken == 1 {
                    return Ok(true);
                }
                let inserted = diesel::insert_into(table_leases::table)
                    .values((
                        table_leases::project_id.eq(project),
                        table_leases::table_name.eq(&table),
                        table_leases::holder.eq(&holder),
                        table_leases::expires_at.eq(until),
                    ))
                    .execute(conn);
                match inserted {
                    Ok(_) => Ok(true),
                    // Held by another holder, whose lease runs on.
                    Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
                    Err(err) => Err(DbError::from(err)),
                }
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn release(&self, project: ProjectId, table: &TableName, holder: Uuid) -> Result<(), StoreError> {
        let (project, table, holder) = (project.get(), table.as_str().to_owned(), holder.to_string());
        self.db
            .run(move |conn| {
                diesel::delete(
                    table_leases::table
                        .filter(table_leases::project_id.eq(project))
                        .filter(table_leases::table_name.eq(&table))
                        .filter(table_leases::holder.eq(&holder)),
                )
                .execute(conn)?;
                Ok(())
            })
            .await?;
        Ok(())
    }
}
