//! A run's answer.
//!
//! It is written in three parts, so that a cache hit writes only what differs per request: the members of this
//! request ([`PerRequest`], written by hand: through a derived `Serialize` they cost a cached run more than all
//! of its other JSON), the members of the computed run ([`Computed`], serialized once at the run's first answer
//! and kept with the cached run), and the rows as the engine wrote them. Its schema is those two types' and the
//! rows', merged into one object. Read back (by clients and the API tests), it is a [`RunResult`]: those two
//! types, owned, and the rows.

use std::borrow::Cow;

use domain::{CachedRun, RunOutcome};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use time::OffsetDateTime;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};
use uuid::Uuid;

use super::millis;

/// Time spent answering, in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Timings {
    /// In the engine or the stored result; 0 for an answer from the cache.
    pub query_ms: f64,
    /// In the service, from the request's arrival.
    pub total_ms: f64,
}

/// The members of a run's answer that differ from one request to the next.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct PerRequest<'a> {
    /// As the request sent it.
    #[schema(value_type = Option<String>, required = true)]
    pub client_query_id: Option<Cow<'a, str>>,
    /// New for every answer.
    pub execution_id: Uuid,
    pub is_cached: bool,
    pub limit: u32,
    #[schema(value_type = String)]
    pub name: Cow<'a, str>,
    /// The cursor of the next page, when rows follow this one (null otherwise, and for a page of a stored
    /// result, which pages by `offset`): send it as `cursor`, with the same variables, for the next page of the
    /// same snapshot of the tables, while rows are appended or compacted. Valid for `--cursor-ttl` (1 hour).
    #[schema(value_type = Option<String>, required = true)]
    pub next: Option<Cow<'a, str>>,
    pub offset: u64,
    #[schema(inline)]
    pub timings: Timings,
}

impl PerRequest<'_> {
    /// Appends the members, without braces, exactly as the derived `Serialize` writes them: names as constant
    /// bytes, values through `serde_json`.
    fn write_members(&self, body: &mut Vec<u8>) {
        let mut id = Uuid::encode_buffer();
        body.extend_from_slice(b"\"client_query_id\":");
        serde_json::to_writer(&mut *body, &self.client_query_id).expect("a Vec takes every write");
        body.extend_from_slice(b",\"execution_id\":\"");
        body.extend_from_slice(self.execution_id.hyphenated().encode_lower(&mut id).as_bytes());
        body.extend_from_slice(b"\",\"is_cached\":");
        body.extend_from_slice(if self.is_cached { b"true" } else { b"false" });
        body.extend_from_slice(b",\"limit\":");
        serde_json::to_writer(&mut *body, &self.limit).expect("a Vec takes every write");
        body.extend_from_slice(b",\"name\":");
        serde_json::to_writer(&mut *body, &*self.name).expect("a Vec takes every write");
        body.extend_from_slice(b",\"next\":");
        serde_json::to_writer(&mut *body, &self.next).expect("a Vec takes every write");
        body.extend_from_slice(b",\"offset\":");
        serde_json::to_writer(&mut *body, &self.offset).expect("a Vec takes every write");
        body.extend_from_slice(b",\"timings\":{\"query_ms\":");
        serde_json::to_writer(&mut *body, &self.timings.query_ms).expect("a Vec takes every write");
        body.extend_from_slice(b",\"total_ms\":");
        serde_json::to_writer(&mut *body, &self.timings.total_ms).expect("a Vec takes every write");
        body.push(b'}');
    }
}

/// The members of a run's answer that are the same for every answer with one computed run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Computed<'a> {
    /// When the cache stops serving this result; null when it was not cached.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub cache_expires_at: Option<OffsetDateTime>,
    /// The column names, in order.
    #[schema(value_type = Vec<String>)]
    pub columns: Vec<Cow<'a, str>>,
    /// Whether the rows were read from the endpoint's stored result.
    pub endpoint_materialized: bool,
    /// When that stored result was computed.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub endpoint_materialized_at: Option<OffsetDateTime>,
    /// The time up to which appended rows are in the answer: when its computation began reading the tables,
    /// or the stored result's own; null when there is no result. Also the `X-Data-As-Of` header.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub data_as_of: Option<OffsetDateTime>,
    /// The version that ran; null when nothing was cached for `force_cache`.
    #[schema(required = true)]
    pub endpoint_version: Option<u32>,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub endpoint_version_created_at: Option<OffsetDateTime>,
    /// Whether rows follow this page.
    #[serde(rename = "hasMore")]
    pub has_more: bool,
    /// When the result was computed.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(required = true)]
    pub last_refresh: Option<OffsetDateTime>,
    #[schema(inline)]
    pub statistics: RunStatistics,
    /// `[name, type]` of each column.
    #[schema(value_type = Vec<Vec<String>>)]
    pub types: Vec<(Cow<'a, str>, domain::ColumnType)>,
}

