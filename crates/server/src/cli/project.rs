//! `endpoints project create|list`

use clap::Subcommand;
use domain::{Project, ProjectStore};
use serde_json::{json, Value};

use super::{print_json, rfc3339, CliError};
use crate::config::Config;
use crate::startup::Services;

#[derive(Debug, Subcommand)]
pub enum ProjectCommand {
    /// Create a project and print its id.
    Create {
        /// A name for people; it need not be unique.
        #[arg(long)]
        name: String,
    },
    /// List all projects.
    List,
    /// Change a project's settings: the web origins whose pages may call its runs from a browser (CORS).
    Update {
        #[arg(long)]
        project: i64,
        /// An origin allowed to call the project's runs from a browser, as `https://app.example.com`;
        /// repeat it for several. The list given replaces the project's.
        #[arg(long = "allow-origin", value_name = "ORIGIN", value_parser = origin, required_unless_present = "no_origins")]
        allow_origins: Vec<String>,
        /// Allow no origin at all (the default for a new project).
        #[arg(long, conflicts_with = "allow_origins")]
        no_origins: bool,
    },
    /// Replace the secret that signs the project's run tokens: every run token issued for it stops working,
    /// on every node.
    RotateTokenSecret {
        #[arg(long)]
        project: i64,
    },
}

/// `--allow-origin`: an origin as a browser writes it.
fn origin(raw: &str) -> Result<String, String> {
    domain::parse_origin(raw).map_err(|e| e.detail)
}

fn view(project: &Project) -> Value {
    json!({
        "id": project.id.get(),
        "name": project.name,
        "created_at": rfc3339(project.created_at),
        "allowed_origins": project.allowed_origins,
    })
}

fn project_id(raw: i64) -> Result<domain::ProjectId, CliError> {
    domain::ProjectId::new(raw).map_err(|e| CliError::Usage(e.detail))
}

pub(super) async fn run(config: &Config, command: ProjectCommand, json: bool) -> Result<(), CliError> {
    let services = Services::open(config)?;
    match command {
        ProjectCommand::Create { name } => {
            let name = name.trim().to_owned();
            if name.is_empty() {
                return Err(CliError::Usage("--name must not be empty".into()));
            }
            let project = services
                .store
                .create(name, domain::Clock::now(&domain::SystemClock))
                .await
                .map_err(domain::Error::from)?;
            if json {
                print_json(&view(&project));
            } else {
                println!("Created project {} ({})", project.id, project.name);
            }
        }
        ProjectCommand::List => {
            let projects = ProjectStore::list(&*services.store).await.map_err(domain::Error::from)?;
            if json {
                print_json(&Value::Array(projects.iter().map(view).collect()));
            } else {
                for p in &projects {
                    let origins = if p.allowed_origins.is_empty() {
                        String::new()
                    } else {
                        format!("  (origins: {})", p.allowed_origins.join(" "))
                    };
                    println!("{:>6}  {}  {}{origins}", p.id, rfc3339(p.created_at), p.name);
                }
            }
        }
        ProjectCommand::Update { project, allow_origins, no_origins: _ } => {
            let project = project_id(project)?;
            let origins = services.keys.set_allowed_origins(project, &allow_origins).await?;
            if json {
                print_json(&json!({"id": project.get(), "allowed_origins": origins}));
            } else if origins.is_empty() {
                println!("Project {project} allows no origin");
            } else {
                println!("Project {project} allows pages of {}", origins.join(", "));
            }
        }
        ProjectCommand::RotateTokenSecret { project } => {
            let project = project_id(project)?;
            services.keys.rotate_token_secret(project).await?;
            if json {
                print_json(&json!({"id": project.get(), "token_secret_rotated": true}));
            } else {
                println!("Rotated project {project}'s token secret: its run tokens no longer work");
            }
        }
    }
    Ok(())
}
