//! A table's history as its log keeps it: the commits (for people), and what was appended since a version (for
//! stored results that fold appended rows).

use std::collections::{BTreeMap, HashMap, VecDeque};

use deltalake::kernel::{Action, Add, Metadata};
use deltalake::logstore::get_actions;
use deltalake::DeltaTable;
use futures_util::StreamExt;
use object_store::path::Path as ObjectPath;

use crate::{CommitError, DataFile, DeltaTables, ROWS_ADDED, ROWS_REMOVED};

/// One commit of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Commit {
    pub version: u64,
    /// When it was committed, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The Delta operation: `WRITE`, `OPTIMIZE`, `CREATE TABLE`, ...
    pub operation: String,
    pub rows_added: Option<u64>,
    pub rows_removed: Option<u64>,
}

/// What became of a table since a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Only rows were added, in these files (files a compaction rewrote are not among them: their rows were
    /// there before).
    Appended(Vec<DataFile>),
    /// Rows were removed or the columns changed (a replace): what was read from the older version is stale.
    Rewritten,
}

/// How many commits [`DeltaTables::changes_since`] reads at once.
const COMMITS_AT_ONCE: usize = 8;

/// How many of a table's newest commits a process keeps what they did ([`Recent`]): a fold a second after the
/// last, while 100 appends a second land, asks for about 100.
pub(crate) const KEPT_COMMITS: usize = 256;

/// What each of a table's newest commits did to its rows, as this process made them or read them one by one
/// (following another process's commits), so that [`DeltaTables::changes_since`] tells what was appended since a
/// version without reading those commits from the log again. It holds an unbroken run of versions: a commit
/// after one it does not know starts the run again, and a commit it cannot tell (one changing the columns or
/// properties) or a read of the whole log ends it.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    /// The version the first step follows.
    after: u64,
    steps: VecDeque<Step>,
}

/// What one commit did to a table's rows.
#[derive(Debug, Clone)]
enum Step {
    /// Rows were added in these files (none: the commit moved rows between files, as a compaction does).
    Added(Vec<DataFile>),
    /// Rows were removed: what was read before is stale.
    Rewritten,
}

impl Step {
    /// What a commit of `actions` did, the way [`DeltaTables::changes_since`] reads a commit from the log; `None`
    /// for one that changed the columns or properties, which only the log and the version before tell.
    fn of(table: &ObjectPath, actions: &[Action]) -> Option<Self> {
        let mut added = Vec::new();
        for action in actions {
            match action {
                Action::Add(add) if add.data_change => added.push(data_file(table, add)),
                Action::Remove(remove) if remove.data_change => return Some(Self::Rewritten),
                Action::Metadata(_) | Action::Protocol(_) => return None,
                _ => {}
            }
        }
        Some(Self::Added(added))
    }
}

impl Recent {
    /// The version after the last step kept.
    fn next(&self) -> u64 {
        self.after + self.steps.len() as u64 + 1
    }

    /// Keeps what the commit of `version` (of `actions`) did, after the steps kept when it is the next one.
    pub(crate) fn made(&mut self, table: &ObjectPath, version: u64, actions: &[Action]) {
        if version > self.after && version < self.next() {
            // Known: a version's commit is written once.
            return;
        }
        let Some(step) = Step::of(table, actions) else {
            self.forget();
            return;
        };
        if version != self.next() {
            self.after = version.saturating_sub(1);
            self.steps.clear();
        }
        self.steps.push_back(step);
        if self.steps.len() > KEPT_COMMITS {
            self.steps.pop_front();
            self.after += 1;
        }
    }

    /// Forgets every step: the table's state came from elsewhere than its commits one by one.
    pub(crate) fn forget(&mut self) {
        self.steps.clear();
    }

    /// What the commits after `version` up to `until` did, when each of them is kept.
    pub(crate) fn since(&self, version: u64, until: u64) -> Option<Changes> {
        if version < self.after || until >= self.next() || version > until {
            return None;
        }
        let (first, last) =
            (usize::try_from(version - self.after).ok()?, usize::try_from(until - self.after).ok()?);
        let mut appended = Vec::new();
        for step in self.steps.range(first..last) {
            match step {
                Step::Added(files) => appended.extend(files.iter().cloned()),
                Step::Rewritten => return Some(Changes::Rewritten),
            }
        }
        Some(Changes::Appended(appended))
    }
}

/// The location from the storage's root of a file the table's log names by `path` (relative to the table).
pub(crate) fn location(table: &ObjectPath, path: &str) -> ObjectPath {
    let path = ObjectPath::parse(path).unwrap_or_else(|_| ObjectPath::from(path));
    ObjectPath::from_iter(table.parts().chain(path.parts()))
}

