//! What a log record says, how its readers filter and page it, and how usage is computed from it.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::Invalid;

/// What was done: an endpoint run, or a refresh of its stored result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogKind {
    Run,
    Refresh,
}

/// Where a run's answer came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogSource {
    /// The result cache.
    Cache,
    /// The endpoint's stored result.
    Materialized,
    /// Computed for the request.
    Live,
}

/// How a run was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    Rest,
    Mcp,
}

macro_rules! named {
    ($kind:ident, $attr:literal, $($variant:ident => $name:literal),+) => {
        impl $kind {
            pub const ALL: [Self; [$($name),+].len()] = [$(Self::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $name),+ }
            }

            /// # Errors
            /// [`Invalid`] naming the field for any other word.
            pub fn parse(raw: &str) -> Result<Self, Invalid> {
                Self::ALL.into_iter().find(|known| known.as_str() == raw).ok_or_else(|| {
                    let names: Vec<_> = Self::ALL.iter().map(|known| known.as_str()).collect();
                    Invalid::field($attr, format!("{} must be one of: {}.", $attr, names.join(", ")))
                })
            }
        }
    };
}

named!(LogKind, "kind", Run => "run", Refresh => "refresh");
named!(LogSource, "source", Cache => "cache", Materialized => "materialized", Live => "live");
named!(Transport, "transport", Rest => "rest", Mcp => "mcp");

/// One run or refresh. It never holds a variable's value: only what identifies the run and how it went.
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub id: Uuid,
    /// When the request (or refresh) began.
    pub at: Timestamp,
    pub project: ProjectId,
    pub endpoint: String,
    /// The version that ran; `None` when the run failed before one was chosen.
    pub version: Option<u32>,
    pub kind: LogKind,
    /// The HTTP status the run was answered with (a refresh: 200, or the status its failure would have).
    pub status: u16,
    /// The error code of a failure (`query_timeout`, `rate_limited`, ...).
    pub code: Option<String>,
    pub duration: Duration,
    /// Rows answered (a refresh: rows stored).
    pub rows: Option<u64>,
    /// Bytes the engine read from storage; `None` when nothing was computed or the engine cannot tell.
    pub bytes_read: Option<u64>,
    pub source: Option<LogSource>,
    /// The key's label (its prefix when it has none), or the run token's id.
    pub credential: Option<Arc<str>>,
    /// `None` for a refresh.
    pub transport: Option<Transport>,
    /// The request's id (`X-Request-Id`), for a run.
    pub request_id: Option<String>,
    /// How many runs it stands for: one, or, for a sample of a project's refused runs past its share of the
    /// log's buffer, those it was kept for (the others like it left out).
    pub runs: u32,
}

/// Whether a run answered with `status` failed: a status of 400 or more. The one rule the log's filters, usage
/// and the run metrics count errors by.
pub const fn is_error_status(status: u16) -> bool {
    status >= 400
}

impl LogRecord {
    /// Whether it counts as an error in usage ([`is_error_status`]).
    pub fn is_error(&self) -> bool {
        is_error_status(self.status)
    }

    /// Its duration in milliseconds, as records show it.
    pub fn duration_ms(&self) -> f64 {
        self.duration.as_secs_f64() * 1000.0
    }
}

/// Which statuses a listing keeps: one status, or every success or every error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusFilter {
    Exactly(u16),
    /// Below 400.
    Ok,
    /// 400 and above.
    Error,
}

impl StatusFilter {
    /// # Errors
    /// [`Invalid`] (attr `status`) for anything but `ok`, `error` or a status from 100 to 599.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        match raw {
            "ok" => Ok(Self::Ok),
            "error" => Ok(Self::Error),
            other => other
                .parse::<u16>()
                .ok()
                .filter(|status| (100..=599).contains(status))
                .map(Self::Exactly)
                .ok_or_else(|| {
                    Invalid::field("status", "status must be ok, error or an HTTP status from 100 to 599.")
                }),
        }
    }

    pub fn keeps(self, status: u16) -> bool {
        match self {
            Self::Exactly(wanted) => status == wanted,
            Self::Ok => !is_error_status(status),
            Self::Error => is_error_status(status),
        }
    }
}

/// Where a listing goes on: below the last record of the page before (newest first, ties by id).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogCursor {
    pub at: Timestamp,
    pub id: Uuid,
}

