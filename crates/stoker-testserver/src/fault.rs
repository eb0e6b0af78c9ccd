//! Injected faults: what can go wrong with a request, which requests it hits, and how often.
//!
//! A [`FaultInjector`] holds an ordered list of [`FaultRule`]s. Each S3 request the server
//! receives is offered to the rules in the order they were added; the first rule that matches
//! and still has uses left is consumed (its count goes down by one) and its [`Fault`] is
//! delivered instead of, or on top of, the normal answer. Exhausted rules are dropped.

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

#[derive(Debug, Default)]
struct Inner {
    rules: Mutex<Vec<FaultRule>>,
    hits: AtomicU64,
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

    /// Removes every rule. The [`hits`](Self::hits) counter is kept.
    pub fn clear(&self) {
        self.inner.rules.lock().clear();
    }

    /// How many faults have been delivered since the server started.
    pub fn hits(&self) -> u64 {
        self.inner.hits.load(Ordering::Relaxed)
    }

    /// How many rules still have uses left.
    pub fn pending(&self) -> usize {
        self.inner.rules.lock().len()
    }

    /// Consumes one use of the first rule matching the request, returning its fault.
    pub(crate) fn take(
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
        drop(rules);
        self.inner.hits.fetch_add(1, Ordering::Relaxed);
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
    fn query_and_decoded_path_match() {
        let f = FaultInjector::new();
        f.add(FaultRule::new(Fault::Reset).path_contains("list-type=2"));
        f.add(FaultRule::new(Fault::Reset).path_contains("my key"));
        assert!(f.take("GET", "/b", "/b?list-type=2&prefix=x").is_some());
        assert!(f.take("GET", "/b/my key", "/b/my%20key").is_some());
    }
}
