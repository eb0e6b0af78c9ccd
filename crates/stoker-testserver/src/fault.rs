//! Injected faults: what can go wrong with a request, which requests it hits, and how often.
//!
//! A [`FaultInjector`] holds an ordered list of [`FaultRule`]s. Each S3 request the server
//! receives is offered to the rules in the order they were added; the first rule that matches
//! and still has uses left is consumed (its count goes down by one) and its [`Fault`] is
//! delivered instead of, or on top of, the normal answer. Exhausted rules are dropped.
//!
//! A request no rule takes may still be hit by [`Chaos`]: with a probability per request,
//! a fault of a kind drawn from a mix, from a seeded generator, so a soak can be repeated
//! (the sequence of draws is the seed's; which request gets which draw depends on the order
//! requests arrive in). Faults delivered are counted per kind ([`FaultCounts`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

/// What an injected fault does to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this HTTP status and an S3 XML error body carrying `code`
    /// (for example 503 `SlowDown` or 500 `InternalError`), without touching the store.
    Status {
        /// The HTTP status code, e.g. 503.
        status: u16,
        /// The S3 error code put in the XML body, e.g. `SlowDown`.
        code: String,
    },
    /// Close the connection without answering: the client sees the connection end
    /// before any response byte arrives.
    Reset,
    /// Send the real status and headers (including the real `Content-Length`), then only
    /// the first `after_bytes` bytes of the body, then abort the connection, so the client
    /// sees a body cut short. Only meaningful for responses whose body is longer than
    /// `after_bytes`; combine with [`FaultRule::method`]`("GET")` so a `HEAD` or a listing
    /// does not use it up.
    ShortBody {
        /// How many body bytes are delivered before the connection is aborted.
        after_bytes: u64,
    },
    /// Wait this long before answering (a slow first byte), then answer normally.
    /// Comes on top of the server-wide latency.
    Delay(Duration),
    /// Send the real status and headers and the first `after_bytes` bytes of the body, then
    /// stop sending for `pause`, then send the rest: a body that stalls mid-way. A body
    /// shorter than `after_bytes` is sent whole without a pause.
    Stall {
        /// How many body bytes are sent before the pause.
        after_bytes: u64,
        /// How long the body stops.
        pause: Duration,
    },
}

impl Fault {
    /// An error status with an S3 error `code`.
    pub fn status(status: u16, code: impl Into<String>) -> Self {
        Self::Status {
            status,
            code: code.into(),
        }
    }

    /// 503 `SlowDown`, what S3 answers when throttling.
    pub fn slow_down() -> Self {
        Self::status(503, "SlowDown")
    }

    /// 500 `InternalError`.
    pub fn internal_error() -> Self {
        Self::status(500, "InternalError")
    }

    /// The kind of this fault, as counted in [`FaultCounts`].
    pub fn kind(&self) -> FaultKind {
        match self {
            Self::Status { .. } => FaultKind::Status,
            Self::Reset => FaultKind::Reset,
            Self::ShortBody { .. } => FaultKind::Short,
            Self::Delay(_) => FaultKind::Delay,
            Self::Stall { .. } => FaultKind::Stall,
        }
    }

    /// The S3 error code S3 conventionally uses with an HTTP status.
    pub fn default_code(status: u16) -> &'static str {
        match status {
            400 => "InvalidRequest",
            403 => "AccessDenied",
            404 => "NoSuchKey",
            409 => "OperationAborted",
            412 => "PreconditionFailed",
            416 => "InvalidRange",
            429 | 503 => "SlowDown",
            501 => "NotImplemented",
            _ => "InternalError",
        }
    }
}

/// One rule: which requests a [`Fault`] applies to, and how many of them.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultRule {
    /// The fault delivered to a matching request.
    pub fault: Fault,
    /// Only requests with this HTTP method (upper case, e.g. `GET`); `None` matches all.
    pub method: Option<String>,
    /// Only requests whose path contains this substring; `None` matches all. The substring
    /// is looked for in the percent-decoded path (so `my key` matches a request for
    /// `/bucket/my%20key`) and in the raw path with its query string (so `list-type=2`
    /// matches listings).
    pub path_contains: Option<String>,
    /// How many matching requests the rule affects before it is used up.
    /// [`u32::MAX`] means it is never used up; 0 means it never fires.
    pub times: u32,
}

