//! `MaterializationRecords` on diesel: one record per materialized endpoint, claimed by compare-and-set on its
//! `revision`, so that of several workers (in one process or many sharing the database) exactly one wins each
//! claim.

use async_trait::async_trait;
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use domain::{
    attempt_location, Change, Claim, Coverage, EndpointName, Fold, Freshness, Hibernation,
    MaterializationRecords, MaterializationState, MaterializationStatus, ProjectId, StoreError, StoredResult,
    Switch, SyncFrequency, Timestamp,
};
use tracing::instrument;
use uuid::Uuid;

use crate::changes::announce;
use crate::connection::AnyConnection;
use crate::error::DbError;
use crate::rows::{self, instant, micros, uuid, version_number};
use crate::schema::{endpoint_versions, endpoints, materializations};
use crate::DieselStore;

#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = materializations)]
struct MaterializationRow {
    endpoint_id: String,
    version: i64,
    status: String,
    next_run_at: i64,
    error: Option<String>,
    result_version: Option<i64>,
    result_location: Option<String>,
    result_row_count: Option<i64>,
    result_at: Option<i64>,
    lease_token: Option<String>,
    lease_expires_at: Option<i64>,
    revision: i64,
    appended_since: Option<i64>,
    result_data_as_of: Option<i64>,
    full_refreshes: i64,
    result_coverage: Option<String>,
    last_folded_at: Option<i64>,
    rows_folded: i64,
    result_fold: Option<String>,
    result_fold_reason: Option<String>,
}

impl MaterializationRow {
    fn into_domain(self) -> Result<MaterializationState, DbError> {
        let result = match (self.result_version, self.result_location, self.result_row_count, self.result_at)
        {
            (Some(version), Some(location), Some(rows), Some(at)) => Some(StoredResult {
                version: version_number(version)?,
                location,
                row_count: u64::try_from(rows).unwrap_or(0),
                materialized_at: instant(at)?,
                data_as_of: instant(self.result_data_as_of.unwrap_or(at))?,
                coverage: self.result_coverage.map(Coverage),
                // A kind this release does not read (a later release's, on a node not yet upgraded) is not known,
                // as for a result of an earlier release, rather than a record that claims and runs cannot read.
                fold: self.result_fold.and_then(|fold| Fold::parse(&fold, self.result_fold_reason)),
            }),
            _ => None,
        };
        let lease = match (self.lease_token, self.lease_expires_at) {
            (Some(token), Some(until)) => Some((uuid(&token)?, instant(until)?)),
            _ => None,
        };
        Ok(MaterializationState {
            endpoint_id: uuid(&self.endpoint_id)?,
            version: version_number(self.version)?,
            status: MaterializationStatus::parse(&self.status)
                .map_err(|s| DbError::Corrupt(format!("materialization status {s}")))?,
            next_run_at: instant(self.next_run_at)?,
            error: self.error,
            result,
            lease,
            appended_since: self.appended_since.map(instant).transpose()?,
            full_refreshes: u64::try_from(self.full_refreshes).unwrap_or(0),
            last_folded_at: self.last_folded_at.map(instant).transpose()?,
            rows_folded: u64::try_from(self.rows_folded).unwrap_or(0),
        })
    }
}

diesel::define_sql_function!(fn coalesce(x: diesel::sql_types::Nullable<diesel::sql_types::BigInt>, y: diesel::sql_types::BigInt) -> diesel::sql_types::BigInt);

/// A due refresh as read before claiming it: the endpoint, and its record (every `record_` field `None` when it
/// has none yet). The fields are in the order `due` selects them.
#[derive(Debug, Queryable)]
struct Candidate {
    id: String,
    project_id: i64,
    name: String,
    current_version: i64,
    sync_frequency: Option<String>,
    freshness_seconds: Option<i64>,
    record_revision: Option<i64>,
    record_version: Option<i64>,
    record_lease_token: Option<String>,
    record_next_run_at: Option<i64>,
}

