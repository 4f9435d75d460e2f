//! `endpoints`: parse the command line, run the command.

use std::process::ExitCode;

/// jemalloc with its background threads on: memory a compaction, a merge or a run freed goes back to the system
/// within seconds, where glibc's malloc kept it (docs/flows.md, "The allocator").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[actix_web::main]
async fn main() -> ExitCode {
    server::cli::run(server::cli::Cli::load()).await
}
