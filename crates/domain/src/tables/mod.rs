//! Tables: a project's data, uploaded over HTTP or with the CLI, that its endpoints' queries read.

mod compaction;
mod idempotency;
mod layout;
mod model;
mod ports;
mod service;

pub use compaction::{CompactionOutcome, MaintenanceDeps, TableMaintenance, LAYOUT_RECHECK};
pub use idempotency::{
    AppendKeyState, AppendTag, BodyDigest, IdempotencyKey, TaggedWrite, APPEND_IN_FLIGHT, IDEMPOTENCY_WINDOW,
};
pub use layout::{cluster_columns, layout_pin, pinned_columns, TableLayout, MAX_CLUSTER_COLUMNS};
pub use model::{
    Compaction, ExternalSource, Findable, Table, TableColumn, TableCommit, TableFormat, TableInfo, TableName,
    TableSource, Upload, UploadBody, WriteMode, Written,
};
pub use ports::{AppendKeys, TableAnnouncer, TableLeases, TableStore};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockAppendKeys, MockTableAnnouncer, MockTableLeases, MockTableStore};
pub use service::{TableDeps, TableService, PREVIEW_ROWS};
