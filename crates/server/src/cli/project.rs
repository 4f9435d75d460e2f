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
}

fn view(project: &Project) -> Value {
    json!({"id": project.id.get(), "name": project.name, "created_at": rfc3339(project.created_at)})
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
                    println!("{:>6}  {}  {}", p.id, rfc3339(p.created_at), p.name);
                }
            }
        }
    }
    Ok(())
}
