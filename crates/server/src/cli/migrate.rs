//! `endpoints migrate`

use store_diesel::{Database, DatabaseConfig};

use super::{print_json, CliError};
use crate::config::Config;
use crate::startup::StartupError;

pub(super) fn run(config: &Config, json: bool) -> Result<(), CliError> {
    let database =
        Database::connect(&DatabaseConfig::new(config.database_url())).map_err(StartupError::Database)?;
    let applied = database.migrate().map_err(StartupError::Database)?;
    if json {
        print_json(&serde_json::json!({ "applied": applied }));
    } else if applied.is_empty() {
        println!("The database is up to date.");
    } else {
        println!("Applied {} migration(s): {}", applied.len(), applied.join(", "));
    }
    Ok(())
}
