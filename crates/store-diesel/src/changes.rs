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
//! waits for each live process's acknowledgement on [`ACKS`] (one statement reads who is live and sends the
//! barrier, after the news the writer announces with it, such as a table write's): PostgreSQL delivers
//! notifications in commit order and a listener applies them one after the other, so a listener that
//! acknowledges the barrier has applied the change before it. A process that does not acknowledge within
//! [`ACK_WITHIN`] is counted out: its next heartbeat reads that, and it forgets everything it keeps
//! ([`Change::Everything`]).
//!
//! The writer's own listener hears the acknowledgements and wakes it ([`crate::waiters`]): a waiting writer
//! holds no database connection, so any number of writes wait at once on a small pool. One statement at a
//! time sends what this process's writers queued ([`crate::waiters::Outbox`]), so concurrent writes share a
//! statement and a barrier. A process whose
//! listener is not connected (a command, or a listener reconnecting) waits on a pooled connection of its own.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::{Array, Bool, Double, Nullable, Text};
use diesel::{Connection, PgConnection, QueryableByName, RunQueryDsl};
use domain::{Change, EndpointName, ProjectId, Propagation, StoreError, TableAnnouncer, TableName};
use tokio::sync::oneshot;

use crate::connection::{AnyConnection, Backend, Database};
use crate::error::DbError;
use crate::waiters::{Turn, Waiters};
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
/// How often the listener looks for notifications for [`BUSY_FOR`] after notifications arrived: a barrier of a
/// stream of writes is acknowledged within about half a millisecond, while an idle listener wakes only every [`POLL`].
const ACK_POLL: Duration = Duration::from_micros(500);
/// How often the listener looks for acknowledgements while a writer of its process waits for them: most of a
/// barrier's round trip is the two listeners' pauses, and this one lasts only as long as a write waits.
const WAITING_POLL: Duration = Duration::from_micros(200);
/// How long the listener keeps looking every [`ACK_POLL`] after notifications arrived.
const BUSY_FOR: Duration = Duration::from_secs(1);
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

