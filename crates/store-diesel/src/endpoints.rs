//! `EndpointStore` on diesel.

use async_trait::async_trait;
use diesel::prelude::*;
use domain::{
    Change, Endpoint, EndpointChange, EndpointFilter, EndpointName, EndpointStore, EndpointVersion,
    NewEndpoint, NewVersion, Page, PageRequest, ProjectId, Replanned, StoreError, TableReader, Timestamp,
};

use crate::rows::{instant, version_number};
use tracing::instrument;

use crate::changes::announce;
use crate::connection::AnyConnection;
use crate::error::DbError;
use crate::rows::{
    breaking_changes_text, columns_text, eligibility_text, hibernation_days, micros, tables_text,
    EndpointRow, VersionRow,
};
use crate::schema::{endpoint_reads, endpoint_versions, endpoints, materializations};
use crate::DieselStore;

diesel::define_sql_function!(fn lower(x: diesel::sql_types::Text) -> diesel::sql_types::Text);

/// `LIKE` pattern matching `needle` anywhere, with the pattern characters escaped.
fn contains_pattern(needle: &str) -> String {
    let escaped = needle.to_lowercase().replace('\\', "\\\\").replace('%', "\\%").replace('_', "\\_");
    format!("%{escaped}%")
}

fn offset(page: PageRequest) -> i64 {
    i64::try_from(page.offset).unwrap_or(i64::MAX)
}

/// The endpoints of a project matching a filter, as a boxed query over `$source`.
macro_rules! filtered {
    ($source:expr, $project:expr, $filter:expr) => {{
        let mut query = $source.filter(endpoints::project_id.eq($project)).into_boxed();
        if let Some(active) = $filter.is_active {
            query = query.filter(endpoints::is_active.eq(active));
        }
        if let Some(materialized) = $filter.is_materialized {
            query = query.filter(endpoints::is_materialized.eq(materialized));
        }
        if let Some(search) = &$filter.search {
            let pattern = contains_pattern(search);
            query = query.filter(
                lower(endpoints::name)
                    .like(pattern.clone())
                    .escape('\\')
                    .or(lower(endpoints::description).like(pattern).escape('\\')),
            );
        }
        query
    }};
}

/// Endpoints joined with their current version.
macro_rules! current_version_join {
    () => {
        endpoints::table.inner_join(
            endpoint_versions::table.on(endpoint_versions::endpoint_id
                .eq(endpoints::id)
                .and(endpoint_versions::version.eq(endpoints::current_version))),
        )
    };
}

fn load(conn: &mut AnyConnection, project: i64, name: &str) -> Result<Endpoint, DbError> {
    let (row, version) = current_version_join!()
        .filter(endpoints::project_id.eq(project))
        .filter(endpoints::name.eq(name))
        .select((EndpointRow::as_select(), VersionRow::as_select()))
        .first::<(EndpointRow, VersionRow)>(conn)
        .optional()?
        .ok_or(DbError::NotFound)?;
    row.into_domain(&version)
}

fn endpoint_id(conn: &mut AnyConnection, project: i64, name: &str) -> Result<(String, i64), DbError> {
    endpoints::table
        .filter(endpoints::project_id.eq(project))
        .filter(endpoints::name.eq(name))
        .select((endpoints::id, endpoints::current_version))
        .first(conn)
        .optional()?
        .ok_or(DbError::NotFound)
}

#[derive(AsChangeset)]
#[diesel(table_name = endpoints)]
struct EndpointUpdate {
    description: String,
    derived_from_insight: Option<Option<String>>,
    is_active: bool,
    is_materialized: bool,
    cache_age_seconds: Option<Option<i64>>,
    sync_frequency: Option<Option<String>>,
    freshness_seconds: Option<Option<i64>>,
    hibernate_after_days: Option<Option<i64>>,
    current_version: i64,
    updated_at: i64,
}

#[derive(AsChangeset)]
#[diesel(table_name = endpoint_versions)]
struct VersionSettings {
    description: String,
    cache_age_seconds: Option<Option<i64>>,
    sync_frequency: Option<Option<String>>,
}

/// The table name of an `endpoint_reads` row that stands for tables not recorded: such an endpoint may read any.
const UNKNOWN_TABLES: &str = "*";

