//! Time: every instant of the domain is a UTC [`Timestamp`], read from a [`Clock`] so that tests control it.

/// Timestamps are UTC instants throughout the domain.
pub type Timestamp = time::OffsetDateTime;

/// The current time, injectable so tests control it.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

/// The wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// Now, to the microsecond: the precision every store keeps, so a value reads back as it was written.
    fn now(&self) -> Timestamp {
        let now = time::OffsetDateTime::now_utc();
        now.replace_nanosecond(now.nanosecond() / 1_000 * 1_000).unwrap_or(now)
    }
}
