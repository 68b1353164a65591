//! [`Client`]: retries, the in-flight limit, accounting, budget and cache
//! around any provider.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheEntry, ResponseCache};
use crate::semaphore::Semaphore;
use crate::{ChatProvider, ChatRequest, ChatResponse, LlmError, PriceTable, Usage};

/// When and how often to try again.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Provider calls per request, the first included (at least 1).
    pub max_attempts: u32,
    /// Backoff before retry n is uniform in `[0, min(max_delay, base_delay * 2^(n-1))]`
    /// ("full jitter"), unless the server sent `Retry-After`.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// A `Retry-After` longer than this ends the call instead of stalling the run.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The full-jitter pause before retry number `retry` (1-based).
    pub fn backoff(&self, retry: u32) -> Duration {
        let exp = self.base_delay.saturating_mul(
            1u32.checked_shl(retry.saturating_sub(1))
                .unwrap_or(u32::MAX),
        );
        let cap = exp.min(self.max_delay);
        cap.mul_f64(fastrand::f64())
    }
}

/// Spending limits for a run. `None` means unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Input plus output tokens over all calls (cache hits are free).
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

/// Everything the client does besides calling the provider.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub retry: RetryPolicy,
    /// At most this many provider calls in flight at once (at least 1).
    pub max_in_flight: usize,
    pub budget: Budget,
    /// Where cached replies live; no caching when `None`.
    pub cache_dir: Option<PathBuf>,
    pub prices: PriceTable,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            retry: RetryPolicy::default(),
            max_in_flight: 4,
            budget: Budget::default(),
            cache_dir: None,
            prices: PriceTable::builtin(),
        }
    }
}

/// Spending of one role tag.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleTotals {
    pub calls: u64,
    pub cached_calls: u64,
    pub failed_calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

/// Spending so far. Tokens and cost count provider calls only; cache hits
/// are counted in `cached_calls` and cost nothing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Requests answered (by the provider or the cache).
    pub calls: u64,
    pub cached_calls: u64,
    /// Requests that ended in an error (budget refusals excluded).
    pub failed_calls: u64,
    /// Requests refused by the budget.
    pub budget_refusals: u64,
    /// Provider calls made, retries included.
    pub attempts: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    /// Answered calls whose token counts were (partly) estimated.
    pub estimated_calls: u64,
    /// Answered calls whose model has no price (counted at 0 USD).
    pub unpriced_calls: u64,
    pub by_role: BTreeMap<String, RoleTotals>,
}

impl Totals {
    pub fn tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }
}

#[derive(Default)]
struct Ledger {
    totals: Totals,
    /// Estimated input of calls in flight, so that concurrent calls cannot
    /// all pass the budget check on the same remaining allowance.
    reserved_tokens: u64,
    reserved_cost: f64,
    warned_unpriced: HashSet<String>,
}

/// A provider with retries, a concurrency limit, accounting, a budget and a
/// response cache. It is itself a [`ChatProvider`], so it can be wrapped by
/// a [`crate::Recorder`].
pub struct Client {
    provider: Arc<dyn ChatProvider>,
    cfg: ClientConfig,
    cache: Option<ResponseCache>,
    sem: Semaphore,
    ledger: Mutex<Ledger>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("provider", &self.provider.name())
            .field("model", &self.provider.model())
            .field("retry", &self.cfg.retry)
            .field("max_in_flight", &self.cfg.max_in_flight)
            .field("budget", &self.cfg.budget)
            .field("cache_dir", &self.cfg.cache_dir)
            .finish()
    }
}

impl Client {
    pub fn new(provider: Arc<dyn ChatProvider>, cfg: ClientConfig) -> Result<Self, LlmError> {
        if cfg.retry.max_attempts == 0 {
            return Err(LlmError::Config("max_attempts must be at least 1".into()));
        }
        if cfg.max_in_flight == 0 {
            return Err(LlmError::Config("max_in_flight must be at least 1".into()));
        }
        if let Some(c) = cfg.budget.max_cost_usd {
            if !c.is_finite() || c < 0.0 {
                return Err(LlmError::Config(format!(
                    "max_cost_usd must be a non-negative number, got {c}"
                )));
            }
        }
        let cache = cfg.cache_dir.as_ref().map(ResponseCache::new).transpose()?;
        Ok(Client {
            sem: Semaphore::new(cfg.max_in_flight),
            provider,
            cache,
            cfg,
            ledger: Mutex::new(Ledger::default()),
        })
    }

    /// Spending so far.
    pub fn totals(&self) -> Totals {
        self.lock().totals.clone()
    }

    pub fn budget(&self) -> Budget {
        self.cfg.budget
    }

