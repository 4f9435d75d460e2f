//! The key service: issuing keys and run tokens, resolving a bearer credential to its caller (with short-lived
//! caches of the keys, projects and tokens read from the store), checking scope and project, revoking, and
//! noting when each key was last used.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rand::RngCore;
use subtle::ConstantTimeEq;
use uuid::Uuid;

use super::model::{
    hash_secret, looks_like_key, parse_origin, ApiKey, NewApiKey, Principal, Project, ProjectAccess,
    ProjectId, ProjectRef, Scope, SecretHash, KEY_PREFIX, SECRET_BYTES,
};
use super::ports::{ApiKeyStore, ProjectStore};
use super::token::{self, IssuedRunToken, RunTokenRequest, TokenSecret};
use crate::clock::{Clock, Timestamp};
use crate::error::{Error, Invalid, StoreError};
use crate::propagation::{NoPropagation, Propagation};
use crate::recent::RecentReads;

/// Issues, checks and revokes API keys and run tokens.
pub struct ApiKeyService {
    keys: Arc<dyn ApiKeyStore>,
    projects: Arc<dyn ProjectStore>,
    clock: Arc<dyn Clock>,
    /// Keys found, by the hash of their secret.
    cache: RecentReads<String, ApiKey>,
    /// Projects' token secrets and allowed origins.
    access: RecentReads<ProjectId, ProjectAccess>,
    /// Run tokens verified, by their whole text, as the caller each one is.
    tokens: RecentReads<Box<str>, Principal>,
    /// Hashes of secrets the store did not know, and projects it did not have: a flood of unknown credentials
    /// reads the store once per credential (or claimed project) per [`Self::UNKNOWN_TTL`], not once per request.
    unknown_keys: RecentReads<String, ()>,
    unknown_projects: RecentReads<ProjectId, ()>,
    /// When each key was last used, since the last flush.
    usage: Mutex<HashMap<Uuid, Timestamp, foldhash::fast::RandomState>>,
    /// A revocation is waited for on the other processes before it returns.
    propagation: Arc<dyn Propagation>,
}

impl ApiKeyService {
    pub fn new(keys: Arc<dyn ApiKeyStore>, projects: Arc<dyn ProjectStore>, clock: Arc<dyn Clock>) -> Self {
        let ttl = Self::KEY_CACHE_TTL;
        Self {
            keys,
            projects,
            clock,
            cache: RecentReads::new(ttl, 100_000),
            access: RecentReads::new(ttl, 100_000),
            tokens: RecentReads::new(ttl, 20_000),
            unknown_keys: RecentReads::new(Self::UNKNOWN_TTL, 100_000),
            unknown_projects: RecentReads::new(Self::UNKNOWN_TTL, 100_000),
            usage: Mutex::default(),
            propagation: Arc::new(NoPropagation),
        }
    }

    /// How long a key, a project's token secret and origins, or a verified run token is trusted without reading
    /// the store again, by default: the most a change made by another process waits to take effect here where
    /// the store does not announce changes.
    pub const KEY_CACHE_TTL: Duration = Duration::from_secs(1);

    /// How long a credential the store did not know is refused without reading it again. No real key can be
    /// among them (a secret is random, and unknown until it is issued), and a project created meanwhile is
    /// announced (`forget_project`) or has no token of its own yet.
    pub const UNKNOWN_TTL: Duration = Duration::from_secs(60);

    /// Revocations are waited for on the other processes through `propagation`.
    #[must_use]
    pub fn with_propagation(mut self, propagation: Arc<dyn Propagation>) -> Self {
        self.propagation = propagation;
        self
    }

