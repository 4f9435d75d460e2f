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

    /// Validates raw query-string values; absent values take the defaults.
    ///
    /// # Errors
    /// [`Invalid`] on `limit` outside `1..=1000` or a negative or non-numeric `offset`.
    pub fn parse(limit: Option<&str>, offset: Option<&str>) -> Result<Self, Invalid> {
        let limit = match limit {
            None => Self::DEFAULT_LIMIT,
            Some(raw) => raw
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=Self::MAX_LIMIT).contains(l))
                .ok_or_else(|| Invalid::field("limit", "limit must be an integer between 1 and 1000."))?,
        };
        let offset = match offset {
            None => 0,
            Some(raw) => raw
                .parse::<u64>()
                .ok()
                .filter(|o| i64::try_from(*o).is_ok())
                .ok_or_else(|| Invalid::field("offset", "offset must be a non-negative integer."))?,
        };
        Ok(Self { limit, offset })
    }
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