/// A day in the stored unit of time.
const DAY_MICROS: i64 = 86_400 * 1_000_000;

fn due(conn: &mut AnyConnection, now: i64, max: usize) -> Result<Vec<Candidate>, DbError> {
    let running = MaterializationStatus::Running.as_str();
    let failed = MaterializationStatus::Failed.as_str();
    // When pending appends make a refresh due: `freshness_seconds` after the first of them.
    let fresh_by = materializations::appended_since.nullable()
        + (coalesce(endpoints::freshness_seconds, i64::from(Freshness::DEFAULT_SECONDS)) * 1_000_000_i64)
            .nullable();
    // Awake (see `Endpoint::hibernates_at`): it never hibernates (0), or it ran or changed within its days.
    let days = coalesce(endpoints::hibernate_after_days, i64::from(Hibernation::DEFAULT_DAYS));
    let awake_for = days * DAY_MICROS;
    let awake = days
        .eq(0)
        .or((endpoints::updated_at + awake_for).gt(now))
        .or((endpoints::last_executed_at + awake_for.nullable()).gt(now));
    Ok(endpoints::table
        .left_join(materializations::table.on(materializations::endpoint_id.eq(endpoints::id)))
        .filter(endpoints::is_materialized.eq(true))
        .filter(endpoints::is_active.eq(true))
        .filter(awake)
        .filter(
            materializations::endpoint_id
                .nullable()
                .is_null()
                .or(materializations::version.nullable().ne(endpoints::current_version.nullable()))
                .or(materializations::status
                    .nullable()
                    .ne(running)
                    .and(materializations::next_run_at.nullable().le(now)))
                .or(materializations::status
                    .nullable()
                    .eq(running)
                    .and(materializations::lease_expires_at.le(now)))
                // Appends waiting past their freshness; a failed refresh still waits for its retry.
                .or(materializations::status.nullable().ne(running).and(fresh_by.le(now)).and(
                    materializations::status
                        .nullable()
                        .ne(failed)
                        .or(materializations::next_run_at.nullable().le(now)),
                )),
        )
        // Oldest due first; an endpoint without a record (NULL) is due since it was turned on, so it goes first.
        .order(coalesce(materializations::next_run_at.nullable(), 0_i64).asc())
        .limit(i64::try_from(max).unwrap_or(i64::MAX))
        .select((
            endpoints::id,
            endpoints::project_id,
            endpoints::name,
            endpoints::current_version,
            endpoints::sync_frequency,
            endpoints::freshness_seconds,
            materializations::revision.nullable(),
            materializations::version.nullable(),
            materializations::lease_token.nullable(),
            materializations::next_run_at.nullable(),
        ))
        .load(conn)?)
}

/// Claims one candidate: inserts its first record, or moves its record on from the revision read. `false` when
/// another worker got there first.
fn claim_one(
    conn: &mut AnyConnection,
    candidate: &Candidate,
    token: Uuid,
    now: i64,
    lease_until: i64,
) -> Result<bool, DbError> {
    let (id, version) = (&candidate.id, candidate.current_version);
    let running = MaterializationStatus::Running.as_str();
    match candidate.record_revision {
        None => {
            let row = MaterializationRow {
                endpoint_id: id.clone(),
                version,
                status: running.to_owned(),
                next_run_at: now,
                error: None,
                result_version: None,
                result_location: None,
                result_row_count: None,
                result_at: None,
                lease_token: Some(token.to_string()),
                lease_expires_at: Some(lease_until),
                revision: 1,
                appended_since: None,
                result_data_as_of: None,
                full_refreshes: 0,
                result_coverage: None,
                last_folded_at: None,
                rows_folded: 0,
                result_fold: None,
                result_fold_reason: None,
            };
            match diesel::insert_into(materializations::table).values(&row).execute(conn) {
                Ok(n) => Ok(n == 1),
                // Another process claimed it first, or the endpoint was deleted since it was found due: a lost
                // race either way.
                Err(DieselError::DatabaseError(
                    DatabaseErrorKind::UniqueViolation | DatabaseErrorKind::ForeignKeyViolation,
                    _,
                )) => Ok(false),
                Err(other) => Err(other.into()),
            }
        }
        Some(revision) => {
            let claimed = diesel::update(materializations::table.find(id))
                .filter(materializations::revision.eq(revision))
                .set((
                    materializations::version.eq(version),
                    materializations::status.eq(running),
                    materializations::lease_token.eq(Some(token.to_string())),
                    materializations::lease_expires_at.eq(Some(lease_until)),
                    materializations::revision.eq(revision + 1),
                    // The refresh reads the tables after this: it includes every append recorded before it.
                    materializations::appended_since.eq(None::<i64>),
                ))
                .execute(conn)?;
            Ok(claimed == 1)
        }
    }
}

