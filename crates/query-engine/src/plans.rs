//! Live queries' plans, kept from one run to the next.
//!
//! Before a live run executes, its query is parsed, the tables it names are looked up and registered (their
//! files' schema read), and its logical plan is built: a fixed cost, large beside a run over a small table.
//! None of it depends on the run's variables, which are placeholders until
//! bound, so the plan before binding is kept, by project and SQL, together with where each table it names had
//! its rows. A later run of the same SQL reads those tables' `_current` pointers again (as registering them
//! would) and takes the kept plan only when every one is as it was. So a replace, or a table created or
//! dropped under a name the query uses, is seen by the next run on any node. An append adds files to the
//! current version, which the plan does not hold: a table lists its files when a run is planned physically.
//!
//! Plans of queries that read an external source are not kept: its files or columns change where it is, and
//! only reading it again tells. Kept plans are bounded by an estimate of their size, and one unused for ten
//! minutes goes (a version no longer run, with it).

use std::sync::Arc;
use std::time::Duration;

use datafusion::logical_expr::LogicalPlan;
use domain::{EngineError, ProjectId};
use moka::sync::Cache;

use crate::storage::Storage;
use crate::tables::catalog::{self, Current, Named};

/// A plan and what it was planned against.
struct KeptPlan {
    tables: Named,
    plan: LogicalPlan,
    /// The versions of the tables it reads, as an answer gives them.
    read: Vec<domain::TableVersion>,
}

/// The kept plans, shared by the engine's clones.
#[derive(Clone)]
pub(crate) struct Plans {
    entries: Cache<(ProjectId, String), Arc<KeptPlan>>,
}

impl std::fmt::Debug for Plans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plans").field("entries", &self.entries.entry_count()).finish()
    }
}

impl Plans {
    /// An estimate of the memory kept plans take in all.
    const CAPACITY_BYTES: u64 = 16 * 1024 * 1024;
    /// An estimate of a plan's size beyond its SQL's: its nodes, schemas and table providers.
    const PLAN_BYTES: usize = 16 * 1024;
    /// A plan unused for this long goes.
    const IDLE: Duration = Duration::from_secs(600);

    pub(crate) fn new() -> Self {
        let entries = Cache::builder()
            .max_capacity(Self::CAPACITY_BYTES)
            // A plan grows with its query: each expression in the SQL is a node or two.
            .weigher(|(_, sql): &(ProjectId, String), _: &Arc<KeptPlan>| {
                u32::try_from(Self::PLAN_BYTES + 8 * sql.len()).unwrap_or(u32::MAX)
            })
            .time_to_idle(Self::IDLE)
            .build();
        Self { entries }
    }

    /// The plan kept for `sql` in the project, and the versions of the tables it reads, when every table it names is where it
    /// was when it was planned.
    ///
    /// # Errors
    /// The storage's, when a pointer cannot be read (as registering the tables would fail).
    pub(crate) async fn current(
        &self,
        storage: &Storage,
        project: ProjectId,
        sql: &str,
    ) -> Result<Option<(LogicalPlan, Vec<domain::TableVersion>)>, EngineError> {
        let Some(kept) = self.entries.get(&(project, sql.to_owned())) else { return Ok(None) };
        for (name, was) in &kept.tables {
            if catalog::current(storage, &catalog::table_prefix(project, name)).await? != *was {
                return Ok(None);
            }
        }
        Ok(Some((kept.plan.clone(), kept.read.clone())))
    }

    /// Keeps `plan` of `sql` in the project, planned against `tables`; not when it reads an external source.
    pub(crate) fn keep(&self, project: ProjectId, sql: &str, tables: Named, plan: &LogicalPlan) {
        if tables.iter().any(|(_, current)| matches!(current, Some(Current::External { .. }))) {
            return;
        }
        let read = catalog::versions_read(&tables);
        self.entries
            .insert((project, sql.to_owned()), Arc::new(KeptPlan { tables, plan: plan.clone(), read }));
    }
}
