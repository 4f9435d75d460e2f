//! Tables: a project's data, uploaded over HTTP or with the CLI, that its endpoints' queries read.

mod compaction;
mod model;
mod ports;
mod service;

pub use compaction::{CompactionOutcome, CompactionService};

pub use model::{
    Compaction, ExternalSource, Table, TableColumn, TableFormat, TableInfo, TableName, TableSource, Upload,
    UploadBody, WriteMode, Written,
};
#[cfg(any(test, feature = "mocks"))]
pub use ports::{MockTableLeases, MockTableStore};
pub use ports::{TableLeases, TableStore};
pub use service::{TableDeps, TableService, PREVIEW_ROWS};
