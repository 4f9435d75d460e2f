//! `endpoints`: parse the command line, run the command.

use std::process::ExitCode;

use clap::Parser;

#[actix_web::main]
async fn main() -> ExitCode {
    server::cli::run(server::cli::Cli::parse()).await
}
