//! The baseline of `make bench`'s live-run scenario: the same SQL on bare DataFusion, with the session settings
//! the service's engine uses (no information_schema, a memory-capped runtime without spilling, the table
//! registered from its Parquet directory), timed round by round.
//!
//! `bench-datafusion TABLE_DIR SQL ROUNDS MEMORY_MB` prints `{"runs_ms": [...], "median_ms", "rows",
//! "peak_rss_kb"}`.

use std::time::Instant;

use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, table_dir, sql, rounds, memory_mb] = args.as_slice() else {
        eprintln!("usage: bench-datafusion TABLE_DIR SQL ROUNDS MEMORY_MB");
        std::process::exit(2);
    };
    let rounds: usize = rounds.parse()?;
    let memory: usize = memory_mb.parse::<usize>()? * 1024 * 1024;
    let mut runs_ms = Vec::with_capacity(rounds);
    let mut rows = 0;
    for _ in 0..rounds {
        let started = Instant::now();
        // A session per run, as the service makes one per query.
        let runtime = RuntimeEnvBuilder::new()
            .with_disk_manager_builder(DiskManagerBuilder::default().with_mode(DiskManagerMode::Disabled))
            .with_memory_limit(memory, 1.0)
            .build_arc()?;
        let mut config = SessionConfig::new().with_information_schema(false);
        // `BENCH_DATAFUSION_OPTIONS="key=value,..."`: settings to try against the defaults, by hand.
        for option in std::env::var("BENCH_DATAFUSION_OPTIONS").unwrap_or_else(|_| String::new()).split(',') {
            if let Some((key, value)) = option.split_once('=') {
                config.options_mut().set(key.trim(), value.trim())?;
            }
        }
        let ctx = SessionContext::new_with_config_rt(config, runtime);
        ctx.register_parquet("events", &format!("{table_dir}/"), ParquetReadOptions::default()).await?;
        // `BENCH_DATAFUSION_TABLES="name=dir,..."`: more tables the SQL reads (a join's other side).
        for table in std::env::var("BENCH_DATAFUSION_TABLES").unwrap_or_else(|_| String::new()).split(',') {
            if let Some((name, dir)) = table.split_once('=') {
                ctx.register_parquet(name.trim(), &format!("{}/", dir.trim()), ParquetReadOptions::default())
                    .await?;
            }
        }
        let batches = ctx.sql(sql).await?.collect().await?;
        rows = batches.iter().map(|b| b.num_rows()).sum::<usize>();
        // `BENCH_DATAFUSION_PRINT=1`: the answer on stderr (with `EXPLAIN ANALYZE ...`, where the time goes).
        if std::env::var_os("BENCH_DATAFUSION_PRINT").is_some() {
            eprintln!("{}", datafusion::arrow::util::pretty::pretty_format_batches(&batches)?);
        }
        runs_ms.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    let mut sorted = runs_ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    println!(
        "{}",
        serde_json::json!({"runs_ms": runs_ms, "median_ms": median, "rows": rows, "peak_rss_kb": peak_rss_kb()})
    );
    Ok(())
}