impl FaultRule {
    /// A rule delivering `fault` once, to the next request of any kind.
    pub fn new(fault: Fault) -> Self {
        Self {
            fault,
            method: None,
            path_contains: None,
            times: 1,
        }
    }

    /// Restricts the rule to one HTTP method (compared case-insensitively).
    #[must_use]
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = Some(method.into().to_ascii_uppercase());
        self
    }

    /// Restricts the rule to requests whose path contains `substring`.
    #[must_use]
    pub fn path_contains(mut self, substring: impl Into<String>) -> Self {
        self.path_contains = Some(substring.into());
        self
    }

    /// Sets how many matching requests the rule affects.
    #[must_use]
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }

    /// Makes the rule affect every matching request until [`FaultInjector::clear`].
    #[must_use]
    pub fn forever(self) -> Self {
        self.times(u32::MAX)
    }

    fn matches(&self, method: &str, decoded_path: &str, raw_path_and_query: &str) -> bool {
        if let Some(m) = &self.method {
            if !m.eq_ignore_ascii_case(method) {
                return false;
            }
        }
        if let Some(sub) = &self.path_contains {
            if !decoded_path.contains(sub.as_str()) && !raw_path_and_query.contains(sub.as_str()) {
                return false;
            }
        }
        true
    }
}

/// The kinds of [`Fault`], as named by the control endpoint (`status`, `reset`, `short`,
/// `delay`, `stall`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// [`Fault::Status`].
    Status,
    /// [`Fault::Reset`].
    Reset,
    /// [`Fault::ShortBody`].
    Short,
    /// [`Fault::Delay`].
    Delay,
    /// [`Fault::Stall`].
    Stall,
}

impl FaultKind {
    /// Every kind, in the order [`FaultCounts`] lists them.
    pub const ALL: [FaultKind; 5] = [
        FaultKind::Status,
        FaultKind::Reset,
        FaultKind::Short,
        FaultKind::Delay,
        FaultKind::Stall,
    ];

    /// The kind's name on the control endpoint.
    pub fn name(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Reset => "reset",
            Self::Short => "short",
            Self::Delay => "delay",
            Self::Stall => "stall",
        }
    }

    /// The kind called `name` on the control endpoint.
    pub fn from_name(name: &str) -> Option<FaultKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Faults delivered, per kind (rules' and chaos's together).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FaultCounts {
    /// Error statuses.
    pub status: u64,
    /// Connections closed without an answer.
    pub reset: u64,
    /// Bodies cut short.
    pub short: u64,
    /// Slow first bytes.
    pub delay: u64,
    /// Bodies that stalled mid-way.
    pub stall: u64,
}

impl FaultCounts {
    /// The count of one kind.
    pub fn get(&self, kind: FaultKind) -> u64 {
        match kind {
            FaultKind::Status => self.status,
            FaultKind::Reset => self.reset,
            FaultKind::Short => self.short,
            FaultKind::Delay => self.delay,
            FaultKind::Stall => self.stall,
        }
    }

    /// All kinds together.
    pub fn total(&self) -> u64 {
        FaultKind::ALL.into_iter().map(|k| self.get(k)).sum()
    }
}

/// Random faults: each request that no [`FaultRule`] takes is hit, with probability
/// `probability`, by a fault of a kind drawn uniformly from `kinds`, its parameters drawn
/// too (a short body's and a stall's byte offset in `0..max_offset`, a delay's and a
/// stall's pause in `max_delay / 4..=max_delay`, an error status from `statuses`). The
/// draws come from a generator seeded with `seed`.
///
/// ```
/// use std::time::Duration;
/// use stoker_testserver::{Chaos, FaultInjector, FaultKind};
///
/// let faults = FaultInjector::new();
/// faults.set_chaos(Some(
///     Chaos::new(0.2, &[FaultKind::Status, FaultKind::Reset, FaultKind::Stall], 7)
///         .max_delay(Duration::from_millis(300)),
/// ));
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Chaos {
    /// The chance, in 0..=1, that a request is hit.
    pub probability: f64,
    /// The kinds drawn from (uniformly); empty means none.
    pub kinds: Vec<FaultKind>,
    /// The generator's seed.
    pub seed: u64,
    /// Only requests with this HTTP method (upper case); `None` matches all.
    pub method: Option<String>,
    /// The longest slow first byte or stall pause.
    pub max_delay: Duration,
    /// Short bodies and stalls happen after a byte offset below this.
    pub max_offset: u64,
    /// The error statuses drawn from (with S3's code for each).
    pub statuses: Vec<u16>,
}

