//! Changes announced to every process on the same PostgreSQL database, with `NOTIFY` inside the writing
//! transaction (delivered at commit, never for a rollback) and a `LISTEN`ing thread per process.
//!
//! SQLite serves one process, so nothing is announced there. A listener whose connection drops reports
//! [`Change::Everything`] at once and again at every failed reconnection, and once more when it is back (it may
//! have missed changes in between), so a process never trusts what it keeps longer than the reconnection
//! interval while the channel is down.
//!
//! Read your writes on every process ([`PgPropagation`]): every listening process writes a heartbeat to
//! `endpoints_nodes` each second. A writer, once its change is committed, sends a barrier on the channel and
//! waits for each live process's acknowledgement on [`ACKS`]: PostgreSQL delivers notifications in commit order
//! and a listener applies them one after the other, so a listener that acknowledges the barrier has applied the
//! change before it. A process that does not acknowledge within [`ACK_WITHIN`] is counted out: its next
//! heartbeat reads that, and it forgets everything it keeps ([`Change::Everything`]).
//!
//! The writer's own listener hears the acknowledgements and wakes it ([`crate::waiters`]): a waiting writer
//! holds no database connection, so any number of writes wait at once on a small pool. A process whose
//! listener is not connected (a command, or a listener reconnecting) waits on a pooled connection of its own.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{Array, Bool, Double, Nullable, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use domain::{Change, EndpointName, ProjectId, Propagation, StoreError, TableAnnouncer, TableName};

use crate::connection::{AnyConnection, Backend, Database};
use crate::error::DbError;
use crate::waiters::Waiters;
use crate::DieselStore;

/// The channel every process listens on.
const CHANNEL: &str = "endpoints_changes";
/// The channel acknowledgements of barriers go back on (listened to only by a writer waiting for them).
const ACKS: &str = "endpoints_acks";
/// How often the listener looks for delivered notifications: the delay a change takes to reach other processes.
const POLL: Duration = Duration::from_millis(5);
/// How often the listener writes its heartbeat, which also checks that its connection is alive (a dead peer
/// sends no error on its own).
const HEARTBEAT: Duration = Duration::from_secs(1);
/// A process whose heartbeat is older than this is not waited for.
const LIVE_WITHIN: Duration = Duration::from_secs(5);
/// A process whose heartbeat is older than this has stopped: what it had in flight (an append under an
/// `Idempotency-Key`) may be taken over. Longer than [`LIVE_WITHIN`], so that a listener reconnecting after a
/// short outage is not taken for stopped while its process still writes.
const STOPPED_AFTER: Duration = Duration::from_secs(15);
/// How long a writer waits for a live process's acknowledgement before counting it out.
pub const ACK_WITHIN: Duration = Duration::from_secs(2);
/// How often the listener looks for notifications while a writer of its process waits for acknowledgements.
const ACK_POLL: Duration = Duration::from_millis(1);
/// How long the listener waits between reconnection attempts.
const RECONNECT: Duration = Duration::from_secs(1);
/// libpq settings of the listening connection, so that a peer that vanishes without closing the connection (a
/// network partition) fails the heartbeat within seconds instead of blocking it for TCP's default hours: a
/// connection attempt gives up after 5 s, and sent data unacknowledged for 5 s, or 3 unanswered keepalives 2 s
/// apart after 2 s of silence, close the connection. A setting the URL already has is kept.
const LIBPQ_SETTINGS: [(&str, &str); 6] = [
    ("connect_timeout", "5"),
    ("keepalives", "1"),
    ("keepalives_idle", "2"),
    ("keepalives_interval", "2"),
    ("keepalives_count", "3"),
    ("tcp_user_timeout", "5000"),
];

/// The database URL with [`LIBPQ_SETTINGS`] added where it does not set them itself.
fn listening_url(url: &str) -> String {
    let mut url = url.to_owned();
    for (name, value) in LIBPQ_SETTINGS {
        let query = url.split_once('?').map_or("", |(_, query)| query);
        if query.split('&').any(|pair| pair.split('=').next() == Some(name)) {
            continue;
        }
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("{name}={value}"));
    }
    url
}

