//! `TableLeases` and `AppendKeys` on diesel.
//!
//! A lease is one row per leased table: a claim takes an expired (or its own) lease by a conditional update, or
//! a free one by an insert that the primary key lets only one claimer make. An append key is one row per
//! project, table and key, pending (no answer) or answered; every change to it is conditional on the write id
//! it expects, so two appends racing for one key never both write.

use async_trait::async_trait;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use domain::{
    AppendKeyState, AppendKeys, IdempotencyKey, ProjectId, StoreError, TableLeases, TableName, Timestamp,
    Written,
};
use serde::{Deserialize, Serialize};
use tracing::instrument;
use uuid::Uuid;

use crate::connection::AnyConnection;
use crate::error::DbError;
use crate::rows::{instant, micros, uuid};
use crate::schema::{append_keys, table_leases};
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

#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = append_keys)]
struct KeyRow {
    body_sha256: String,
    write_id: String,
    answer: Option<String>,
    created_at: i64,
    updated_at: i64,
    writer: Option<String>,
}

/// An append's answer as a key's row keeps it.
#[derive(Serialize, Deserialize)]
struct Answer {
    rows: u64,
    bytes: u64,
    #[serde(default)]
    quarantined: u64,
}

impl KeyRow {
    /// The key's state as `node`, this process, reads it.
    fn state(self, conn: &mut AnyConnection, node: &str) -> Result<AppendKeyState, DbError> {
        match self.answer {
            Some(text) => {
                let answer: Answer = serde_json::from_str(&text)
                    .map_err(|e| DbError::Corrupt(format!("append key answer {text}: {e}")))?;
                Ok(AppendKeyState::Answered {
                    body_sha256: self.body_sha256,
                    written: Written {
                        rows: answer.rows,
                        bytes: answer.bytes,
                        created: false,
                        rows_quarantined: answer.quarantined,
                    },
                })
            }
            None => Ok(AppendKeyState::Pending {
                write_id: uuid(&self.write_id)?,
                since: instant(self.updated_at)?,
                writer_gone: match self.writer.as_deref() {
                    // Claimed before writers were recorded, or by this process, which is writing it now.
                    None => false,
                    Some(writer) if writer == node => false,
                    Some(writer) => gone(conn, writer)?,
                },
            }),
        }
    }
}

/// Whether the process `writer` is known to have stopped: with SQLite, which one process serves, any process but
/// this one; with PostgreSQL, one whose heartbeat stopped ([`crate::changes::stopped`]).
fn gone(conn: &mut AnyConnection, writer: &str) -> Result<bool, DbError> {
    match conn {
        AnyConnection::Sqlite(_) => Ok(true),
        AnyConnection::Postgresql(conn) => Ok(crate::changes::stopped(conn, writer)?),
    }
}

/// The row of one key, as a filter.
macro_rules! key_row {
    ($project:expr, $table:expr, $key:expr) => {
        append_keys::table
            .filter(append_keys::project_id.eq($project))
            .filter(append_keys::table_name.eq($table))
            .filter(append_keys::idempotency_key.eq($key))
    };
}

/// How many times a claim reads a key again after losing a race for it.
const CLAIM_ATTEMPTS: usize = 3;

