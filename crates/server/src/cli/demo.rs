//! `endpoints demo`: a demo project and a fresh read-write key, ready for a first curl.

use clap::Args;
use domain::ports::ProjectStore;
use domain::Scope;
use serde_json::json;

use super::{key, print_json, CliError};
use crate::config::Config;
use crate::startup::Services;

pub const DEMO_PROJECT: &str = "Demo";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The base URL the printed curl line should use.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
}

pub(super) async fn run(config: &Config, args: DemoArgs, json: bool) -> Result<(), CliError> {
    let services = Services::open(config)?;
    let existing = ProjectStore::list(&*services.store).await.map_err(domain::Error::from)?;
    let project = match existing.into_iter().find(|p| p.name == DEMO_PROJECT) {
        Some(project) => project,
        None => services
            .store
            .create(DEMO_PROJECT.into(), domain::ports::Clock::now(&domain::ports::SystemClock))
            .await
            .map_err(domain::Error::from)?,
    };
    let created = key::create(&services, project.id, vec![Scope::EndpointWrite], "demo".into(), None).await?;
    let secret = created["key"].as_str().unwrap_or_default();
    let curl = format!(
        "curl -s -H 'Authorization: Bearer {secret}' {}/api/projects/{}/endpoints/",
        args.base_url.trim_end_matches('/'),
        project.id
    );
    if json {
        print_json(&json!({"project_id": project.id.get(), "key": secret, "curl": curl}));
    } else {
        println!("Demo project: {} (id {})", project.name, project.id);
        println!("API key (read and write, shown once): {secret}");
        println!("Try:\n  {curl}");
    }
    Ok(())
}