/// The claim of a candidate just claimed, with what its refresh reads: the claimed version's query and the
/// record's result (which no other worker switches while the claim holds). `None` when the endpoint was deleted
/// since it was found due (its record goes with it).
fn into_claim(conn: &mut AnyConnection, candidate: Candidate, token: Uuid) -> Result<Option<Claim>, DbError> {
    let Some((query, eligibility)) = endpoint_versions::table
        .find((&candidate.id, candidate.current_version))
        .select((endpoint_versions::query, endpoint_versions::eligibility))
        .first::<(String, Option<String>)>(conn)
        .optional()?
    else {
        return Ok(None);
    };
    let current = match candidate.record_revision {
        Some(_) => materializations::table
            .find(&candidate.id)
            .select(MaterializationRow::as_select())
            .first(conn)
            .optional()?
            .map(MaterializationRow::into_domain)
            .transpose()?
            .and_then(|record| record.result),
        None => None,
    };
    let id = uuid(&candidate.id)?;
    let abandoned = match (candidate.record_version, candidate.record_lease_token) {
        (Some(v), Some(t)) => Some(attempt_location(id, version_number(v)?, uuid(&t)?)),
        _ => None,
    };
    Ok(Some(Claim {
        endpoint_id: id,
        project: ProjectId::new(candidate.project_id).map_err(|e| DbError::Corrupt(e.detail))?,
        name: EndpointName::parse(&candidate.name).map_err(|e| DbError::Corrupt(e.detail))?,
        version: version_number(candidate.current_version)?,
        sync_frequency: candidate
            .sync_frequency
            .as_deref()
            .map(SyncFrequency::parse)
            .transpose()
            .map_err(|e| DbError::Corrupt(e.detail))?
            .unwrap_or(SyncFrequency::DEFAULT),
        freshness: Freshness::new(candidate.freshness_seconds).map_err(|e| DbError::Corrupt(e.detail))?,
        token,
        abandoned,
        due_at: candidate.record_next_run_at.map(instant).transpose()?,
        query: rows::query(&query)?,
        eligibility: rows::eligibility(eligibility.as_deref())?,
        current,
    }))
}