fn payload(change: &Change) -> String {
    match change {
        Change::Endpoint { project, name } => format!("endpoint:{project}:{name}"),
        Change::Keys => "keys".into(),
        Change::Project { project } => format!("project:{project}"),
        Change::Table { project, name } => format!("table:{project}:{name}"),
        // Never announced (a listener's own news): read back as what it is nearest to, the safe side.
        Change::Everything | Change::Heard => "everything".into(),
    }
}

/// What a payload announces. Unknown payloads (a newer version's) are read as "everything", the safe side.
fn parse(payload: &str) -> Change {
    let mut parts = payload.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("endpoint"), Some(project), Some(name)) => {
            let project = project.parse().ok().and_then(|id| ProjectId::new(id).ok());
            match (project, EndpointName::parse(name)) {
                (Some(project), Ok(name)) => Change::Endpoint { project, name },
                _ => Change::Everything,
            }
        }
        (Some("table"), Some(project), Some(name)) => {
            let project = project.parse().ok().and_then(|id| ProjectId::new(id).ok());
            match (project, TableName::parse(name)) {
                (Some(project), Ok(name)) => Change::Table { project, name },
                _ => Change::Everything,
            }
        }
        (Some("keys"), None, None) => Change::Keys,
        (Some("project"), Some(project), None) => {
            match project.parse().ok().and_then(|id| ProjectId::new(id).ok()) {
                Some(project) => Change::Project { project },
                None => Change::Everything,
            }
        }
        _ => Change::Everything,
    }
}