#[async_trait]
impl AppendKeys for DieselStore {
    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn claim(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
        now: Timestamp,
        expired: Timestamp,
    ) -> Result<AppendKeyState, StoreError> {
        let (project, table, key) = (project.get(), table.as_str().to_owned(), key.as_str().to_owned());
        let (write_id, now, expired) = (write_id.to_string(), micros(now), micros(expired));
        let node = self.db.node().to_owned();
        Ok(self
            .db
            .run(move |conn| {
                for _ in 0..CLAIM_ATTEMPTS {
                    let found: Option<KeyRow> =
                        key_row!(project, &table, &key).select(KeyRow::as_select()).first(conn).optional()?;
                    match found {
                        Some(row) if row.created_at >= expired => return row.state(conn, &node),
                        // Past its window: the key is new again, if nobody renews it first.
                        Some(row) => {
                            let renewed = diesel::update(
                                key_row!(project, &table, &key)
                                    .filter(append_keys::write_id.eq(&row.write_id))
                                    .filter(append_keys::created_at.eq(row.created_at)),
                            )
                            .set((
                                append_keys::write_id.eq(&write_id),
                                append_keys::body_sha256.eq(""),
                                append_keys::answer.eq(None::<String>),
                                append_keys::created_at.eq(now),
                                append_keys::updated_at.eq(now),
                                append_keys::writer.eq(&node),
                            ))
                            .execute(conn)?;
                            if renewed == 1 {
                                return Ok(AppendKeyState::Claimed);
                            }
                        }
                        None => {
                            let inserted = diesel::insert_into(append_keys::table)
                                .values((
                                    append_keys::project_id.eq(project),
                                    append_keys::table_name.eq(&table),
                                    append_keys::idempotency_key.eq(&key),
                                    append_keys::body_sha256.eq(""),
                                    append_keys::write_id.eq(&write_id),
                                    append_keys::created_at.eq(now),
                                    append_keys::updated_at.eq(now),
                                    append_keys::writer.eq(&node),
                                ))
                                .execute(conn);
                            match inserted {
                                Ok(_) => return Ok(AppendKeyState::Claimed),
                                // Another append claimed it first: read what it made.
                                Err(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {}
                                Err(err) => return Err(err.into()),
                            }
                        }
                    }
                }
                Err(DbError::Corrupt(format!(
                    "append key {key} changed {CLAIM_ATTEMPTS} times while claimed"
                )))
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn take_over(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        from: Uuid,
        write_id: Uuid,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let (project, table, key) = (project.get(), table.as_str().to_owned(), key.as_str().to_owned());
        let (from, write_id, now) = (from.to_string(), write_id.to_string(), micros(now));
        let node = self.db.node().to_owned();
        Ok(self
            .db
            .run(move |conn| {
                let taken = diesel::update(
                    key_row!(project, &table, &key)
                        .filter(append_keys::write_id.eq(&from))
                        .filter(append_keys::answer.is_null()),
                )
                .set((
                    append_keys::write_id.eq(&write_id),
                    append_keys::updated_at.eq(now),
                    append_keys::writer.eq(&node),
                ))
                .execute(conn)?;
                Ok(taken == 1)
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn answer(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
        body_sha256: &str,
        written: Written,
    ) -> Result<(), StoreError> {
        let (project, table, key) = (project.get(), table.as_str().to_owned(), key.as_str().to_owned());
        let (write_id, sha) = (write_id.to_string(), body_sha256.to_owned());
        let answer = serde_json::to_string(&Answer {
            rows: written.rows,
            bytes: written.bytes,
            quarantined: written.rows_quarantined,
        })
        .map_err(|e| StoreError::Internal(Box::new(e)))?;
        self.db
            .run(move |conn| {
                diesel::update(key_row!(project, &table, &key).filter(append_keys::write_id.eq(&write_id)))
                    .set((append_keys::answer.eq(Some(answer)), append_keys::body_sha256.eq(sha)))
                    .execute(conn)?;
                Ok(())
            })
            .await?;
        Ok(())
    }

    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn forget(
        &self,
        project: ProjectId,
        table: &TableName,
        key: &IdempotencyKey,
        write_id: Uuid,
    ) -> Result<(), StoreError> {
        let (project, table, key) = (project.get(), table.as_str().to_owned(), key.as_str().to_owned());
        let write_id = write_id.to_string();
        self.db
            .run(move |conn| {
                diesel::delete(
                    key_row!(project, &table, &key)
                        .filter(append_keys::write_id.eq(&write_id))
                        .filter(append_keys::answer.is_null()),
                )
                .execute(conn)?;
                Ok(())
            })
            .await?;
        Ok(())
    }

    #[instrument(skip_all, fields(project = %project, table = %table))]
    async fn pending(&self, project: ProjectId, table: &TableName) -> Result<Vec<Uuid>, StoreError> {
        let (project, table) = (project.get(), table.as_str().to_owned());
        Ok(self
            .db
            .run(move |conn| {
                let ids: Vec<String> = append_keys::table
                    .filter(append_keys::project_id.eq(project))
                    .filter(append_keys::table_name.eq(&table))
                    .filter(append_keys::answer.is_null())
                    .select(append_keys::write_id)
                    .load(conn)?;
                ids.iter().map(|id| uuid(id)).collect()
            })
            .await?)
    }

    #[instrument(skip_all)]
    async fn sweep(&self, expired: Timestamp) -> Result<u64, StoreError> {
        let expired = micros(expired);
        Ok(self
            .db
            .run(move |conn| {
                let removed = diesel::delete(append_keys::table.filter(append_keys::created_at.lt(expired)))
                    .execute(conn)?;
                Ok(removed as u64)
            })
            .await?)
    }
}
