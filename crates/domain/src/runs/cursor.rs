//! Cursors: the next page of a run, over the same snapshot of its tables.
//!
//! A cursor says which page comes next and which version of each table the first page read (and when its data
//! was as of). It carries no secret and grants nothing: the versions it pins are the project's own, which the
//! caller may read with `as_of` too, and it is checked against the run it continues (project, endpoint,
//! version, a digest of the bound variables, whatever form they were sent in), so a cursor of another run is refused rather than followed.
//! Its age is bounded by the service's cursor lifetime.

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::access::ProjectId;
use crate::clock::Timestamp;
use crate::error::{Error, Invalid};
use crate::query::TableVersion;

/// The longest cursor read: a cursor names a few tables; anything longer was not made here.
const MAX_CURSOR_BYTES: usize = 8 * 1024;

/// How far apart the clocks of the service's nodes may be: a cursor issued by one is read by another.
const CLOCK_SKEW: Duration = Duration::from_secs(300);

/// The most tables a cursor pins (a query names far fewer).
const MAX_PINNED: usize = 256;

/// What a cursor says, as it is written (short names: it travels in URLs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Written {
    /// The project.
    p: i64,
    /// The endpoint.
    e: String,
    /// The endpoint's version that ran.
    v: u32,
    /// A digest of the run's bound variables.
    h: String,
    /// The table versions the first page read.
    t: Vec<TableVersion>,
    /// The offset of the next page.
    o: u64,
    /// When it was issued, in seconds since the Unix epoch.
    i: i64,
    /// The first page's `data_as_of`, in nanoseconds since the Unix epoch.
    d: i64,
}

/// The run a cursor continues: what it is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunOf<'a> {
    pub project: ProjectId,
    pub endpoint: &'a str,
    pub version: u32,
    pub variables: &'a serde_json::Value,
}

impl RunOf<'_> {
    /// A digest of the bound variables and what they were bound for.
    fn digest(&self) -> String {
        let mut hash = Sha256::new();
        hash.update(self.project.get().to_be_bytes());
        hash.update(self.endpoint.as_bytes());
        hash.update([0]);
        hash.update(self.version.to_be_bytes());
        hash.update(self.variables.to_string().as_bytes());
        hex::encode(&hash.finalize()[..16])
    }
}

/// A cursor read and checked: where the page it asks for starts, and what it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub project: ProjectId,
    pub endpoint: String,
    pub version: u32,
    pub offset: u64,
    pub pinned: Vec<TableVersion>,
    pub data_as_of: Timestamp,
    digest: String,
}

fn not_a_cursor() -> Error {
    Error::Invalid(Invalid::field("cursor", "cursor is not a cursor this service issued."))
}

fn nanos(at: Timestamp) -> i64 {
    i64::try_from(at.unix_timestamp_nanos()).unwrap_or(i64::MAX)
}

impl Cursor {
    /// The cursor of the page at `offset` of `run`, which read `pinned` with data as of `data_as_of`.
    pub(crate) fn issue(
        run: RunOf<'_>,
        offset: u64,
        pinned: &[TableVersion],
        data_as_of: Timestamp,
        now: Timestamp,
    ) -> String {
        let written = Written {
            p: run.project.get(),
            e: run.endpoint.to_owned(),
            v: run.version,
            h: run.digest(),
            t: pinned.to_vec(),
            o: offset,
            i: now.unix_timestamp(),
            d: nanos(data_as_of),
        };
        let json = serde_json::to_vec(&written).expect("a cursor is strings and numbers");
        URL_SAFE_NO_PAD.encode(json)
    }

    /// Reads a cursor as sent.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`cursor`) for anything this service did not write; [`Error::CursorExpired`] for a
    /// cursor issued more than `ttl` before `now`.
    pub fn read(raw: &str, now: Timestamp, ttl: Duration) -> Result<Self, Error> {
        if raw.len() > MAX_CURSOR_BYTES {
            return Err(not_a_cursor());
        }
        let bytes = URL_SAFE_NO_PAD.decode(raw.trim()).map_err(|_| not_a_cursor())?;
        let written: Written = serde_json::from_slice(&bytes).map_err(|_| not_a_cursor())?;
        let project = ProjectId::new(written.p).map_err(|_| not_a_cursor())?;
        let issued = Timestamp::from_unix_timestamp(written.i).map_err(|_| not_a_cursor())?;
        let data_as_of =
            Timestamp::from_unix_timestamp_nanos(i128::from(written.d)).map_err(|_| not_a_cursor())?;
        if written.t.len() > MAX_PINNED {
            return Err(not_a_cursor());
        }
        // Issued later than now (beyond the skew of two nodes' clocks): made up, not issued here.
        if issued - now > CLOCK_SKEW {
            return Err(not_a_cursor());
        }
        // Differences, not sums: a made-up time at the end of the calendar must not overflow.
        if now - issued > ttl {
            let ttl = humantime::format_duration(ttl);
            return Err(Error::CursorExpired(format!(
                "The cursor is older than the {ttl} cursors are kept for; run again without it for a new first page."
            )));
        }
        Ok(Self {
            project,
            endpoint: written.e,
            version: written.v,
            offset: written.o,
            pinned: written.t,
            data_as_of,
            digest: written.h,
        })
    }

