//! The configuration file (`--config PATH` or `ENDPOINTS_CONFIG`): TOML whose keys are the long options'
//! names with underscores. Top-level keys set global options, the `[serve]` table sets `serve`'s.
//!
//! A file value becomes the option's default, so a flag beats the environment, the environment beats the file,
//! and the file beats the built-in default. Unknown keys and values of the wrong type are refused with the
//! file's name, before anything starts.
//!
//! ```toml
//! data_dir = "/var/lib/endpoints"
//! database_url = "postgres://endpoints@db/endpoints"
//! log_json = true
//!
//! [serve]
//! bind = "0.0.0.0:8000"
//! query_timeout_secs = 30
//! ```

use std::path::Path;

use clap::Command;

/// Sections of the file and the subcommand each configures (`None`: the global options).
const SECTIONS: [(&str, Option<&str>); 2] = [("", None), ("serve", Some("serve"))];

/// A problem with the configuration file.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {problem}")]
pub struct FileError {
    path: String,
    problem: String,
}

/// Reads `path` and makes its values the defaults of `command`'s options.
///
/// # Errors
/// [`FileError`] for an unreadable file, invalid TOML, an unknown key or a value that is not a string, number or
/// boolean.
pub fn apply(command: Command, path: &Path) -> Result<Command, FileError> {
    let fail = |problem: String| FileError { path: path.display().to_string(), problem };
    let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| fail(e.message().to_owned()))?;
    apply_table(command, &table).map_err(fail)
}

/// [`apply`] with a parsed file: its values become the defaults of `command`'s options.
///
/// # Errors
/// A sentence naming an unknown section or key, or a value that is not a string, number or boolean.
pub fn apply_table(mut command: Command, table: &toml::Table) -> Result<Command, String> {
    for (key, value) in table {
        if let toml::Value::Table(section) = value {
            let Some((_, Some(subcommand))) = SECTIONS.iter().find(|(name, _)| name == key) else {
                return Err(format!("unknown section [{key}]; the sections are: [serve]"));
            };
            let sub =
                command.find_subcommand(subcommand).cloned().ok_or_else(|| format!("no command {key}"))?;
            let sub = set_defaults(sub, section, &format!("[{key}] "))?;
            command = command.mut_subcommand(subcommand, |_| sub);
        }
    }
    let globals: toml::Table =
        table.iter().filter(|(_, v)| !v.is_table()).map(|(k, v)| (k.clone(), v.clone())).collect();
    set_defaults(command, &globals, "")
}

/// The option ids a file may set: every named option except the file itself, help, version and `--json` (which
/// is about one command's output, not the deployment).
fn settable(command: &Command) -> Vec<String> {
    command
        .get_arguments()
        .filter(|arg| {
            arg.get_long().is_some()
                && !["config", "help", "version", "json"].contains(&arg.get_id().as_str())
        })
        .map(|arg| arg.get_id().to_string())
        .collect()
}

fn set_defaults(mut command: Command, table: &toml::Table, section: &str) -> Result<Command, String> {
    let known = settable(&command);
    for (key, value) in table {
        if !known.contains(key) {
            return Err(format!("unknown setting {section}{key}; the settings are: {}", known.join(", ")));
        }
        // A list (`allow_sources = ["s3://a/", "s3://b/"]`) sets a repeatable setting's values.
        let repeatable = command
            .get_arguments()
            .find(|arg| arg.get_id() == key.as_str())
            .is_some_and(|arg| matches!(arg.get_action(), clap::ArgAction::Append));
        if let (toml::Value::Array(items), true) = (value, repeatable) {
            let values = items
                .iter()
                .map(|item| item.as_str().map(str::to_owned))
                .collect::<Option<Vec<String>>>()
                .ok_or_else(|| format!("{section}{key} must be a list of strings"))?;
            command = command.mut_arg(key.as_str(), |arg| arg.default_values(values));
            continue;
        }
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Float(f) => f.to_string(),
            other => {
                return Err(format!(
                    "{section}{key} must be a string, number or boolean, not {}",
                    other.type_str()
                ))
            }
        };
        command = command.mut_arg(key.as_str(), |arg| arg.default_value(text));
    }
    Ok(command)
}