    /// True once spending has reached a limit: every further uncached call
    /// will be refused.
    pub fn budget_exhausted(&self) -> bool {
        let l = self.lock();
        let b = &self.cfg.budget;
        b.max_tokens.is_some_and(|m| l.totals.tokens() >= m)
            || b.max_cost_usd.is_some_and(|m| l.totals.cost_usd >= m)
    }

    pub fn provider(&self) -> &Arc<dyn ChatProvider> {
        &self.provider
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Ledger> {
        // Only bookkeeping happens under this lock; after a panic elsewhere
        // the numbers are still the best we have.
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn price(&self, model: &str, usage: &Usage) -> Option<f64> {
        self.cfg
            .prices
            .cost(model, usage)
            .or_else(|| self.cfg.prices.cost(self.provider.model(), usage))
    }

    /// Checks the budget for `req` and reserves its estimated input.
    fn reserve(&self, req: &ChatRequest) -> Result<(u64, f64), LlmError> {
        let est_tokens = req.estimated_input_tokens();
        let est_usage = Usage {
            input_tokens: est_tokens,
            output_tokens: 0,
            estimated: true,
        };
        let est_cost = if self.provider.prices_responses() {
            0.0
        } else {
            self.price(self.provider.model(), &est_usage).unwrap_or(0.0)
        };
        let mut l = self.lock();
        let b = self.cfg.budget;
        let refusal = if let Some(max) = b.max_tokens.filter(|&max| {
            let used = l.totals.tokens() + l.reserved_tokens;
            used >= max || used + est_tokens > max
        }) {
            Some(format!(
                "token budget {max}: {} used, {} reserved by calls in flight, this call needs about {est_tokens} more",
                l.totals.tokens(),
                l.reserved_tokens
            ))
        } else {
            b.max_cost_usd
                .filter(|&max| {
                    let used = l.totals.cost_usd + l.reserved_cost;
                    used >= max || used + est_cost > max
                })
                .map(|max| {
                    format!(
                        "cost budget ${max:.4}: ${:.4} spent, ${:.4} reserved by calls in flight, this call needs about ${est_cost:.4} more",
                        l.totals.cost_usd, l.reserved_cost
                    )
                })
        };
        if let Some(reason) = refusal {
            l.totals.budget_refusals += 1;
            return Err(LlmError::BudgetExhausted { reason });
        }
        l.reserved_tokens += est_tokens;
        l.reserved_cost += est_cost;
        Ok((est_tokens, est_cost))
    }

    fn release(&self, reserved: (u64, f64)) {
        let mut l = self.lock();
        l.reserved_tokens = l.reserved_tokens.saturating_sub(reserved.0);
        l.reserved_cost = (l.reserved_cost - reserved.1).max(0.0);
    }

    fn serve_cached(&self, key: &str, req: &ChatRequest, start: Instant) -> Option<ChatResponse> {
        let entry = self.cache.as_ref()?.get(key)?;
        let mut l = self.lock();
        l.totals.calls += 1;
        l.totals.cached_calls += 1;
        let role = l.totals.by_role.entry(req.role_tag.clone()).or_default();
        role.calls += 1;
        role.cached_calls += 1;
        Some(ChatResponse {
            text: entry.text,
            model: entry.model,
            usage: entry.usage,
            cost_usd: 0.0,
            latency_ms: start.elapsed().as_millis() as u64,
            cached: true,
            attempts: 0,
            stop_reason: entry.stop_reason,
        })
    }

    /// Calls the provider until success, a non-retryable error, or the
    /// attempt limit. Returns the reply or the final error, and the number
    /// of attempts made.
    fn call_with_retries(&self, req: &ChatRequest) -> (Result<ChatResponse, LlmError>, u32) {
        let policy = &self.cfg.retry;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let result = {
                let _permit = self.sem.acquire();
                self.provider.complete(req)
            };
            let err = match result {
                Ok(resp) => return (Ok(resp), attempt),
                Err(e) => e,
            };
            if !err.is_retryable() {
                return (Err(err), attempt);
            }
            if attempt >= policy.max_attempts {
                let final_err = if attempt > 1 {
                    LlmError::GaveUp {
                        attempts: attempt,
                        last: Box::new(err),
                    }
                } else {
                    err
                };
                return (Err(final_err), attempt);
            }
            let delay = match err.retry_after() {
                Some(wait) if wait > policy.max_retry_after => {
                    log::warn!(
                        "{}: server asks to wait {wait:?}, more than the {:?} allowed; giving up",
                        self.provider.name(),
                        policy.max_retry_after
                    );
                    return (Err(err), attempt);
                }
                Some(wait) => wait,
                None => policy.backoff(attempt),
            };
            log::warn!(
                "{} [{}]: attempt {attempt}/{} failed: {err}; retrying in {delay:?}",
                self.provider.name(),
                req.role_tag,
                policy.max_attempts
            );
            std::thread::sleep(delay);
        }
    }

    fn record_success(&self, req: &ChatRequest, resp: &mut ChatResponse, attempts: u32) {
        let cost = if self.provider.prices_responses() {
            Some(resp.cost_usd)
        } else {
            self.price(&resp.model, &resp.usage)
        };
        let mut l = self.lock();
        if cost.is_none() && l.warned_unpriced.insert(resp.model.clone()) {
            log::warn!(
                "model {:?} has no entry in the price table; its calls count as $0",
                resp.model
            );
        }
        resp.cost_usd = cost.unwrap_or(0.0);
        let t = &mut l.totals;
        t.calls += 1;
        t.attempts += u64::from(attempts);
        t.input_tokens += resp.usage.input_tokens;
        t.output_tokens += resp.usage.output_tokens;
        t.cost_usd += resp.cost_usd;
        t.estimated_calls += u64::from(resp.usage.estimated);
        t.unpriced_calls += u64::from(cost.is_none());
        let role = t.by_role.entry(req.role_tag.clone()).or_default();
        role.calls += 1;
        role.input_tokens += resp.usage.input_tokens;
        role.output_tokens += resp.usage.output_tokens;
        role.cost_usd += resp.cost_usd;
        let b = self.cfg.budget;
        let over_tokens = b.max_tokens.is_some_and(|m| t.tokens() > m);
        let over_cost = b.max_cost_usd.is_some_and(|m| t.cost_usd > m);
        if over_tokens || over_cost {
            log::warn!(
                "budget exceeded after this call ({} tokens, ${:.4}); further calls will be refused",
                t.tokens(),
                t.cost_usd
            );
        }
    }

    fn record_failure(&self, req: &ChatRequest, attempts: u32) {
        let mut l = self.lock();
        l.totals.failed_calls += 1;
        l.totals.attempts += u64::from(attempts);
        l.totals
            .by_role
            .entry(req.role_tag.clone())
            .or_default()
            .failed_calls += 1;
    }
}

impl ChatProvider for Client {
    fn name(&self) -> &str {
        self.provider.name()
    }

