//! Request rate limits per credential (API key or run token), per project, and a run token's own: token buckets
//! (GCRA, from `governor`) checked right after authentication. A request over any limit gets 429 with
//! `Retry-After`; every authenticated answer carries `X-RateLimit-Limit`, `X-RateLimit-Remaining` and
//! `X-RateLimit-Reset` of the tightest bucket.
//!
//! Failed authentications are limited per client address as well: an address past its budget of 401s gets 429
//! for its next requests, before any key is hashed or looked up, so a flood of made-up keys costs the service
//! a map lookup per request.
//!
//! The buckets live in this process: with several processes behind a load balancer, each allows its share.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use domain::{Principal, ProjectId};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::{StateInformationMiddleware, StateSnapshot};
use governor::state::keyed::DefaultKeyedStateStore;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use uuid::Uuid;

type Limiter<K> = RateLimiter<K, DefaultKeyedStateStore<K>, DefaultClock, StateInformationMiddleware>;
type TokenLimiter = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// A sustained rate with a burst of twice that many requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: NonZeroU32,
}

/// How many seconds' worth of requests one burst may take.
const BURST_SECONDS: NonZeroU32 = NonZeroU32::MIN.saturating_add(1);

impl Rate {
    fn quota(self) -> Quota {
        Quota::per_second(self.per_second).allow_burst(self.per_second.saturating_mul(BURST_SECONDS))
    }
}

/// The limits in force; `None` turns one off.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    pub per_key: Option<Rate>,
    pub per_project: Option<Rate>,
    /// Failed authentications (401) one client address may have, with bursts of twice as many.
    pub failed_auth_per_address: Option<Rate>,
}

/// What a client is told about its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    limit: u32,
    remaining: u32,
    /// Until the bucket is full again.
    reset: Duration,
}

const LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

impl Budget {
    pub(crate) fn write(&self, headers: &mut HeaderMap) {
        headers.insert(LIMIT, HeaderValue::from(self.limit));
        headers.insert(REMAINING, HeaderValue::from(self.remaining));
        headers.insert(RESET, HeaderValue::from(crate::error::whole_seconds(self.reset)));
    }
}

/// A request over a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exceeded {
    pub(crate) scope: &'static str,
    pub(crate) retry_after: Duration,
    pub(crate) budget: Budget,
}

/// One kind of bucket (per key or per project): a bucket per caller, all with the same quota.
struct Buckets<K: Clone + std::hash::Hash + Eq> {
    limiter: Limiter<K>,
    quota: Quota,
    scope: &'static str,
}

impl<K: Clone + std::hash::Hash + Eq> Buckets<K> {
    fn new(rate: Rate, scope: &'static str) -> Self {
        let quota = rate.quota();
        Self {
            limiter: RateLimiter::keyed(quota).with_middleware::<StateInformationMiddleware>(),
            quota,
            scope,
        }
    }

    fn take(&self, key: &K, clock: &DefaultClock) -> Result<Budget, Exceeded> {
        budget(self.limiter.check_key(key), self.quota, self.scope, clock)
    }

    fn shrink(&self) {
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
    }
}

/// What a bucket's answer tells the client.
fn budget(
    checked: Result<StateSnapshot, governor::NotUntil<<DefaultClock as Clock>::Instant>>,
    quota: Quota,
    scope: &'static str,
    clock: &DefaultClock,
) -> Result<Budget, Exceeded> {
    let limit = quota.burst_size().get();
    let refill = quota.replenish_interval();
    match checked {
        Ok(snapshot) => {
            let remaining = snapshot.remaining_burst_capacity();
            Ok(Budget { limit, remaining, reset: refill * (limit - remaining) })
        }
        Err(not_until) => Err(Exceeded {
            scope,
            retry_after: not_until.wait_time_from(clock.now()),
            budget: Budget { limit, remaining: 0, reset: refill * limit },
        }),
    }
}

/// The buckets of run tokens with a rate of their own (each its own quota), by token id.
#[derive(Default)]
struct TokenBuckets {
    buckets: Mutex<HashMap<Uuid, (Arc<TokenLimiter>, Quota), foldhash::fast::RandomState>>,
}

impl TokenBuckets {
    /// More tokens than are in use at once; past it the buckets start again (full) rather than grow.
    const MAX_ENTRIES: usize = 100_000;

