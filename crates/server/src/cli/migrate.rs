//! `endpoints migrate`: the database's schema, then the tables of earlier releases as Delta tables.

use query_engine::{DataFusionEngine, TablesUpgraded};
use store_diesel::{Database, DatabaseConfig};

use super::{print_json, CliError};
use crate::config::Config;
use crate::startup::StartupError;

pub(super) async fn run(config: &Config, json: bool) -> Result<(), CliError> {
    let database =
        Database::connect(&DatabaseConfig::new(config.database_url())).map_err(StartupError::Database)?;
    let applied = database.migrate().map_err(StartupError::Database)?;
    let tables = upgrade_tables(config).await?;
    if json {
        print_json(&serde_json::json!({ "applied": applied, "tables_converted": tables.converted }));
        return Ok(());
    }
    if applied.is_empty() {
        println!("The database is up to date.");
    } else {
        println!("Applied {} migration(s): {}", applied.len(), applied.join(", "));
    }
    if !tables.converted.is_empty() {
        println!(
            "Converted {} table(s) into Delta tables: {}",
            tables.converted.len(),
            tables.converted.join(", ")
        );
    }
    Ok(())
}

/// Converts the tables an earlier release wrote into Delta tables (nothing when every table is one already).
pub(super) async fn upgrade_tables(config: &Config) -> Result<TablesUpgraded, CliError> {
    let storage = config.storage().map_err(StartupError::Storage)?;
    let upgraded = DataFusionEngine::new(storage).upgrade_tables().await;
    Ok(upgraded.map_err(|e| StartupError::Engine(e.to_string()))?)
}