#[async_trait]
impl MaterializationRecords for DieselStore {
    #[instrument(skip_all, fields(endpoint = %endpoint_id))]
    async fn get(&self, endpoint_id: Uuid) -> Result<Option<MaterializationState>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                materializations::table
                    .find(endpoint_id.to_string())
                    .select(MaterializationRow::as_select())
                    .first(conn)
                    .optional()?
                    .map(MaterializationRow::into_domain)
                    .transpose()
            })
            .await?)
    }

    #[instrument(skip_all, fields(count = endpoint_ids.len()))]
    async fn get_many(&self, endpoint_ids: Vec<Uuid>) -> Result<Vec<MaterializationState>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let ids: Vec<String> = endpoint_ids.iter().map(Uuid::to_string).collect();
                materializations::table
                    .filter(materializations::endpoint_id.eq_any(&ids))
                    .select(MaterializationRow::as_select())
                    .load(conn)?
                    .into_iter()
                    .map(MaterializationRow::into_domain)
                    .collect()
            })
            .await?)
    }

    #[instrument(skip_all, fields(max))]
    async fn claim_due(
        &self,
        now: Timestamp,
        lease_until: Timestamp,
        max: usize,
    ) -> Result<Vec<Claim>, StoreError> {
        let (now, lease_until) = (micros(now), micros(lease_until));
        Ok(self
            .db
            .run(move |conn| {
                let mut claims = Vec::new();
                // Each claim is its own statement: a lost race costs one row, not the batch.
                for candidate in due(conn, now, max)? {
                    let token = Uuid::new_v4();
                    if claim_one(conn, &candidate, token, now, lease_until)? {
                        claims.extend(into_claim(conn, candidate, token)?);
                    }
                }
                Ok(claims)
            })
            .await?)
    }

    #[instrument(skip_all, fields(endpoint = %endpoint_id))]
    async fn renew(&self, endpoint_id: Uuid, token: Uuid, until: Timestamp) -> Result<bool, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let renewed = diesel::update(materializations::table.find(endpoint_id.to_string()))
                    .filter(materializations::lease_token.eq(token.to_string()))
                    .filter(materializations::status.eq(MaterializationStatus::Running.as_str()))
                    .set((
                        materializations::lease_expires_at.eq(Some(micros(until))),
                        materializations::revision.eq(materializations::revision + 1),
                    ))
                    .execute(conn)?;
                Ok(renewed == 1)
            })
            .await?)
    }

    #[instrument(skip_all, fields(endpoint = %endpoint_id))]
    async fn complete(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        result: StoredResult,
        next_run_at: Timestamp,
        folded: Option<u64>,
    ) -> Result<Switch, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let id = endpoint_id.to_string();
                    // The write comes first: it takes the row lock before the replaced location is read.
                    let switched = diesel::update(materializations::table.find(&id))
                        .filter(materializations::lease_token.eq(token.to_string()))
                        .set(materializations::revision.eq(materializations::revision + 1))
                        .execute(conn)?;
                    if switched == 0 {
                        return Ok(Switch::Lost);
                    }
                    let replaced: Option<String> = materializations::table
                        .find(&id)
                        .select(materializations::result_location)
                        .first(conn)?;
                    diesel::update(materializations::table.find(&id))
                        .set((
                            materializations::status.eq(MaterializationStatus::Completed.as_str()),
                            materializations::error.eq(None::<String>),
                            materializations::result_version.eq(Some(i64::from(result.version))),
                            materializations::result_location.eq(Some(result.location.clone())),
                            materializations::result_row_count
                                .eq(Some(i64::try_from(result.row_count).unwrap_or(i64::MAX))),
                            materializations::result_at.eq(Some(micros(result.materialized_at))),
                            materializations::result_data_as_of.eq(Some(micros(result.data_as_of))),
                            materializations::result_coverage
                                .eq(result.coverage.as_ref().map(|c| c.0.clone())),
                            materializations::result_fold.eq(result.fold.as_ref().map(Fold::as_str)),
                            materializations::result_fold_reason
                                .eq(result.fold.as_ref().and_then(Fold::reason)),
                            materializations::next_run_at.eq(micros(next_run_at)),
                            materializations::lease_token.eq(None::<String>),
                            materializations::lease_expires_at.eq(None::<i64>),
                        ))
                        .execute(conn)?;
                    let counted = diesel::update(materializations::table.find(&id));
                    match folded {
                        Some(rows) => counted
                            .set((
                                materializations::last_folded_at.eq(Some(micros(result.materialized_at))),
                                materializations::rows_folded
                                    .eq(materializations::rows_folded
                                        + i64::try_from(rows).unwrap_or(i64::MAX)),
                            ))
                            .execute(conn)?,
                        None => counted
                            .set(materializations::full_refreshes.eq(materializations::full_refreshes + 1))
                            .execute(conn)?,
                    };

                    // Told as the switch commits: other processes drop runs cached from the result before.
                    if matches!(conn, AnyConnection::Postgresql(_)) {
                        let (project, name): (i64, String) = endpoints::table
                            .find(&id)
                            .select((endpoints::project_id, endpoints::name))
                            .first(conn)?;
                        let project = ProjectId::new(project).map_err(|e| DbError::Corrupt(e.detail))?;
                        let name = EndpointName::parse(&name).map_err(|e| DbError::Corrupt(e.detail))?;
                        announce(conn, &Change::Endpoint { project, name })?;
                    }
                    Ok(Switch::Switched { replaced: replaced.filter(|old| *old != result.location) })
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(endpoint = %endpoint_id))]
    async fn fail(
        &self,
        endpoint_id: Uuid,
        token: Uuid,
        error: String,
        next_run_at: Timestamp,
    ) -> Result<bool, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let failed = diesel::update(materializations::table.find(endpoint_id.to_string()))
                    .filter(materializations::lease_token.eq(token.to_string()))
                    .set((
                        materializations::status.eq(MaterializationStatus::Failed.as_str()),
                        materializations::error.eq(Some(error)),
                        materializations::next_run_at.eq(micros(next_run_at)),
                        materializations::lease_token.eq(None::<String>),
                        materializations::lease_expires_at.eq(None::<i64>),
                        materializations::revision.eq(materializations::revision + 1),
                    ))
                    .execute(conn)?;
                Ok(failed == 1)
            })
            .await?)
    }

    #[instrument(skip_all, fields(endpoint = %endpoint_id))]
    async fn reschedule(&self, endpoint_id: Uuid, at: Timestamp) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                diesel::update(materializations::table.find(endpoint_id.to_string()))
                    .set((
                        materializations::next_run_at.eq(micros(at)),
                        materializations::revision.eq(materializations::revision + 1),
                    ))
                    .execute(conn)?;
                Ok(())
            })
            .await?)
    }

    #[instrument(skip_all, fields(count = endpoint_ids.len()))]
    async fn appended(&self, endpoint_ids: Vec<Uuid>, at: Timestamp) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let ids: Vec<String> = endpoint_ids.iter().map(Uuid::to_string).collect();
                // Only records with nothing pending change: the first pending append keeps the time the
                // refresh is due by.
                diesel::update(materializations::table)
                    .filter(materializations::endpoint_id.eq_any(&ids))
                    .filter(materializations::appended_since.is_null())
                    .set(materializations::appended_since.eq(Some(micros(at))))
                    .execute(conn)?;
                Ok(())
            })
            .await?)
    }

    #[instrument(skip_all)]
    async fn all(&self) -> Result<Vec<MaterializationState>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                materializations::table
                    .select(MaterializationRow::as_select())
                    .load(conn)?
                    .into_iter()
                    .map(MaterializationRow::into_domain)
                    .collect()
            })
            .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Database, DatabaseConfig};

    /// An endpoint deleted between the scan for due endpoints and its first claim is a lost race, as another
    /// process's claim of it is: that claim answers `false`, never an error that fails the batch's other claims
    /// (`make test` saw one fail so on PostgreSQL, from a test deleting endpoints beside another's claims).
    #[tokio::test]
    async fn the_first_claim_of_an_endpoint_deleted_meanwhile_is_lost_not_failed() {
        let dir = std::env::temp_dir().join(format!("endpoints-claim-test-{}", Uuid::new_v4()));
        let db =
            Database::connect(&DatabaseConfig::new(format!("sqlite://{}/store.db", dir.display()))).unwrap();
        db.migrate().unwrap();
        let gone = Candidate {
            id: Uuid::new_v4().to_string(),
            project_id: 1,
            name: "gone".into(),
            current_version: 1,
            sync_frequency: Some("1h".into()),
            freshness_seconds: None,
            record_revision: None,
            record_version: None,
            record_lease_token: None,
            record_next_run_at: None,
        };
        let claimed = db.run(move |conn| claim_one(conn, &gone, Uuid::new_v4(), 0, 60_000_000)).await;
        let _ = std::fs::remove_dir_all(&dir);
        assert!(!claimed.unwrap(), "no endpoint, no claim");
    }
}
