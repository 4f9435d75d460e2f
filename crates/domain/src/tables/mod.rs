//! Tables: a project's data, uploaded over HTTP or with the CLI, that its endpoints' queries read.

mod model;
mod ports;
mod service;

pub use model::{
    ExternalSource, Table, TableColumn, TableFormat, TableInfo, TableName, TableSource, Upload, UploadBody,
    WriteMode, Written,
};
#[cfg(any(test, feature = "mocks"))]
pub use ports::MockTableStore;
pub use ports::TableStore;
pub use service::{TableDeps, TableService, PREVIEW_ROWS};
