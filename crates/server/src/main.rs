//! `endpoints`: parse the command line, run the command.

use std::process::ExitCode;

/// mimalloc rather than the system allocator: a cached run allocates a few dozen small blocks, and glibc's
/// malloc and free were the largest item of its profile after the network (see docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[actix_web::main]
async fn main() -> ExitCode {
    server::cli::run(server::cli::Cli::load()).await
}
