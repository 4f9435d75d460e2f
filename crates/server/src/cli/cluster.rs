//! `endpoints cluster`: a Ballista scheduler and executors in one process, reading the configured storage, for
//! `serve --engine ballista://...` (the `ballista` feature).

use clap::Args;
use query_engine::distributed::Cluster;
use serde_json::json;

use super::{print_json, CliError};
use crate::config::Config;
use crate::startup::{shutdown_signal, StartupError};

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// Executors to start.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub executors: u16,
    /// Tasks each executor runs at once; 0 means one per core.
    #[arg(long, default_value_t = 0)]
    pub slots: usize,
}

pub(super) async fn run(config: &Config, args: ClusterArgs, json: bool) -> Result<(), CliError> {
    let storage = config.storage().map_err(StartupError::Storage)?;
    let slots = match args.slots {
        0 => std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get),
        n => n,
    };
    let cluster = Cluster::start(&storage, usize::from(args.executors), slots)
        .await
        .map_err(|e| CliError::Usage(format!("cannot start the cluster: {e}")))?;
    if json {
        print_json(&json!({"engine": cluster.url(), "executors": args.executors, "slots": slots}));
    } else {
        println!(
            "Ballista scheduler with {} executor(s) of {slots} slot(s) over {}: serve with --engine {}",
            args.executors,
            storage.location(),
            cluster.url()
        );
    }
    shutdown_signal().await;
    Ok(())
}