    fn take(&self, token: Uuid, rate: NonZeroU32, clock: &DefaultClock) -> Result<Budget, Exceeded> {
        let (limiter, quota) = {
            let mut buckets = self.buckets.lock().unwrap_or_else(PoisonError::into_inner);
            if buckets.len() >= Self::MAX_ENTRIES && !buckets.contains_key(&token) {
                buckets.clear();
            }
            let (limiter, quota) = buckets.entry(token).or_insert_with(|| {
                let quota = Rate { per_second: rate }.quota();
                (Arc::new(RateLimiter::direct(quota).with_middleware::<StateInformationMiddleware>()), quota)
            });
            (Arc::clone(limiter), *quota)
        };
        budget(limiter.check(), quota, "token", clock)
    }
}

/// Client addresses past their budget of failed authentications, until each may try again.
struct FailedAuthentications {
    buckets: Buckets<IpAddr>,
    blocked: Mutex<HashMap<IpAddr, Instant, foldhash::fast::RandomState>>,
    /// How many addresses are blocked: while none is, a request checks nothing but this.
    count: AtomicUsize,
}

impl FailedAuthentications {
    /// More addresses than fail at once; past it the oldest are let go rather than the map grow.
    const MAX_BLOCKED: usize = 100_000;

    fn new(rate: Rate) -> Self {
        Self { buckets: Buckets::new(rate, "address"), blocked: Mutex::default(), count: AtomicUsize::new(0) }
    }

    fn admit(&self, address: IpAddr) -> Result<(), Exceeded> {
        if self.count.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        match blocked.get(&address) {
            Some(until) if *until > now => {
                let limit = self.buckets.quota.burst_size().get();
                let reset = self.buckets.quota.replenish_interval() * limit;
                Err(Exceeded {
                    scope: "address",
                    retry_after: *until - now,
                    budget: Budget { limit, remaining: 0, reset },
                })
            }
            Some(_) => {
                blocked.remove(&address);
                self.count.store(blocked.len(), Ordering::Relaxed);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn failed(&self, address: IpAddr, clock: &DefaultClock) {
        let Err(exceeded) = self.buckets.take(&address, clock) else { return };
        let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        if blocked.len() >= Self::MAX_BLOCKED {
            blocked.retain(|_, until| *until > now);
        }
        blocked.insert(address, now + exceeded.retry_after.max(Duration::from_secs(1)));
        self.count.store(blocked.len(), Ordering::Relaxed);
    }
}

/// The per-credential, per-project and per-token buckets, and those of failed authentications per address.
pub struct RateLimits {
    per_key: Option<Buckets<Uuid>>,
    per_project: Option<Buckets<ProjectId>>,
    per_token: TokenBuckets,
    failed_auth: Option<FailedAuthentications>,
    clock: DefaultClock,
}

impl Default for RateLimits {
    fn default() -> Self {
        Self::new(RateLimitConfig::default())
    }
}

impl std::fmt::Debug for RateLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimits")
            .field("per_key", &self.per_key.as_ref().map(|b| b.quota))
            .field("per_project", &self.per_project.as_ref().map(|b| b.quota))
            .finish()
    }
}

impl RateLimits {
    pub fn new(config: RateLimitConfig) -> Self {
        Self {
            per_key: config.per_key.map(|rate| Buckets::new(rate, "key")),
            per_project: config.per_project.map(|rate| Buckets::new(rate, "project")),
            per_token: TokenBuckets::default(),
            failed_auth: config.failed_auth_per_address.map(FailedAuthentications::new),
            clock: DefaultClock::default(),
        }
    }

    /// Refuses a client address that failed to authenticate too often lately, before its credential is read.
    pub(crate) fn admit_address(&self, address: Option<IpAddr>) -> Result<(), Exceeded> {
        match (&self.failed_auth, address) {
            (Some(failed), Some(address)) => failed.admit(address),
            _ => Ok(()),
        }
    }

    /// Counts a failed authentication of a client address; past its budget the address is refused for a while.
    pub(crate) fn authentication_failed(&self, address: Option<IpAddr>) {
        if let (Some(failed), Some(address)) = (&self.failed_auth, address) {
            failed.failed(address, &self.clock);
        }
    }

