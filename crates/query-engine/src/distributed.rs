//! The distributed engine: Apache DataFusion Ballista (the `ballista` cargo feature).
//!
//! With `--engine ballista://HOST:PORT` a query is parsed, checked and planned exactly as on the embedded engine
//! (the same dialect, the same read-only check, the same typed parameters); only its execution is handed to a
//! Ballista scheduler, whose executors read the project's tables from the shared storage by their URLs. Rows
//! come back to this process, which pages them and writes the JSON (or the stored result) as always.
//!
//! [`Cluster`] runs a scheduler and executors inside this process, reading the same storage: `endpoints
//! cluster`, and the tests.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ballista_core::extension::{SessionConfigExt, SessionStateExt};
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use datafusion::error::DataFusionError;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;
use datafusion::execution::context::SessionState;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::session_state::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use domain::EngineError;

use crate::storage::Storage;

/// The port a scheduler listens on when its URL names none (Ballista's default).
const DEFAULT_PORT: u16 = 50050;

/// The gRPC address of the scheduler a `ballista://HOST[:PORT]` URL names.
///
/// # Errors
/// A message saying what is wrong with the URL.
pub fn scheduler_address(raw: &str) -> Result<String, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("'{raw}' is not a URL: {e}"))?;
    let host = url.host_str().filter(|h| !h.is_empty());
    match (url.scheme(), host, url.path()) {
        ("ballista", Some(host), "" | "/") => {
            Ok(format!("http://{host}:{}", url.port().unwrap_or(DEFAULT_PORT)))
        }
        _ => Err(format!("'{raw}' is not a Ballista scheduler: use ballista://HOST:PORT")),
    }
}

/// Whether an error says the cluster could not be reached, rather than that the query failed. Ballista reports
/// both as execution errors with text only, so the text of the gRPC transport's failures is what tells them
/// apart.
pub(crate) fn is_unreachable(err: &DataFusionError) -> bool {
    let DataFusionError::Execution(text) = err.find_root() else { return false };
    ["tonic::transport::Error", "transport error", "code: Unavailable"].iter().any(|sign| text.contains(sign))
}

/// Whether `ctx` plans for a cluster's scheduler (a session of [`session`]).
pub(crate) fn plans_for_cluster(ctx: &SessionContext) -> bool {
    let state = ctx.state_ref();
    let state = state.read();
    state.config().options().extensions.get::<ballista_core::config::BallistaConfig>().is_some()
}

/// A session state that reads the storage, with Ballista's configuration.
fn state(storage: &Storage, runtime: Arc<RuntimeEnv>) -> SessionState {
    storage.register(&runtime);
    let config = SessionConfig::new_with_ballista().with_information_schema(false);
    SessionStateBuilder::new().with_default_features().with_config(config).with_runtime_env(runtime).build()
}

/// A session whose queries run on the cluster whose scheduler is at `scheduler` (`http://HOST:PORT`).
pub(crate) fn session(
    storage: &Storage,
    runtime: Option<Arc<RuntimeEnv>>,
    scheduler: &str,
) -> Result<SessionContext, EngineError> {
    let state = state(storage, runtime.unwrap_or_else(|| Arc::new(RuntimeEnv::default())))
        .upgrade_for_ballista(scheduler.to_owned())
        .map_err(|e| EngineError::Internal(Box::new(e)))?;
    Ok(SessionContext::new_with_state(state))
}

/// A Ballista scheduler and its executors, running on the current Tokio runtime until it ends.
#[derive(Debug, Clone, Copy)]
pub struct Cluster {
    scheduler: SocketAddr,
}

impl Cluster {
    /// Starts a scheduler on a free loopback port and `executors` executors, each running up to `slots` tasks
    /// at once, all reading `storage`.
    ///
    /// # Errors
    /// [`EngineError::Unavailable`] when a part cannot start or the scheduler does not answer within 10 s.
    pub async fn start(storage: &Storage, executors: usize, slots: usize) -> Result<Self, EngineError> {
        let unavailable = |e: Box<dyn std::error::Error + Send + Sync>| EngineError::Unavailable(e);
        // One runtime serves every job of the cluster, so it must not remember a table's files: an append adds
        // files to the same version, and the next query must see them.
        let caches = CacheManagerConfig::default().with_list_files_cache_limit(0);
        let runtime = RuntimeEnvBuilder::new()
            .with_cache_manager(caches)
            .build_arc()
            .map_err(|e| EngineError::Internal(Box::new(e)))?;
        let state = state(storage, runtime);
        let scheduler = ballista_scheduler::standalone::new_standalone_scheduler_from_state(&state)
            .await
            .map_err(|e| unavailable(Box::new(e)))?;
        let address = format!("http://localhost:{}", scheduler.port());
        let deadline = Instant::now() + Duration::from_secs(10);
        let client = loop {
            match SchedulerGrpcClient::connect(address.clone()).await {
                Ok(client) => break client,
                Err(e) if Instant::now() > deadline => return Err(unavailable(Box::new(e))),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        for _ in 0..executors.max(1) {
            ballista_executor::new_standalone_executor_from_state(client.clone(), slots.max(1), &state)
                .await
                .map_err(|e| unavailable(Box::new(e)))?;
        }
        Ok(Self { scheduler })
    }

    /// The URL `--engine` takes to use this cluster.
    pub fn url(&self) -> String {
        format!("ballista://localhost:{}", self.scheduler.port())
    }
}

#[cfg(test)]
mod tests {
    use domain::{ProjectId, Query, QueryEngine};
    use serde_json::json;

    use super::*;
    use crate::DataFusionEngine;

    #[test]
    fn scheduler_urls_name_a_host_and_a_port() {
        assert_eq!(
            scheduler_address("ballista://sched.internal:50051").unwrap(),
            "http://sched.internal:50051"
        );
        assert_eq!(scheduler_address("ballista://10.0.0.7").unwrap(), "http://10.0.0.7:50050");
        for refused in ["df://host:1", "ballista://", "ballista://host/path", "host:50050", ""] {
            assert!(scheduler_address(refused).is_err(), "{refused}");
        }
    }

    fn storage() -> (Storage, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("qe-ballista-{}", uuid::Uuid::new_v4()));
        (Storage::local(&dir).unwrap(), dir)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn queries_run_on_the_cluster_and_fail_clearly_without_it() {
        let (storage, dir) = storage();
        let q = Query::try_from(&json!({"kind": "SQLQuery", "query": "SELECT 40 + 2 AS answer"})).unwrap();
        let project = ProjectId::new(1).unwrap();

        let cluster = Cluster::start(&storage, 2, 2).await.unwrap();
        let engine = DataFusionEngine::new(storage.clone()).on_ballista(&cluster.url()).unwrap();
        assert_eq!(engine.engine(), format!("http://localhost:{}", cluster.scheduler.port()));
        engine.ping().await.unwrap();
        let result = engine.execute(project, &q, &Default::default(), 10, 0).await.unwrap();
        assert_eq!(result.rows_json, r#"[{"answer":42}]"#);

        // Nothing listens on this port: execution goes to a scheduler, never silently to this process.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let nowhere =
            DataFusionEngine::new(storage).on_ballista(&format!("ballista://127.0.0.1:{port}")).unwrap();
        let err = nowhere.execute(project, &q, &Default::default(), 10, 0).await.unwrap_err();
        assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
        assert!(matches!(nowhere.ping().await, Err(EngineError::Unavailable(_))));
        let _ = std::fs::remove_dir_all(dir);
    }
}
