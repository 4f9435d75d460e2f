//! The key service: issuing keys, resolving a bearer token to its caller (with a short-lived cache of keys
//! read from the store), checking scope and project, revoking.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngCore;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::model::{
    hash_secret, looks_like_key, ApiKey, NewApiKey, Principal, ProjectId, Scope, SecretHash, CURRENT_PROJECT,
    KEY_PREFIX, SECRET_BYTES,
};
use super::ports::{ApiKeyStore, ProjectStore};
use crate::clock::{Clock, Timestamp};
use crate::error::{Error, Invalid};

/// Issues, checks and revokes API keys.
pub struct ApiKeyService {
    keys: Arc<dyn ApiKeyStore>,
    projects: Arc<dyn ProjectStore>,
    clock: Arc<dyn Clock>,
    cache: KeyCache,
}

/// Keys found recently, by the hash of their secret, so most requests authenticate without a store read. An
/// entry is trusted for `ttl`: a key revoked by this process stops working at once, one revoked by another
/// process (the CLI, another node) within `ttl`. Expiry is checked on every request. Only keys that exist are
/// kept, so the cache holds at most one entry per real key.
struct KeyCache {
    ttl: Duration,
    /// Keyed by hashes of real keys only, so a seeded fast hasher is enough.
    entries: Mutex<HashMap<String, (Arc<ApiKey>, Timestamp), foldhash::fast::RandomState>>,
}

impl KeyCache {
    /// More entries than any deployment has keys; past it the cache starts again rather than grow.
    const MAX_ENTRIES: usize = 100_000;

    fn get(&self, hash: &str, now: Timestamp) -> Option<Arc<ApiKey>> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(hash).filter(|(_, fetched)| now < *fetched + self.ttl).map(|(key, _)| Arc::clone(key))
    }

    fn put(&self, key: &Arc<ApiKey>, now: Timestamp) {
        if self.ttl.is_zero() {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= Self::MAX_ENTRIES {
            entries.clear();
        }
        entries.insert(key.secret_hash.clone(), (Arc::clone(key), now));
    }

    fn forget(&self, id: Uuid) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).retain(|_, (key, _)| key.id != id);
    }

    fn clear(&self) {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }
}

impl ApiKeyService {
    pub fn new(keys: Arc<dyn ApiKeyStore>, projects: Arc<dyn ProjectStore>, clock: Arc<dyn Clock>) -> Self {
        Self {
            keys,
            projects,
            clock,
            cache: KeyCache { ttl: Self::KEY_CACHE_TTL, entries: Mutex::default() },
        }
    }

    /// How long a key found in the store is trusted without reading it again, by default: the most a revocation
    /// made by another process waits to take effect here.
    pub const KEY_CACHE_TTL: Duration = Duration::from_secs(1);

