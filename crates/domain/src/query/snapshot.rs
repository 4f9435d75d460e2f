//! Which version of each table a run reads: the newest, the one of a past time (`as_of`), or the ones a
//! cursor pinned.

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;

/// A version of one of the project's tables, as a run read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableVersion {
    pub table: String,
    pub version: u64,
}

/// Which version of each table a query reads.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ReadAt {
    /// Each table's newest version.
    #[default]
    Newest,
    /// Each table's newest version committed at or before this time.
    AsOf(Timestamp),
    /// These versions (a cursor's); a table not among them did not exist when they were read.
    Pinned(Vec<TableVersion>),
}

impl ReadAt {
    pub fn is_newest(&self) -> bool {
        matches!(self, Self::Newest)
    }
}
