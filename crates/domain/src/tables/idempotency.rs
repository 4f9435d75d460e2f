//! Appends made once: an `Idempotency-Key` names an append, so that a client that retries (a timeout, a broken
//! connection, its own process restarted) adds the rows once and gets the first answer again.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::model::{UploadBody, Written};
use crate::clock::Timestamp;
use crate::error::{Invalid, UploadError};

/// How long an append's key is remembered: a retry within it adds nothing.
pub const IDEMPOTENCY_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How long an append under a key may be in flight. A retry meanwhile is told to wait (409); after it, the first
/// append is taken to have been cut off (its process stopped), and the retry finds its rows in the table or
/// writes them.
pub const APPEND_IN_FLIGHT: Duration = Duration::from_secs(120);

/// An append's `Idempotency-Key`: 1 to 128 visible ASCII characters, chosen by the client (a UUID, a batch id).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 128;

    /// # Errors
    /// [`Invalid`] (attr `Idempotency-Key`) for an empty or longer key, or one with other characters.
    pub fn parse(raw: &str) -> Result<Self, Invalid> {
        let visible = raw.bytes().all(|b| b.is_ascii_graphic());
        if raw.is_empty() || raw.len() > Self::MAX_LEN || !visible {
            return Err(Invalid::field(
                "Idempotency-Key",
                format!(
                    "An Idempotency-Key is 1 to {} visible ASCII characters (letters, digits, punctuation).",
                    Self::MAX_LEN
                ),
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The SHA-256 of a body, computed as the body passes.
#[derive(Clone, Default)]
pub struct BodyDigest(Arc<Mutex<Sha256>>);

impl std::fmt::Debug for BodyDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("BodyDigest").finish_non_exhaustive()
    }
}

impl BodyDigest {
    /// The body, each chunk added to this digest as it is read.
    pub fn wrap(&self, body: UploadBody) -> UploadBody {
        let digest = Arc::clone(&self.0);
        Box::pin(body.inspect(move |chunk| {
            if let Ok(bytes) = chunk {
                digest.lock().unwrap_or_else(PoisonError::into_inner).update(bytes);
            }
        }))
    }

    /// The SHA-256 of the bytes read so far, in hex.
    pub fn hex(&self) -> String {
        hex::encode(self.0.lock().unwrap_or_else(PoisonError::into_inner).clone().finalize())
    }

    /// The SHA-256 of a whole body, read to its end (at most `limit_bytes`) and dropped.
    ///
    /// # Errors
    /// [`UploadError::TooLarge`] past the limit, [`UploadError::CutOff`] for a body that stops before its end.
    pub async fn of(body: UploadBody, limit_bytes: u64) -> Result<String, UploadError> {
        let digest = Self::default();
        let mut body = digest.wrap(body);
        let mut size = 0_u64;
        while let Some(chunk) = body.next().await {
            size += chunk.map_err(|e| UploadError::CutOff(Box::new(e)))?.len() as u64;
            if size > limit_bytes {
                return Err(UploadError::TooLarge { limit_bytes });
            }
        }
        Ok(digest.hex())
    }
}

/// An append made under a key: the id its rows are written under and its body's digest, which the engine keeps
/// with the rows so that an append cut off before it was answered can be found by its id; and the key with the
/// table's version read before the key was claimed (`after`). Of the appends made under one key, the engine
/// commits at most one after that version: an append whose key a retry took over while its writer was silent
/// (not gone, only slow) adds nothing when it wakes up ([`UploadError::TakenOver`](crate::UploadError)).
#[derive(Debug, Clone)]
pub struct AppendTag {
    pub write_id: Uuid,
    pub digest: BodyDigest,
    pub key: IdempotencyKey,
    pub after: u64,
}

/// An append found in a table by its write id: what it wrote and the SHA-256 of its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaggedWrite {
    pub written: Written,
    pub body_sha256: String,
}

/// What the store knows of a key when an append claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendKeyState {
    /// New (or its record had expired): now pending under the caller's write id.
    Claimed,
    /// Answered before: that body's SHA-256 and what it wrote.
    Answered { body_sha256: String, written: Written },
    /// Pending since `since` under another write id: in flight, or cut off. `writer_gone` when the process that
    /// claimed it is known to have stopped (it cannot still be writing it).
    Pending { write_id: Uuid, since: Timestamp, writer_gone: bool },
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn body(parts: &[&'static str]) -> UploadBody {
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            parts.iter().map(|p| Ok(Bytes::from_static(p.as_bytes()))).collect();
        Box::pin(futures_util::stream::iter(chunks))
    }

    #[test]
    fn keys_are_one_to_128_visible_characters() {
        for good in ["a", "batch-2026-11-26/0001", "550e8400-e29b-41d4-a716-446655440000", &"k".repeat(128)] {
            assert_eq!(IdempotencyKey::parse(good).unwrap().as_str(), good);
        }
        for bad in ["", " ", "a b", "é", "tab\there", &"k".repeat(129)] {
            let err = IdempotencyKey::parse(bad).unwrap_err();
            assert_eq!(err.attr.as_deref(), Some("Idempotency-Key"), "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_digest_is_the_sha256_of_the_whole_body_however_it_is_cut() {
        let whole = BodyDigest::of(body(&["id,kind\n1,a\n"]), 100).await.unwrap();
        assert_eq!(whole, BodyDigest::of(body(&["id,k", "ind\n1", ",a\n"]), 100).await.unwrap());
        assert_eq!(whole, hex::encode(Sha256::digest(b"id,kind\n1,a\n")));
        assert_ne!(whole, BodyDigest::of(body(&["id,kind\n1,b\n"]), 100).await.unwrap());
        assert!(matches!(
            BodyDigest::of(body(&["0123456789", "0"]), 10).await,
            Err(UploadError::TooLarge { limit_bytes: 10 })
        ));
    }
}