/// Records in the `endpoint_reads` index the tables an endpoint's current version reads (`None`: not recorded),
/// in the transaction that writes that version.
fn set_reads(
    conn: &mut AnyConnection,
    project: i64,
    id: &str,
    tables: Option<&[String]>,
) -> Result<(), DbError> {
    diesel::delete(endpoint_reads::table.filter(endpoint_reads::endpoint_id.eq(id))).execute(conn)?;
    let names: std::collections::BTreeSet<&str> = match tables {
        Some(tables) => tables.iter().map(String::as_str).collect(),
        None => [UNKNOWN_TABLES].into(),
    };
    for name in names {
        diesel::insert_into(endpoint_reads::table)
            .values((
                endpoint_reads::project_id.eq(project),
                endpoint_reads::table_name.eq(name),
                endpoint_reads::endpoint_id.eq(id),
            ))
            .execute(conn)?;
    }
    Ok(())
}

fn apply_change(
    conn: &mut AnyConnection,
    project: i64,
    name: &str,
    change: EndpointChange,
    at: i64,
) -> Result<Endpoint, DbError> {
    // The first statement is a write: it takes the row lock (PostgreSQL) or the database's write lock (SQLite)
    // before anything is read, so concurrent changes of one endpoint run one after the other and each sees the
    // version number the previous one wrote.
    let locked = diesel::update(endpoints::table)
        .filter(endpoints::project_id.eq(project))
        .filter(endpoints::name.eq(name))
        .set(endpoints::updated_at.eq(at))
        .execute(conn)?;
    if locked == 0 {
        return Err(DbError::NotFound);
    }
    let row: EndpointRow = endpoints::table
        .filter(endpoints::project_id.eq(project))
        .filter(endpoints::name.eq(name))
        .select(EndpointRow::as_select())
        .first(conn)?;

    let cache_age = change.cache_age.map(|c| c.configured().map(i64::from));
    let sync_frequency = change.sync_frequency.map(|f| f.map(|f| f.as_str().to_owned()));
    let description = change.description.unwrap_or(row.description.clone());
    let final_cache = cache_age.unwrap_or(row.cache_age_seconds);
    let final_sync = sync_frequency.clone().unwrap_or(row.sync_frequency.clone());

    let mut current_version = row.current_version;
    match change.query {
        Some(version) if i64::from(version.number) != current_version + 1 => {
            return Err(DbError::Superseded { current: version_number(current_version)? });
        }
        Some(NewVersion { number, planned }) => {
            current_version = i64::from(number);
            diesel::insert_into(endpoint_versions::table)
                .values(VersionRow {
                    endpoint_id: row.id.clone(),
                    version: current_version,
                    query: planned.query.canonical(),
                    description: description.clone(),
                    output_columns: columns_text(&planned.columns),
                    cache_age_seconds: final_cache,
                    sync_frequency: final_sync.clone(),
                    created_at: at,
                    eligibility: eligibility_text(&planned.eligibility),
                    source_tables: tables_text(&planned.tables),
                    plan_error: None,
                    breaking_changes: breaking_changes_text(&planned.breaking_changes),
                })
                .execute(conn)?;
            set_reads(conn, project, &row.id, Some(&planned.tables))?;
        }
        None => {
            diesel::update(endpoint_versions::table)
                .filter(endpoint_versions::endpoint_id.eq(&row.id))
                .filter(endpoint_versions::version.eq(current_version))
                .set(VersionSettings {
                    description: description.clone(),
                    cache_age_seconds: Some(final_cache),
                    sync_frequency: Some(final_sync),
                })
                .execute(conn)?;
        }
    }
    // An endpoint that is not materialized has no materialization record.
    let is_materialized = change.is_materialized.unwrap_or(row.is_materialized);
    if !is_materialized {
        diesel::delete(materializations::table.find(&row.id)).execute(conn)?;
    }
    diesel::update(endpoints::table.find(&row.id))
        .set(EndpointUpdate {
            description,
            derived_from_insight: change.derived_from_insight,
            is_active: change.is_active.unwrap_or(row.is_active),
            is_materialized,
            cache_age_seconds: cache_age,
            sync_frequency,
            freshness_seconds: change.freshness.map(|f| f.configured().map(i64::from)),
            hibernate_after_days: change.hibernation.map(|h| Some(hibernation_days(h))),
            current_version,
            updated_at: at,
        })
        .execute(conn)?;
    load(conn, project, name)
}