impl Chaos {
    /// Chaos of `kinds` with `probability` per request, seeded with `seed`; delays and
    /// stalls up to 500 ms, cuts and stalls within the first 256 KiB, statuses 503 and 500.
    pub fn new(probability: f64, kinds: &[FaultKind], seed: u64) -> Self {
        Self {
            probability: probability.clamp(0.0, 1.0),
            kinds: kinds.to_vec(),
            seed,
            method: None,
            max_delay: Duration::from_millis(500),
            max_offset: 256 * 1024,
            statuses: vec![503, 500],
        }
    }

    /// Restricts chaos to one HTTP method.
    #[must_use]
    pub fn method(mut self, method: impl Into<String>) -> Self {
        self.method = Some(method.into().to_ascii_uppercase());
        self
    }

    /// Sets the longest slow first byte or stall pause.
    #[must_use]
    pub fn max_delay(mut self, d: Duration) -> Self {
        self.max_delay = d;
        self
    }

    /// Sets the bound of the byte offset at which bodies are cut or stall.
    #[must_use]
    pub fn max_offset(mut self, bytes: u64) -> Self {
        self.max_offset = bytes;
        self
    }

    /// Sets the error statuses drawn from (an empty list means 503).
    #[must_use]
    pub fn statuses(mut self, statuses: &[u16]) -> Self {
        self.statuses = statuses.to_vec();
        self
    }
}

/// SplitMix64: small, fast, and good enough to draw faults from.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in 0..1.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in 0..n (0 when n is 0).
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

#[derive(Debug)]
struct ChaosState {
    chaos: Chaos,
    rng: Rng,
}

impl ChaosState {
    fn draw(&mut self, method: &str) -> Option<Fault> {
        let c = &self.chaos;
        if c.kinds.is_empty() || c.probability <= 0.0 {
            return None;
        }
        if let Some(m) = &c.method {
            if !m.eq_ignore_ascii_case(method) {
                return None;
            }
        }
        if self.rng.unit() >= c.probability {
            return None;
        }
        let kind = c.kinds[self.rng.below(c.kinds.len() as u64) as usize];
        let max_ms = u64::try_from(c.max_delay.as_millis()).unwrap_or(u64::MAX);
        let pause = Duration::from_millis(max_ms / 4 + self.rng.below(max_ms - max_ms / 4 + 1));
        let offset = self.rng.below(c.max_offset);
        Some(match kind {
            FaultKind::Status => {
                let status = if c.statuses.is_empty() {
                    503
                } else {
                    c.statuses[self.rng.below(c.statuses.len() as u64) as usize]
                };
                Fault::status(status, Fault::default_code(status))
            }
            FaultKind::Reset => Fault::Reset,
            FaultKind::Short => Fault::ShortBody {
                after_bytes: offset,
            },
            FaultKind::Delay => Fault::Delay(pause),
            FaultKind::Stall => Fault::Stall {
                after_bytes: offset,
                pause,
            },
        })
    }
}

#[derive(Debug, Default)]
struct Inner {
    rules: Mutex<Vec<FaultRule>>,
    chaos: Mutex<Option<ChaosState>>,
    hits: AtomicU64,
    by_kind: [AtomicU64; 5],
}

/// A shared, cloneable handle on a server's fault rules.
///
/// Every clone refers to the same rules, so a test can keep one while the server consults
/// another. Rules are consulted only for S3 requests, never for the `/__stoker/` control
/// endpoint.
#[derive(Debug, Clone, Default)]
pub struct FaultInjector {
    inner: Arc<Inner>,
}

