//! The project's tables as the engine keeps them in the storage (each a Delta table, through `tables-delta`):
//! which tables there are and where their rows are (`catalog`), uploads imported and appended with group
//! commits (`imports`, `appends`, `records`, `quarantine`), bodies written to disk as they arrive (`spool`),
//! compaction and the layout it sorts files by (`compaction`, `layout`), external sources (`sources`, read
//! through `confined` for local files), the domain's `TableStore` over all of it (`table_store`), and the upgrade
//! of earlier layouts (`upgrade`).

pub(crate) mod appends;
pub(crate) mod catalog;
pub(crate) mod compaction;
pub(crate) mod confined;
pub(crate) mod files;
pub mod imports;
pub(crate) mod layout;
pub(crate) mod quarantine;
pub(crate) mod records;
pub(crate) mod sources;
pub(crate) mod spool;
pub(crate) mod table_store;
pub(crate) mod upgrade;