#[async_trait]
impl EndpointStore for DieselStore {
    #[instrument(skip_all, fields(project = %endpoint.project_id, name = %endpoint.name))]
    async fn insert(&self, endpoint: NewEndpoint) -> Result<Endpoint, StoreError> {
        let name = endpoint.name.to_string();
        let project = endpoint.project_id.get();
        let at = micros(endpoint.created_at);
        let row = EndpointRow {
            id: endpoint.id.to_string(),
            project_id: project,
            name: name.clone(),
            description: endpoint.description.clone(),
            derived_from_insight: endpoint.derived_from_insight,
            is_active: endpoint.is_active,
            is_materialized: endpoint.is_materialized,
            cache_age_seconds: endpoint.cache_age.configured().map(i64::from),
            sync_frequency: endpoint.sync_frequency.map(|f| f.as_str().to_owned()),
            current_version: 1,
            created_at: at,
            updated_at: at,
            last_executed_at: None,
            freshness_seconds: endpoint.freshness.configured().map(i64::from),
            hibernate_after_days: Some(hibernation_days(endpoint.hibernation)),
        };
        let version = VersionRow {
            endpoint_id: row.id.clone(),
            version: 1,
            query: endpoint.query.canonical(),
            description: endpoint.description,
            output_columns: columns_text(&endpoint.columns),
            cache_age_seconds: row.cache_age_seconds,
            sync_frequency: row.sync_frequency.clone(),
            created_at: at,
            eligibility: eligibility_text(&endpoint.eligibility),
            source_tables: tables_text(&endpoint.tables),
            plan_error: None,
            breaking_changes: breaking_changes_text(&[]),
        };
        let (lookup, tables) = (name.clone(), endpoint.tables);
        self.db
            .run(move |conn| {
                conn.transaction(|conn| {
                    diesel::insert_into(endpoints::table).values(&row).execute(conn)?;
                    diesel::insert_into(endpoint_versions::table).values(&version).execute(conn)?;
                    set_reads(conn, project, &row.id, Some(&tables))?;
                    load(conn, project, &lookup)
                })
            })
            .await
            .map_err(|e| e.into_store_error_naming(&name))
    }

