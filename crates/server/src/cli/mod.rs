//! The command line: global options, subcommands and their dispatch. One file per command.

#[cfg(feature = "ballista")]
mod cluster;
pub mod code;
mod data;
mod demo;
pub mod demo_data;
pub mod file;
mod key;
mod migrate;
mod project;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::config::Config;

pub use serve::ServeArgs;

/// Saved SQL query endpoints, served over HTTP.
#[derive(Debug, Parser)]
#[command(name = "endpoints", version, about)]
pub struct Cli {
    /// A TOML file of settings (see docs/operations.md); flags and environment variables override it.
    #[arg(long, global = true, env = "ENDPOINTS_CONFIG")]
    pub config: Option<PathBuf>,
    /// Directory for the embedded database and the project tables.
    #[arg(long, global = true, env = "ENDPOINTS_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
    /// Where project tables and stored results live: a directory, file:///PATH or s3://BUCKET[/PREFIX] (with
    /// the usual AWS_* variables). Default: DATA_DIR.
    #[arg(long, global = true, env = "ENDPOINTS_STORAGE")]
    pub storage: Option<String>,
    /// Where queries run: embedded (in this process) or ballista://HOST:PORT (a Ballista scheduler whose
    /// executors read the same storage; needs a build with the `ballista` feature).
    #[arg(long, global = true, env = "ENDPOINTS_ENGINE")]
    pub engine: Option<String>,
    /// Database URL: sqlite://PATH (default: DATA_DIR/endpoints.db) or postgres://USER:PASS@HOST/DB.
    #[arg(long, global = true, env = "DATABASE_URL")]
    pub database_url: Option<String>,
    /// Print command results as JSON, for scripts.
    #[arg(long, global = true)]
    pub json: bool,
    /// Log as JSON lines (for production log collectors).
    #[arg(long, global = true, env = "ENDPOINTS_LOG_JSON")]
    pub log_json: bool,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API until SIGINT or SIGTERM.
    Serve(serve::ServeArgs),
    /// Apply pending database migrations.
    Migrate,
    /// Manage projects.
    #[command(subcommand)]
    Project(project::ProjectCommand),
    /// Manage API keys.
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Load data into a project's tables, or list them.
    #[command(subcommand)]
    Data(data::DataCommand),
    /// Set up a demo project (with generated data and endpoints) and print a working API key and curl line.
    Demo(demo::DemoArgs),
    /// Run a Ballista scheduler and executors over the storage, for `--engine ballista://...`, until SIGINT or
    /// SIGTERM.
    #[cfg(feature = "ballista")]
    Cluster(cluster::ClusterArgs),
    /// Write a project's endpoints into a folder, one YAML file each (endpoints as code; docs/as-code.md).
    Pull(code::Target),
    /// Show how a server's endpoints differ from the folder's; exit 1 when they do.
    Diff(code::Target),
    /// Make a server's endpoints what the folder says: the plan, then each change (stops at the first error).
    Push(code::PushArgs),
    /// Run the folder's test cases against a server; exit 1 when one fails.
    Test(code::TestArgs),
}

impl Cli {
    /// Parses the command line. When a configuration file is named, its values become the defaults and the
    /// command line is read again, so flags and the environment still win.
    pub fn load() -> Self {
        let first = Self::parse();
        let Some(path) = first.config.clone() else { return first };
        let command = file::apply(Self::command(), &path).unwrap_or_else(|err| {
            eprintln!("error: {err}");
            std::process::exit(2);
        });
        let mut matches = command.get_matches();
        Self::from_arg_matches_mut(&mut matches).unwrap_or_else(|err| err.format(&mut Self::command()).exit())
    }

    fn config(&self) -> Config {
        let mut config = Config::new(&self.data_dir);
        config.database_url.clone_from(&self.database_url);
        config.storage.clone_from(&self.storage);
        config.engine.clone_from(&self.engine);
        config
    }
}

/// A command's failure: printed on stderr, exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Startup(#[from] crate::startup::StartupError),
    #[error(transparent)]
    Domain(#[from] domain::Error),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// A domain error as an operator should read it: validation details and not-found messages as they are, the
/// cause chain of internal errors.
fn describe(err: &CliError) -> String {
    let mut text = match err {
        CliError::Domain(domain::Error::Invalid(invalid)) => invalid.detail.clone(),
        other => other.to_string(),
    };
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs the parsed command line.
pub async fn run(cli: Cli) -> ExitCode {
    crate::telemetry::init(cli.log_json);
    let config = cli.config();
    let result = match cli.command {
        Command::Pull(target) => return code::exit(code::pull(target).await),
        Command::Diff(target) => return code::exit(code::diff(target).await),
        Command::Push(args) => return code::exit(code::push(args).await),
        Command::Test(args) => return code::exit(code::test(args).await),
        Command::Serve(args) => serve::run(config, args).await,
        Command::Migrate => migrate::run(&config, cli.json).await,
        Command::Project(command) => project::run(&config, command, cli.json).await,
        Command::Key(command) => key::run(&config, command, cli.json).await,
        Command::Data(command) => data::run(&config, command, cli.json).await,
        Command::Demo(args) => demo::run(&config, args, cli.json).await,
        #[cfg(feature = "ballista")]
        Command::Cluster(args) => cluster::run(&config, args, cli.json).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", describe(&err));
            ExitCode::FAILURE
        }
    }
}

/// Prints a value as one line of JSON.
fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

fn rfc3339(at: domain::Timestamp) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .expect("stored times are within years 0 to 9999")
}

/// A positive human duration (`humantime`: 90d, 12h, 30m, 45s, "1h 30m"), as flags take lifetimes and periods.
pub(crate) fn positive_duration(raw: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(raw) {
        Ok(duration) if duration.is_zero() => Err("the duration must be positive".into()),
        Ok(duration) => Ok(duration),
        Err(err) => Err(format!("{err}; write a duration such as 90d, 12h or 30m")),
    }
}