impl LogCursor {
    pub fn after(record: &LogRecord) -> Self {
        Self { at: record.at, id: record.id }
    }

    /// The cursor as the `next` of a page: the instant in microseconds and the id.
    pub fn text(&self) -> String {
        format!("{}.{}", self.at.unix_timestamp_nanos() / 1000, self.id.simple())
    }

    /// # Errors
    /// [`Invalid`] (attr `cursor`) for text no page gave.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        let invalid = || Invalid::field("cursor", "cursor must be the `next` of a page of this listing.");
        let (micros, id) = raw.split_once('.').ok_or_else(invalid)?;
        let micros: i128 = micros.parse().map_err(|_| invalid())?;
        let nanos = micros.checked_mul(1000).ok_or_else(invalid)?;
        let at = Timestamp::from_unix_timestamp_nanos(nanos).map_err(|_| invalid())?;
        let id = Uuid::try_parse(id).map_err(|_| invalid())?;
        Ok(Self { at, id })
    }

    /// Whether a record comes after this cursor in the listing's order.
    pub fn precedes(&self, record: &LogRecord) -> bool {
        record.at < self.at || (record.at == self.at && record.id < self.id)
    }
}

/// A listing of one endpoint's records: newest first, within `since..until`, one kind and some statuses.
#[derive(Debug, Clone, PartialEq)]
pub struct LogFilter {
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
    pub kind: Option<LogKind>,
    pub status: Option<StatusFilter>,
    pub limit: u32,
    pub cursor: Option<LogCursor>,
}

impl LogFilter {
    pub const DEFAULT_LIMIT: u32 = 100;
    pub const MAX_LIMIT: u32 = 1000;

    /// Whether a record is in the listing (the cursor included); `since` is inclusive, `until` not.
    pub fn keeps(&self, record: &LogRecord) -> bool {
        self.since.is_none_or(|since| record.at >= since)
            && self.until.is_none_or(|until| record.at < until)
            && self.kind.is_none_or(|kind| record.kind == kind)
            && self.status.is_none_or(|status| status.keeps(record.status))
            && self.cursor.is_none_or(|cursor| cursor.precedes(record))
    }
}

/// One page of a listing; `next` continues it.
#[derive(Debug, Clone, PartialEq)]
pub struct LogPage {
    pub records: Vec<LogRecord>,
    pub next: Option<LogCursor>,
}

impl LogPage {
    /// The page of `found`, which holds up to `limit + 1` records in the listing's order: the one past the
    /// limit says there is more.
    pub fn of(mut found: Vec<LogRecord>, limit: u32) -> Self {
        let limit = usize::try_from(limit).expect("a page's limit is at most 1000");
        let next = (found.len() > limit).then(|| LogCursor::after(&found[limit - 1]));
        found.truncate(limit);
        Self { records: found, next }
    }
}

/// The width of a usage bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interval {
    Minute,
    Hour,
    Day,
}

named!(Interval, "interval", Minute => "minute", Hour => "hour", Day => "day");

impl Interval {
    pub fn seconds(self) -> i64 {
        match self {
            Self::Minute => 60,
            Self::Hour => 3600,
            Self::Day => 86_400,
        }
    }

    /// The range a usage query covers when it names no `since`: an hour of minutes, a day of hours, 30 days.
    pub fn default_span(self) -> time::Duration {
        match self {
            Self::Minute => time::Duration::hours(1),
            Self::Hour => time::Duration::days(1),
            Self::Day => time::Duration::days(30),
        }
    }

    /// The start of the bucket `at` falls in.
    pub fn floor(self, at: Timestamp) -> Timestamp {
        let seconds = at.unix_timestamp();
        let start = seconds - seconds.rem_euclid(self.seconds());
        Timestamp::from_unix_timestamp(start).expect("a bucket starts no earlier than an instant it holds")
    }
}

/// Usage of one endpoint's runs in `since..until`, in buckets of `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageQuery {
    pub since: Timestamp,
    pub until: Timestamp,
    pub interval: Interval,
}

impl UsageQuery {
    /// The most buckets one answer holds (a week of minutes).
    pub const MAX_BUCKETS: i64 = 7 * 24 * 60;

