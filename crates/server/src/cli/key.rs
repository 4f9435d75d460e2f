//! `endpoints key create|list|revoke`

use clap::Subcommand;
use domain::{ApiKey, NewApiKey, ProjectId, Scope};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{print_json, rfc3339, CliError};
use crate::config::Config;
use crate::startup::Services;

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Create an API key. The secret is printed once and never stored.
    Create {
        /// The project the key gives access to.
        #[arg(long)]
        project: i64,
        /// endpoint:read, endpoint:write (implies endpoint:read), table:read, table:write (implies table:read);
        /// repeat for several.
        #[arg(long = "scope", required = true)]
        scopes: Vec<Scope>,
        /// A note for people: who or what uses the key.
        #[arg(long, default_value = "")]
        label: String,
        /// Lifetime such as 90d, 12h, 30m or "1h 30m"; without it the key does not expire.
        #[arg(long, value_parser = super::positive_duration)]
        expires_in: Option<std::time::Duration>,
    },
    /// List keys (never their secrets).
    List {
        #[arg(long)]
        project: Option<i64>,
    },
    /// Revoke a key at once.
    Revoke {
        /// The key's id, as `key list` shows it.
        id: Uuid,
    },
}

fn view(key: &ApiKey) -> Value {
    json!({
        "id": key.id,
        "project_id": key.project_id.get(),
        "label": key.label,
        "prefix": key.prefix,
        "scopes": key.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "created_at": rfc3339(key.created_at),
        "expires_at": key.expires_at.map(rfc3339),
        "revoked_at": key.revoked_at.map(rfc3339),
        "last_used_at": key.last_used_at.map(rfc3339),
    })
}

fn project_id(raw: i64) -> Result<ProjectId, CliError> {
    ProjectId::new(raw).map_err(|e| CliError::Usage(e.detail))
}

/// Creates a key and returns its JSON view with the secret under `key`.
pub(crate) async fn create(
    services: &Services,
    project: ProjectId,
    scopes: Vec<Scope>,
    label: String,
    expires_in: Option<std::time::Duration>,
) -> Result<NewApiKey, CliError> {
    Ok(services.keys.create(project, scopes, label, expires_in).await?)
}

/// A new key as `--json` prints it, its secret included.
fn created_view(new: &NewApiKey) -> Value {
    json!({
        "id": new.key.id,
        "key": new.secret,
        "scopes": new.key.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "project_id": new.key.project_id.get(),
        "expires_at": new.key.expires_at.map(rfc3339),
    })
}

pub(super) async fn run(config: &Config, command: KeyCommand, json: bool) -> Result<(), CliError> {
    let services = Services::open(config)?;
    match command {
        KeyCommand::Create { project, scopes, label, expires_in } => {
            let created = create(&services, project_id(project)?, scopes, label, expires_in).await?;
            if json {
                print_json(&created_view(&created));
            } else {
                println!("Created key {} for project {}", created.key.id, project);
                println!("Secret (shown once, store it now): {}", created.secret);
            }
        }
        KeyCommand::List { project } => {
            let keys = services.keys.list(project.map(project_id).transpose()?).await?;
            if json {
                print_json(&Value::Array(keys.iter().map(view).collect()));
            } else {
                for k in &keys {
                    let state = if k.revoked_at.is_some() { "revoked" } else { "active" };
                    let scopes = k.scopes.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(",");
                    let used = k
                        .last_used_at
                        .map_or_else(|| "never used".to_owned(), |at| format!("used {}", rfc3339(at)));
                    println!(
                        "{}  project {}  {}…  {state}  {scopes}  {used}  {}",
                        k.id, k.project_id, k.prefix, k.label
                    );
                }
            }
        }
        KeyCommand::Revoke { id } => {
            services.keys.revoke(id).await?;
            if json {
                print_json(&json!({"id": id, "revoked": true}));
            } else {
                println!("Revoked key {id}");
            }
        }
    }
    Ok(())
}