    /// What identifies the run it continues (the version and the digest of project, endpoint and variables), for
    /// a cache key.
    pub(crate) fn run_key(&self) -> String {
        format!("{}:{}", self.version, self.digest)
    }

    /// Checks that the cursor continues `run`.
    ///
    /// # Errors
    /// [`Error::Invalid`] (`cursor`) naming what differs.
    pub(crate) fn check(&self, run: RunOf<'_>) -> Result<(), Error> {
        let differs = if self.project != run.project || self.endpoint != run.endpoint {
            Some("another endpoint")
        } else if self.version != run.version {
            Some("another version of the endpoint")
        } else if self.digest != run.digest() {
            Some("other variables: send the variables of the run it continues")
        } else {
            None
        };
        match differs {
            Some(what) => {
                Err(Error::Invalid(Invalid::field("cursor", format!("cursor belongs to a run of {what}."))))
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_unix_timestamp(1_800_000_000 + seconds).unwrap()
    }

    fn run<'a>(variables: &'a serde_json::Value, version: u32) -> RunOf<'a> {
        RunOf { project: ProjectId::new(3).unwrap(), endpoint: "sales", version, variables }
    }

    #[test]
    fn a_cursor_reads_back_what_it_was_issued_with_and_continues_only_its_run() {
        let vars = json!({"country": "US"});
        let pinned = vec![TableVersion { table: "orders".into(), version: 17 }];
        let raw = Cursor::issue(run(&vars, 2), 100, &pinned, at(-5), at(0));
        assert!(raw.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'), "URL-safe: {raw}");
        let cursor = Cursor::read(&raw, at(60), Duration::from_secs(3600)).unwrap();
        assert_eq!((cursor.offset, cursor.version, cursor.pinned.clone()), (100, 2, pinned));
        assert_eq!(cursor.data_as_of, at(-5));
        cursor.check(run(&vars, 2)).unwrap();

        let refused = |err: Error| match err {
            Error::Invalid(invalid) => invalid.detail,
            other => panic!("{other:?}"),
        };
        let other_vars = json!({"country": "FR"});
        assert!(refused(cursor.check(run(&other_vars, 2)).unwrap_err()).contains("other variables"));
        assert!(refused(cursor.check(run(&vars, 3)).unwrap_err()).contains("another version"));
        let other_project = RunOf { project: ProjectId::new(4).unwrap(), ..run(&vars, 2) };
        assert!(refused(cursor.check(other_project).unwrap_err()).contains("another endpoint"));
        let other_endpoint = RunOf { endpoint: "stock", ..run(&vars, 2) };
        assert!(refused(cursor.check(other_endpoint).unwrap_err()).contains("another endpoint"));
    }

    #[test]
    fn an_old_or_made_up_cursor_is_refused() {
        let vars = json!({});
        let raw = Cursor::issue(run(&vars, 1), 10, &[], at(0), at(0));
        let ttl = Duration::from_secs(3600);
        assert!(Cursor::read(&raw, at(3600), ttl).is_ok());
        assert!(matches!(Cursor::read(&raw, at(3601), ttl), Err(Error::CursorExpired(_))));
        // Issued at the end of the calendar, or an hour from now: made up (and no arithmetic overflows).
        let forged = |issued: i64| {
            let written = Written {
                p: 3,
                e: "sales".into(),
                v: 1,
                h: String::new(),
                t: Vec::new(),
                o: 0,
                i: issued,
                d: 0,
            };
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&written).unwrap())
        };
        let end_of_calendar = forged(253_402_300_799);
        let later = forged(at(3600).unix_timestamp());
        for junk in [
            "",
            "abc",
            "!!!!",
            &"A".repeat(MAX_CURSOR_BYTES + 1),
            &URL_SAFE_NO_PAD.encode(b"{\"p\":1}"),
            &end_of_calendar,
            &later,
        ] {
            match Cursor::read(junk, at(0), ttl) {
                Err(Error::Invalid(invalid)) => assert_eq!(invalid.attr.as_deref(), Some("cursor")),
                other => panic!("{junk}: {other:?}"),
            }
        }
    }
}