/// What computing the result read and took, from the engine's metrics; an answer from the cache or a stored
/// result reports the computation it came from, an answer with no result zeros.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RunStatistics {
    /// Rows read from the tables (or from the stored result); null when the engine cannot tell (Ballista).
    #[schema(required = true)]
    pub rows_read: Option<u64>,
    /// Bytes read from storage for them; null when the engine cannot tell.
    #[schema(required = true)]
    pub bytes_read: Option<u64>,
    /// Planning and execution in the engine.
    pub elapsed_ms: f64,
}

impl RunStatistics {
    fn of(statistics: Option<&domain::Statistics>) -> Self {
        match statistics {
            Some(s) => {
                Self { rows_read: s.rows_read, bytes_read: s.bytes_read, elapsed_ms: millis(s.elapsed) }
            }
            None => Self { rows_read: Some(0), bytes_read: Some(0), elapsed_ms: 0.0 },
        }
    }
}

impl Computed<'_> {
    fn of(run: Option<&CachedRun>) -> Computed<'_> {
        let result = run.map(|r| &r.result);
        Computed {
            cache_expires_at: run.and_then(|r| r.expires_at),
            columns: result
                .map_or_else(Vec::new, |r| r.columns.iter().map(|c| Cow::from(c.name.as_str())).collect()),
            endpoint_materialized: run.is_some_and(|r| r.endpoint_materialized),
            endpoint_materialized_at: run.and_then(|r| r.materialized_at),
            data_as_of: run.map(|r| r.data_as_of),
            endpoint_version: run.map(|r| r.version),
            endpoint_version_created_at: run.map(|r| r.version_created_at),
            has_more: result.is_some_and(|r| r.has_more),
            last_refresh: run.map(|r| r.computed_at),
            statistics: RunStatistics::of(result.map(|r| &r.statistics)),
            types: result.map_or_else(Vec::new, |r| {
                r.columns.iter().map(|c| (Cow::from(c.name.as_str()), c.column_type)).collect()
            }),
        }
    }

    /// The members, without braces.
    fn members(&self) -> Vec<u8> {
        let mut fields = Vec::with_capacity(512);
        // Serializing plain fields into memory cannot fail; if it did, the members are left out and the body
        // stays valid JSON.
        if serde_json::to_writer(&mut fields, self).is_err() || fields.len() < 2 {
            return Vec::new();
        }
        fields.remove(0);
        fields.pop();
        fields
    }
}

/// A run's answer as a client reads it: the members of the request and of the computed run, and the rows.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct RunResult {
    #[serde(flatten)]
    pub request: PerRequest<'static>,
    #[serde(flatten)]
    pub computed: Computed<'static>,
    /// The page of rows, keyed by column name (typed per endpoint); null when nothing was cached for
    /// `force_cache`.
    pub results: Value,
}

/// A run's answer.
pub(crate) struct RunAnswer<'a> {
    request: PerRequest<'a>,
    run: Option<&'a CachedRun>,
}

impl<'a> RunAnswer<'a> {
    pub(crate) fn of(outcome: &'a RunOutcome) -> Self {
        let run = outcome.run.as_deref();
        let query_ms = match run {
            Some(run) if !outcome.is_cached => millis(run.query_time),
            _ => 0.0,
        };
        let request = PerRequest {
            client_query_id: outcome.client_query_id.as_deref().map(Cow::Borrowed),
            execution_id: outcome.execution_id,
            is_cached: outcome.is_cached,
            limit: outcome.limit,
            name: Cow::Borrowed(outcome.name.as_str()),
            next: outcome.next.as_deref().map(Cow::Borrowed),
            offset: outcome.offset,
            timings: Timings { query_ms, total_ms: millis(outcome.total) },
        };
        Self { request, run }
    }

