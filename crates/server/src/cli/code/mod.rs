//! Endpoints as code: `pull`, `diff`, `push` and `test` keep a project's endpoints in a folder (for git and
//! CI), talking to a server through its public API only (see docs/as-code.md).
//!
//! Exit status: 0 when the command did what it says and found nothing to report, 1 when it found something
//! (`diff`: a difference; `push`: a breaking change not confirmed; `test`: a failing case), 2 when it could not
//! do its work (a file or the server refused, the server unreachable, a push stopped halfway).

pub mod cases;
pub mod client;
pub mod files;
pub mod plan;

use std::path::PathBuf;
use std::process::ExitCode;

use similar::TextDiff;
use url::Url;

use client::{Api, ClientError};
use files::FileError;
use plan::{Action, Plan, PlanError, StepKind};

/// Where the folder and the server are.
#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// The server's root URL, e.g. https://endpoints.example.com.
    #[arg(long, env = "ENDPOINTS_URL")]
    pub url: Url,
    /// The project whose endpoints the folder holds.
    #[arg(long, env = "ENDPOINTS_PROJECT", value_parser = clap::value_parser!(i64).range(1..))]
    pub project: i64,
    /// The folder: DIR/endpoints/<name>.yaml and DIR/tests/<name>.yaml.
    #[arg(long, default_value = ".")]
    pub dir: PathBuf,
    /// The API key (endpoint:read to pull, diff and test; endpoint:write to push; endpoint:run to test).
    #[arg(long, env = "ENDPOINTS_API_KEY", hide_env_values = true)]
    pub key: String,
}

#[derive(Debug, clap::Args)]
pub struct PushArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print the plan and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Delete the endpoints that have no file.
    #[arg(long)]
    pub prune: bool,
    /// Save new versions that remove or retype columns of endpoints run recently (within the server's window
    /// for breaking changes).
    #[arg(long)]
    pub confirm_breaking: bool,
}

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    #[command(flatten)]
    pub target: Target,
    /// Also write the outcomes as a JUnit XML report to this file.
    #[arg(long)]
    pub junit: Option<PathBuf>,
}

/// Why a command could not do its work (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error("{0}")]
    Stopped(String),
}

/// What a command found: nothing to report (0), or something a CI job fails on (1).
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    Nothing,
    Something,
}

