//! `endpoints demo`: a demo project with an `events` table and a few endpoints, a fresh key, and a curl line.

use clap::Args;
use domain::{Clock, Project, ProjectId, ProjectStore, Scope, SystemClock};
use serde_json::{json, Value};

use super::{data, key, print_json, CliError};
use crate::config::Config;
use crate::startup::Services;

pub const DEMO_PROJECT: &str = "Demo";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The base URL the printed curl line should use.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub base_url: String,
    /// Rows of the generated `events` table.
    #[arg(long, default_value_t = 1_000_000)]
    pub rows: usize,
    /// Seed of the generator: the same seed gives the same rows.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Generate `events` again even if the demo project has it already.
    #[arg(long)]
    pub regenerate: bool,
}

/// The demo endpoints: each shows a kind of variable.
fn demo_endpoints() -> Vec<Value> {
    vec![
        json!({
            "name": "events-by-country",
            "description": "Events and revenue per country since a day, materialized hourly as a rollup by day",
            "is_materialized": true,
            "sync_frequency": "1hour",
            "query": {"kind": "SQLQuery",
                      "query": "SELECT country, count(*) AS events, round(sum(revenue), 2) AS revenue FROM events WHERE timestamp >= {variables.since} GROUP BY country ORDER BY events DESC",
                      "variables": {"since": {"type": "Date", "default": "2026-01-01", "description": "First day counted"}}},
        }),
        json!({
            "name": "daily-revenue",
            "description": "Revenue per day in one country",
            "query": {"kind": "SQLQuery",
                      "query": "SELECT CAST(date_trunc('day', timestamp) AS DATE) AS day, count(*) AS purchases, round(sum(revenue), 2) AS revenue FROM events WHERE event = 'purchase' AND country = {variables.country} GROUP BY 1 ORDER BY 1",
                      "variables": {"country": {"type": "String", "default": "US"}}},
        }),
        json!({
            "name": "browser-share",
            "description": "Events per browser, for the browsers listed",
            "query": {"kind": "SQLQuery",
                      "query": "SELECT browser, count(*) AS events FROM events WHERE browser IN {variables.browsers} AND revenue >= {variables.min_revenue} GROUP BY browser ORDER BY events DESC",
                      "variables": {"browsers": {"type": "List", "default": ["Chrome", "Safari", "Firefox"]},
                                    "min_revenue": {"type": "Number", "default": 0}}},
        }),
        json!({
            "name": "country-daily",
            "description": "Events and revenue per day in one country, materialized hourly",
            "is_materialized": true,
            "sync_frequency": "1hour",
            "query": {"kind": "SQLQuery",
                      "query": "WITH daily AS (SELECT country, CAST(date_trunc('day', timestamp) AS DATE) AS day, revenue FROM events) SELECT country, day, count(*) AS events, round(sum(revenue), 2) AS revenue FROM daily WHERE country = {variables.country} AND day >= {variables.since} GROUP BY country, day ORDER BY day",
                      "variables": {"country": {"type": "String", "default": "US"},
                                    "since": {"type": "Date", "default": "2026-01-01", "description": "First day shown"}}},
        }),
    ]
}

async fn demo_project(services: &Services) -> Result<Project, CliError> {
    let existing = ProjectStore::list(&*services.store).await.map_err(domain::Error::from)?;
    match existing.into_iter().find(|p| p.name == DEMO_PROJECT) {
        Some(project) => Ok(project),
        None => Ok(services
            .store
            .create(DEMO_PROJECT.into(), SystemClock.now())
            .await
            .map_err(domain::Error::from)?),
    }
}

async fn ensure_events(services: &Services, project: ProjectId, args: &DemoArgs) -> Result<bool, CliError> {
    let has_events = services
        .engine
        .tables(project)
        .await
        .map_err(domain::Error::from)?
        .iter()
        .any(|t| t.name == "events");
    if has_events && !args.regenerate {
        return Ok(false);
    }
    let bar = data::progress("generating events");
    let written = query_engine::tables::imports::write_table(
        services.engine.storage(),
        project,
        "events",
        super::demo_data::events_schema(),
        super::demo_data::events(args.rows, args.seed),
        &|rows| bar.set_position(rows),
    )
    .await;
    bar.finish_and_clear();
    written.map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(true)
}

pub(super) async fn run(config: &Config, args: DemoArgs, json: bool) -> Result<(), CliError> {
    let services = Services::open(config)?;
    let project = demo_project(&services).await?;
    let generated = ensure_events(&services, project.id, &args).await?;
    let mut created = Vec::new();
    for body in demo_endpoints() {
        let command = domain::CreateEndpoint::try_from(&body).map_err(domain::Error::from)?;
        match services.endpoints.get(project.id, &command.name).await {
            Ok(_) => {}
            Err(domain::Error::NotFound(_)) => {
                created.push(command.name.to_string());
                services.endpoints.create(project.id, command).await?;
            }
            Err(other) => return Err(other.into()),
        }
    }
    // The demo key may do everything the console offers: endpoints and the project's tables.
    let scopes = vec![Scope::EndpointWrite, Scope::TableWrite];
    let key = key::create(&services, project.id, scopes, "demo".into(), None).await?;
    let secret = &key.secret;
    let base = format!("{}/api/projects/{}/endpoints", args.base_url.trim_end_matches('/'), project.id);
    let curl = format!("curl -s -H 'Authorization: Bearer {secret}' '{base}/events-by-country/run?variables.since=2026-03-01'");
    if json {
        print_json(
            &json!({"project_id": project.id.get(), "key": secret, "curl": curl, "generated_events": generated, "created_endpoints": created}),
        );
    } else {
        println!("Demo project: {} (id {})", project.name, project.id);
        if generated {
            println!("Generated table 'events' ({} rows, seed {})", args.rows, args.seed);
        }
        println!(
            "Demo endpoints: events-by-country (materialized, a rollup), daily-revenue, browser-share, \
             country-daily (materialized)"
        );
        println!("API key (endpoints and tables, read and write; shown once): {secret}");
        println!("Try:\n  {curl}\n  curl -s -H 'Authorization: Bearer {secret}' '{base}/'");
        let console = format!("{}/console/", args.base_url.trim_end_matches('/'));
        println!("Or open the console at {console} and paste the key.");
    }
    Ok(())
}
