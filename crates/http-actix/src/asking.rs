//! How this adapter asks the run service for a run: who asks (the caller authentication found), over which
//! transport, with which request id and since when. The service records each run it is asked for (contract
//! section 19); what this adapter tells it besides is a run it refused itself, before asking (a rate limit, a
//! missing scope, a request it could not read), with what it answered.

use std::time::Instant;

use actix_web::http::header::HeaderValue;
use domain::{Principal, ProjectId, RunBy, RunService, Transport};

use crate::error::ApiError;
use crate::request_context::RequestContext;

/// The asking of the request being served: its id and when it came.
pub(crate) struct Asking {
    id: Option<HeaderValue>,
    since: Instant,
}

impl Asking {
    /// The current request's (see [`RequestContext`]); outside of one, asked now with no id.
    pub(crate) fn current() -> Self {
        RequestContext::current(|request| Self {
            id: Some(request.id_value().clone()),
            since: request.started(),
        })
        .unwrap_or_else(|| Self { id: None, since: Instant::now() })
    }

    /// `caller`'s run over `transport`.
    pub(crate) fn by<'a>(&'a self, caller: &'a Principal, transport: Transport) -> RunBy<'a> {
        RunBy {
            caller,
            transport,
            request_id: self.id.as_ref().and_then(|id| id.to_str().ok()),
            since: self.since,
        }
    }

    /// Tells `runs` of a run of `endpoint` in `project` that this adapter refused with `err`.
    pub(crate) fn refused(
        &self,
        runs: &RunService,
        caller: &Principal,
        transport: Transport,
        project: ProjectId,
        endpoint: &str,
        err: &ApiError,
    ) {
        let code = err.code();
        runs.refused(self.by(caller, transport), project, endpoint, code.status().as_u16(), code.as_str());
    }
}
