//! What a folder changes on the server: each endpoint's file checked by the server itself (`?dry_run=true`, so
//! that the server's own rules say what the file becomes and whether it breaks callers), compared with what the
//! server holds.

use std::collections::{BTreeMap, BTreeSet};

use http_actix::api::{BreakingChange, Endpoint};

use super::client::{Api, ClientError};
use super::files::EndpointFile;

/// What happens to one endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Create,
    /// The query changed: a new version.
    NewVersion,
    /// Settings only (description, cache, materialization, ...): no new version.
    Settings,
    Delete,
}

/// What a step does, with the body that does it: a create or an update always has one, a delete never.
#[derive(Debug)]
pub enum Action {
    Create(serde_json::Value),
    NewVersion(serde_json::Value),
    Settings(serde_json::Value),
    Delete,
}

/// One endpoint's step of a plan.
#[derive(Debug)]
pub struct Step {
    pub name: String,
    pub action: Action,
    /// The file's text as the server would hold it, and as it holds it now (none for a create or a delete).
    pub after: Option<String>,
    pub before: Option<String>,
    /// What the new version would break, as the server's check says (only for [`StepKind::NewVersion`]).
    pub breaking: Vec<BreakingChange>,
}

impl Step {
    pub fn kind(&self) -> StepKind {
        match self.action {
            Action::Create(_) => StepKind::Create,
            Action::NewVersion(_) => StepKind::NewVersion,
            Action::Settings(_) => StepKind::Settings,
            Action::Delete => StepKind::Delete,
        }
    }
}

/// Every change, in order of name; endpoints that stay as they are have no step.
#[derive(Debug, Default)]
pub struct Plan {
    pub steps: Vec<Step>,
}

/// A step that could not be planned: the file the server refused, and why.
#[derive(Debug, thiserror::Error)]
#[error("{name}: {source}")]
pub struct PlanError {
    pub name: String,
    #[source]
    pub source: ClientError,
}

impl Plan {
    /// The plan that makes the server's project what `local` says; with `prune`, endpoints without a file are
    /// deleted.
    ///
    /// # Errors
    /// The first file the server refuses (its error names the field), or the server's failure.
    pub async fn make(
        api: &Api,
        local: &BTreeMap<String, EndpointFile>,
        remote: &[Endpoint],
        prune: bool,
    ) -> Result<Self, PlanError> {
        let on_server: BTreeMap<&str, &Endpoint> = remote.iter().map(|e| (e.name.as_str(), e)).collect();
        let names: BTreeSet<&str> =
            local.keys().map(String::as_str).chain(on_server.keys().copied()).collect();
        let mut steps = Vec::new();
        for name in names {
            let failed = |source| PlanError { name: name.to_owned(), source };
            let step = match (local.get(name), on_server.get(name)) {
                (Some(file), None) => {
                    let body = file.body().map_err(|invalid| failed(ClientError::invalid(&invalid)))?;
                    let would = api.create(&body, true).await.map_err(failed)?;
                    let after = Some(yaml(&would).map_err(failed)?);
                    Some(Step {
                        name: name.into(),
                        action: Action::Create(body),
                        after,
                        before: None,
                        breaking: vec![],
                    })
                }
                (Some(file), Some(current)) => {
                    let mut body = file.body().map_err(|invalid| failed(ClientError::invalid(&invalid)))?;
                    let (would, breaking) = match api.update(name, &body, true).await {
                        Ok(would) => (would, Vec::new()),
                        Err(ClientError::Api { code, breaking_changes, .. }) if code == "breaking_change" => {
                            body["confirm_breaking"] = true.into();
                            (api.update(name, &body, true).await.map_err(failed)?, breaking_changes)
                        }
                        Err(err) => return Err(failed(err)),
                    };
                    let (after, before) = (yaml(&would).map_err(failed)?, yaml(current).map_err(failed)?);
                    let action = if would.current_version != current.current_version {
                        Some(Action::NewVersion(body))
                    } else if after != before {
                        Some(Action::Settings(body))
                    } else {
                        None
                    };
                    action.map(|action| Step {
                        name: name.into(),
                        action,
                        after: Some(after),
                        before: Some(before),
                        breaking,
                    })
                }
                (None, Some(current)) if prune => {
                    let before = Some(yaml(current).map_err(failed)?);
                    Some(Step {
                        name: name.into(),
                        action: Action::Delete,
                        after: None,
                        before,
                        breaking: vec![],
                    })
                }
                (None, _) => None,
            };
            steps.extend(step);
        }
        Ok(Self { steps })
    }

    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The steps whose new version breaks callers.
    pub fn breaking(&self) -> impl Iterator<Item = &Step> {
        self.steps.iter().filter(|step| !step.breaking.is_empty())
    }

    /// How many steps of `kind`.
    pub fn count(&self, kind: StepKind) -> usize {
        self.steps.iter().filter(|step| step.kind() == kind).count()
    }
}

/// An endpoint as its file would say it.
fn yaml(endpoint: &Endpoint) -> Result<String, ClientError> {
    EndpointFile::from(endpoint).to_yaml().map_err(|err| ClientError::Unexpected(err.to_string()))
}
