//! Running an endpoint: the run request and its refresh modes, the cache key and the computed run it keeps,
//! and what a run answers.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use uuid::Uuid;

use crate::access::{ProjectId, RunGrant};
use crate::clock::Timestamp;
use crate::endpoints::EndpointName;
use crate::error::{Error, Invalid, Violation};
use crate::page::PageRequest;
use crate::query::{QueryResult, ReadAt, ResultFormat};

/// How a run may use cached and materialized results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Refresh {
    /// Serve a fresh cached result, else compute now.
    #[default]
    Blocking,
    /// Compute now; the result replaces the cached one.
    ForceBlocking,
    /// Only a cached result; none is `results: null`.
    ForceCache,
    /// Compute from the live tables, bypassing the cache entirely.
    Direct,
}

impl Refresh {
    pub const ALL: [Refresh; 4] = [Self::Blocking, Self::ForceBlocking, Self::ForceCache, Self::Direct];

    /// # Errors
    /// [`Invalid`] (attr `refresh`) for the asynchronous modes and unknown values.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        match raw {
            "blocking" => Ok(Self::Blocking),
            "force_blocking" => Ok(Self::ForceBlocking),
            "force_cache" => Ok(Self::ForceCache),
            "direct" => Ok(Self::Direct),
            "async" | "lazy_async" | "force_async" => Err(Invalid::field(
                "refresh",
                format!("refresh '{raw}' is asynchronous; this service runs synchronously: use blocking, force_blocking, force_cache or direct."),
            )),
            _ => Err(Invalid::field(
                "refresh",
                format!("refresh must be one of {}.", Self::ALL.map(Self::as_str).join(", ")),
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Blocking => "blocking",
            Self::ForceBlocking => "force_blocking",
            Self::ForceCache => "force_cache",
            Self::Direct => "direct",
        }
    }
}

/// A validated run request.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub version: Option<u32>,
    /// Variable values as supplied, before binding to the declarations.
    pub variables: Map<String, Value>,
    pub limit: u32,
    pub offset: u64,
    pub refresh: Refresh,
    pub client_query_id: Option<String>,
    /// How the rows are written: the request's `format`, else what the client accepts.
    pub format: ResultFormat,
    /// The oldest data the caller takes: a cached or stored answer whose `data_as_of` is older than this is not
    /// served (a `blocking` run computes live instead). `None` takes any that is otherwise fresh.
    pub max_staleness: Option<Duration>,
    /// Read every table at its newest version committed at or before this time (`as_of`); a cursor's page is
    /// as of its first page's time.
    pub as_of: Option<Timestamp>,
    /// The next page of an earlier run, as its answer's `next` gave it.
    pub cursor: Option<String>,
    /// That cursor, read: set by the run service (see [`RunRequest::follow`]).
    pub followed: Option<super::Cursor>,
}

/// No version named (the current one), no variables, the first page of the default size, a cached answer when
/// fresh: what an empty body or query string asks for.
impl Default for RunRequest {
    fn default() -> Self {
        Self {
            version: None,
            variables: Map::new(),
            limit: Self::DEFAULT_LIMIT,
            offset: 0,
            refresh: Refresh::default(),
            client_query_id: None,
            format: ResultFormat::Json,
            max_staleness: None,
            as_of: None,
            cursor: None,
            followed: None,
        }
    }
}

impl RunRequest {
    pub const DEFAULT_LIMIT: u32 = 100;
    pub const MAX_LIMIT: u32 = 10_000;

    /// The largest page a run may write in another format than JSON, by default: those pages are written
    /// without holding them in memory.
    pub const DEFAULT_EXPORT_LIMIT: u32 = 1_000_000;

    /// The most variables one run may pass (a query declares far fewer; this bounds the work of refusing).
    pub const MAX_VARIABLES: usize = 100;

    /// The largest `max_staleness_seconds`: a year.
    pub const MAX_STALENESS_SECONDS: i64 = 366 * 86_400;

    /// `max_staleness_seconds` as sent; `None` when it was not.
    ///
    /// # Errors
    /// [`Invalid`] (`max_staleness_seconds`) outside `0..=31622400`.
    pub fn max_staleness(requested: Option<i64>) -> Result<Option<Duration>, Invalid> {
        requested
            .map(|seconds| {
                u64::try_from(seconds)
                    .ok()
                    .filter(|s| i64::try_from(*s).is_ok_and(|s| s <= Self::MAX_STALENESS_SECONDS))
                    .map(Duration::from_secs)
                    .ok_or_else(|| {
                        Invalid::field(
                            "max_staleness_seconds",
                            format!(
                                "max_staleness_seconds must be an integer between 0 and {}.",
                                Self::MAX_STALENESS_SECONDS
                            ),
                        )
                    })
            })
            .transpose()
    }