    /// Trusts a key found in the store for `ttl` (zero reads the store on every request).
    #[must_use]
    pub fn with_key_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache.ttl = ttl;
        self
    }

    /// Forgets every key read from the store, so the next request with each reads it again: how a revocation
    /// announced by another process takes effect here at once.
    pub fn forget_cached_keys(&self) {
        self.cache.clear();
    }

    /// Creates a key for an existing project.
    ///
    /// # Errors
    /// [`Error::Invalid`] for no scopes or an unknown project; store failures.
    pub async fn create(
        &self,
        project_id: ProjectId,
        scopes: Vec<Scope>,
        label: String,
        expires_in: Option<Duration>,
    ) -> Result<NewApiKey, Error> {
        if scopes.is_empty() {
            return Err(Invalid::field("scope", "A key needs at least one scope.").into());
        }
        if self.projects.get(project_id).await?.is_none() {
            return Err(Invalid::field("project", format!("Project {project_id} does not exist.")).into());
        }
        let mut bytes = [0_u8; SECRET_BYTES];
        rand::rng().fill_bytes(&mut bytes);
        let secret = format!("{KEY_PREFIX}{}", hex::encode(bytes));
        let now = self.clock.now();
        let mut scopes = scopes;
        scopes.sort();
        scopes.dedup();
        let key = ApiKey {
            id: Uuid::new_v4(),
            project_id,
            label,
            scopes,
            secret_hash: hash_secret(&secret),
            prefix: secret[..KEY_PREFIX.len() + 6].to_owned(),
            created_at: now,
            expires_at: expires_in.map(|d| now + d),
            revoked_at: None,
        };
        let key = self.keys.insert(key).await?;
        Ok(NewApiKey { key, secret })
    }

    /// Resolves a bearer token to its caller.
    ///
    /// # Errors
    /// [`Error::NotAuthenticated`] for a malformed, unknown, revoked or expired key; store failures.
    pub async fn authenticate(&self, token: &str) -> Result<Principal, Error> {
        if !looks_like_key(token) {
            return Err(Error::NotAuthenticated("The API key is malformed.".into()));
        }
        let hash = SecretHash::of(token);
        let hash = hash.as_str();
        let now = self.clock.now();
        let key = match self.cache.get(hash, now) {
            Some(key) => key,
            None => {
                let found = self.keys.find_by_hash(hash).await?.map(Arc::new);
                if let Some(key) = &found {
                    self.cache.put(key, now);
                }
                found.ok_or_else(|| Error::NotAuthenticated("The API key is not valid.".into()))?
            }
        };
        // The store found the key by its hash; comparing again in constant time costs nothing and does not
        // depend on how the store compares.
        if !bool::from(key.secret_hash.as_bytes().ct_eq(hash.as_bytes())) {
            return Err(Error::NotAuthenticated("The API key is not valid.".into()));
        }
        if !key.is_usable_at(now) {
            return Err(Error::NotAuthenticated("The API key has been revoked or has expired.".into()));
        }
        Ok(Principal { key_id: key.id, project_id: key.project_id, scopes: key.scopes.clone() })
    }

    /// Checks that `principal` may use scope `needed` on the project named in a path (`42` or `@current`).
    ///
    /// # Errors
    /// [`Error::Invalid`] for a malformed project id; [`Error::PermissionDenied`] for a missing scope or another
    /// project (existing or not: the two are indistinguishable).
    pub fn authorize(
        &self,
        principal: &Principal,
        path_project: &str,
        needed: Scope,
    ) -> Result<ProjectId, Error> {
        let project = if path_project == CURRENT_PROJECT {
            principal.project_id
        } else {
            path_project.parse::<i64>().ok().and_then(|id| ProjectId::new(id).ok()).ok_or_else(|| {
                Invalid::field("project_id", "project_id must be a positive integer or @current.")
            })?
        };
        if project != principal.project_id {
            return Err(Error::PermissionDenied("This API key does not give access to this project.".into()));
        }
        if !principal.scopes.iter().any(|s| s.grants(needed)) {
            return Err(Error::PermissionDenied(format!("This action needs the scope '{needed}'.")));
        }
        Ok(project)
    }

    /// # Errors
    /// [`Error::NotFound`] for an unknown key id; store failures.
    pub async fn revoke(&self, id: Uuid) -> Result<(), Error> {
        self.keys.revoke(id, self.clock.now()).await?;
        self.cache.forget(id);
        Ok(())
    }

    /// # Errors
    /// Store failures.
    pub async fn list(&self, project: Option<ProjectId>) -> Result<Vec<ApiKey>, Error> {
        Ok(self.keys.list(project).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::super::model::Project;
    use super::super::ports::{MockApiKeyStore, MockProjectStore};
    use super::*;
    use crate::clock::MockClock;
    use crate::testing::{api_key, ManualClock, T0 as NOW};

    fn clock() -> Arc<MockClock> {
        let mut clock = MockClock::new();
        clock.expect_now().return_const(NOW);
        Arc::new(clock)
    }

    fn project(id: i64) -> ProjectId {
        ProjectId::new(id).unwrap()
    }

    fn service_with(key: Option<ApiKey>) -> ApiKeyService {
        let mut keys = MockApiKeyStore::new();
        keys.expect_find_by_hash().returning(move |hash| Ok(key.clone().filter(|k| k.secret_hash == hash)));
        ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock())
    }

    const SECRET: &str = "phx_00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    #[test]
    fn secrets_hash_to_the_stored_form() {
        // Keys already stored hold exactly this: SHA-256 as lowercase hex (FIPS 180-2's "abc" vector).
        assert_eq!(hash_secret("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(SecretHash::of(SECRET).as_str(), hash_secret(SECRET));
    }

    #[tokio::test]
    async fn created_keys_are_prefixed_and_stored_only_as_a_hash() {
        let stored = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&stored);
        let mut keys = MockApiKeyStore::new();
        keys.expect_insert().times(1).returning(move |key| {
            *seen.lock().unwrap() = Some(key.clone());
            Ok(key)
        });
        let mut projects = MockProjectStore::new();
        projects.expect_get().returning(|id| Ok(Some(Project { id, name: "p".into(), created_at: NOW })));
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(projects), clock());
        let new = svc
            .create(
                project(1),
                vec![Scope::EndpointWrite, Scope::EndpointRead, Scope::EndpointRead],
                "ci".into(),
                Some(Duration::from_secs(60)),
            )
            .await
            .unwrap();
        assert!(looks_like_key(&new.secret), "{}", new.secret);
        assert_eq!(new.key.secret_hash, hash_secret(&new.secret));
        // Nothing the store is given holds the secret's random part: only its hash and its first characters.
        let stored = format!("{:?}", stored.lock().unwrap().take().expect("the key was stored"));
        let random = &new.secret[KEY_PREFIX.len()..];
        assert!(!stored.contains(random), "the store was given the secret: {stored}");
        assert!(stored.contains(&new.key.secret_hash));
        assert!(new.secret.starts_with(&new.key.prefix));
        assert_eq!(new.key.scopes, vec![Scope::EndpointRead, Scope::EndpointWrite]);
        assert_eq!(new.key.expires_at, Some(NOW + Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn keys_need_a_scope_and_an_existing_project() {
        let mut projects = MockProjectStore::new();
        projects.expect_get().returning(|_| Ok(None));
        let svc = ApiKeyService::new(Arc::new(MockApiKeyStore::new()), Arc::new(projects), clock());
        assert!(matches!(svc.create(project(1), vec![], String::new(), None).await, Err(Error::Invalid(_))));
        assert!(matches!(
            svc.create(project(9), vec![Scope::EndpointRead], String::new(), None).await,
            Err(Error::Invalid(_))
        ));
    }

    #[tokio::test]
    async fn found_keys_are_trusted_for_the_cache_ttl_and_forgotten_when_revoked() {
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = Arc::clone(&reads);
        let mut keys = MockApiKeyStore::new();
        let live = api_key(SECRET, vec![Scope::EndpointRead]);
        keys.expect_find_by_hash().returning(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Some(live.clone()))
        });
        keys.expect_revoke().returning(|_, _| Ok(()));
        let clock = Arc::new(ManualClock::new(NOW));
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock.clone());
        let read_count = || reads.load(std::sync::atomic::Ordering::SeqCst);
        for _ in 0..5 {
            svc.authenticate(SECRET).await.unwrap();
        }
        assert_eq!(read_count(), 1, "one store read for five requests");
        clock.advance(ApiKeyService::KEY_CACHE_TTL);
        svc.authenticate(SECRET).await.unwrap();
        assert_eq!(read_count(), 2, "an entry older than the TTL is read again");
        svc.revoke(Uuid::nil()).await.unwrap();
        svc.authenticate(SECRET).await.unwrap();
        assert_eq!(read_count(), 3, "a key revoked here is read again at once");
        svc.forget_cached_keys();
        svc.authenticate(SECRET).await.unwrap();
        assert_eq!(read_count(), 4, "a revocation announced by another process: every key is read again");

        // Unknown keys are never cached.
        let mut keys = MockApiKeyStore::new();
        keys.expect_find_by_hash().times(2).returning(|_| Ok(None));
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock);
        for _ in 0..2 {
            assert!(matches!(svc.authenticate(SECRET).await, Err(Error::NotAuthenticated(_))));
        }
    }

    #[tokio::test]
    async fn authenticate_accepts_only_live_known_keys() {
        let live = api_key(SECRET, vec![Scope::EndpointRead]);
        let principal = service_with(Some(live.clone())).authenticate(SECRET).await.unwrap();
        assert_eq!(principal.project_id, project(1));

        // Malformed tokens never reach the store (the mock would panic on an unexpected call).
        let strict =
            ApiKeyService::new(Arc::new(MockApiKeyStore::new()), Arc::new(MockProjectStore::new()), clock());
        for bad in ["", "phx_", "Bearer x", &SECRET.to_uppercase(), &format!("{SECRET}0")] {
            assert!(matches!(strict.authenticate(bad).await, Err(Error::NotAuthenticated(_))), "{bad}");
        }

        let unknown = SECRET.replace("00112233", "99999999");
        assert!(matches!(
            service_with(Some(live.clone())).authenticate(&unknown).await,
            Err(Error::NotAuthenticated(_))
        ));

        let revoked = ApiKey { revoked_at: Some(NOW), ..live.clone() };
        assert!(matches!(
            service_with(Some(revoked)).authenticate(SECRET).await,
            Err(Error::NotAuthenticated(_))
        ));
        let expired = ApiKey { expires_at: Some(NOW), ..live.clone() };
        assert!(matches!(
            service_with(Some(expired)).authenticate(SECRET).await,
            Err(Error::NotAuthenticated(_))
        ));
        let not_yet_expired = ApiKey { expires_at: Some(NOW + Duration::from_secs(1)), ..live };
        assert!(service_with(Some(not_yet_expired)).authenticate(SECRET).await.is_ok());
    }

    #[test]
    fn authorize_checks_project_binding_and_scope() {
        let svc = service_with(None);
        let reader =
            Principal { key_id: Uuid::nil(), project_id: project(1), scopes: vec![Scope::EndpointRead] };
        let writer = Principal { scopes: vec![Scope::EndpointWrite], ..reader.clone() };

        assert_eq!(svc.authorize(&reader, "1", Scope::EndpointRead).unwrap(), project(1));
        assert_eq!(svc.authorize(&reader, CURRENT_PROJECT, Scope::EndpointRead).unwrap(), project(1));
        assert_eq!(
            svc.authorize(&writer, "1", Scope::EndpointRead).unwrap(),
            project(1),
            "write implies read"
        );
        match svc.authorize(&reader, "1", Scope::EndpointWrite) {
            Err(Error::PermissionDenied(detail)) => assert!(detail.contains("endpoint:write")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(svc.authorize(&writer, "2", Scope::EndpointRead), Err(Error::PermissionDenied(_))));
        for bad in ["0", "-1", "abc", "1.0", "current"] {
            assert!(
                matches!(svc.authorize(&writer, bad, Scope::EndpointRead), Err(Error::Invalid(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn each_write_scope_implies_only_its_own_read() {
        use Scope::*;
        let grants: Vec<(Scope, Scope)> = Scope::ALL
            .into_iter()
            .flat_map(|a| Scope::ALL.map(|b| (a, b)))
            .filter(|(a, b)| a.grants(*b))
            .collect();
        let mut expected = Scope::ALL.map(|s| (s, s)).to_vec();
        expected.extend([(EndpointWrite, EndpointRead), (TableWrite, TableRead)]);
        expected.sort();
        let mut grants = grants;
        grants.sort();
        assert_eq!(grants, expected, "endpoint:write grants no table scope, table:write no endpoint scope");
        for scope in Scope::ALL {
            assert_eq!(scope.as_str().parse::<Scope>().unwrap(), scope);
        }
        assert!("table:admin".parse::<Scope>().unwrap_err().detail.contains("table:write"));
    }
}