    /// The query for the range and interval asked for, `until` defaulting to `now` and `since` to the
    /// interval's default span before it. A range of more than [`Self::MAX_BUCKETS`] buckets is answered for its
    /// newest ones (`since` moves up, and says so in the answer); an empty range (`since` at or after `until`)
    /// has no bucket.
    ///
    /// # Errors
    /// [`Invalid`] (attr `until`) when no span fits before `until`.
    pub fn new(
        since: Option<Timestamp>,
        until: Option<Timestamp>,
        interval: Option<Interval>,
        now: Timestamp,
    ) -> Result<Self, Invalid> {
        let interval = interval.unwrap_or(Interval::Hour);
        let until = until.unwrap_or(now);
        let out_of_range = || Invalid::field("until", "until is out of range.");
        let since = match since {
            Some(since) => since,
            None => until.checked_sub(interval.default_span()).ok_or_else(out_of_range)?,
        };
        let last = until.checked_sub(time::Duration::MICROSECOND).unwrap_or(until);
        let span = time::Duration::seconds(interval.seconds() * (Self::MAX_BUCKETS - 1));
        let since = match interval.floor(last).checked_sub(span) {
            Some(widest) => since.max(widest),
            None => since,
        };
        Ok(Self { since, until, interval })
    }

    /// The starts of its buckets, oldest first.
    fn starts(&self) -> impl Iterator<Item = Timestamp> + '_ {
        let step = time::Duration::seconds(self.interval.seconds());
        let empty = self.since >= self.until;
        std::iter::successors(Some(self.interval.floor(self.since)), move |start| start.checked_add(step))
            .take_while(move |start| !empty && *start < self.until)
    }
}

impl From<&LogRecord> for UsageSample {
    fn from(record: &LogRecord) -> Self {
        Self {
            at_micros: unix_micros(record.at),
            status: record.status,
            cache_hit: record.source == Some(LogSource::Cache),
            duration_ms: record.duration_ms(),
            rows: record.rows,
            bytes_read: record.bytes_read,
            runs: record.runs,
        }
    }
}

/// What usage needs of one run's record.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageSample {
    /// When the run began, in microseconds since the Unix epoch (as the log keeps it: usage reads millions).
    pub at_micros: i64,
    pub status: u16,
    /// Whether the run was answered from the cache ([`LogSource::Cache`]).
    pub cache_hit: bool,
    pub duration_ms: f64,
    pub rows: Option<u64>,
    pub bytes_read: Option<u64>,
    /// How many runs the record stands for ([`LogRecord::runs`]).
    pub runs: u32,
}

/// One bucket of usage: counts and sums, and latency percentiles over its runs (`None` when it has none).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageBucket {
    pub start: Timestamp,
    pub requests: u64,
    pub errors: u64,
    pub cache_hits: u64,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub rows: u64,
    pub bytes_read: u64,
}

/// Usage buckets filled one sample at a time; percentiles are exact (nearest rank) over every sample.
#[derive(Debug)]
pub struct UsageAccumulator {
    query: UsageQuery,
    /// `since`, `until` and the first bucket's start, in microseconds.
    range: (i64, i64, i64),
    buckets: Vec<(UsageBucket, Vec<f32>)>,
}

impl UsageAccumulator {
    pub fn new(query: UsageQuery) -> Self {
        let buckets = query
            .starts()
            .map(|start| {
                let bucket = UsageBucket {
                    start,
                    requests: 0,
                    errors: 0,
                    cache_hits: 0,
                    p50_ms: None,
                    p95_ms: None,
                    p99_ms: None,
                    rows: 0,
                    bytes_read: 0,
                };
                (bucket, Vec::new())
            })
            .collect();
        let first = query.interval.floor(query.since);
        let range = (unix_micros(query.since), unix_micros(query.until), unix_micros(first));
        Self { range, query, buckets }
    }