/// A file an `add` action of the table's log adds.
pub(crate) fn data_file(table: &ObjectPath, add: &Add) -> DataFile {
    DataFile {
        location: location(table, &add.path),
        size: u64::try_from(add.size).unwrap_or(0),
        rows: add.get_stats().ok().flatten().map(|s| s.num_records.unsigned_abs()),
        modified_ms: add.modification_time,
    }
}

impl DeltaTables {
    pub(crate) async fn actions(
        &self,
        table: &ObjectPath,
        version: u64,
    ) -> Result<Option<Vec<Action>>, CommitError> {
        let log = &self.kept(table).log;
        let Some(bytes) = log.read_commit_entry(version).await.map_err(|e| CommitError::storage(table, e))?
        else {
            return Ok(None);
        };
        get_actions(version, &bytes).map(Some).map_err(|e| CommitError::storage(table, e))
    }

    /// The table's commits before version `before`, newest first, at most `limit` of them; commits whose log
    /// entry is gone (past the log's retention) end the list.
    ///
    /// # Errors
    /// [`CommitError::Storage`].
    pub async fn commits(
        &self,
        table: &ObjectPath,
        before: u64,
        limit: usize,
    ) -> Result<Vec<Commit>, CommitError> {
        let mut commits = Vec::new();
        for version in (0..before).rev().take(limit) {
            let Some(actions) = self.actions(table, version).await? else { break };
            let info = actions.into_iter().find_map(|action| match action {
                Action::CommitInfo(info) => Some(info),
                _ => None,
            });
            let count =
                |key: &str| info.as_ref().and_then(|i| i.info.get(key)).and_then(serde_json::Value::as_u64);
            commits.push(Commit {
                version,
                at_ms: info.as_ref().and_then(|i| i.in_commit_timestamp.or(i.timestamp)).unwrap_or(0),
                // A commit of another writer that says no operation is shown as an empty one.
                operation: info.as_ref().and_then(|i| i.operation.clone()).unwrap_or_else(String::new),
                rows_added: count(ROWS_ADDED),
                rows_removed: count(ROWS_REMOVED),
            });
        }
        Ok(commits)
    }

    /// What became of the table after `version` up to `until`: the files appended, or that it was rewritten.
    ///
    /// # Errors
    /// [`CommitError::Storage`] (also when a commit in between is no longer in the log).
    pub async fn changes_since(
        &self,
        table: &ObjectPath,
        version: u64,
        until: u64,
    ) -> Result<Changes, CommitError> {
        // The commits this process made or followed one by one are not read again.
        if let Some(known) = self.kept(table).recent().since(version, until) {
            return Ok(known);
        }
        let mut appended = Vec::new();
        // Read a few at a time, taken in order: on an object store each commit is a request of its own.
        let mut commits = futures_util::stream::iter(version + 1..=until)
            .map(|at| async move { (at, self.actions(table, at).await) })
            .buffered(COMMITS_AT_ONCE);
        while let Some((at, actions)) = commits.next().await {
            let Some(actions) = actions? else {
                return Err(CommitError::storage(table, format!("version {at} is no longer in the log")));
            };
            for action in actions {
                match action {
                    Action::Add(add) if add.data_change => appended.push(data_file(table, &add)),
                    Action::Remove(remove) if remove.data_change => return Ok(Changes::Rewritten),
                    Action::Metadata(metadata) if self.keeps_rows(table, version, &metadata).await? => {}
                    Action::Metadata(_) | Action::Protocol(_) => return Ok(Changes::Rewritten),
                    _ => {}
                }
            }
        }
        Ok(Changes::Appended(appended))
    }

    /// Whether a commit's `metadata` leaves the table's rows read as at `version`: the same columns, and the
    /// same properties but the layout's ([`LAYOUT_PROPERTIES`](crate::LAYOUT_PROPERTIES), which order files, not
    /// rows).
    async fn keeps_rows(
        &self,
        table: &ObjectPath,
        version: u64,
        metadata: &Metadata,
    ) -> Result<bool, CommitError> {
        let log = self.log_store(table);
        let mut delta = DeltaTable::new(log);
        delta.load_version(version).await.map_err(|e| CommitError::storage(table, e))?;
        let state = delta.snapshot().map_err(|e| CommitError::storage(table, e))?;
        let before = state.metadata();
        let but_layout = |properties: &HashMap<String, String>| -> BTreeMap<String, String> {
            properties
                .iter()
                .filter(|(k, _)| !crate::LAYOUT_PROPERTIES.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        Ok(before.schema_string() == metadata.schema_string()
            && but_layout(before.configuration()) == but_layout(metadata.configuration()))
    }
}