    /// Trusts what was read from the store for `ttl` (zero reads the store on every request).
    #[must_use]
    pub fn with_key_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache.ttl = ttl;
        self.access.ttl = ttl;
        self.tokens.ttl = ttl;
        self
    }

    /// Forgets every key read from the store, so the next request with each reads it again: how a revocation
    /// announced by another process takes effect here at once.
    pub fn forget_cached_keys(&self) {
        self.cache.clear();
    }

    /// Forgets what was read of a project (its token secret and origins) and the run tokens verified with it:
    /// how a rotated secret or changed origins announced by another process take effect here at once.
    pub fn forget_project(&self, project: ProjectId) {
        self.access.retain(|id, _| *id != project);
        self.unknown_projects.retain(|id, ()| *id != project);
        self.tokens.retain(|_, principal| principal.project_id != project);
    }

    /// Forgets everything read from the store (changes may have been missed).
    pub fn forget_everything(&self) {
        self.cache.clear();
        self.access.clear();
        self.tokens.clear();
        self.unknown_projects.clear();
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
            last_used_at: None,
        };
        let key = self.keys.insert(key).await?;
        Ok(NewApiKey { key, secret })
    }

    /// Resolves a bearer credential, an API key or a run token, to its caller, and notes the use of its key.
    ///
    /// # Errors
    /// [`Error::NotAuthenticated`] for a malformed, unknown, revoked or expired key or run token (a forged or
    /// rotated one, or one of another project); store failures.
    pub async fn authenticate(&self, credential: &str) -> Result<Principal, Error> {
        let now = self.clock.now();
        let principal = if looks_like_key(credential) {
            self.key(credential, now).await?
        } else if token::looks_like_token(credential) {
            self.run_token(credential, now).await?
        } else {
            return Err(Error::NotAuthenticated(
                "The credential is malformed: send an API key (phx_...) or a run token.".into(),
            ));
        };
        self.note_use(principal.key_id, now);
        Ok(principal)
    }

    async fn key(&self, secret: &str, now: Timestamp) -> Result<Principal, Error> {
        let hash = SecretHash::of(secret);
        let hash = hash.as_str();
        let unknown = || Error::NotAuthenticated("The API key is not valid.".into());
        let key = match self.cache.get(hash, now) {
            Some(key) => key,
            None if self.unknown_keys.get(hash, now).is_some() => return Err(unknown()),
            None => {
                let found = self.keys.find_by_hash(hash).await?.map(Arc::new);
                match &found {
                    Some(key) => self.cache.put(key.secret_hash.clone(), key, now),
                    None => self.unknown_keys.put(hash.to_owned(), &Arc::new(()), now),
                }
                found.ok_or_else(unknown)?
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
        Ok(Principal {
            key_id: key.id,
            project_id: key.project_id,
            scopes: key.scopes.clone(),
            grant: None,
            // A key without a label is told apart by its prefix.
            label: Arc::from(if key.label.is_empty() { key.prefix.as_str() } else { key.label.as_str() }),
        })
    }

    async fn run_token(&self, token: &str, now: Timestamp) -> Result<Principal, Error> {
        let refused = |why: &str| Error::NotAuthenticated(why.to_owned());
        let principal = match self.tokens.get(token, now) {
            Some(principal) => principal,
            None => {
                let project = token::claimed_project(token).map_err(refused)?;
                let access = self.project_access(project, now).await?;
                let secret = access
                    .as_ref()
                    .and_then(|a| a.token_secret.as_ref())
                    .ok_or_else(|| refused(token::NOT_VALID))?;
                let (issuer, grant) = token::verify(token, secret, project).map_err(refused)?;
                let principal = Arc::new(Principal {
                    key_id: issuer,
                    project_id: project,
                    scopes: vec![Scope::EndpointRead],
                    label: Arc::from(grant.token_id.to_string()),
                    grant: Some(Arc::new(grant)),
                });
                self.tokens.put(token.into(), &principal, now);
                principal
            }
        };
        if principal.grant.as_ref().is_some_and(|grant| now >= grant.expires_at) {
            return Err(refused(token::EXPIRED));
        }
        Ok((*principal).clone())
    }

    /// A project's token secret and origins, from memory when read within the TTL; `None` for no such project.
    async fn project_access(
        &self,
        project: ProjectId,
        now: Timestamp,
    ) -> Result<Option<Arc<ProjectAccess>>, Error> {
        if let Some(access) = self.access.get(&project, now) {
            return Ok(Some(access));
        }
        if self.unknown_projects.get(&project, now).is_some() {
            return Ok(None);
        }
        let found = self.projects.access(project).await?.map(Arc::new);
        match &found {
            Some(access) => self.access.put(project, access, now),
            None => self.unknown_projects.put(project, &Arc::new(()), now),
        }
        Ok(found)
    }

    /// Reads a project's allowed origins into memory unless they were read within the TTL, so that
    /// [`ApiKeyService::allows_origin`], which cannot wait, answers for it.
    ///
    /// # Errors
    /// Store failures.
    pub async fn load_origins(&self, project: ProjectId) -> Result<(), Error> {
        self.project_access(project, self.clock.now()).await.map(drop)
    }

    /// Whether a page of `origin` may call the project's runs, as last read (see
    /// [`ApiKeyService::load_origins`]). A project not read yet allows no origin.
    pub fn allows_origin(&self, project: ProjectId, origin: &str) -> bool {
        self.access.any_age(&project).is_some_and(|access| access.allowed_origins.iter().any(|o| o == origin))
    }

    fn note_use(&self, key: Uuid, at: Timestamp) {
        let mut usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        let last = usage.entry(key).or_insert(at);
        if *last < at {
            *last = at;
        }
    }

    /// Writes when each key was last used since the last flush, in one batch; kept for the next flush when the
    /// store fails.
    ///
    /// # Errors
    /// The store's error.
    pub async fn flush_usage(&self) -> Result<usize, StoreError> {
        let batch: Vec<(Uuid, Timestamp)> =
            self.usage.lock().unwrap_or_else(PoisonError::into_inner).drain().collect();
        if batch.is_empty() {
            return Ok(0);
        }
        let count = batch.len();
        if let Err(err) = self.keys.record_usage(batch.clone()).await {
            for (key, at) in batch {
                self.note_use(key, at);
            }
            return Err(err);
        }
        Ok(count)
    }

    /// Signs a run token for the caller's project. The caller (a key with `endpoint:write`) is its issuer; the
    /// project's secret is made on its first token. Whether the named endpoints exist and take the fixed variables
    /// is the run service's to check first.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] for a run token as the issuer; store failures.
    pub async fn issue_run_token(
        &self,
        issuer: &Principal,
        project: ProjectId,
        request: RunTokenRequest,
    ) -> Result<IssuedRunToken, Error> {
        if issuer.grant.is_some() {
            return Err(Error::PermissionDenied("A run token cannot issue run tokens.".into()));
        }
        // Read from the store, not memory: a secret rotated by another process a moment ago must not sign.
        let access = self
            .projects
            .access(project)
            .await?
            .ok_or_else(|| Error::NotFound(format!("Project {project} does not exist.")))?;
        let secret = match access.token_secret {
            Some(secret) => secret,
            None => {
                let secret = self.projects.set_token_secret(project, TokenSecret::generate(), false).await?;
                self.forget_project(project);
                secret
            }
        };
        token::sign(&secret, project, issuer.key_id, request, self.clock.now())
            .map_err(|err| Error::Internal(Box::new(err)))
    }

    /// Replaces a project's token secret: every run token issued for it stops working, here at once and in
    /// other processes as soon as they hear of it.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown project; store failures.
    pub async fn rotate_token_secret(&self, project: ProjectId) -> Result<(), Error> {
        match self.projects.set_token_secret(project, TokenSecret::generate(), true).await {
            Ok(_) => {
                self.forget_project(project);
                Ok(())
            }
            Err(StoreError::NotFound) => Err(Error::NotFound(format!("Project {project} does not exist."))),
            Err(other) => Err(other.into()),
        }
    }

    /// Replaces the origins whose pages may call a project's runs from a browser; each is checked and written
    /// as a browser sends it.
    ///
    /// # Errors
    /// [`Error::Invalid`] for something that is not an origin; [`Error::NotFound`] for an unknown project; store
    /// failures.
    pub async fn set_allowed_origins(
        &self,
        project: ProjectId,
        origins: &[String],
    ) -> Result<Vec<String>, Error> {
        let mut parsed = origins.iter().map(|o| parse_origin(o)).collect::<Result<Vec<_>, _>>()?;
        parsed.sort();
        parsed.dedup();
        match self.projects.set_allowed_origins(project, parsed.clone()).await {
            Ok(()) => {
                self.forget_project(project);
                Ok(parsed)
            }
            Err(StoreError::NotFound) => Err(Error::NotFound(format!("Project {project} does not exist."))),
            Err(other) => Err(other.into()),
        }
    }

    /// Checks that `principal` may use scope `needed` on the project a path names, and answers that project.
    /// `runs` names the endpoint of an operation that runs it (see [`Principal::permits`]).
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] for a missing scope, another project (existing or not: the two are
    /// indistinguishable), or a run token out of its grant; [`Error::NotAuthenticated`] for a run token of
    /// another project.
    pub fn authorize(
        &self,
        principal: &Principal,
        project: ProjectRef,
        needed: Scope,
        runs: Option<&str>,
    ) -> Result<ProjectId, Error> {
        let project = Self::member(principal, project)?;
        principal.permits(needed, runs)?;
        Ok(project)
    }

    /// The project a path names, when it is `principal`'s own.
    ///
    /// # Errors
    /// As [`ApiKeyService::authorize`], for another project.
    pub fn member(principal: &Principal, project: ProjectRef) -> Result<ProjectId, Error> {
        let project = project.resolve(principal);
        if project != principal.project_id && principal.grant.is_some() {
            return Err(Error::NotAuthenticated("This run token is not valid for this project.".into()));
        }
        if project != principal.project_id {
            return Err(Error::PermissionDenied(
                "This credential does not give access to this project.".into(),
            ));
        }
        Ok(project)
    }

    /// The project a path names, as any API key of it may read it (its id, name and creation time); a run
    /// token, which may only run, may not.
    ///
    /// # Errors
    /// As [`ApiKeyService::member`]; [`Error::PermissionDenied`] for a run token; [`Error::NotFound`] for a
    /// project deleted since the key was read; store failures.
    pub async fn project(&self, principal: &Principal, project: ProjectRef) -> Result<Project, Error> {
        let id = Self::member(principal, project)?;
        if principal.grant.is_some() {
            return Err(Error::PermissionDenied(
                "A run token may only run the endpoints it names and read their OpenAPI documents.".into(),
            ));
        }
        self.projects.get(id).await?.ok_or_else(|| Error::NotFound(format!("Project {id} does not exist.")))
    }

    /// # Errors
    /// [`Error::NotFound`] for an unknown key id; store failures.
    pub async fn revoke(&self, id: Uuid) -> Result<(), Error> {
        self.keys.revoke(id, self.clock.now()).await?;
        self.cache.retain(|_, key| key.id != id);
        // Answered once no process accepts the key any more.
        self.propagation.settle().await;
        Ok(())
    }

    /// Keys with when each was last used, counting uses not flushed yet.
    ///
    /// # Errors
    /// Store failures.
    pub async fn list(&self, project: Option<ProjectId>) -> Result<Vec<ApiKey>, Error> {
        let mut keys = self.keys.list(project).await?;
        let usage = self.usage.lock().unwrap_or_else(PoisonError::into_inner);
        for key in &mut keys {
            if let Some(at) = usage.get(&key.id) {
                key.last_used_at = Some(key.last_used_at.map_or(*at, |stored| stored.max(*at)));
            }
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::super::model::Project;
    use super::super::ports::{MockApiKeyStore, MockProjectStore};
    use super::super::token::RunGrant;
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
        projects.expect_get().returning(|id| {
            Ok(Some(Project { id, name: "p".into(), created_at: NOW, allowed_origins: vec![] }))
        });
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

        // An unknown key reaches the store once a minute, however often it is sent.
        let mut keys = MockApiKeyStore::new();
        keys.expect_find_by_hash().times(2).returning(|_| Ok(None));
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock.clone());
        for _ in 0..1000 {
            assert!(matches!(svc.authenticate(SECRET).await, Err(Error::NotAuthenticated(_))));
        }
        clock.advance(ApiKeyService::UNKNOWN_TTL);
        assert!(matches!(svc.authenticate(SECRET).await, Err(Error::NotAuthenticated(_))));
    }

    #[tokio::test]
    async fn a_token_of_an_unknown_project_reaches_the_store_once_a_minute() {
        let mut projects = MockProjectStore::new();
        projects.expect_access().times(2).returning(|_| Ok(None));
        let clock = Arc::new(ManualClock::new(NOW));
        let svc = ApiKeyService::new(Arc::new(MockApiKeyStore::new()), Arc::new(projects), clock.clone());
        let header = base64url(r#"{"alg":"HS256","typ":"JWT","kid":"424242"}"#);
        let forged = format!("{header}.{}.c2lnbmF0dXJl", base64url(r#"{"pid":424242}"#));
        for _ in 0..1000 {
            assert!(matches!(svc.authenticate(&forged).await, Err(Error::NotAuthenticated(_))));
        }
        clock.advance(ApiKeyService::UNKNOWN_TTL);
        assert!(matches!(svc.authenticate(&forged).await, Err(Error::NotAuthenticated(_))));
    }

    fn base64url(text: &str) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
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

    /// A key service over one project (1) whose secret the store holds, counting the store's reads of it.
    fn token_service(clock: Arc<ManualClock>) -> (ApiKeyService, Arc<Mutex<TokenSecret>>, Arc<AtomicUsize>) {
        let secret = Arc::new(Mutex::new(TokenSecret::generate()));
        let reads = Arc::new(AtomicUsize::new(0));
        let mut projects = MockProjectStore::new();
        let (stored, counted) = (Arc::clone(&secret), Arc::clone(&reads));
        projects.expect_access().returning(move |id| {
            counted.fetch_add(1, Ordering::SeqCst);
            let secret = stored.lock().unwrap().clone();
            Ok((id == project(1))
                .then(|| ProjectAccess { allowed_origins: vec![], token_secret: Some(secret) }))
        });
        let mut keys = MockApiKeyStore::new();
        keys.expect_record_usage().returning(|_| Ok(()));
        (ApiKeyService::new(Arc::new(keys), Arc::new(projects), clock), secret, reads)
    }

    fn issuer() -> Principal {
        Principal {
            key_id: Uuid::nil(),
            project_id: project(1),
            scopes: vec![Scope::EndpointWrite],
            grant: None,
            label: Arc::from("test"),
        }
    }

    #[tokio::test]
    async fn run_tokens_are_verified_once_per_ttl_expire_exactly_and_die_with_their_secret() {
        let clock = Arc::new(ManualClock::new(NOW));
        let (svc, secret, reads) = token_service(Arc::clone(&clock));
        let body =
            serde_json::json!({"endpoints": ["a"], "expires_in_seconds": 10, "fixed_variables": {"t": 1}});
        let issued =
            svc.issue_run_token(&issuer(), project(1), RunTokenRequest::try_from(&body).unwrap()).await;
        let token = issued.unwrap().token;
        let before = reads.load(Ordering::SeqCst);
        for _ in 0..5 {
            let caller = svc.authenticate(&token).await.unwrap();
            assert_eq!((caller.project_id, caller.key_id), (project(1), Uuid::nil()));
            assert_eq!(caller.grant.as_ref().unwrap().fixed_variables["t"], 1);
        }
        assert_eq!(reads.load(Ordering::SeqCst) - before, 1, "one read of the secret for five requests");

        // Expiry is the service's clock's, to the second, cached or not.
        clock.advance(Duration::from_millis(9_999));
        assert!(svc.authenticate(&token).await.is_ok());
        clock.advance(Duration::from_millis(1));
        assert!(
            matches!(svc.authenticate(&token).await, Err(Error::NotAuthenticated(d)) if d.contains("expired"))
        );

        // A rotated secret, announced: every token of the project is refused at once.
        clock.advance(Duration::from_secs(3600));
        let token = svc
            .issue_run_token(&issuer(), project(1), RunTokenRequest::try_from(&body).unwrap())
            .await
            .unwrap()
            .token;
        assert!(svc.authenticate(&token).await.is_ok());
        *secret.lock().unwrap() = TokenSecret::generate();
        assert!(
            svc.authenticate(&token).await.is_ok(),
            "trusted until the change is heard or the TTL passes"
        );
        svc.forget_project(project(1));
        assert!(matches!(svc.authenticate(&token).await, Err(Error::NotAuthenticated(_))));
    }

    #[tokio::test]
    async fn uses_are_noted_per_key_and_flushed_in_one_batch() {
        let mut keys = MockApiKeyStore::new();
        keys.expect_find_by_hash().returning(|hash| {
            Ok(Some(api_key(SECRET, vec![Scope::EndpointRead])).filter(|k| k.secret_hash == hash))
        });
        let batches = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&batches);
        keys.expect_record_usage().returning(move |batch| {
            seen.lock().unwrap().push(batch);
            Ok(())
        });
        let clock = Arc::new(ManualClock::new(NOW));
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock.clone());
        svc.authenticate(SECRET).await.unwrap();
        clock.advance(Duration::from_secs(5));
        svc.authenticate(SECRET).await.unwrap();
        assert_eq!(svc.flush_usage().await.unwrap(), 1);
        assert_eq!(svc.flush_usage().await.unwrap(), 0, "nothing new");
        assert_eq!(*batches.lock().unwrap(), vec![vec![(Uuid::nil(), NOW + Duration::from_secs(5))]]);
    }

    /// A run token's grant of the endpoint `a`, expiring now.
    fn grant_of_a() -> RunGrant {
        RunGrant {
            token_id: Uuid::nil(),
            endpoints: vec!["a".into()],
            fixed_variables: serde_json::Map::new(),
            rate_limit_per_sec: None,
            versions: std::collections::BTreeMap::new(),
            expires_at: NOW,
        }
    }

    #[test]
    fn a_run_token_passes_only_its_endpoints_runs_and_documents() {
        let svc = service_with(None);
        let grant = grant_of_a();
        let token = Principal {
            key_id: Uuid::nil(),
            project_id: project(1),
            scopes: vec![Scope::EndpointRead],
            grant: Some(Arc::new(grant)),
            label: Arc::from("test"),
        };
        assert_eq!(
            svc.authorize(&token, ProjectRef::Id(project(1)), Scope::EndpointRead, Some("a")).unwrap(),
            project(1)
        );
        assert_eq!(
            svc.authorize(&token, ProjectRef::Current, Scope::EndpointRead, Some("a")).unwrap(),
            project(1)
        );
        for (scope, endpoint) in
            [(Scope::EndpointRead, None), (Scope::EndpointRead, Some("b")), (Scope::TableRead, None)]
        {
            assert!(matches!(
                svc.authorize(&token, ProjectRef::Id(project(1)), scope, endpoint),
                Err(Error::PermissionDenied(_))
            ));
        }
        assert!(matches!(
            svc.authorize(&token, ProjectRef::Id(project(2)), Scope::EndpointRead, Some("a")),
            Err(Error::NotAuthenticated(_))
        ));
        assert!(token.may_run("a") && !token.may_run("b"));
    }

    #[tokio::test]
    async fn any_key_of_a_project_reads_it_and_a_run_token_does_not() {
        let mut projects = MockProjectStore::new();
        projects.expect_get().returning(|id| {
            Ok((id == project(1)).then(|| Project {
                id,
                name: "Shop".into(),
                created_at: NOW,
                allowed_origins: Vec::new(),
            }))
        });
        let svc = ApiKeyService::new(Arc::new(MockApiKeyStore::new()), Arc::new(projects), clock());
        let loader = Principal {
            key_id: Uuid::nil(),
            project_id: project(1),
            scopes: vec![Scope::TableWrite],
            grant: None,
            label: Arc::from("test"),
        };
        assert_eq!(svc.project(&loader, ProjectRef::Current).await.unwrap().name, "Shop");
        assert_eq!(svc.project(&loader, ProjectRef::Id(project(1))).await.unwrap().id, project(1));
        assert!(matches!(
            svc.project(&loader, ProjectRef::Id(project(2))).await,
            Err(Error::PermissionDenied(_))
        ));
        let grant = grant_of_a();
        let token = Principal { grant: Some(Arc::new(grant)), ..loader.clone() };
        assert!(matches!(svc.project(&token, ProjectRef::Current).await, Err(Error::PermissionDenied(_))));
        // A project removed since its key was read.
        let orphan = Principal { project_id: project(3), ..loader };
        assert!(matches!(svc.project(&orphan, ProjectRef::Current).await, Err(Error::NotFound(_))));
    }

    #[test]
    fn authorize_checks_project_binding_and_scope() {
        let svc = service_with(None);
        let reader = Principal {
            key_id: Uuid::nil(),
            project_id: project(1),
            scopes: vec![Scope::EndpointRead],
            grant: None,
            label: Arc::from("test"),
        };
        let writer = Principal { scopes: vec![Scope::EndpointWrite], ..reader.clone() };
        let loader = Principal { scopes: vec![Scope::TableWrite], ..reader.clone() };
        assert!(
            reader.may_run("a") && writer.may_run("a") && !loader.may_run("a"),
            "runs need endpoint:read"
        );
        assert!(matches!(
            svc.authorize(&loader, ProjectRef::Id(project(1)), Scope::EndpointRead, None),
            Err(Error::PermissionDenied(_))
        ));

        assert_eq!(
            svc.authorize(&reader, ProjectRef::Id(project(1)), Scope::EndpointRead, None).unwrap(),
            project(1)
        );
        assert_eq!(
            svc.authorize(&reader, ProjectRef::Current, Scope::EndpointRead, None).unwrap(),
            project(1)
        );
        assert_eq!(
            svc.authorize(&writer, ProjectRef::Id(project(1)), Scope::EndpointRead, None).unwrap(),
            project(1),
            "write implies read"
        );
        match svc.authorize(&reader, ProjectRef::Id(project(1)), Scope::EndpointWrite, None) {
            Err(Error::PermissionDenied(detail)) => assert!(detail.contains("endpoint:write")),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            svc.authorize(&writer, ProjectRef::Id(project(2)), Scope::EndpointRead, None),
            Err(Error::PermissionDenied(_))
        ));
        assert_eq!("@current".parse(), Ok(ProjectRef::Current));
        assert_eq!("12".parse(), Ok(ProjectRef::Id(project(12))));
        for bad in ["0", "-1", "abc", "1.0", "current", "", " 1"] {
            let err = bad.parse::<ProjectRef>().unwrap_err();
            assert_eq!(err.attr.as_deref(), Some("project_id"), "{bad}");
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

    /// A revocation is answered once every other process has applied it (it waits on the propagation).
    #[tokio::test]
    async fn a_revocation_waits_until_every_process_applied_it() {
        let mut keys = MockApiKeyStore::new();
        let mut order = mockall::Sequence::new();
        keys.expect_revoke().times(1).in_sequence(&mut order).returning(|_, _| Ok(()));
        let mut propagation = crate::propagation::MockPropagation::new();
        propagation.expect_settle().times(1).in_sequence(&mut order).return_const(());
        let svc = ApiKeyService::new(Arc::new(keys), Arc::new(MockProjectStore::new()), clock())
            .with_propagation(Arc::new(propagation));
        svc.revoke(Uuid::nil()).await.unwrap();
    }
}