impl FaultInjector {
    /// An injector with no rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a rule after the existing ones. A rule with `times == 0` is ignored.
    pub fn add(&self, rule: FaultRule) {
        if rule.times == 0 {
            return;
        }
        self.inner.rules.lock().push(rule);
    }

    /// Removes every rule and turns chaos off. The counters are kept.
    pub fn clear(&self) {
        self.inner.rules.lock().clear();
        *self.inner.chaos.lock() = None;
    }

    /// Turns random faults on (replacing any earlier chaos, its generator re-seeded) or,
    /// with `None`, off. Rules still come first.
    pub fn set_chaos(&self, chaos: Option<Chaos>) {
        *self.inner.chaos.lock() = chaos.map(|chaos| ChaosState {
            rng: Rng(chaos.seed),
            chaos,
        });
    }

    /// The chaos in force, if any.
    pub fn chaos(&self) -> Option<Chaos> {
        self.inner.chaos.lock().as_ref().map(|c| c.chaos.clone())
    }

    /// Faults delivered since the server started, per kind.
    pub fn counts(&self) -> FaultCounts {
        let ld = |k: FaultKind| self.inner.by_kind[k.index()].load(Ordering::Relaxed);
        FaultCounts {
            status: ld(FaultKind::Status),
            reset: ld(FaultKind::Reset),
            short: ld(FaultKind::Short),
            delay: ld(FaultKind::Delay),
            stall: ld(FaultKind::Stall),
        }
    }

    /// How many faults have been delivered since the server started.
    pub fn hits(&self) -> u64 {
        self.inner.hits.load(Ordering::Relaxed)
    }

    /// How many rules still have uses left.
    pub fn pending(&self) -> usize {
        self.inner.rules.lock().len()
    }

    /// Consumes one use of the first rule matching the request, returning its fault; when
    /// no rule matches, draws from the chaos, if any.
    pub(crate) fn take(
        &self,
        method: &str,
        decoded_path: &str,
        raw_path_and_query: &str,
    ) -> Option<Fault> {
        let fault = self
            .take_rule(method, decoded_path, raw_path_and_query)
            .or_else(|| self.inner.chaos.lock().as_mut()?.draw(method))?;
        self.inner.hits.fetch_add(1, Ordering::Relaxed);
        self.inner.by_kind[fault.kind().index()].fetch_add(1, Ordering::Relaxed);
        Some(fault)
    }