/// The exit status of a command's result, its error printed.
pub fn exit(result: Result<Found, CodeError>) -> ExitCode {
    match result {
        Ok(Found::Nothing) => ExitCode::SUCCESS,
        Ok(Found::Something) => ExitCode::from(1),
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

fn api(target: &Target) -> Result<Api, CodeError> {
    Ok(Api::new(&target.url, target.project, &target.key)?)
}

/// Writes every endpoint of the project into the folder, one file each.
pub async fn pull(target: Target) -> Result<Found, CodeError> {
    let api = api(&target)?;
    let remote = api.list().await?;
    let mut written = 0;
    for endpoint in &remote {
        if files::write_endpoint(&target.dir, &files::EndpointFile::from(endpoint))? {
            written += 1;
        }
    }
    let local = files::read_endpoints(&target.dir)?;
    for name in local.keys().filter(|name| !remote.iter().any(|e| &e.name == *name)) {
        println!("kept {}/{name}.yaml: no such endpoint on the server (push creates it)", files::ENDPOINTS);
    }
    println!("pulled {} endpoint(s), {written} file(s) written", remote.len());
    Ok(Found::Nothing)
}

/// Prints how the server differs from the folder, endpoint by endpoint (exit 1 when it does).
pub async fn diff(target: Target) -> Result<Found, CodeError> {
    let api = api(&target)?;
    let local = files::read_endpoints(&target.dir)?;
    let plan = Plan::make(&api, &local, &api.list().await?, true).await?;
    for step in &plan.steps {
        print!("{}", unified(step));
    }
    print_summary(&plan);
    Ok(if plan.is_empty() { Found::Nothing } else { Found::Something })
}

/// Applies the folder: the plan first, then endpoint by endpoint, stopping at the first error.
pub async fn push(args: PushArgs) -> Result<Found, CodeError> {
    let api = api(&args.target)?;
    let local = files::read_endpoints(&args.target.dir)?;
    let plan = Plan::make(&api, &local, &api.list().await?, args.prune).await?;
    for step in &plan.steps {
        print_step(step);
    }
    print_summary(&plan);
    let breaking: Vec<&str> = plan.breaking().map(|step| step.name.as_str()).collect();
    if !breaking.is_empty() && !args.confirm_breaking {
        println!(
            "nothing changed: the new versions of {} break callers that ran within {} days; \
             push again with --confirm-breaking to save them",
            breaking.join(", "),
            domain::BREAKING_WINDOW.whole_days()
        );
        return Ok(Found::Something);
    }
    if args.dry_run || plan.is_empty() {
        return Ok(Found::Nothing);
    }
    for (done, step) in plan.steps.iter().enumerate() {
        let applied = match &step.action {
            Action::Create(body) => api.create(body, false).await.map(drop),
            Action::NewVersion(body) | Action::Settings(body) => {
                api.update(&step.name, body, false).await.map(drop)
            }
            Action::Delete => api.delete(&step.name).await,
        };
        if let Err(err) = applied {
            let names = |steps: &[plan::Step]| {
                let names: Vec<&str> = steps.iter().map(|step| step.name.as_str()).collect();
                if names.is_empty() {
                    "none".to_owned()
                } else {
                    names.join(", ")
                }
            };
            return Err(CodeError::Stopped(format!(
                "push stopped at {}: {err}\napplied: {}\nnot applied: {}",
                step.name,
                names(&plan.steps[..done]),
                names(&plan.steps[done..]),
            )));
        }
        println!("applied {} {}", verb(step.kind()), step.name);
    }
    Ok(Found::Nothing)
}

/// Runs every case of the folder's tests; exit 1 when one fails.
pub async fn test(args: TestArgs) -> Result<Found, CodeError> {
    let api = api(&args.target)?;
    let tests = files::read_tests(&args.target.dir)?;
    let outcomes = cases::run_all(&api, &tests).await;
    for outcome in &outcomes {
        match &outcome.result {
            Ok(differences) if differences.is_empty() => {
                println!("ok   {} / {}", outcome.endpoint, outcome.case)
            }
            Ok(differences) => {
                println!("FAIL {} / {}", outcome.endpoint, outcome.case);
                for difference in differences {
                    println!("     {difference}");
                }
            }
            Err(err) => println!("FAIL {} / {}: {err}", outcome.endpoint, outcome.case),
        }
    }
    let failed = outcomes.iter().filter(|outcome| !outcome.passed()).count();
    println!("{} case(s), {} passed, {failed} failed", outcomes.len(), outcomes.len() - failed);
    if let Some(path) = &args.junit {
        let report = cases::junit(&outcomes).map_err(CodeError::Stopped)?;
        std::fs::write(path, report).map_err(|source| FileError::Io { path: path.clone(), source })?;
    }
    Ok(if failed == 0 { Found::Nothing } else { Found::Something })
}

fn verb(kind: StepKind) -> &'static str {
    match kind {
        StepKind::Create => "create",
        StepKind::NewVersion => "update (new version)",
        StepKind::Settings => "update (settings)",
        StepKind::Delete => "delete",
    }
}

fn print_step(step: &plan::Step) {
    let mark = match step.kind() {
        StepKind::Create => '+',
        StepKind::NewVersion | StepKind::Settings => '~',
        StepKind::Delete => '-',
    };
    println!("{mark} {} {}", verb(step.kind()), step.name);
    for change in &step.breaking {
        println!("    breaking: {change}");
    }
}

fn print_summary(plan: &Plan) {
    if plan.is_empty() {
        println!("no changes: the server matches the folder");
    } else {
        println!(
            "plan: {} to create, {} to update with a new version, {} to update settings, {} to delete",
            plan.count(StepKind::Create),
            plan.count(StepKind::NewVersion),
            plan.count(StepKind::Settings),
            plan.count(StepKind::Delete)
        );
    }
}

/// A step as a unified diff of the endpoint's file, from the server's to the folder's.
fn unified(step: &plan::Step) -> String {
    let (before, after) = (step.before.as_deref().unwrap_or(""), step.after.as_deref().unwrap_or(""));
    let name = format!("{}/{}.yaml", files::ENDPOINTS, step.name);
    let mut text = TextDiff::from_lines(before, after)
        .unified_diff()
        .header(&format!("server/{name}"), &format!("folder/{name}"))
        .to_string();
    for change in &step.breaking {
        text.push_str(&format!("# breaking: {change}\n"));
    }
    text
}
