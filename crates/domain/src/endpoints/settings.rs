//! Per-endpoint settings: how long cached results live, how often a materialization refreshes, how soon
//! appended rows reach it, and when an unused one stops refreshing.

use std::fmt;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::error::Invalid;

/// `raw` as a setting of `field` when it is within `range`; else [`Invalid`] saying the range (and `also`, what
/// else the field takes).
fn within(field: &str, raw: i64, range: RangeInclusive<u32>, also: &str) -> Result<u32, Invalid> {
    u32::try_from(raw).ok().filter(|v| range.contains(v)).ok_or_else(|| {
        Invalid::field(
            field,
            format!("{field} must be an integer between {} and {}{also}.", range.start(), range.end()),
        )
    })
}

/// `cache_age_seconds`: `None` means the server default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheAge(Option<u32>);

impl CacheAge {
    /// No age of its own: cached results live the server's default.
    pub const DEFAULT: Self = Self(None);
    pub const DEFAULT_SECONDS: u32 = 300;
    pub const MAX_SECONDS: u32 = 86_400;

    /// # Errors
    /// [`Invalid`] on `cache_age_seconds` outside `0..=86400`.
    pub fn new(seconds: Option<i64>) -> Result<Self, Invalid> {
        seconds.map(|s| within("cache_age_seconds", s, 0..=Self::MAX_SECONDS, "")).transpose().map(Self)
    }

    /// The configured value, `None` when the default applies.
    pub fn configured(self) -> Option<u32> {
        self.0
    }

    /// The age in force: the configured value or the default. Zero means never serve from cache.
    pub fn effective(self) -> Duration {
        Duration::from_secs(u64::from(self.0.unwrap_or(Self::DEFAULT_SECONDS)))
    }
}

/// `freshness_seconds`: how soon after an append a materialized endpoint's stored result includes the appended
/// rows. `None` means the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Freshness(Option<u32>);

impl Freshness {
    /// No freshness of its own: appended rows are included within the default.
    pub const DEFAULT: Self = Self(None);
    pub const DEFAULT_SECONDS: u32 = 60;
    pub const MIN_SECONDS: u32 = 1;
    /// A day: an endpoint that may lag more than that has its `sync_frequency`.
    pub const MAX_SECONDS: u32 = 86_400;

    /// # Errors
    /// [`Invalid`] on `freshness_seconds` outside `1..=86400`.
    pub fn new(seconds: Option<i64>) -> Result<Self, Invalid> {
        let range = Self::MIN_SECONDS..=Self::MAX_SECONDS;
        seconds.map(|s| within("freshness_seconds", s, range, "")).transpose().map(Self)
    }

    /// The configured value, `None` when the default applies.
    pub fn configured(self) -> Option<u32> {
        self.0
    }

    /// The freshness in force, in seconds: the configured value or the default.
    pub fn seconds(self) -> u32 {
        self.0.unwrap_or(Self::DEFAULT_SECONDS)
    }

    /// The freshness in force.
    pub fn effective(self) -> Duration {
        Duration::from_secs(u64::from(self.seconds()))
    }
}

/// `hibernate_after_days`: how many days a materialized endpoint that nobody runs (and nobody changes) keeps
/// refreshing. Past them it hibernates: no refresh and no fold until a run wakes it. `None` never hibernates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hibernation(Option<u32>);

impl Hibernation {
    /// An endpoint that does not choose hibernates after a week unused.
    pub const DEFAULT: Self = Self(Some(Self::DEFAULT_DAYS));
    /// Refreshed for as long as it is materialized, run or not.
    pub const NEVER: Self = Self(None);
    pub const DEFAULT_DAYS: u32 = 7;
    pub const MIN_DAYS: u32 = 1;
    /// Ten years: longer is what `null` (never) says.
    pub const MAX_DAYS: u32 = 3_650;

    /// # Errors
    /// [`Invalid`] on `hibernate_after_days` outside `1..=3650`; `None` (an explicit null) never hibernates.
    pub fn new(days: Option<i64>) -> Result<Self, Invalid> {
        let range = Self::MIN_DAYS..=Self::MAX_DAYS;
        days.map(|d| within("hibernate_after_days", d, range, ", or null for never")).transpose().map(Self)
    }