    /// Counts one run; a sample outside the query's range is left out.
    pub fn add(&mut self, sample: &UsageSample) {
        let at = sample.at_micros;
        if at < self.range.0 || at >= self.range.1 {
            return;
        }
        let index = (at - self.range.2) / (self.query.interval.seconds() * 1_000_000);
        let Some((bucket, durations)) = usize::try_from(index).ok().and_then(|i| self.buckets.get_mut(i))
        else {
            return;
        };
        let runs = u64::from(sample.runs);
        bucket.requests += runs;
        bucket.errors += runs * u64::from(is_error_status(sample.status));
        bucket.cache_hits += runs * u64::from(sample.cache_hit);
        bucket.rows += runs * sample.rows.unwrap_or(0);
        bucket.bytes_read += runs * sample.bytes_read.unwrap_or(0);
        // Milliseconds to a microsecond's precision fit an f32 for any duration a run can have.
        #[allow(clippy::cast_possible_truncation)]
        durations.push(sample.duration_ms as f32);
    }

    /// Counts the runs `other` counted too: accumulators of one query filled from parts of the records (a
    /// reader's partitions, each on a core of its own) merge into the one all the records would have filled.
    ///
    /// # Panics
    /// When `other` is of another query: its buckets are not these.
    pub fn merge(&mut self, other: Self) {
        assert_eq!(self.query, other.query, "usage of one query merged");
        for ((bucket, durations), (theirs, their_durations)) in self.buckets.iter_mut().zip(other.buckets) {
            bucket.requests += theirs.requests;
            bucket.errors += theirs.errors;
            bucket.cache_hits += theirs.cache_hits;
            bucket.rows += theirs.rows;
            bucket.bytes_read += theirs.bytes_read;
            if durations.is_empty() {
                *durations = their_durations;
            } else {
                durations.extend_from_slice(&their_durations);
            }
        }
    }

    pub fn finish(self) -> Vec<UsageBucket> {
        self.buckets
            .into_iter()
            .map(|(mut bucket, mut durations)| {
                let [p50, p95, p99] =
                    nearest_ranks(&mut durations, [0.50, 0.95, 0.99]).map(|p| p.map(f64::from));
                (bucket.p50_ms, bucket.p95_ms, bucket.p99_ms) = (p50, p95, p99);
                bucket
            })
            .collect()
    }
}

/// An instant in microseconds since the Unix epoch (every instant of years -9999 to 9999 fits).
pub fn unix_micros(at: Timestamp) -> i64 {
    i64::try_from(at.unix_timestamp_nanos() / 1000)
        .expect("an instant of years -9999 to 9999 in microseconds")
}

