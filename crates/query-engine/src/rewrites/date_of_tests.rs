//! `date_of` answers as `CAST(ts AS DATE)`: over random timestamps of every unit (before 1970, at midnight,
//! NULL, at the ends of what dates can hold), with and without a time zone, in a projection, a GROUP BY and a
//! filter; and it is taken only where the date is the UTC one.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::datasource::MemTable;
use datafusion::prelude::SessionContext;
use proptest::prelude::*;

use super::tests::{answer, block_on, optimized};

const UNITS: [TimeUnit; 4] =
    [TimeUnit::Second, TimeUnit::Millisecond, TimeUnit::Microsecond, TimeUnit::Nanosecond];

fn per_second(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

/// A table `t(ts)` of `seconds` (and a fraction of one: `units` past them), as timestamps of `unit` in `zone`.
fn session(
    values: &[Option<(i64, i64)>],
    unit: TimeUnit,
    zone: Option<&str>,
    rewrites: bool,
) -> SessionContext {
    let raw: Int64Array = values
        .iter()
        .map(|value| {
            value.map(|(seconds, units)| seconds.saturating_mul(per_second(unit)).saturating_add(units))
        })
        .collect();
    let data_type = DataType::Timestamp(unit, zone.map(Into::into));
    let timestamps = cast(&(Arc::new(raw) as ArrayRef), &data_type).unwrap();
    let schema = Arc::new(Schema::new(vec![Field::new("ts", data_type, true)]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![timestamps]).unwrap();
    let ctx = SessionContext::new();
    if rewrites {
        super::register(&ctx);
    }
    ctx.register_table("t", Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())).unwrap();
    ctx
}

const QUERIES: &[&str] = &[
    "SELECT CAST(ts AS DATE) FROM t",
    "SELECT CAST(date_trunc('day', ts) AS DATE) AS day, count(*) AS n FROM t GROUP BY 1 ORDER BY 1",
    "SELECT CAST(date_trunc('DAY', ts) AS DATE), count(*) FROM t GROUP BY CAST(date_trunc('DAY', ts) AS DATE) \
     ORDER BY 1",
    "SELECT count(*) AS n FROM t WHERE CAST(ts AS DATE) >= DATE '1970-01-01'",
    "SELECT CAST(date_trunc('hour', ts) AS DATE) AS d FROM t ORDER BY d",
];

/// Seconds around the epoch, midnights, the days of a year, and far from it (up to what every unit holds).
fn seconds() -> impl Strategy<Value = i64> {
    prop_oneof![
        -200_000_i64..200_000,
        (-1000_i64..1000).prop_map(|day| day * 86_400),
        (-1000_i64..1000).prop_map(|day| day * 86_400 - 1),
        -9_000_000_000_i64..9_000_000_000,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_timestamps_date_is_the_casts(
        values in prop::collection::vec(prop::option::weighted(0.9, (seconds(), 0_i64..1_000_000_000)), 0..40),
        unit in prop::sample::select(&UNITS[..]),
        zone in prop::sample::select(&[None, Some("UTC"), Some("+00:00"), Some("+05:30"), Some("America/New_York")][..]),
    ) {
        let values: Vec<_> =
            values.into_iter().map(|v| v.map(|(seconds, units)| (seconds, units % per_second(unit)))).collect();
        let (rewritten, plain) = (session(&values, unit, zone, true), session(&values, unit, zone, false));
        for sql in QUERIES {
            prop_assert_eq!(block_on(answer(&rewritten, sql)), block_on(answer(&plain, sql)), "{}", sql);
        }
    }
}

#[test]
fn a_cast_to_a_date_is_divided_only_where_the_date_is_the_utc_one() {
    let values = [Some((86_400, 0))];
    for (zone, taken) in
        [(None, true), (Some("UTC"), true), (Some("+00:00"), true), (Some("Europe/Paris"), false)]
    {
        let ctx = session(&values, TimeUnit::Microsecond, zone, true);
        for sql in
            ["SELECT CAST(ts AS DATE) FROM t", "SELECT CAST(date_trunc('day', ts) AS DATE) AS d FROM t"]
        {
            let plan = block_on(optimized(&ctx, sql));
            assert_eq!(plan.contains("date_of(t.ts)"), taken, "{zone:?} {sql}: {plan}");
            assert_eq!(
                plan.contains("date_trunc"),
                sql.contains("date_trunc") && !taken,
                "{zone:?} {sql}: {plan}"
            );
        }
    }
    // Another truncation than the day's is kept under it.
    let ctx = session(&values, TimeUnit::Microsecond, None, true);
    let plan = block_on(optimized(&ctx, "SELECT CAST(date_trunc('month', ts) AS DATE) AS d FROM t"));
    assert!(plan.contains("date_of(date_trunc(Utf8(\"month\"), t.ts))"), "{plan}");
}

#[test]
fn a_timestamp_no_date_can_hold_fails_as_the_cast_does() {
    // Seconds past year 262,143: the cast fails on it, and so does the rewritten plan.
    let values = [Some((0, 0)), Some((9_000_000_000_000_000, 0))];
    let (rewritten, plain) =
        (session(&values, TimeUnit::Second, None, true), session(&values, TimeUnit::Second, None, false));
    let sql = "SELECT CAST(ts AS DATE) AS d FROM t";
    let failed = block_on(answer(&plain, sql));
    assert!(failed.starts_with("error:"), "{failed}");
    assert_eq!(block_on(answer(&rewritten, sql)), failed);
}
