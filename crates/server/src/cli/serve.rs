//! `endpoints serve`

use clap::Args;

use super::CliError;
use crate::config::Config;
use crate::startup::{shutdown_signal, Application};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 picks a free port (the chosen address is logged).
    #[arg(long, env = "ENDPOINTS_BIND", default_value = "127.0.0.1:8000")]
    pub bind: String,
    /// HTTP worker threads (default: one per core).
    #[arg(long, env = "ENDPOINTS_WORKERS", default_value_t = 0)]
    pub workers: usize,
    /// Database connections in the pool.
    #[arg(long, env = "ENDPOINTS_DB_POOL_SIZE", default_value_t = 8)]
    pub pool_size: u32,
}

pub(super) async fn run(mut config: Config, args: ServeArgs) -> Result<(), CliError> {
    config.bind = args.bind;
    config.workers = args.workers;
    config.pool_size = args.pool_size;
    let app = Application::build(&config)?;
    app.run_until(shutdown_signal()).await?;
    tracing::info!("stopped");
    Ok(())
}
