//! `endpoints data import|list`: load files into a project's tables and see what is loaded.

use std::path::PathBuf;

use clap::Subcommand;
use domain::{ProjectId, ProjectStore};
use indicatif::{ProgressBar, ProgressStyle};
use query_engine::tables::imports::{import_files, parse_format, ImportMode};
use serde_json::{json, Value};

use super::{print_json, CliError};
use crate::config::Config;
use crate::startup::Services;

#[derive(Debug, Subcommand)]
pub enum DataCommand {
    /// Load Parquet, CSV (with a header row) or NDJSON files into a table, as Parquet.
    Import {
        #[arg(long)]
        project: i64,
        /// Table name: a letter, then letters, digits and '_' (write one with capitals in double quotes in SQL).
        #[arg(long)]
        table: String,
        /// Add the rows to the table instead of replacing it (the columns must match).
        #[arg(long)]
        append: bool,
        /// parquet, csv or ndjson; by default taken from each file's extension.
        #[arg(long)]
        format: Option<String>,
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// List the tables of one project or of all.
    List {
        #[arg(long)]
        project: Option<i64>,
    },
}

fn project_id(raw: i64) -> Result<ProjectId, CliError> {
    ProjectId::new(raw).map_err(|e| CliError::Usage(e.detail))
}

/// A bar on stderr of the bytes of `files` read, with the rows written, the rate and the time left; invisible
/// when stderr is not a terminal.
fn import_bar(files: &[PathBuf]) -> ProgressBar {
    // A file that cannot be read is reported by the import itself.
    let total = files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:30} {binary_bytes}/{binary_total_bytes} ({binary_bytes_per_sec}, {eta} left) {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    bar
}

/// A spinner on stderr counting rows; invisible when stderr is not a terminal.
pub(super) fn progress(message: &'static str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg}: {human_pos} rows ({per_sec})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

pub(super) async fn run(config: &Config, command: DataCommand, json: bool) -> Result<(), CliError> {
    let services = Services::open(config)?;
    match command {
        DataCommand::Import { project, table, append, format, files } => {
            let project = project_id(project)?;
            if services.store.get(project).await.map_err(domain::Error::from)?.is_none() {
                return Err(CliError::Usage(format!("project {project} does not exist")));
            }
            let format = format.as_deref().map(parse_format).transpose().map_err(CliError::Usage)?;
            let mode = if append { ImportMode::Append } else { ImportMode::Replace };
            let bar = import_bar(&files);
            let total = bar.length().unwrap_or(0);
            let report =
                import_files(services.engine.storage(), project, &table, &files, format, mode, &|at| {
                    // Parquet footers are read twice: the count may pass the files' size.
                    bar.set_position(at.bytes_read.min(total));
                    bar.set_message(format!("{} rows", indicatif::HumanCount(at.rows)));
                })
                .await
                .map_err(|e| CliError::Usage(e.to_string()));
            bar.finish_and_clear();
            let report = report?;
            // As an upload through the API: the readers' cached runs go, their stored results follow.
            if let Ok(name) = domain::TableName::parse(&report.table) {
                if let Err(err) = services.tables.imported(project, &name, !append).await {
                    tracing::warn!(table = %name, error = %err, "cannot tell the table's readers of the import");
                }
            }
            if json {
                print_json(
                    &json!({"project_id": project.get(), "table": report.table, "rows": report.rows, "files": report.files}),
                );
            } else {
                let verb = if append { "Appended" } else { "Loaded" };
                println!(
                    "{verb} {} rows from {} file(s) into table '{}' of project {project}",
                    report.rows, report.files, report.table
                );
            }
        }
        DataCommand::List { project } => {
            let projects = match project {
                Some(id) => vec![project_id(id)?],
                None => ProjectStore::list(&*services.store)
                    .await
                    .map_err(domain::Error::from)?
                    .into_iter()
                    .map(|p| p.id)
                    .collect(),
            };
            let mut listed = Vec::new();
            for project in projects {
                for table in services.engine.tables(project).await.map_err(domain::Error::from)? {
                    listed.push((project, table));
                }
            }
            if json {
                let view = |(project, table): &(ProjectId, query_engine::TableFiles)| {
                    json!({"project_id": project.get(), "table": table.name, "files": table.files,
                           "bytes": table.bytes, "location": table.location})
                };
                print_json(&Value::Array(listed.iter().map(view).collect()));
            } else {
                for (project, table) in &listed {
                    println!(
                        "project {:>4}  {:<24} {:>4} file(s) {:>12} bytes",
                        project.get(),
                        table.name,
                        table.files,
                        table.bytes
                    );
                }
            }
        }
    }
    Ok(())
}
