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

fn apply_table(mut command: Command, table: &toml::Table) -> Result<Command, String> {
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

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches};

    use super::apply_table;
    use crate::cli::{Cli, Command as Sub};

    fn parse(file: &str, args: &[&str]) -> Result<Cli, String> {
        let command = apply_table(Cli::command(), &file.parse().map_err(|e| format!("{e}"))?)?;
        let matches = command.try_get_matches_from(args).map_err(|e| e.to_string())?;
        Cli::from_arg_matches(&matches).map_err(|e| e.to_string())
    }

    fn serve(cli: Cli) -> crate::cli::serve::ServeArgs {
        match cli.command {
            Sub::Serve(args) => args,
            other => panic!("not serve: {other:?}"),
        }
    }

    const FILE: &str = r#"
        data_dir = "/srv/endpoints"
        log_json = true

        [serve]
        bind = "0.0.0.0:9000"
        query_timeout_secs = 45
        materialize_workers = 0
    "#;

    #[test]
    fn file_values_are_defaults_that_flags_override() {
        let cli = parse(FILE, &["endpoints", "serve"]).unwrap();
        assert_eq!((cli.data_dir.to_str(), cli.log_json), (Some("/srv/endpoints"), true));
        let args = serve(cli);
        assert_eq!(
            (args.bind.as_str(), args.query_timeout_secs, args.materialize_workers),
            ("0.0.0.0:9000", 45, 0)
        );
        assert_eq!(args.pool_size, 8, "settings the file leaves out keep their defaults");

        let cli = parse(FILE, &["endpoints", "--data-dir", "/tmp/x", "serve", "--query-timeout-secs", "5"])
            .unwrap();
        assert_eq!(cli.data_dir.to_str(), Some("/tmp/x"));
        assert_eq!(serve(cli).query_timeout_secs, 5);
    }

    #[test]
    fn unknown_keys_sections_and_bad_values_are_refused() {
        for (file, expected) in [
            ("data_dri = \"x\"", "unknown setting data_dri"),
            ("[serve]\nquery_timeout = 3", "unknown setting [serve] query_timeout"),
            ("[server]\nbind = \"x\"", "unknown section [server]"),
            ("[serve]\nbind = [1, 2]", "[serve] bind must be a string, number or boolean"),
            ("[serve]\nworkers = \"many\"", "invalid value 'many'"),
        ] {
            let err =
                parse(file, &["endpoints", "serve"]).err().unwrap_or_else(|| panic!("{file} was accepted"));
            assert!(err.contains(expected), "{file}: {err}");
        }
    }

    #[test]
    fn every_setting_is_documented() {
        let doc = include_str!("../../../../docs/operations.md");
        let command = Cli::command();
        let serve = command.find_subcommand("serve").unwrap();
        for arg in command.get_arguments().chain(serve.get_arguments()) {
            let (Some(long), id) = (arg.get_long(), arg.get_id().as_str()) else { continue };
            if ["help", "version", "json"].contains(&id) {
                continue;
            }
            assert!(doc.contains(&format!("`--{long}`")), "docs/operations.md does not document --{long}");
            if let Some(env) = arg.get_env() {
                let env = env.to_string_lossy();
                assert!(doc.contains(&format!("`{env}`")), "docs/operations.md does not document {env}");
            }
        }
    }
}