    #[instrument(skip_all)]
    async fn read_tables(&self) -> Result<Vec<(ProjectId, String)>, StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let rows: Vec<(i64, String)> = endpoint_reads::table
                    .filter(endpoint_reads::table_name.ne(UNKNOWN_TABLES))
                    .select((endpoint_reads::project_id, endpoint_reads::table_name))
                    .distinct()
                    .order((endpoint_reads::project_id.asc(), endpoint_reads::table_name.asc()))
                    .load(conn)?;
                rows.into_iter()
                    .map(|(project, table)| {
                        let project = ProjectId::new(project).map_err(|e| DbError::Corrupt(e.detail))?;
                        Ok((project, table))
                    })
                    .collect::<Result<Vec<_>, DbError>>()
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, tables = tables.len()))]
    async fn readers(&self, project: ProjectId, tables: &[String]) -> Result<Vec<TableReader>, StoreError> {
        let mut names = tables.to_vec();
        names.push(UNKNOWN_TABLES.to_owned());
        Ok(self
            .db
            .run(move |conn| {
                let rows: Vec<(String, String, bool, bool, Option<String>)> = endpoint_reads::table
                    .inner_join(endpoints::table.on(endpoints::id.eq(endpoint_reads::endpoint_id)))
                    .inner_join(
                        endpoint_versions::table.on(endpoint_versions::endpoint_id
                            .eq(endpoints::id)
                            .and(endpoint_versions::version.eq(endpoints::current_version))),
                    )
                    .filter(endpoint_reads::project_id.eq(project.get()))
                    .filter(endpoint_reads::table_name.eq_any(names))
                    .select((
                        endpoints::id,
                        endpoints::name,
                        endpoints::is_materialized,
                        endpoints::is_active,
                        endpoint_versions::source_tables,
                    ))
                    .distinct()
                    // By name, as a table's `used_by` and an `in_use` refusal list them.
                    .order(endpoints::name.asc())
                    .load(conn)?;
                rows.into_iter()
                    .map(|(id, name, materialized, active, tables)| {
                        Ok(TableReader {
                            id: crate::rows::uuid(&id)?,
                            name: EndpointName::parse(&name).map_err(|e| DbError::Corrupt(e.detail))?,
                            refreshed: materialized && active,
                            tables: crate::rows::tables(tables.as_deref())?,
                        })
                    })
                    .collect::<Result<Vec<_>, DbError>>()
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, name = %name))]
    async fn get(&self, project: ProjectId, name: &EndpointName) -> Result<Endpoint, StoreError> {
        let name = name.to_string();
        Ok(self.db.run(move |conn| load(conn, project.get(), &name)).await?)
    }

    #[instrument(skip_all, fields(project = %project))]
    async fn list(
        &self,
        project: ProjectId,
        filter: &EndpointFilter,
        page: PageRequest,
    ) -> Result<Page<Endpoint>, StoreError> {
        let filter = filter.clone();
        let project = project.get();
        Ok(self
            .db
            .run(move |conn| {
                let total: i64 = filtered!(endpoints::table, project, filter).count().get_result(conn)?;
                let rows: Vec<(EndpointRow, VersionRow)> =
                    filtered!(current_version_join!(), project, filter)
                        .order(endpoints::name.asc())
                        .limit(i64::from(page.limit))
                        .offset(offset(page))
                        .select((EndpointRow::as_select(), VersionRow::as_select()))
                        .load(conn)?;
                let items = rows
                    .into_iter()
                    .map(|(row, version)| row.into_domain(&version))
                    .collect::<Result<_, _>>()?;
                Ok(Page { items, total: u64::try_from(total).unwrap_or(0), request: page })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, name = %name))]
    async fn update(
        &self,
        project: ProjectId,
        name: &EndpointName,
        change: EndpointChange,
        at: Timestamp,
    ) -> Result<Endpoint, StoreError> {
        let changed = Change::Endpoint { project, name: name.clone() };
        let name = name.to_string();
        let at = micros(at);
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let endpoint = apply_change(conn, project.get(), &name, change, at)?;
                    announce(conn, &changed)?;
                    Ok(endpoint)
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(endpoint = %endpoint_id, version))]
    async fn replan(
        &self,
        endpoint_id: uuid::Uuid,
        version: u32,
        replanned: Replanned,
    ) -> Result<bool, StoreError> {
        let (id, version) = (endpoint_id.to_string(), i64::from(version));
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let target = endpoint_versions::table
                        .filter(endpoint_versions::endpoint_id.eq(&id))
                        .filter(endpoint_versions::version.eq(version));
                    let updated = match replanned {
                        Ok(planned) => {
                            let updated = diesel::update(target)
                                .set((
                                    endpoint_versions::output_columns.eq(columns_text(&planned.columns)),
                                    endpoint_versions::eligibility.eq(eligibility_text(&planned.eligibility)),
                                    endpoint_versions::source_tables.eq(tables_text(&planned.tables)),
                                    endpoint_versions::plan_error.eq(None::<String>),
                                ))
                                .execute(conn)?;
                            // The index follows the current version only.
                            let current: Option<(i64, i64)> = endpoints::table
                                .find(&id)
                                .select((endpoints::project_id, endpoints::current_version))
                                .first(conn)
                                .optional()?;
                            if let Some((project, _)) = current.filter(|(_, current)| *current == version) {
                                set_reads(conn, project, &id, Some(&planned.tables))?;
                            }
                            updated
                        }
                        Err(reason) => diesel::update(target)
                            .set(endpoint_versions::plan_error.eq(Some(reason)))
                            .execute(conn)?,
                    };
                    Ok::<_, DbError>(updated > 0)
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, endpoints = names.len()))]
    async fn announce(&self, project: ProjectId, names: Vec<EndpointName>) -> Result<(), StoreError> {
        if names.is_empty() {
            return Ok(());
        }
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    for name in names {
                        announce(conn, &Change::Endpoint { project, name })?;
                    }
                    Ok::<_, DbError>(())
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, name = %name))]
    async fn delete(&self, project: ProjectId, name: &EndpointName) -> Result<uuid::Uuid, StoreError> {
        let changed = Change::Endpoint { project, name: name.clone() };
        let name = name.to_string();
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let (id, _) = endpoint_id(conn, project.get(), &name)?;
                    announce(conn, &changed)?;
                    // Dependent rows go first so the delete does not depend on the backend's cascade support.
                    diesel::delete(endpoint_reads::table.filter(endpoint_reads::endpoint_id.eq(&id)))
                        .execute(conn)?;
                    diesel::delete(materializations::table.find(&id)).execute(conn)?;
                    diesel::delete(endpoint_versions::table.filter(endpoint_versions::endpoint_id.eq(&id)))
                        .execute(conn)?;
                    diesel::delete(endpoints::table.find(&id)).execute(conn)?;
                    crate::rows::uuid(&id)
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, name = %name))]
    async fn list_versions(
        &self,
        project: ProjectId,
        name: &EndpointName,
        page: PageRequest,
    ) -> Result<Page<EndpointVersion>, StoreError> {
        let name = name.to_string();
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let (id, current) = endpoint_id(conn, project.get(), &name)?;
                    let rows: Vec<VersionRow> = endpoint_versions::table
                        .filter(endpoint_versions::endpoint_id.eq(&id))
                        .order(endpoint_versions::version.desc())
                        .limit(i64::from(page.limit))
                        .offset(offset(page))
                        .select(VersionRow::as_select())
                        .load(conn)?;
                    let items = rows.into_iter().map(|r| r.into_domain(current)).collect::<Result<_, _>>()?;
                    Ok(Page { items, total: u64::try_from(current).unwrap_or(0), request: page })
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, name = %name, version))]
    async fn get_version(
        &self,
        project: ProjectId,
        name: &EndpointName,
        version: u32,
    ) -> Result<EndpointVersion, StoreError> {
        let name = name.to_string();
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    let (id, current) = endpoint_id(conn, project.get(), &name)?;
                    endpoint_versions::table
                        .find((&id, i64::from(version)))
                        .select(VersionRow::as_select())
                        .first(conn)
                        .optional()?
                        .ok_or(DbError::VersionNotFound(version))?
                        .into_domain(current)
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(count = batch.len()))]
    async fn record_executions(
        &self,
        batch: Vec<(ProjectId, EndpointName, Timestamp)>,
    ) -> Result<(), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                conn.transaction(|conn| {
                    for (project, name, at) in &batch {
                        let at = micros(*at);
                        diesel::update(endpoints::table)
                            .filter(endpoints::project_id.eq(project.get()))
                            .filter(endpoints::name.eq(name.as_str()))
                            .filter(
                                endpoints::last_executed_at.is_null().or(endpoints::last_executed_at.lt(at)),
                            )
                            .set(endpoints::last_executed_at.eq(at))
                            .execute(conn)?;
                    }
                    Ok(())
                })
            })
            .await?)
    }

    #[instrument(skip_all, fields(project = %project, names = names.len()))]
    async fn last_executions(
        &self,
        project: ProjectId,
        names: Vec<EndpointName>,
        since: Timestamp,
    ) -> Result<(Vec<(EndpointName, Timestamp)>, u64), StoreError> {
        Ok(self
            .db
            .run(move |conn| {
                let wanted: Vec<&str> = names.iter().map(EndpointName::as_str).collect();
                let rows: Vec<(String, Option<i64>)> = endpoints::table
                    .filter(endpoints::project_id.eq(project.get()))
                    .filter(endpoints::name.eq_any(&wanted))
                    .filter(endpoints::last_executed_at.ge(micros(since)))
                    .select((endpoints::name, endpoints::last_executed_at))
                    .load(conn)?;
                let read = rows.len() as u64;
                let found = rows
                    .into_iter()
                    .filter_map(|(name, at)| Some((name, at?)))
                    .map(|(name, at)| {
                        let name = EndpointName::parse(&name).map_err(|e| DbError::Corrupt(e.detail))?;
                        Ok((name, instant(at)?))
                    })
                    .collect::<Result<Vec<_>, DbError>>()?;
                Ok((found, read))
            })
            .await?)
    }
}
