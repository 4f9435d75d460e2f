//! Each run's record (contract section 19), made here, by the run service, from what it knows: who asked and
//! over what, the version that ran, where the answer came from, the rows, and how the run ended. A transport
//! only says who asked ([`RunBy`]) and, for a run it refused before asking the service (a rate limit, a request
//! it could not read), what it answered ([`RunService::refused`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use super::logs::Ran;
use super::service::RunService;
use crate::access::{Principal, ProjectId};
use crate::clock::{Clock, Timestamp};
use crate::endpoints::EndpointName;
use crate::error::Error;
use crate::logs::{LogKind, LogRecord, RunLog, Transport};

/// Who asks for a run, and how: what the run's record says of the asking.
#[derive(Debug, Clone, Copy)]
pub struct RunBy<'a> {
    /// Authorized for the project the run addresses.
    pub caller: &'a Principal,
    pub transport: Transport,
    /// The request's id (`X-Request-Id`), when the transport has one.
    pub request_id: Option<&'a str>,
    /// When the transport was asked: a record's duration counts from here, reading the request included.
    pub since: Instant,
}

impl<'a> RunBy<'a> {
    /// Asked over `transport` just now, with no request id.
    pub fn now(caller: &'a Principal, transport: Transport) -> Self {
        Self { caller, transport, request_id: None, since: Instant::now() }
    }
}

/// The code and status of a run whose caller went away before it ended (the run was cancelled with it), as the
/// HTTP adapter answers `client_closed_request` (a test there holds them together).
pub const CANCELLED: (&str, u16) = ("client_closed_request", 499);

/// How a run ended, as its record says it.
enum Ended<'e> {
    Answered(Ran),
    Failed(&'e Error),
    Refused { status: u16, code: &'static str },
    Cancelled,
}

/// A run's record from its start: filed once, with how the run ended, or as cancelled when the run is dropped
/// before it ends (its caller went away, or the process is stopping).
pub(super) struct Recording<'a> {
    log: &'a dyn RunLog,
    clock: &'a dyn Clock,
    by: RunBy<'a>,
    project: ProjectId,
    endpoint: String,
    filed: bool,
}

impl<'a> Recording<'a> {
    /// A record of `by`'s run of `endpoint`, kept when the caller is of the project the run addresses (anyone
    /// could write in a project's log otherwise).
    pub(super) fn start(
        service: &'a RunService,
        by: RunBy<'a>,
        project: ProjectId,
        endpoint: &EndpointName,
    ) -> Self {
        Self {
            log: service.log.as_ref(),
            clock: service.clock.as_ref(),
            by,
            project,
            endpoint: endpoint.as_str().to_owned(),
            filed: by.caller.project_id != project,
        }
    }

    /// The run `work` does, its record filed once it ends (what it answered, as `ran` says, or how it failed),
    /// or as cancelled if it is dropped first.
    pub(super) async fn of<T>(
        mut self,
        work: impl std::future::Future<Output = Result<T, Error>>,
        ran: impl FnOnce(&T) -> Ran,
    ) -> Result<T, Error> {
        let ended = work.await;
        match &ended {
            Ok(answer) => self.file(Ended::Answered(ran(answer))),
            Err(err) => self.file(Ended::Failed(err)),
        }
        ended
    }

    fn file(&mut self, ended: Ended<'_>) {
        if std::mem::replace(&mut self.filed, true) {
            return;
        }
        let (status, code, ran) = match ended {
            Ended::Answered(ran) => (200, None, Some(ran)),
            Ended::Failed(err) => {
                let (code, status) = err.code_and_status();
                (status, Some(code), None)
            }
            Ended::Refused { status, code } => (status, Some(code), None),
            Ended::Cancelled => (CANCELLED.1, Some(CANCELLED.0), None),
        };
        let took = self.by.since.elapsed();
        self.log.record(LogRecord {
            id: record_id(),
            at: began(self.clock.now(), took),
            project: self.project,
            endpoint: std::mem::take(&mut self.endpoint),
            version: ran.and_then(|ran| ran.version),
            kind: LogKind::Run,
            status,
            code: code.map(str::to_owned),
            duration: took,
            rows: ran.map(|ran| ran.rows),
            bytes_read: ran.and_then(|ran| ran.bytes_read),
            source: ran.and_then(|ran| ran.source),
            credential: Some(Arc::clone(&self.by.caller.label)),
            transport: Some(self.by.transport),
            request_id: self.by.request_id.map(str::to_owned),
            runs: 1,
        });
    }
}

impl Drop for Recording<'_> {
    fn drop(&mut self) {
        self.file(Ended::Cancelled);
    }
}

impl RunService {
    /// Records a run of `endpoint` that the transport refused before asking this service (a rate limit, a
    /// missing scope, a request it could not read), answered with `status` and `code`. Nothing is recorded for a
    /// name that cannot be an endpoint's, nor for a caller of another project than `project`.
    pub fn refused(
        &self,
        by: RunBy<'_>,
        project: ProjectId,
        endpoint: &str,
        status: u16,
        code: &'static str,
    ) {
        let Ok(name) = EndpointName::parse(endpoint) else { return };
        Recording::start(self, by, project, &name).file(Ended::Refused { status, code });
    }
}

/// When a run that ends `now`, after `took`, began, to the microsecond the log keeps: the time its record is
/// filed under.
fn began(now: Timestamp, took: Duration) -> Timestamp {
    let at = now - took;
    at.replace_nanosecond(at.nanosecond() / 1000 * 1000).unwrap_or(at)
}

/// A record's id: a UUID of version 8 (its bits are the service's) holding 64 random bits drawn once per process
/// and a counter, so ids are unique across processes and nodes without a random draw per run, and a process's
/// ids follow its runs' order.
fn record_id() -> uuid::Uuid {
    static PROCESS: LazyLock<u64> = LazyLock::new(rand::random);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let next = NEXT.fetch_add(1, Ordering::Relaxed);
    let bits = (u128::from(*PROCESS) << 64) | u128::from(next);
    uuid::Builder::from_custom_bytes(bits.to_be_bytes()).into_uuid()
}
