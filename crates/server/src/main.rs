//! `endpoints`: parse the command line, run the command.

use std::process::ExitCode;

#[actix_web::main]
async fn main() -> ExitCode {
    server::cli::run(server::cli::Cli::load()).await
}
