//! Database errors, translated into the domain's `StoreError` at the boundary.

use diesel::result::{DatabaseErrorKind, Error as DieselError};
use domain::StoreError;

/// An error inside a store operation, before translation.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DbError {
    #[error("not found")]
    NotFound,
    #[error("version {0} not found")]
    VersionNotFound(u32),
    #[error("the endpoint moved on to version {current}")]
    Superseded { current: u32 },
    #[error(transparent)]
    Diesel(#[from] DieselError),
    #[error(transparent)]
    Pool(#[from] r2d2::Error),
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),
    #[error("blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

impl DbError {
    /// Translates for operations where a unique violation means the endpoint name is taken.
    pub(crate) fn into_store_error_naming(self, name: &str) -> StoreError {
        match self {
            DbError::Diesel(DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => {
                StoreError::NameTaken(name.to_owned())
            }
            other => other.into(),
        }
    }
}

fn is_unavailable(err: &DieselError) -> bool {
    match err {
        DieselError::DatabaseError(DatabaseErrorKind::ClosedConnection, _) => true,
        // SQLite reports a lock it waited for in vain (busy_timeout exceeded) with this message.
        DieselError::DatabaseError(_, info) => info.message().contains("database is locked"),
        _ => false,
    }
}

impl From<DbError> for StoreError {
    fn from(err: DbError) -> Self {
        match err {
            DbError::NotFound | DbError::Diesel(DieselError::NotFound) => StoreError::NotFound,
            DbError::VersionNotFound(v) => StoreError::VersionNotFound(v),
            DbError::Superseded { current } => StoreError::Superseded { current },
            DbError::Pool(e) => StoreError::Unavailable(Box::new(e)),
            DbError::Diesel(e) if is_unavailable(&e) => StoreError::Unavailable(Box::new(e)),
            other => StoreError::Internal(Box::new(other)),
        }
    }
}