    fn model(&self) -> &str {
        self.provider.model()
    }

    fn prices_responses(&self) -> bool {
        true
    }

    fn preflight(&self) -> Result<(), LlmError> {
        self.provider.preflight()
    }

    fn complete(&self, req: &ChatRequest) -> Result<ChatResponse, LlmError> {
        let start = Instant::now();
        let key = ResponseCache::key(self.provider.name(), self.provider.model(), req);
        // A hit costs nothing, so it is served even when the budget is spent.
        if let Some(resp) = self.serve_cached(&key, req, start) {
            return Ok(resp);
        }
        let reserved = self.reserve(req)?;
        let (result, attempts) = self.call_with_retries(req);
        self.release(reserved);
        match result {
            Ok(mut resp) => {
                resp.attempts = attempts;
                resp.cached = false;
                resp.latency_ms = start.elapsed().as_millis() as u64;
                self.record_success(req, &mut resp, attempts);
                if let Some(cache) = &self.cache {
                    let entry = CacheEntry {
                        version: 0,
                        provider: self.provider.name().to_string(),
                        requested_model: self.provider.model().to_string(),
                        request_hash: req.hash(),
                        text: resp.text.clone(),
                        model: resp.model.clone(),
                        usage: resp.usage,
                        original_cost_usd: resp.cost_usd,
                        stop_reason: resp.stop_reason.clone(),
                    };
                    if let Err(e) = cache.put(&key, entry) {
                        log::warn!("could not cache a reply: {e}");
                    }
                }
                Ok(resp)
            }
            Err(e) => {
                self.record_failure(req, attempts);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_capped_full_jitter() {
        let p = RetryPolicy {
            max_attempts: 10,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            max_retry_after: Duration::from_secs(1),
        };
        let mut max_seen = [Duration::ZERO; 6];
        for _ in 0..2000 {
            for (i, m) in max_seen.iter_mut().enumerate() {
                let d = p.backoff(i as u32 + 1);
                let cap = Duration::from_millis((100u64 << i).min(1000));
                assert!(d <= cap, "retry {} slept {d:?} > {cap:?}", i + 1);
                *m = (*m).max(d);
            }
        }
        // Jitter spreads over the whole range: the largest draw of 2000 is
        // close to the cap, so the cap really grows and then stops growing.
        assert!(max_seen[0] > Duration::from_millis(90));
        assert!(max_seen[2] > Duration::from_millis(360));
        assert!(max_seen[5] > Duration::from_millis(900));
        // Huge retry numbers do not overflow.
        assert!(p.backoff(200) <= Duration::from_millis(1000));
    }
}