    /// `as_of` as sent: an RFC 3339 time.
    ///
    /// # Errors
    /// [`Invalid`] (`as_of`) for anything else.
    pub fn as_of(raw: Option<&str>) -> Result<Option<Timestamp>, Invalid> {
        raw.map(|raw| {
            Timestamp::parse(raw, &time::format_description::well_known::Rfc3339).map_err(|_| {
                Invalid::field("as_of", "as_of must be an RFC 3339 time, such as 2026-11-27T09:30:00Z.")
            })
        })
        .transpose()
    }

    /// Which version of each table the run reads.
    pub fn read_at(&self) -> ReadAt {
        match (&self.followed, self.as_of) {
            (Some(cursor), _) => ReadAt::Pinned(cursor.pinned.clone()),
            (None, Some(at)) => ReadAt::AsOf(at),
            (None, None) => ReadAt::Newest,
        }
    }

    /// The time its data is as of when it reads earlier versions: its cursor's first page's, or `as_of`.
    pub fn pinned_as_of(&self) -> Option<Timestamp> {
        self.followed.as_ref().map(|cursor| cursor.data_as_of).or(self.as_of)
    }

    /// Takes the page a cursor (already read, see [`super::Cursor::read`]) asks for: its offset and versions.
    ///
    /// # Errors
    /// [`Invalid`] (`offset`, `as_of`) when the request also says where to start or which versions to read.
    pub fn follow(&mut self, cursor: super::Cursor) -> Result<(), Invalid> {
        if self.offset != 0 {
            return Err(Invalid::field(
                "offset",
                "Send either offset or cursor: the cursor says where its page starts.",
            ));
        }
        if self.as_of.is_some() {
            return Err(Invalid::field(
                "as_of",
                "Send either as_of or cursor: a cursor's pages are as of its first.",
            ));
        }
        self.offset = cursor.offset;
        self.followed = Some(cursor);
        Ok(())
    }

    /// Whether data as of `data_as_of` is recent enough for this request at `now`.
    pub fn takes(&self, data_as_of: Timestamp, now: Timestamp) -> bool {
        self.max_staleness.is_none_or(|most| data_as_of + most >= now)
    }

    /// Sets the variables a run token fixes, so that a run of its holder sees only the tenant's rows. They are
    /// part of the variables from here on, so of the cache key too: two tenants never share an answer.
    ///
    /// # Errors
    /// [`Invalid`] (`fixed_variable`) when the request sends one of them, whatever its value.
    pub fn fix_variables(&mut self, fixed: &Map<String, Value>) -> Result<(), Invalid> {
        if let Some(name) = fixed.keys().find(|name| self.variables.contains_key(*name)) {
            return Err(Invalid::new(
                format!("variables.{name}"),
                Violation::FixedVariable,
                format!("The variable '{name}' is fixed by the run token and cannot be sent."),
            ));
        }
        self.variables.extend(fixed.iter().map(|(name, value)| (name.clone(), value.clone())));
        Ok(())
    }

    /// Applies a run token's grant to a request of its holder for `endpoint`: the current version unless the
    /// token was issued for the version named, and the token's fixed variables (see
    /// [`RunRequest::fix_variables`]).
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] for a version the token was not issued for; [`Error::Invalid`]
    /// (`fixed_variable`) for a fixed variable sent.
    pub(crate) fn admit(&mut self, grant: &RunGrant, endpoint: &str) -> Result<(), Error> {
        grant.admit_version(endpoint, self.version)?;
        self.fix_variables(&grant.fixed_variables).map_err(Error::from)
    }

    /// The rows a page holds: a JSON page at most [`MAX_LIMIT`](Self::MAX_LIMIT); a page in another format is
    /// bounded by the service's export limit, which the run checks. `None` is the default page size.
    ///
    /// # Errors
    /// [`Invalid`] (`limit`) out of range.
    pub fn page_limit(requested: Option<i64>, format: ResultFormat) -> Result<u32, Invalid> {
        let max = if format == ResultFormat::Json { Self::MAX_LIMIT } else { u32::MAX };
        match requested {
            None => Ok(Self::DEFAULT_LIMIT),
            Some(l) => u32::try_from(l).ok().filter(|l| (1..=max).contains(l)).ok_or_else(|| {
                Invalid::field("limit", format!("limit must be an integer between 1 and {max}."))
            }),
        }
    }

    /// The rows a page skips; `None` is none.
    ///
    /// # Errors
    /// [`Invalid`] (`offset`) for a negative offset.
    pub fn page_offset(requested: Option<i64>) -> Result<u64, Invalid> {
        requested.map_or(Ok(0), PageRequest::checked_offset)
    }

    /// # Errors
    /// [`Invalid`] (`variables`) for more than [`MAX_VARIABLES`](Self::MAX_VARIABLES) variables.
    pub fn check_variable_count(variables: &Map<String, Value>) -> Result<(), Invalid> {
        if variables.len() > Self::MAX_VARIABLES {
            return Err(Invalid::field(
                "variables",
                format!("A run takes at most {} variables.", Self::MAX_VARIABLES),
            ));
        }
        Ok(())
    }
}