/// The `qs` quantiles (in ascending order) of `values` by the nearest-rank rule: for each, the smallest value
/// with at least `q` of them at or below it. `values` is reordered: each quantile is selected from the values
/// below the one after it, in linear time (sorting a bucket of a million runs took most of a usage's time).
fn nearest_ranks<const N: usize>(values: &mut [f32], qs: [f64; N]) -> [Option<f32>; N] {
    let mut found = [None; N];
    let len = values.len();
    if len == 0 {
        return found;
    }
    // `values[..below]` holds the `below` smallest values.
    let mut below = len;
    for (found, q) in found.iter_mut().zip(qs).rev() {
        // At most a week of a bucket's runs: the count is exact in an f64.
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let rank = ((q * len as f64).ceil() as usize).clamp(1, len) - 1;
        debug_assert!(rank <= below, "quantiles in ascending order");
        if rank < below {
            values[..below].select_nth_unstable_by(rank, f32::total_cmp);
            below = rank;
        }
        *found = Some(values[rank]);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    use proptest::prelude::*;

    proptest! {
        /// Quantiles selected read the same as from the values sorted, ties and `NaN` included.
        #[test]
        fn quantiles_selected_equal_quantiles_of_the_sorted_values(
            values in prop::collection::vec(
                prop_oneof![0_u8..20, Just(255)].prop_map(|v| {
                    if v == 255 { f32::NAN } else { f32::from(v) / 4.0 }
                }),
                0..300,
            )
        ) {
            let mut sorted = values.clone();
            sorted.sort_unstable_by(f32::total_cmp);
            let qs = [0.0, 0.01, 0.50, 0.95, 0.99, 1.0];
            let expected = qs.map(|q| {
                #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let rank = (q * sorted.len() as f64).ceil() as usize;
                (!sorted.is_empty()).then(|| sorted[rank.clamp(1, sorted.len()) - 1].to_bits())
            });
            let mut selected = values;
            let found = nearest_ranks(&mut selected, qs).map(|value| value.map(f32::to_bits));
            prop_assert_eq!(found, expected);
        }
    }

    proptest! {
        /// Accumulators filled from any split of the samples merge into what one fed them all answers.
        #[test]
        fn usage_of_parts_merged_equals_usage_of_the_whole(
            samples in prop::collection::vec(
                (-10_i64..200, prop_oneof![Just(200_u16), Just(429), Just(500)], any::<bool>(), 0_u8..50,
                 1_u32..4, 0_usize..3),
                0..200,
            )
        ) {
            let query = UsageQuery::new(Some(at(0)), Some(at(180)), Some(Interval::Minute), at(0)).unwrap();
            let mut whole = UsageAccumulator::new(query);
            let mut parts = [(); 3].map(|()| UsageAccumulator::new(query));
            for &(seconds, status, cache_hit, ms, runs, part) in &samples {
                let sample = UsageSample {
                    at_micros: unix_micros(at(seconds)),
                    status,
                    cache_hit,
                    duration_ms: f64::from(ms) / 4.0,
                    rows: Some(u64::from(ms)),
                    bytes_read: (ms % 2 == 0).then_some(u64::from(runs)),
                    runs,
                };
                whole.add(&sample);
                parts[part].add(&sample);
            }
            let [mut merged, second, third] = parts;
            merged.merge(second);
            merged.merge(third);
            prop_assert_eq!(merged.finish(), whole.finish());
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    fn record(seconds: i64, id: u128, status: u16) -> LogRecord {
        LogRecord {
            id: Uuid::from_u128(id),
            at: at(seconds),
            project: ProjectId::new(1).unwrap(),
            endpoint: "e".into(),
            version: Some(1),
            kind: LogKind::Run,
            status,
            code: None,
            duration: Duration::from_millis(3),
            rows: Some(1),
            bytes_read: None,
            source: Some(LogSource::Live),
            credential: None,
            transport: Some(Transport::Rest),
            request_id: None,
            runs: 1,
        }
    }

    #[test]
    fn words_read_back_and_others_name_their_field() {
        for kind in LogKind::ALL {
            assert_eq!(LogKind::parse(kind.as_str()).unwrap(), kind);
        }
        assert_eq!(Interval::parse("day").unwrap(), Interval::Day);
        assert_eq!(Interval::parse("week").unwrap_err().attr.as_deref(), Some("interval"));
        assert_eq!(LogKind::parse("Run").unwrap_err().attr.as_deref(), Some("kind"));
        assert_eq!(StatusFilter::parse("429").unwrap(), StatusFilter::Exactly(429));
        for bad in ["99", "600", "4xx", "", "-1"] {
            assert_eq!(StatusFilter::parse(bad).unwrap_err().attr.as_deref(), Some("status"), "{bad}");
        }
        assert!(
            StatusFilter::Error.keeps(429) && !StatusFilter::Error.keeps(200) && StatusFilter::Ok.keeps(304)
        );
    }

    #[test]
    fn a_cursor_reads_back_and_continues_below_its_record() {
        let cursor = LogCursor::after(&record(5, 7, 200));
        assert_eq!(LogCursor::parse(&cursor.text()).unwrap(), cursor);
        let huge = format!("{}.00000000000000000000000000000001", "9".repeat(38));
        for bad in [
            "",
            "1",
            "x.y",
            "1.not-a-uuid",
            "99999999999999999999999999.00000000000000000000000000000001",
            &huge,
        ] {
            assert_eq!(LogCursor::parse(bad).unwrap_err().attr.as_deref(), Some("cursor"), "{bad}");
        }
        assert!(cursor.precedes(&record(4, 9, 200)));
        assert!(cursor.precedes(&record(5, 6, 200)));
        assert!(!cursor.precedes(&record(5, 7, 200)) && !cursor.precedes(&record(5, 8, 200)));
    }

    #[test]
    fn a_page_holds_its_limit_and_says_where_the_next_begins() {
        let found: Vec<_> = (0..4).rev().map(|i| record(i, 1, 200)).collect();
        let page = LogPage::of(found.clone(), 3);
        assert_eq!(page.records, found[..3]);
        assert_eq!(page.next, Some(LogCursor::after(&found[2])));
        assert_eq!(LogPage::of(found[..3].to_vec(), 3).next, None);
        let filter = LogFilter {
            since: Some(at(1)),
            until: Some(at(3)),
            kind: Some(LogKind::Run),
            status: Some(StatusFilter::Error),
            limit: 10,
            cursor: None,
        };
        assert!(filter.keeps(&record(1, 1, 500)) && filter.keeps(&record(2, 1, 429)));
        assert!(!filter.keeps(&record(3, 1, 500)) && !filter.keeps(&record(0, 1, 500)));
        assert!(!filter.keeps(&record(2, 1, 200)));
    }

    #[test]
    fn usage_buckets_count_and_rank_their_runs() {
        let query = UsageQuery::new(Some(at(0)), Some(at(180)), Some(Interval::Minute), at(0)).unwrap();
        let mut usage = UsageAccumulator::new(query);
        // 100 runs of 1..=100 ms in the first minute, one error and one cache hit among them; none in the second.
        for ms in 1..=100_u16 {
            usage.add(&UsageSample {
                at_micros: unix_micros(at(i64::from(ms % 60))),
                status: if ms == 7 { 500 } else { 200 },
                cache_hit: ms == 8,
                duration_ms: f64::from(ms),
                rows: Some(2),
                bytes_read: Some(10),
                runs: 1,
            });
        }
        let sample = |seconds, ms| UsageSample {
            at_micros: unix_micros(at(seconds)),
            status: 200,
            cache_hit: false,
            duration_ms: ms,
            rows: None,
            bytes_read: None,
            runs: 1,
        };
        usage.add(&sample(130, 4.5));
        // A sample that stands for 64 refused runs counts 64 requests and errors; its latency counts once.
        usage.add(&UsageSample { status: 429, runs: 64, ..sample(70, 0.5) });
        // Outside the range: left out.
        usage.add(&sample(180, 1.0));
        usage.add(&sample(-1, 1.0));
        let buckets = usage.finish();
        assert_eq!(buckets.iter().map(|b| b.start).collect::<Vec<_>>(), [at(0), at(60), at(120)]);
        let first = &buckets[0];
        assert_eq!(
            (first.requests, first.errors, first.cache_hits, first.rows, first.bytes_read),
            (100, 1, 1, 200, 1000)
        );
        assert_eq!((first.p50_ms, first.p95_ms, first.p99_ms), (Some(50.0), Some(95.0), Some(99.0)));
        assert_eq!((buckets[1].requests, buckets[1].errors, buckets[1].p50_ms), (64, 64, Some(0.5)));
        assert_eq!((buckets[2].requests, buckets[2].p99_ms), (1, Some(4.5)));
    }

    #[test]
    fn a_usage_query_takes_defaults_and_answers_the_newest_buckets_of_a_wide_range() {
        let now = at(10_000);
        let query = UsageQuery::new(None, None, None, now).unwrap();
        assert_eq!(
            (query.since, query.until, query.interval),
            (now - time::Duration::days(1), now, Interval::Hour)
        );
        // Nothing between: no bucket.
        let empty = UsageQuery::new(Some(now), Some(now - time::Duration::HOUR), None, now).unwrap();
        assert!(UsageAccumulator::new(empty).finish().is_empty());
        // A year of minutes: the newest week of them.
        let year = UsageQuery::new(Some(now - time::Duration::days(365)), None, Some(Interval::Minute), now)
            .unwrap();
        let buckets = UsageAccumulator::new(year).finish();
        assert_eq!(buckets.len() as i64, UsageQuery::MAX_BUCKETS);
        assert_eq!(buckets.last().unwrap().start, Interval::Minute.floor(now));
        let week = time::Duration::minutes(UsageQuery::MAX_BUCKETS - 1);
        assert_eq!(year.since, Interval::Minute.floor(now) - week);
        let days =
            UsageQuery::new(Some(now - time::Duration::days(365)), None, Some(Interval::Day), now).unwrap();
        assert_eq!(days.since, now - time::Duration::days(365));
        // The last instants a time can name: the buckets end there, without overflowing.
        let end = time::macros::datetime!(9999-12-31 23:59:59.999999 UTC);
        let query = UsageQuery::new(None, Some(end), Some(Interval::Hour), now).unwrap();
        assert_eq!(UsageAccumulator::new(query).finish().len(), 25);
        let first = time::macros::datetime!(-9999-01-01 0:00 UTC);
        assert!(UsageQuery::new(None, Some(first), Some(Interval::Day), now).is_err());
    }
}