    /// The whole body, in a buffer sized for it. The rows and the run's members are copied as they are.
    pub(crate) fn write(&self) -> Vec<u8> {
        let fresh;
        let computed: &[u8] = match self.run {
            Some(run) => run.rendered.get_or_init(|| Computed::of(Some(run)).members()),
            None => {
                fresh = Computed::of(None).members();
                &fresh
            }
        };
        let rows = self.run.map_or("null", |r| r.result.rows_json.as_str());
        let mut body = Vec::with_capacity(rows.len() + computed.len() + 256);
        body.push(b'{');
        self.request.write_members(&mut body);
        if !computed.is_empty() {
            body.push(b',');
            body.extend_from_slice(computed);
        }
        body.extend_from_slice(b",\"results\":");
        body.extend_from_slice(rows.as_bytes());
        body.push(b'}');
        body
    }

    /// The answer's schema with `rows` as the schema of `results` (typed per column in an endpoint's own
    /// document).
    pub(crate) fn schema_with_rows(rows: RefOr<Schema>) -> Schema {
        let mut answer = ObjectBuilder::new();
        for part in [PerRequest::schema(), Computed::schema()] {
            if let RefOr::T(Schema::Object(object)) = part {
                for (name, property) in object.properties {
                    answer = answer.property(name, property);
                }
                for name in object.required {
                    answer = answer.required(name);
                }
            }
        }
        let results = ArrayBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
            .items(rows)
            .description(Some(
                "The page of rows, keyed by column name; null when nothing was cached for `force_cache`.",
            ));
        Schema::Object(answer.property("results", results).required("results").build())
    }
}

impl PartialSchema for RunAnswer<'_> {
    fn schema() -> RefOr<Schema> {
        let row =
            ObjectBuilder::new().schema_type(Type::Object).description(Some("A row: column name to value."));
        RunAnswer::schema_with_rows(row.into()).into()
    }
}

