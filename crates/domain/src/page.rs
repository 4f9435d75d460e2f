//! Offset pagination shared by every list.

use crate::error::Invalid;

/// A validated `limit`/`offset` pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    pub limit: u32,
    pub offset: u64,
}

impl PageRequest {
    pub const DEFAULT_LIMIT: u32 = 100;
    pub const MAX_LIMIT: u32 = 1000;

    /// Reads `limit` and `offset` as a query string carries them; absent values take the defaults.
    ///
    /// # Errors
    /// [`Invalid`] on `limit` outside `1..=1000` or a negative or non-numeric `offset`.
    pub fn parse(limit: Option<&str>, offset: Option<&str>) -> Result<Self, Invalid> {
        let limit = match limit {
            None => Self::DEFAULT_LIMIT,
            Some(raw) => Self::checked_limit(raw.parse().map_err(|_| limit_error())?)?,
        };
        let offset = match offset {
            None => 0,
            Some(raw) => Self::checked_offset(raw.parse().map_err(|_| offset_error())?)?,
        };
        Ok(Self { limit, offset })
    }

    /// A page size: `1..=1000`.
    ///
    /// # Errors
    /// [`Invalid`] (attr `limit`) outside the range.
    pub fn checked_limit(limit: i64) -> Result<u32, Invalid> {
        u32::try_from(limit).ok().filter(|l| (1..=Self::MAX_LIMIT).contains(l)).ok_or_else(limit_error)
    }

    /// An offset: not negative.
    ///
    /// # Errors
    /// [`Invalid`] (attr `offset`) for a negative number.
    pub fn checked_offset(offset: i64) -> Result<u64, Invalid> {
        u64::try_from(offset).map_err(|_| offset_error())
    }
}

fn limit_error() -> Invalid {
    Invalid::field("limit", format!("limit must be an integer between 1 and {}.", PageRequest::MAX_LIMIT))
}

fn offset_error() -> Invalid {
    Invalid::field("offset", "offset must be a non-negative integer.")
}

impl Default for PageRequest {
    fn default() -> Self {
        Self { limit: Self::DEFAULT_LIMIT, offset: 0 }
    }
}

/// One page of results and the total count of matching items.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub total: u64,
    pub request: PageRequest,
}

impl<T> Page<T> {
    /// Whether items exist after this page.
    pub fn has_next(&self) -> bool {
        self.request.offset + (self.items.len() as u64) < self.total
    }

    /// Whether items exist before this page.
    pub fn has_previous(&self) -> bool {
        self.request.offset > 0
    }
}