    fn take_rule(
        &self,
        method: &str,
        decoded_path: &str,
        raw_path_and_query: &str,
    ) -> Option<Fault> {
        let mut rules = self.inner.rules.lock();
        let idx = rules
            .iter()
            .position(|r| r.matches(method, decoded_path, raw_path_and_query))?;
        let rule = &mut rules[idx];
        let fault = rule.fault.clone();
        if rule.times != u32::MAX {
            rule.times -= 1;
            if rule.times == 0 {
                rules.remove(idx);
            }
        }
        Some(fault)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_are_consumed_in_order() {
        let f = FaultInjector::new();
        f.add(
            FaultRule::new(Fault::Reset)
                .method("get")
                .path_contains("a/b")
                .times(2),
        );
        f.add(FaultRule::new(Fault::slow_down()));
        assert_eq!(f.pending(), 2);
        // A PUT skips the GET-only rule and takes the catch-all one.
        assert_eq!(
            f.take("PUT", "/bk/a/b", "/bk/a/b"),
            Some(Fault::slow_down())
        );
        assert_eq!(f.take("PUT", "/bk/a/b", "/bk/a/b"), None);
        assert_eq!(f.take("GET", "/bk/x", "/bk/x"), None);
        assert_eq!(f.take("GET", "/bk/a/b", "/bk/a/b"), Some(Fault::Reset));
        assert_eq!(f.take("GET", "/bk/a/b", "/bk/a/b?x=1"), Some(Fault::Reset));
        assert_eq!(f.take("GET", "/bk/a/b", "/bk/a/b"), None);
        assert_eq!(f.hits(), 3);
        assert_eq!(f.pending(), 0);
    }

    #[test]
    fn forever_and_clear() {
        let f = FaultInjector::new();
        f.add(FaultRule::new(Fault::Delay(Duration::from_millis(1))).forever());
        f.add(FaultRule::new(Fault::Reset).times(0));
        for _ in 0..10 {
            assert!(f.take("GET", "/", "/?list-type=2").is_some());
        }
        assert_eq!(f.pending(), 1);
        f.clear();
        assert!(f.take("GET", "/", "/").is_none());
        assert_eq!(f.hits(), 10);
    }

    #[test]
    fn chaos_hits_about_its_probability_with_every_kind() {
        let f = FaultInjector::new();
        f.set_chaos(Some(Chaos::new(0.2, &FaultKind::ALL, 1)));
        let n = 20_000;
        let hits = (0..n)
            .filter(|_| f.take("GET", "/b/k", "/b/k").is_some())
            .count();
        // 4,000 expected; the binomial's standard deviation is about 57.
        assert!((3_700..4_300).contains(&hits), "{hits}");
        let c = f.counts();
        assert_eq!(c.total(), hits as u64);
        assert_eq!(f.hits(), hits as u64);
        for k in FaultKind::ALL {
            // 800 each expected.
            assert!((600..1_000).contains(&c.get(k)), "{k:?}: {c:?}");
        }
    }

    #[test]
    fn chaos_is_repeatable_from_its_seed() {
        let run = |seed| {
            let f = FaultInjector::new();
            f.set_chaos(Some(Chaos::new(0.3, &FaultKind::ALL, seed)));
            (0..500)
                .map(|_| f.take("GET", "/b/k", "/b/k"))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn chaos_parameters_stay_in_their_bounds() {
        let f = FaultInjector::new();
        let chaos = Chaos::new(
            1.0,
            &[FaultKind::Stall, FaultKind::Delay, FaultKind::Status],
            3,
        )
        .max_delay(Duration::from_millis(100))
        .max_offset(1000)
        .statuses(&[429]);
        f.set_chaos(Some(chaos.clone()));
        assert_eq!(f.chaos(), Some(chaos));
        for _ in 0..1000 {
            match f.take("GET", "/b/k", "/b/k").unwrap() {
                Fault::Stall { after_bytes, pause } => {
                    assert!(after_bytes < 1000);
                    assert!((25..=100).contains(&pause.as_millis()), "{pause:?}");
                }
                Fault::Delay(d) => assert!((25..=100).contains(&d.as_millis()), "{d:?}"),
                Fault::Status { status, code } => {
                    assert_eq!((status, code.as_str()), (429, "SlowDown"))
                }
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn rules_come_before_chaos_and_clear_stops_both() {
        let f = FaultInjector::new();
        f.set_chaos(Some(Chaos::new(1.0, &[FaultKind::Reset], 1).method("get")));
        f.add(FaultRule::new(Fault::slow_down()).times(1));
        assert_eq!(f.take("GET", "/b/k", "/b/k"), Some(Fault::slow_down()));
        assert_eq!(f.take("GET", "/b/k", "/b/k"), Some(Fault::Reset));
        assert_eq!(f.take("HEAD", "/b/k", "/b/k"), None, "chaos is GET only");
        assert_eq!(f.counts().status, 1);
        assert_eq!(f.counts().reset, 1);
        f.clear();
        assert_eq!(f.chaos(), None);
        assert_eq!(f.take("GET", "/b/k", "/b/k"), None);
        assert_eq!(f.counts().total(), 2, "counters are kept");
        f.set_chaos(Some(Chaos::new(0.0, &FaultKind::ALL, 1)));
        assert!((0..100).all(|_| f.take("GET", "/", "/").is_none()));
    }

    #[test]
    fn query_and_decoded_path_match() {
        let f = FaultInjector::new();
        f.add(FaultRule::new(Fault::Reset).path_contains("list-type=2"));
        f.add(FaultRule::new(Fault::Reset).path_contains("my key"));
        assert!(f.take("GET", "/b", "/b?list-type=2&prefix=x").is_some());
        assert!(f.take("GET", "/b/my key", "/b/my%20key").is_some());
    }
}