/// Identifies one cacheable answer: the endpoint, its cache generation and the canonical request.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub project: ProjectId,
    pub name: EndpointName,
    /// Bumped by every update or delete of the endpoint, so older entries become unreachable at once.
    pub generation: u64,
    /// Version (or `latest`), variables as supplied, limit and offset, in one canonical text.
    pub request: String,
}

/// A computed run, as cached and as answered.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedRun {
    pub version: u32,
    pub version_created_at: Timestamp,
    pub result: QueryResult,
    pub computed_at: Timestamp,
    /// When the cache stops serving it; `None` when it was not cached.
    pub expires_at: Option<Timestamp>,
    pub query_time: std::time::Duration,
    pub endpoint_materialized: bool,
    /// When the stored result the answer was read from was computed.
    pub materialized_at: Option<Timestamp>,
    /// The time up to which appended rows are in the answer: when a live computation began reading, or the
    /// stored result's own.
    pub data_as_of: Timestamp,
    /// The bound variables, defaults included.
    pub variables: serde_json::Value,
    /// The serialized form of the fields above, written by the adapter that first answers with this run and
    /// reused by every later answer, so a cache hit writes only what differs per request.
    pub rendered: std::sync::OnceLock<Vec<u8>>,
    /// The entity tag, made at the first answer that needs it (see [`CachedRun::etag`]).
    pub tag: std::sync::OnceLock<String>,
    /// `data_as_of` in RFC 3339, written at the first answer that needs it (see [`CachedRun::as_of_text`]).
    pub as_of: std::sync::OnceLock<String>,
}

impl CachedRun {
    /// The entity tag of the result: a digest of the version, the columns and the rows (32 hex digits), so the
    /// same answer has the same tag on every node and any change of them a new one.
    pub fn etag(&self) -> &str {
        self.tag.get_or_init(|| {
            use sha2::{Digest, Sha256};
            let mut digest = Sha256::new();
            digest.update(self.version.to_be_bytes());
            for column in &self.result.columns {
                digest.update(column.name.as_bytes());
                digest.update([0]);
                digest.update(format!("{:?}", column.column_type).as_bytes());
                digest.update([0]);
            }
            digest.update(self.result.rows_json.as_bytes());
            hex::encode(&digest.finalize()[..16])
        })
    }

    /// `data_as_of` in RFC 3339 (UTC), formatted once for every answer with this run.
    pub fn as_of_text(&self) -> &str {
        self.as_of.get_or_init(|| {
            self.data_as_of
                .to_offset(time::UtcOffset::UTC)
                .format(&time::format_description::well_known::Rfc3339)
                .expect("a time a clock tells, in UTC, is one RFC 3339 writes")
        })
    }

    /// How long a client may keep this answer: until the cache stops serving it, none when it was not cached.
    pub fn fresh_for(&self, now: Timestamp) -> std::time::Duration {
        self.expires_at
            .map_or(std::time::Duration::ZERO, |at| (at - now).max(time::Duration::ZERO).unsigned_abs())
    }
    /// Approximate memory held, for byte-bounded caches (the rendered fields included).
    pub fn weight(&self) -> usize {
        self.result.rows_json.len()
            + self.result.columns.iter().map(|c| 2 * c.name.len() + 32).sum::<usize>()
            + 512
    }
}

/// What a run answers: the result (or none for `force_cache` without a cached one) and how it was obtained.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub name: EndpointName,
    pub run: Option<Arc<CachedRun>>,
    pub is_cached: bool,
    pub endpoint_materialized: bool,
    pub execution_id: Uuid,
    pub client_query_id: Option<String>,
    pub limit: u32,
    pub offset: u64,
    /// Wall time spent in the service for this request.
    pub total: Duration,
    /// How long a client may keep the answer: what the cache has left of it.
    pub fresh_for: Duration,
    /// The cursor of the next page, when rows follow this one.
    pub next: Option<String>,
}

/// A run written in another format than JSON.
#[derive(Debug)]
pub struct Exported {
    pub name: EndpointName,
    /// The version that ran.
    pub version: u32,
    /// The page: no rows for a `force_cache` run with no fresh stored result.
    pub export: crate::query::Export,
    /// When the stored result the page was read from was computed; `None` for a live page.
    pub materialized_at: Option<Timestamp>,
    /// The time up to which appended rows are in the page; `None` for a `force_cache` run with nothing stored.
    pub data_as_of: Option<Timestamp>,
    pub execution_id: Uuid,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn refresh_modes() {
        for mode in ["blocking", "force_blocking", "force_cache", "direct"] {
            assert_eq!(Refresh::parse(mode).unwrap().as_str(), mode);
        }
        for bad in ["async", "lazy_async", "force_async", "sometimes"] {
            assert_eq!(Refresh::parse(bad).unwrap_err().attr.as_deref(), Some("refresh"), "{bad}");
        }
    }

