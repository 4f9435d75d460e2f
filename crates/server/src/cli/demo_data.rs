//! A realistic, reproducible `events` table for the demo project: one row per product-analytics event.

use std::sync::Arc;

use datafusion::arrow::array::{Float64Array, RecordBatch, StringArray, TimestampMicrosecondArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// 2026-01-01T00:00:00Z in microseconds.
const START_MICROS: i64 = 1_767_225_600_000_000;
/// The events span 90 days from the start.
const SPAN_MICROS: i64 = 90 * 86_400 * 1_000_000;
const BATCH_ROWS: usize = 64 * 1024;

const EVENTS: [(&str, u32); 4] = [("pageview", 60), ("click", 25), ("signup", 10), ("purchase", 5)];
const COUNTRIES: [(&str, u32); 10] = [
    ("US", 30),
    ("GB", 12),
    ("DE", 11),
    ("FR", 9),
    ("IN", 9),
    ("BR", 8),
    ("JP", 7),
    ("CA", 6),
    ("ES", 4),
    ("NL", 4),
];
const BROWSERS: [(&str, u32); 5] =
    [("Chrome", 55), ("Safari", 25), ("Firefox", 9), ("Edge", 8), ("Opera", 3)];

/// The columns of `events`. Timestamps are UTC.
pub fn events_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("timestamp", DataType::Timestamp(TimeUnit::Microsecond, None), false),
        Field::new("event", DataType::Utf8, false),
        Field::new("distinct_id", DataType::Utf8, false),
        Field::new("country", DataType::Utf8, false),
        Field::new("browser", DataType::Utf8, false),
        Field::new("revenue", DataType::Float64, false),
    ]))
}

fn pick<'a>(rng: &mut StdRng, weighted: &[(&'a str, u32)]) -> &'a str {
    let total: u32 = weighted.iter().map(|(_, w)| w).sum();
    let mut roll = rng.random_range(0..total);
    for (value, weight) in weighted {
        if roll < *weight {
            return value;
        }
        roll -= weight;
    }
    weighted[0].0
}

/// `rows` events in batches; the same `seed` always gives the same rows.
pub fn events(rows: usize, seed: u64) -> impl Iterator<Item = RecordBatch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let schema = events_schema();
    let mut remaining = rows;
    std::iter::from_fn(move || {
        if remaining == 0 {
            return None;
        }
        let n = remaining.min(BATCH_ROWS);
        remaining -= n;
        let mut timestamps = Vec::with_capacity(n);
        let mut events = Vec::with_capacity(n);
        let mut users = Vec::with_capacity(n);
        let mut countries = Vec::with_capacity(n);
        let mut browsers = Vec::with_capacity(n);
        let mut revenue = Vec::with_capacity(n);
        for _ in 0..n {
            timestamps.push(START_MICROS + rng.random_range(0..SPAN_MICROS));
            let event = pick(&mut rng, &EVENTS);
            events.push(event);
            users.push(format!("user_{:05}", rng.random_range(0..50_000)));
            countries.push(pick(&mut rng, &COUNTRIES));
            browsers.push(pick(&mut rng, &BROWSERS));
            revenue.push(if event == "purchase" {
                f64::from(rng.random_range(500_u32..20_000)) / 100.0
            } else {
                0.0
            });
        }
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(TimestampMicrosecondArray::from(timestamps)),
                Arc::new(StringArray::from(events)),
                Arc::new(StringArray::from(users)),
                Arc::new(StringArray::from(countries)),
                Arc::new(StringArray::from(browsers)),
                Arc::new(Float64Array::from(revenue)),
            ],
        )
        .ok()
    })
}