/// Announces `change` to every listening process when the surrounding transaction commits (PostgreSQL only).
pub(crate) fn announce(conn: &mut AnyConnection, change: &Change) -> Result<(), DbError> {
    if let AnyConnection::Postgresql(conn) = conn {
        diesel::sql_query("SELECT pg_notify($1, $2)")
            .bind::<Text, _>(CHANNEL)
            .bind::<Text, _>(payload(change))
            .execute(conn)?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl TableAnnouncer for DieselStore {
    #[tracing::instrument(skip_all, fields(project = %project, tables = tables.len(), readers = readers.len()))]
    async fn announce(
        &self,
        project: ProjectId,
        tables: Vec<TableName>,
        readers: Vec<EndpointName>,
    ) -> Result<(), StoreError> {
        // Nobody else to tell on SQLite: not even a connection is taken.
        if self.db.backend() != Backend::Postgres || (tables.is_empty() && readers.is_empty()) {
            return Ok(());
        }
        let changes = tables
            .into_iter()
            .map(|name| Change::Table { project, name })
            .chain(readers.into_iter().map(|name| Change::Endpoint { project, name }));
        let payloads: Vec<String> = changes.map(|change| payload(&change)).collect();
        Ok(self
            .db
            .run(move |conn| {
                if let AnyConnection::Postgresql(conn) = conn {
                    // One statement, so one transaction: delivered together, in this order, at its commit.
                    diesel::sql_query("SELECT pg_notify($1, payload) FROM unnest($2) AS payload")
                        .bind::<Text, _>(CHANNEL)
                        .bind::<Array<Text>, _>(payloads)
                        .execute(conn)?;
                }
                Ok::<_, DbError>(())
            })
            .await?)
    }
}

impl Database {
    /// On PostgreSQL, a thread calling `on_change` for every change any process announces, and with
    /// `Change::Everything` whenever changes may have been missed; `None` on SQLite, which serves one process.
    pub fn listen_for_changes(&self, on_change: impl Fn(Change) + Send + 'static) -> Option<ChangeListener> {
        (self.backend() == Backend::Postgres).then(|| {
            let node = Node { name: self.node().to_owned(), waiters: Arc::clone(self.waiters()) };
            ChangeListener::spawn(self.address(), node, on_change)
        })
    }

    /// How a change saved by this process is waited for on the others before it is answered: on PostgreSQL,
    /// every other process listening for changes acknowledges it (or is counted out); on SQLite, which serves
    /// one process, nothing.
    pub fn propagation(&self) -> Arc<dyn Propagation> {
        match self.backend() {
            Backend::Postgres => Arc::new(PgPropagation { db: self.clone() }),
            Backend::Sqlite => Arc::new(domain::NoPropagation),
        }
    }
}

/// A thread listening for the changes other processes announce. Told to stop when dropped; it ends at its next
/// look (within a few milliseconds, or when a connection attempt in progress gives up), and is not waited for.
pub struct ChangeListener {
    stop: Arc<AtomicBool>,
}

impl ChangeListener {
    /// Listens on the PostgreSQL database at `url` as process `node`, calling `on_change` for every change
    /// announced (its own included) and with [`Change::Everything`] whenever changes may have been missed, and
    /// acknowledging barriers.
    fn spawn(url: &str, node: Node, on_change: impl Fn(Change) + Send + 'static) -> Self {
        let url = listening_url(url);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        // Detached: the thread ends on its own once told to stop.
        if let Err(err) = std::thread::Builder::new()
            .name("change-listener".into())
            .spawn(move || listen(&url, &node, &stopping, &on_change))
        {
            tracing::error!(error = %err, "cannot start the change listener; cached state will not follow other processes");
        }
        Self { stop }
    }
}

impl Drop for ChangeListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// The process a listener listens for: its name, and its writers waiting for acknowledgements.
struct Node {
    name: String,
    waiters: Arc<Waiters>,
}

fn listen(url: &str, node: &Node, stop: &AtomicBool, on_change: &dyn Fn(Change)) {
    let mut was_connected = true;
    while !stop.load(Ordering::Acquire) {
        match PgConnection::establish(url).and_then(|mut conn| {
            conn.batch_execute(&format!("LISTEN {CHANNEL}; LISTEN {ACKS}"))
                .map_err(|e| diesel::ConnectionError::BadConnection(e.to_string()))?;
            Ok(conn)
        }) {
            Ok(mut conn) => {
                // Whatever happened while no one listened is unknown.
                on_change(Change::Everything);
                if !was_connected {
                    tracing::info!("change listener reconnected");
                }
                was_connected = true;
                node.waiters.listen();
                let reason = follow(&mut conn, node, stop, on_change);
                node.waiters.deaf();
                let node = &node.name;
                if let Some(reason) = reason {
                    tracing::warn!(error = %reason, "change listener lost its connection; reconnecting");
                    on_change(Change::Everything);
                    was_connected = false;
                } else if let Err(err) = diesel::sql_query("DELETE FROM endpoints_nodes WHERE id = $1")
                    .bind::<Text, _>(node)
                    .execute(&mut conn)
                {
                    // Stopping: writers stop waiting for this process within seconds anyway.
                    tracing::debug!(error = %err, "could not remove this process from endpoints_nodes");
                }
            }
            Err(err) => {
                if was_connected {
                    tracing::warn!(error = %err, "change listener cannot connect; retrying every second");
                }
                was_connected = false;
                on_change(Change::Everything);
            }
        }
        sleep_unless_stopped(RECONNECT, stop);
    }
}

/// Delivers notifications and acknowledges barriers until the connection fails (its error) or the listener
/// stops (`None`); writes the heartbeat, and forgets everything when a writer counted this process out.
fn follow(
    conn: &mut PgConnection,
    node: &Node,
    stop: &AtomicBool,
    on_change: &dyn Fn(Change),
) -> Option<String> {
    let Node { name: node, waiters } = node;
    let mut beat = None::<Instant>;
    while !stop.load(Ordering::Acquire) {
        let beating = beat.is_none_or(|at| at.elapsed() >= HEARTBEAT);
        if beating {
            match heartbeat(conn, node) {
                Ok(false) => {}
                Ok(true) => {
                    tracing::warn!("this process was counted out by a writer it did not answer in time; forgetting what it keeps");
                    on_change(Change::Everything);
                }
                Err(err) => return Some(err.to_string()),
            }
            beat = Some(Instant::now());
        }
        // Taken first (an acknowledgement is sent on the same connection); a broken connection yields errors
        // without end, so the first one ends the listening.
        let mut delivered = Vec::new();
        for notification in conn.notifications_iter() {
            match notification {
                Ok(n) if n.channel == ACKS => {
                    if let Some((token, from)) = n.payload.split_once(':') {
                        waiters.acknowledged(token, from);
                    }
                }
                Ok(n) => delivered.push(n.payload),
                Err(err) => return Some(err.to_string()),
            }
        }
        // Every change delivered before a barrier is applied before it is acknowledged; the barriers of one look
        // are acknowledged together, in one statement, so a flood of writes costs the listener one round trip
        // per look rather than one per write.
        let mut acks = Vec::new();
        for payload in delivered {
            match payload.strip_prefix("barrier:") {
                Some(token) => acks.push(format!("{token}:{node}")),
                None => on_change(parse(&payload)),
            }
        }
        if !acks.is_empty() {
            let acked = diesel::sql_query("SELECT pg_notify($1, ack) FROM unnest($2) AS ack")
                .bind::<Text, _>(ACKS)
                .bind::<Array<Text>, _>(acks)
                .execute(conn);
            if let Err(err) = acked {
                return Some(err.to_string());
            }
        }
        if beating {
            // Writers wait for this process again (the heartbeat cleared its counting out), and every change
            // announced before the heartbeat was applied above.
            on_change(Change::Heard);
        }
        waiters.pause(POLL, ACK_POLL);
    }
    None
}

#[derive(QueryableByName)]
struct Beat {
    #[diesel(sql_type = Nullable<Bool>)]
    was_out: Option<bool>,
}

#[derive(QueryableByName)]
struct Stopped {
    #[diesel(sql_type = Bool)]
    stopped: bool,
}

/// Whether the process `node` is known to have stopped: its heartbeat is older than [`STOPPED_AFTER`] (a process
/// that stops cleanly removes its row after finishing its requests; one that crashed leaves it to go stale). A
/// process without a row (its listener not connected yet) is not known to have stopped.
pub(crate) fn stopped(conn: &mut PgConnection, node: &str) -> Result<bool, diesel::result::Error> {
    let found: Stopped = diesel::sql_query(
        "SELECT COALESCE((SELECT seen_at < now() - make_interval(secs => $2) FROM endpoints_nodes \
         WHERE id = $1), FALSE) AS stopped",
    )
    .bind::<Text, _>(node)
    .bind::<Double, _>(STOPPED_AFTER.as_secs_f64())
    .get_result(conn)?;
    Ok(found.stopped)
}

/// Records that `node` is alive; says whether a writer had counted it out since its last heartbeat.
fn heartbeat(conn: &mut PgConnection, node: &str) -> Result<bool, diesel::result::Error> {
    let beat: Beat = diesel::sql_query(
        "WITH old AS (SELECT counted_out FROM endpoints_nodes WHERE id = $1) \
         INSERT INTO endpoints_nodes (id, seen_at) VALUES ($1, now()) \
         ON CONFLICT (id) DO UPDATE SET seen_at = now(), counted_out = FALSE \
         RETURNING (SELECT counted_out FROM old) AS was_out",
    )
    .bind::<Text, _>(node)
    .get_result(conn)?;
    Ok(beat.was_out == Some(true))
}

#[derive(QueryableByName)]
struct NodeRow {
    #[diesel(sql_type = Text)]
    id: String,
}

/// Waits until every live process but `node` acknowledged a barrier sent after the changes committed so far,
/// or [`ACK_WITHIN`] passed; counts out and returns the processes that did not acknowledge.
fn barrier(conn: &mut PgConnection, node: &str) -> Result<Vec<String>, diesel::result::Error> {
    let waiting = live_nodes(conn, node)?;
    if waiting.is_empty() {
        return Ok(Vec::new());
    }
    conn.batch_execute(&format!("LISTEN {ACKS}"))?;
    // The pooled connection stops listening whatever happened, so no later user of it gathers acknowledgements.
    let waited = await_acks(conn, waiting);
    let unlistened = conn.batch_execute(&format!("UNLISTEN {ACKS}"));
    let out: Vec<String> = waited?.into_iter().collect();
    unlistened?;
    count_out(conn, &out)?;
    Ok(out)
}

/// The live processes but `node` that a writer waits for. A node counted out already is not waited for again:
/// it forgets everything at its next heartbeat.
fn live_nodes(conn: &mut PgConnection, node: &str) -> Result<HashSet<String>, diesel::result::Error> {
    let live: Vec<NodeRow> = diesel::sql_query(
        "SELECT id FROM endpoints_nodes \
         WHERE seen_at > now() - make_interval(secs => $1) AND id <> $2 AND NOT counted_out",
    )
    .bind::<Double, _>(LIVE_WITHIN.as_secs_f64())
    .bind::<Text, _>(node)
    .load(conn)?;
    Ok(live.into_iter().map(|node| node.id).collect())
}

/// Marks the processes that did not acknowledge a barrier in time: each forgets what it keeps at its next
/// heartbeat.
fn count_out(conn: &mut PgConnection, out: &[String]) -> Result<(), diesel::result::Error> {
    if !out.is_empty() {
        diesel::sql_query("UPDATE endpoints_nodes SET counted_out = TRUE WHERE id = ANY($1)")
            .bind::<Array<Text>, _>(out)
            .execute(conn)?;
    }
    Ok(())
}

/// Sends the barrier `token`.
fn send_barrier(conn: &mut PgConnection, token: &str) -> Result<(), diesel::result::Error> {
    diesel::sql_query("SELECT pg_notify($1, $2)")
        .bind::<Text, _>(CHANNEL)
        .bind::<Text, _>(format!("barrier:{token}"))
        .execute(conn)?;
    Ok(())
}

/// Sends a barrier and waits, at most [`ACK_WITHIN`], for each of `waiting` to acknowledge it; returns those that
/// did not.
fn await_acks(
    conn: &mut PgConnection,
    mut waiting: HashSet<String>,
) -> Result<HashSet<String>, diesel::result::Error> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    send_barrier(conn, &token)?;
    let deadline = Instant::now() + ACK_WITHIN;
    while !waiting.is_empty() && Instant::now() < deadline {
        for notification in conn.notifications_iter() {
            let payload = notification?.payload;
            if let Some((acked, from)) = payload.split_once(':') {
                if acked == token {
                    waiting.remove(from);
                }
            }
        }
        if !waiting.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(waiting)
}

/// Read your writes on every process of a PostgreSQL database (see the module's documentation): a writer's
/// [`Propagation::settle`] sends a barrier and waits for every other live process's acknowledgement.
pub struct PgPropagation {
    db: Database,
}

/// How a barrier was waited for.
enum Waited {
    /// Every process acknowledged it, or none was waited for.
    Done,
    /// These did not acknowledge it in time, and were counted out.
    CountedOut(Vec<String>),
    /// This process's listener lost its connection meanwhile: acknowledgements may have been missed.
    Deaf,
}

impl PgPropagation {
    /// Waits on a channel that this process's listener completes (see [`crate::waiters`]): a pooled connection
    /// is held only to read who is live and send the barrier, and again to count out the silent.
    async fn through_listener(&self) -> Result<Waited, String> {
        let waiters = Arc::clone(self.db.waiters());
        let token = uuid::Uuid::new_v4().simple().to_string();
        let (db, node, registering) = (self.db.clone(), self.db.node().to_owned(), token.clone());
        let registered = tokio::task::spawn_blocking(move || {
            db.on_connection(|conn| match conn {
                AnyConnection::Postgresql(conn) => {
                    let live = live_nodes(conn, &node)?;
                    if live.is_empty() {
                        return Ok(None);
                    }
                    let woken = waiters.register(registering.clone(), live);
                    match send_barrier(conn, &registering) {
                        Ok(()) => Ok(Some(woken)),
                        Err(err) => {
                            waiters.abandon(&registering);
                            Err(err)
                        }
                    }
                }
                AnyConnection::Sqlite(_) => Ok(None),
            })?
            .map_err(|err| err.to_string())
        })
        .await
        .map_err(|err| err.to_string())??;
        let Some(woken) = registered else { return Ok(Waited::Done) };
        match tokio::time::timeout(ACK_WITHIN, woken).await {
            Ok(Ok(())) => Ok(Waited::Done),
            Ok(Err(_)) => Ok(Waited::Deaf),
            Err(_) => {
                let out: Vec<String> = self.db.waiters().abandon(&token).into_iter().collect();
                if out.is_empty() {
                    return Ok(Waited::Done);
                }
                let (db, marked) = (self.db.clone(), out.clone());
                tokio::task::spawn_blocking(move || {
                    db.on_connection(|conn| match conn {
                        AnyConnection::Postgresql(conn) => {
                            count_out(conn, &marked).map_err(|e| e.to_string())
                        }
                        AnyConnection::Sqlite(_) => Ok(()),
                    })?
                })
                .await
                .map_err(|err| err.to_string())??;
                Ok(Waited::CountedOut(out))
            }
        }
    }

    /// Waits on a pooled connection of its own, listening for acknowledgements there.
    async fn on_a_connection(&self) -> Result<Vec<String>, String> {
        let (db, node) = (self.db.clone(), self.db.node().to_owned());
        tokio::task::spawn_blocking(move || {
            db.on_connection(|conn| match conn {
                AnyConnection::Postgresql(conn) => barrier(conn, &node).map_err(|err| err.to_string()),
                AnyConnection::Sqlite(_) => Ok(Vec::new()),
            })?
        })
        .await
        .map_err(|err| err.to_string())?
    }
}

#[async_trait::async_trait]
impl Propagation for PgPropagation {
    async fn settle(&self) {
        let waited = if self.db.waiters().listening() {
            match self.through_listener().await {
                Ok(Waited::Deaf) => self.on_a_connection().await,
                Ok(Waited::Done) => Ok(Vec::new()),
                Ok(Waited::CountedOut(out)) => Ok(out),
                Err(err) => Err(err),
            }
        } else {
            self.on_a_connection().await
        };
        match waited {
            Ok(out) if out.is_empty() => {}
            Ok(out) => tracing::warn!(
                nodes = ?out,
                "processes did not acknowledge a change within {} s: counted out, they forget what they keep",
                ACK_WITHIN.as_secs()
            ),
            // The change is saved; other processes still apply it as it is delivered.
            Err(err) => tracing::warn!(error = %err, "could not wait for other processes to apply a change"),
        }
    }
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let until = Instant::now() + total;
    while !stop.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use domain::{Change, EndpointName, ProjectId, TableName};

    use super::{listening_url, parse, payload};

    #[test]
    fn the_listening_connection_fails_fast_unless_the_url_says_otherwise() {
        let url = listening_url("postgres://u:p@db:5432/endpoints");
        assert!(url.starts_with("postgres://u:p@db:5432/endpoints?connect_timeout=5&keepalives=1&"), "{url}");
        assert!(url.ends_with("&tcp_user_timeout=5000"), "{url}");
        let own = listening_url("postgres://db/e?sslmode=require&connect_timeout=30");
        assert!(own.starts_with("postgres://db/e?sslmode=require&connect_timeout=30&keepalives=1&"), "{own}");
        assert_eq!(own.matches("connect_timeout").count(), 1, "{own}");
    }

    #[test]
    fn payloads_round_trip_and_anything_else_means_everything() {
        let changes = [
            Change::Endpoint {
                project: ProjectId::new(7).unwrap(),
                name: EndpointName::parse("daily_2").unwrap(),
            },
            Change::Keys,
            Change::Table {
                project: ProjectId::new(3).unwrap(),
                name: TableName::parse("events_2").unwrap(),
            },
            Change::Everything,
        ];
        for change in changes {
            assert_eq!(parse(&payload(&change)), change);
        }
        assert_eq!(
            parse(&payload(&Change::Heard)),
            Change::Everything,
            "never announced, read as everything"
        );
        for odd in
            ["", "endpoint:0:x", "endpoint:1:bad name", "endpoint:1", "keys:1", "table:1:a-b", "future:thing"]
        {
            assert_eq!(parse(odd), Change::Everything, "{odd}");
        }
    }
}
