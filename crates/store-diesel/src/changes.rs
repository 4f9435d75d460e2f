//! Changes announced to every process on the same PostgreSQL database, with `NOTIFY` inside the writing
//! transaction (delivered at commit, never for a rollback) and a `LISTEN`ing thread per process.
//!
//! SQLite serves one process, so nothing is announced there. A listener whose connection drops reports
//! [`Change::Everything`] at once and again at every failed reconnection, and once more when it is back (it may
//! have missed changes in between), so a process never trusts what it keeps longer than the reconnection
//! interval while the channel is down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::sql_types::Text;
use diesel::{Connection, PgConnection, RunQueryDsl};
use domain::{Change, EndpointName, ProjectId};

use crate::connection::AnyConnection;
use crate::error::DbError;

/// The channel every process listens on.
const CHANNEL: &str = "endpoints_changes";
/// How often the listener looks for delivered notifications: the delay a change takes to reach other processes.
const POLL: Duration = Duration::from_millis(20);
/// How often the listener checks that its connection is alive (a dead peer sends no error on its own).
const HEARTBEAT: Duration = Duration::from_secs(2);
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
        Change::Everything => "everything".into(),
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

/// A thread listening for the changes other processes announce. Told to stop when dropped; it ends at its next
/// look (within a few milliseconds, or when a connection attempt in progress gives up), and is not waited for.
pub struct ChangeListener {
    stop: Arc<AtomicBool>,
}

impl ChangeListener {
    /// Listens on the PostgreSQL database at `url`, calling `on_change` for every change announced (its own
    /// included) and with [`Change::Everything`] whenever changes may have been missed.
    pub(crate) fn spawn(url: &str, on_change: impl Fn(Change) + Send + 'static) -> Self {
        let url = listening_url(url);
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        // Detached: the thread ends on its own once told to stop.
        if let Err(err) = std::thread::Builder::new()
            .name("change-listener".into())
            .spawn(move || listen(&url, &stopping, &on_change))
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

fn listen(url: &str, stop: &AtomicBool, on_change: &dyn Fn(Change)) {
    let mut was_connected = true;
    while !stop.load(Ordering::Acquire) {
        match PgConnection::establish(url).and_then(|mut conn| {
            conn.batch_execute(&format!("LISTEN {CHANNEL}"))
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
                let reason = follow(&mut conn, stop, on_change);
                if let Some(reason) = reason {
                    tracing::warn!(error = %reason, "change listener lost its connection; reconnecting");
                    on_change(Change::Everything);
                    was_connected = false;
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

/// Delivers notifications until the connection fails (its error) or the listener stops (`None`).
fn follow(conn: &mut PgConnection, stop: &AtomicBool, on_change: &dyn Fn(Change)) -> Option<String> {
    let mut checked = Instant::now();
    while !stop.load(Ordering::Acquire) {
        for notification in conn.notifications_iter() {
            match notification {
                Ok(n) => on_change(parse(&n.payload)),
                Err(err) => return Some(err.to_string()),
            }
        }
        if checked.elapsed() >= HEARTBEAT {
            if let Err(err) = conn.batch_execute("SELECT 1") {
                return Some(err.to_string());
            }
            checked = Instant::now();
        }
        std::thread::sleep(POLL);
    }
    None
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let until = Instant::now() + total;
    while !stop.load(Ordering::Acquire) && Instant::now() < until {
        std::thread::sleep(POLL);
    }
}

#[cfg(test)]
mod tests {
    use domain::{Change, EndpointName, ProjectId};

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
            Change::Everything,
        ];
        for change in changes {
            assert_eq!(parse(&payload(&change)), change);
        }
        for odd in ["", "endpoint:0:x", "endpoint:1:bad name", "endpoint:1", "keys:1", "future:thing"] {
            assert_eq!(parse(odd), Change::Everything, "{odd}");
        }
    }
}