    #[test]
    fn a_request_takes_data_no_older_than_its_max_staleness() {
        let now = time::macros::datetime!(2026-11-22 10:00:45 UTC);
        let at = |ago: i64| now - time::Duration::seconds(ago);
        let any = RunRequest::default();
        assert!(any.takes(at(86_400 * 30), now));
        let ten = RunRequest { max_staleness: RunRequest::max_staleness(Some(10)).unwrap(), ..any.clone() };
        assert!(ten.takes(at(10), now) && ten.takes(at(0), now));
        assert!(!ten.takes(at(11), now));
        let zero = RunRequest { max_staleness: RunRequest::max_staleness(Some(0)).unwrap(), ..any };
        assert!(zero.takes(now, now) && !zero.takes(at(1), now));
        for bad in [-1, RunRequest::MAX_STALENESS_SECONDS + 1, i64::MIN] {
            assert_eq!(
                RunRequest::max_staleness(Some(bad)).unwrap_err().attr.as_deref(),
                Some("max_staleness_seconds")
            );
        }
        assert_eq!(RunRequest::max_staleness(None), Ok(None));
    }

    #[test]
    fn pages_are_bounded_by_their_format() {
        assert_eq!(RunRequest::page_limit(None, ResultFormat::Json), Ok(RunRequest::DEFAULT_LIMIT));
        assert_eq!(RunRequest::page_limit(Some(10_000), ResultFormat::Json), Ok(10_000));
        for bad in [0, -1, 10_001] {
            assert_eq!(
                RunRequest::page_limit(Some(bad), ResultFormat::Json).unwrap_err().attr.as_deref(),
                Some("limit")
            );
        }
        assert_eq!(RunRequest::page_limit(Some(1_000_000), ResultFormat::Csv), Ok(1_000_000));
        assert_eq!(RunRequest::page_offset(None), Ok(0));
        assert_eq!(RunRequest::page_offset(Some(-1)).unwrap_err().attr.as_deref(), Some("offset"));
        let many: Map<String, Value> =
            (0..=RunRequest::MAX_VARIABLES).map(|i| (format!("v{i}"), json!(1))).collect();
        assert!(RunRequest::check_variable_count(&many).is_err());
    }

    fn computed(version: u32, rows: &str, expires_in: Option<i64>) -> CachedRun {
        let at = time::macros::datetime!(2026-11-22 10:00 UTC);
        CachedRun {
            version,
            version_created_at: at,
            result: QueryResult {
                columns: vec![crate::query::Column {
                    name: "n".into(),
                    column_type: crate::query::ColumnType::Integer,
                }],
                rows_json: rows.into(),
                row_count: 1,
                has_more: false,
                statistics: crate::query::Statistics::default(),
                read: Vec::new(),
            },
            computed_at: at,
            expires_at: expires_in.map(|s| at + time::Duration::seconds(s)),
            query_time: Duration::ZERO,
            endpoint_materialized: false,
            materialized_at: None,
            data_as_of: at,
            variables: Value::Null,
            rendered: std::sync::OnceLock::new(),
            tag: std::sync::OnceLock::new(),
            as_of: std::sync::OnceLock::new(),
        }
    }

    #[test]
    fn the_tag_follows_the_result_and_nothing_else() {
        let tag = computed(1, r#"[{"n":1}]"#, Some(60)).etag().to_owned();
        assert_eq!(tag.len(), 32);
        assert_eq!(
            computed(1, r#"[{"n":1}]"#, None).etag(),
            tag,
            "the same answer, computed again or elsewhere"
        );
        assert_ne!(computed(2, r#"[{"n":1}]"#, Some(60)).etag(), tag, "another version");
        assert_ne!(computed(1, r#"[{"n":2}]"#, Some(60)).etag(), tag, "other rows");
    }

    #[test]
    fn an_answer_is_fresh_for_what_the_cache_has_left() {
        let now = time::macros::datetime!(2026-11-22 10:00:45 UTC);
        assert_eq!(computed(1, "[]", Some(60)).fresh_for(now), Duration::from_secs(15));
        assert_eq!(computed(1, "[]", Some(30)).fresh_for(now), Duration::ZERO, "expired");
        assert_eq!(computed(1, "[]", None).fresh_for(now), Duration::ZERO, "never cached");
    }
}