/// The payloads announcing that `tables` were written and the endpoints `readers` changed with them.
fn table_payloads(project: ProjectId, tables: Vec<TableName>, readers: Vec<EndpointName>) -> Vec<String> {
    let changes = tables
        .into_iter()
        .map(|name| Change::Table { project, name })
        .chain(readers.into_iter().map(|name| Change::Endpoint { project, name }));
    changes.map(|change| payload(&change)).collect()
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
        let payloads = table_payloads(project, tables, readers);
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

    #[tracing::instrument(skip_all, fields(project = %project, tables = tables.len(), readers = readers.len()))]
    async fn announce_and_settle(
        &self,
        project: ProjectId,
        tables: Vec<TableName>,
        readers: Vec<EndpointName>,
    ) {
        if self.db.backend() == Backend::Postgres {
            self.db.settle_after(table_payloads(project, tables, readers)).await;
        }
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
    let mut news = None::<Instant>;
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
        if !delivered.is_empty() {
            news = Some(Instant::now());
        }
        let mut acks = Vec::new();
        for payload in delivered {
            match payload.strip_prefix("barrier:") {
                // This process's own writers do not wait for it.
                Some(token) if waiters.own(token) => {}
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
        let busy = news.is_some_and(|at| at.elapsed() < BUSY_FOR);
        waiters.pause(if busy { ACK_POLL } else { POLL }, WAITING_POLL);
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
struct Sent {
    #[diesel(sql_type = Array<Text>)]
    live: Vec<String>,
}

/// Sends `payloads` and then, if any other process is live, the barrier `token`, in one statement (so one
/// transaction: delivered together, in this order, after every change committed before it); answers the live
/// processes but `node` that must acknowledge the barrier. A process counted out already is not waited for
/// again: it forgets everything at its next heartbeat.
fn send_barrier(
    conn: &mut PgConnection,
    node: &str,
    token: &str,
    payloads: Vec<String>,
) -> Result<HashSet<String>, diesel::result::Error> {
    let sent: Sent = diesel::sql_query(
        "WITH live AS (SELECT COALESCE(array_agg(id), '{}') AS ids FROM endpoints_nodes \
         WHERE seen_at > now() - make_interval(secs => $4) AND id <> $5 AND NOT counted_out) \
         SELECT live.ids AS live, (SELECT count(pg_notify($1, payload)) FROM unnest($2 || \
         CASE WHEN cardinality(live.ids) > 0 THEN ARRAY[$3] ELSE '{}'::text[] END) AS payload) AS sent \
         FROM live",
    )
    .bind::<Text, _>(CHANNEL)
    .bind::<Array<Text>, _>(payloads)
    .bind::<Text, _>(format!("barrier:{token}"))
    .bind::<Double, _>(LIVE_WITHIN.as_secs_f64())
    .bind::<Text, _>(node)
    .get_result(conn)?;
    Ok(sent.live.into_iter().collect())
}

/// Sends `payloads` and a barrier after them on `conn`, and waits until every live process but `node`
/// acknowledged it, or [`ACK_WITHIN`] passed; counts out and returns the processes that did not acknowledge.
fn barrier(
    conn: &mut PgConnection,
    node: &str,
    payloads: Vec<String>,
) -> Result<Vec<String>, diesel::result::Error> {
    conn.batch_execute(&format!("LISTEN {ACKS}"))?;
    // The pooled connection stops listening whatever happened, so no later user of it gathers acknowledgements.
    let waited = await_acks(conn, node, payloads);
    let unlistened = conn.batch_execute(&format!("UNLISTEN {ACKS}"));
    let out: Vec<String> = waited?.into_iter().collect();
    unlistened?;
    count_out(conn, &out)?;
    Ok(out)
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

/// Sends `payloads` and a barrier, and waits, at most [`ACK_WITHIN`], for each live process but `node` to
/// acknowledge it; returns those that did not.
fn await_acks(
    conn: &mut PgConnection,
    node: &str,
    payloads: Vec<String>,
) -> Result<HashSet<String>, diesel::result::Error> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let mut waiting = send_barrier(conn, node, &token, payloads)?;
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

#[async_trait::async_trait]
impl Propagation for PgPropagation {
    async fn settle(&self) {
        self.db.settle_after(Vec::new()).await;
    }
}

impl Database {
    /// Sends `payloads` on the change channel and returns once every other live process applied them and every
    /// change committed before, or was counted out. With this process's listener connected, the payloads join
    /// the [`crate::waiters::Outbox`]: one statement at a time sends what is queued and a barrier, and the
    /// listener completes the wait; else the writer waits on a connection of its own. Never fails: the changes
    /// are saved, and what could not be waited for is logged.
    async fn settle_after(&self, payloads: Vec<String>) {
        if !self.waiters().listening() {
            report(self.on_a_connection(payloads).await);
            return;
        }
        let done = self.outbox().queue(payloads);
        if let Some(turn) = self.outbox().turn() {
            // A task of its own: the writers of a batch are answered even if this one is cancelled.
            tokio::spawn(self.clone().send_queued(turn));
        }
        // Closed without a word only if the payloads could not be sent (logged).
        let _ = done.await;
    }

    /// Sends what is queued, batch after batch, until nothing is; then gives the turn back (and takes it again
    /// if a writer queued news after the last look and saw the turn taken).
    async fn send_queued(self, mut turn: Turn) {
        loop {
            loop {
                let (payloads, writers) = self.outbox().take(&turn);
                if writers.is_empty() {
                    break;
                }
                self.send_batch(payloads, writers).await;
            }
            drop(turn);
            // Looked at after giving the turn back: a writer that queued before saw it taken, and one that
            // queues after finds it free.
            if self.outbox().is_empty() {
                return;
            }
            match self.outbox().turn() {
                Some(again) => turn = again,
                None => return,
            }
        }
    }

    /// Sends one batch's payloads and a barrier in one statement, then waits for the acknowledgements in a task
    /// of its own (the next batch is sent meanwhile) and wakes the batch's writers.
    async fn send_batch(&self, payloads: Vec<String>, writers: Vec<oneshot::Sender<()>>) {
        let waiters = Arc::clone(self.waiters());
        let token = uuid::Uuid::new_v4().simple().to_string();
        // Registered before it is sent: a fast acknowledgement is not missed.
        let woken = waiters.register(token.clone());
        let (db, node, sending) = (self.clone(), self.node().to_owned(), token.clone());
        let sent = tokio::task::spawn_blocking(move || {
            db.on_connection(|conn| match conn {
                AnyConnection::Postgresql(conn) => send_barrier(conn, &node, &sending, payloads),
                AnyConnection::Sqlite(_) => Ok(HashSet::new()),
            })?
            .map_err(|err| err.to_string())
        })
        .await
        .map_err(|err| err.to_string())
        .and_then(|sent| sent);
        match sent {
            Ok(live) => {
                waiters.expect(&token, live);
                let db = self.clone();
                tokio::spawn(async move {
                    report(db.acknowledged(token, woken).await);
                    for writer in writers {
                        // The writer may have stopped waiting.
                        let _ = writer.send(());
                    }
                });
            }
            Err(err) => {
                waiters.abandon(&token);
                report(Err(err));
            }
        }
    }

    /// Waits, at most [`ACK_WITHIN`], until this process's listener heard every process the barrier `token` was
    /// sent for acknowledge it; counts out and returns those that did not. If the listener lost its connection
    /// meanwhile, waits for a new barrier on a connection of its own.
    async fn acknowledged(&self, token: String, woken: oneshot::Receiver<()>) -> Result<Vec<String>, String> {
        match tokio::time::timeout(ACK_WITHIN, woken).await {
            Ok(Ok(())) => Ok(Vec::new()),
            Ok(Err(_)) => self.on_a_connection(Vec::new()).await,
            Err(_) => {
                let out: Vec<String> = self.waiters().abandon(&token).into_iter().collect();
                if out.is_empty() {
                    return Ok(out);
                }
                let (db, marked) = (self.clone(), out.clone());
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
                Ok(out)
            }
        }
    }

    /// Waits on a pooled connection of its own, listening for acknowledgements there.
    async fn on_a_connection(&self, payloads: Vec<String>) -> Result<Vec<String>, String> {
        let (db, node) = (self.clone(), self.node().to_owned());
        tokio::task::spawn_blocking(move || {
            db.on_connection(|conn| match conn {
                AnyConnection::Postgresql(conn) => {
                    barrier(conn, &node, payloads).map_err(|err| err.to_string())
                }
                AnyConnection::Sqlite(_) => Ok(Vec::new()),
            })?
        })
        .await
        .map_err(|err| err.to_string())?
    }
}

/// Logs how a wait for the other processes ended, unless every one acknowledged.
fn report(waited: Result<Vec<String>, String>) {
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