impl ToSchema for RunAnswer<'_> {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("RunResult")
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use domain::{CachedRun, Column, ColumnType, EndpointName, QueryResult, RunOutcome};
    use serde_json::{json, Value};
    use time::macros::datetime;

    use super::*;

    fn outcome(run: Option<Arc<CachedRun>>, is_cached: bool, client_query_id: Option<&str>) -> RunOutcome {
        RunOutcome {
            name: EndpointName::parse("sales").unwrap(),
            endpoint_materialized: false,
            run,
            is_cached,
            execution_id: uuid::Uuid::new_v4(),
            client_query_id: client_query_id.map(str::to_owned),
            limit: 10,
            offset: 20,
            total: Duration::from_micros(1500),
            fresh_for: Duration::ZERO,
            next: None,
        }
    }

    fn parse(body: &[u8]) -> Value {
        serde_json::from_slice(body).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(body)))
    }

    fn is_required(schema: &Schema, name: &str) -> bool {
        matches!(schema, Schema::Object(o) if o.required.iter().any(|r| r == name))
    }

    fn write(outcome: &RunOutcome) -> Value {
        parse(&RunAnswer::of(outcome).write())
    }

    #[test]
    fn a_cache_hit_reuses_the_run_fields_and_writes_its_own() {
        let at = datetime!(2026-11-22 10:00 UTC);
        let run = Arc::new(CachedRun {
            version: 3,
            version_created_at: at,
            result: QueryResult {
                columns: vec![Column { name: "n\"x".into(), column_type: ColumnType::Integer }],
                rows_json: r#"[{"n\"x":1}]"#.into(),
                row_count: 1,
                has_more: true,
                statistics: domain::Statistics {
                    rows_read: Some(1200),
                    bytes_read: Some(34_567),
                    elapsed: Duration::from_micros(6_500),
                },
                read: Vec::new(),
            },
            computed_at: at,
            expires_at: Some(at + Duration::from_secs(60)),
            query_time: Duration::from_millis(7),
            endpoint_materialized: false,
            materialized_at: None,
            data_as_of: at - Duration::from_secs(1),
            variables: json!({}),
            rendered: std::sync::OnceLock::new(),
            tag: std::sync::OnceLock::new(),
            as_of: std::sync::OnceLock::new(),
        });
        let first = write(&outcome(Some(Arc::clone(&run)), false, None));
        assert!(run.rendered.get().is_some(), "the first answer keeps the run's fields");
        let answer = outcome(Some(Arc::clone(&run)), true, Some("q-\"1"));
        let hit = write(&answer);
        assert_eq!(
            hit,
            json!({
                "client_query_id": "q-\"1",
                "execution_id": answer.execution_id.hyphenated().to_string(),
                "is_cached": true,
                "limit": 10,
                "name": "sales",
                "next": null,
                "offset": 20,
                "timings": {"query_ms": 0.0, "total_ms": 1.5},
                "cache_expires_at": "2026-11-22T10:01:00Z",
                "columns": ["n\"x"],
                "endpoint_materialized": false,
                "endpoint_materialized_at": null,
                "data_as_of": "2026-11-22T09:59:59Z",
                "endpoint_version": 3,
                "endpoint_version_created_at": "2026-11-22T10:00:00Z",
                "hasMore": true,
                "last_refresh": "2026-11-22T10:00:00Z",
                "statistics": {"rows_read": 1200, "bytes_read": 34567, "elapsed_ms": 6.5},
                "types": [["n\"x", "integer"]],
                "results": [{"n\"x": 1}],
            })
        );
        assert_eq!(
            (
                first["is_cached"].clone(),
                first["timings"]["query_ms"].clone(),
                first["client_query_id"].clone()
            ),
            (json!(false), json!(7.0), Value::Null)
        );
        assert_ne!(first["execution_id"], hit["execution_id"]);
        for field in ["columns", "types", "results", "cache_expires_at", "last_refresh", "statistics"] {
            assert_eq!(first[field], hit[field], "{field}");
        }
    }

    /// What a run writes reads back as a [`RunResult`], the type clients and the API tests decode it into.
    #[test]
    fn an_answer_reads_back_as_a_run_result() {
        let body = RunAnswer::of(&outcome(None, true, Some("q-1"))).write();
        let read: RunResult = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (read.request.client_query_id.as_deref(), read.request.is_cached, read.request.name.as_ref()),
            (Some("q-1"), true, "sales")
        );
        assert_eq!((read.request.limit, read.request.offset, read.computed.endpoint_version), (10, 20, None));
        assert_eq!(read.results, Value::Null);
    }

    #[test]
    fn nothing_cached_is_answered_with_empty_run_fields() {
        let body = write(&outcome(None, false, None));
        assert_eq!(body["results"], Value::Null);
        assert_eq!((body["columns"].clone(), body["endpoint_version"].clone()), (json!([]), Value::Null));
        assert_eq!(body["name"], "sales");
        assert_eq!(
            body["statistics"],
            json!({"rows_read": 0, "bytes_read": 0, "elapsed_ms": 0.0}),
            "nothing read"
        );
    }

    /// The hand-written members are byte for byte what the derived `Serialize` writes, so the schema derived
    /// from the type is the schema of the answer.
    #[test]
    fn per_request_members_are_written_as_serde_writes_them() {
        for (client_query_id, is_cached, query_ms) in
            [(None, false, 7.25), (Some("q-\"1\u{7}é"), true, 0.0), (Some(""), false, 1e-3)]
        {
            let members = PerRequest {
                client_query_id: client_query_id.map(Cow::Borrowed),
                execution_id: Uuid::new_v4(),
                is_cached,
                limit: u32::MAX,
                name: Cow::Borrowed("a_b-c"),
                next: client_query_id.map(|_| Cow::Borrowed("eyJwIjoxfQ")),
                offset: u64::MAX,
                timings: Timings { query_ms, total_ms: 12.5 },
            };
            let mut written = vec![b'{'];
            members.write_members(&mut written);
            written.push(b'}');
            assert_eq!(String::from_utf8(written).unwrap(), serde_json::to_string(&members).unwrap());
        }
    }

    #[test]
    fn the_schema_names_every_member_the_answer_has() {
        let schema = RunAnswer::schema_with_rows(ObjectBuilder::new().into());
        let Schema::Object(object) = &schema else { panic!("an object") };
        let mut declared: Vec<&str> = object.properties.keys().map(String::as_str).collect();
        declared.sort_unstable();
        let body = write(&outcome(None, false, None));
        let mut written: Vec<&str> = body.as_object().unwrap().keys().map(String::as_str).collect();
        written.sort_unstable();
        assert_eq!(declared, written);
        assert!(is_required(&schema, "results") && is_required(&schema, "endpoint_version"));
        assert!(!matches!(object.properties["timings"], RefOr::Ref(_)), "timings are inlined");
    }
}