    /// Takes one request from the caller's buckets: a run token's own rate first, then the credential's (a
    /// key's, or a run token's apart from its key's), then the project's; so a caller over its own limit does
    /// not use up its project's.
    pub(crate) fn take(&self, principal: &Principal) -> Result<Option<Budget>, Exceeded> {
        let by_token = principal
            .grant
            .as_ref()
            .and_then(|grant| grant.rate_limit_per_sec.map(|rate| (grant.token_id, rate)))
            .map(|(token, rate)| self.per_token.take(token, rate, &self.clock))
            .transpose()?;
        let by_key =
            self.per_key.as_ref().map(|b| b.take(&principal.credential_id(), &self.clock)).transpose()?;
        let by_project =
            self.per_project.as_ref().map(|b| b.take(&principal.project_id, &self.clock)).transpose()?;
        Ok([by_token, by_key, by_project].into_iter().flatten().min_by_key(|budget| budget.remaining))
    }

    /// Forgets buckets that are full again, so keys and projects that stopped calling cost no memory.
    pub fn shrink(&self) {
        if let Some(buckets) = &self.per_key {
            buckets.shrink();
        }
        if let Some(buckets) = &self.per_project {
            buckets.shrink();
        }
        if let Some(failed) = &self.failed_auth {
            failed.buckets.shrink();
            let mut blocked = failed.blocked.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            blocked.retain(|_, until| *until > now);
            failed.count.store(blocked.len(), Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domain::Scope;

    fn principal(project: i64) -> Principal {
        Principal {
            key_id: Uuid::new_v4(),
            project_id: ProjectId::new(project).unwrap(),
            scopes: vec![Scope::EndpointRead],
            grant: None,
            label: Arc::from("test"),
        }
    }

    fn rate(n: u32) -> Option<Rate> {
        Some(Rate { per_second: NonZeroU32::new(n).unwrap() })
    }

    #[test]
    fn a_key_gets_its_burst_then_429_with_the_wait() {
        let limits = RateLimits::new(RateLimitConfig { per_key: rate(5), ..Default::default() });
        let caller = principal(1);
        let budgets: Vec<Budget> = (0..10).map(|_| limits.take(&caller).unwrap().unwrap()).collect();
        assert_eq!(budgets[0].limit, 10, "a burst of twice the rate");
        assert_eq!(budgets.iter().map(|b| b.remaining).collect::<Vec<_>>(), [9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        let over = limits.take(&caller).unwrap_err();
        assert_eq!(over.scope, "key");
        assert!(
            over.retry_after > Duration::ZERO && over.retry_after <= Duration::from_millis(200),
            "{over:?}"
        );
        // Another key is not affected.
        assert!(limits.take(&principal(1)).is_ok());
    }

    #[test]
    fn keys_of_one_project_share_its_bucket() {
        let limits = RateLimits::new(RateLimitConfig {
            per_key: rate(100),
            per_project: rate(2),
            ..Default::default()
        });
        for _ in 0..4 {
            limits.take(&principal(7)).unwrap();
        }
        assert_eq!(limits.take(&principal(7)).unwrap_err().scope, "project");
        assert!(limits.take(&principal(8)).is_ok(), "another project has its own");
    }

    #[test]
    fn an_address_past_its_failed_authentications_is_refused_until_it_may_try_again() {
        let limits =
            RateLimits::new(RateLimitConfig { failed_auth_per_address: rate(2), ..Default::default() });
        let (attacker, neighbour) = (IpAddr::from([10, 0, 0, 1]), IpAddr::from([10, 0, 0, 2]));
        for _ in 0..4 {
            assert!(limits.admit_address(Some(attacker)).is_ok(), "a burst of twice the rate");
            limits.authentication_failed(Some(attacker));
        }
        limits.authentication_failed(Some(attacker));
        let refused = limits.admit_address(Some(attacker)).unwrap_err();
        assert_eq!(refused.scope, "address");
        assert!(refused.retry_after > Duration::ZERO && refused.retry_after <= Duration::from_secs(1));
        assert!(limits.admit_address(Some(neighbour)).is_ok(), "another address is not affected");
        assert!(limits.admit_address(None).is_ok(), "no address, nothing to count");
        let off = RateLimits::default();
        for _ in 0..100 {
            off.authentication_failed(Some(attacker));
        }
        assert!(off.admit_address(Some(attacker)).is_ok());
    }

    #[test]
    fn no_limits_no_budget() {
        assert_eq!(RateLimits::default().take(&principal(1)), Ok(None));
    }
}