    /// The days without a run after which the endpoint hibernates; `None` for never.
    pub fn days(self) -> Option<u32> {
        self.0
    }

    /// How long the endpoint keeps refreshing after it last ran or changed; `None` for ever.
    pub fn after(self) -> Option<Duration> {
        self.0.map(|days| Duration::from_secs(u64::from(days) * 86_400))
    }
}

impl Default for Hibernation {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How often a materialized endpoint refreshes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncFrequency {
    FiveMinutes,
    ThirtyMinutes,
    OneHour,
    SixHours,
    TwelveHours,
    OneDay,
    SevenDays,
    ThirtyDays,
}

/// The frequency of a materialized endpoint that does not choose one.
impl Default for SyncFrequency {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl SyncFrequency {
    pub const DEFAULT: Self = Self::OneDay;

    pub const ALL: [SyncFrequency; 8] = [
        Self::FiveMinutes,
        Self::ThirtyMinutes,
        Self::OneHour,
        Self::SixHours,
        Self::TwelveHours,
        Self::OneDay,
        Self::SevenDays,
        Self::ThirtyDays,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::FiveMinutes => "5min",
            Self::ThirtyMinutes => "30min",
            Self::OneHour => "1hour",
            Self::SixHours => "6hour",
            Self::TwelveHours => "12hour",
            Self::OneDay => "24hour",
            Self::SevenDays => "7day",
            Self::ThirtyDays => "30day",
        }
    }

    pub fn period(self) -> Duration {
        const MIN: u64 = 60;
        Duration::from_secs(match self {
            Self::FiveMinutes => 5 * MIN,
            Self::ThirtyMinutes => 30 * MIN,
            Self::OneHour => 60 * MIN,
            Self::SixHours => 6 * 60 * MIN,
            Self::TwelveHours => 12 * 60 * MIN,
            Self::OneDay => 24 * 60 * MIN,
            Self::SevenDays => 7 * 24 * 60 * MIN,
            Self::ThirtyDays => 30 * 24 * 60 * MIN,
        })
    }

    /// # Errors
    /// [`Invalid`] on a value that is not one of the eight names.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        Self::ALL.into_iter().find(|f| f.as_str() == raw).ok_or_else(|| {
            Invalid::field(
                "sync_frequency",
                format!("sync_frequency must be one of {}.", Self::ALL.map(Self::as_str).join(", ")),
            )
        })
    }
}

impl fmt::Display for SyncFrequency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freshness_bounds() {
        assert_eq!(Freshness::new(None).unwrap().effective(), Duration::from_secs(60));
        assert_eq!(Freshness::new(Some(1)).unwrap().seconds(), 1);
        assert_eq!(Freshness::new(Some(86_400)).unwrap().configured(), Some(86_400));
        for bad in [0, -1, 86_401, i64::MAX] {
            assert_eq!(
                Freshness::new(Some(bad)).unwrap_err().attr.as_deref(),
                Some("freshness_seconds"),
                "{bad}"
            );
        }
    }

    #[test]
    fn cache_age_bounds() {
        assert_eq!(CacheAge::new(None).unwrap().effective(), Duration::from_secs(300));
        assert_eq!(CacheAge::new(Some(0)).unwrap().effective(), Duration::ZERO);
        assert_eq!(CacheAge::new(Some(86_400)).unwrap().configured(), Some(86_400));
        assert_eq!(CacheAge::new(Some(86_401)).unwrap_err().attr.as_deref(), Some("cache_age_seconds"));
        assert!(CacheAge::new(Some(-1)).is_err());
    }

    #[test]
    fn sync_frequency_round_trips_every_name() {
        for f in SyncFrequency::ALL {
            assert_eq!(SyncFrequency::parse(f.as_str()).unwrap(), f);
        }
        assert_eq!(SyncFrequency::default().as_str(), "24hour");
        assert_eq!(SyncFrequency::SixHours.period(), Duration::from_secs(21_600));
        assert!(SyncFrequency::parse("2hour").is_err());
    }
}
